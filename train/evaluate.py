"""`python -m train.evaluate RUN`: cross-entropy and perplexity of a run's exported model on exactly the samples the
run evaluated, beside the number the run reported. `python -m train.evaluate MODEL --data MDS [--split val]
[--max-seq-len L] [--batch-size B] [--batches N]`: on the first N batches of any MDS split instead.
`--icl-tasks FILE` runs llm-foundry's in-context-learning evaluation on a task file.

MODEL is an exported Hugging Face folder, or a run name (its newest export). Samples are read with the loader
training evaluates with (llm-foundry's `text` loader, unshuffled, samples of `max_seq_len` tokens) and scored with
composer's `LanguageCrossEntropy`, the metric the trainer reports as `eval/LanguageCrossEntropy`: the same samples
give the same number. Which samples a run evaluated depends on its world: each rank reads its first
`eval_subset_num_batches` batches of its own part of the split, and streaming gives each node its own stretch of
the split. The run's metrics.json records what each evaluator read at its last start
(train/task/run_report.py), and without --data each of the run's evaluators is scored on those samples,
partitioned by streaming's own code.
"""
import argparse
import itertools
import json
import logging
import math
import os
import sys
import tempfile
from pathlib import Path

from common import files
from common.errors import Problem, UserError

log = logging.getLogger(__name__)

ICL_TYPES = ("language_modeling", "multiple_choice", "schema", "generation_task_with_answers")
# --split and --batch-size when they apply and are not given (unset on the command line, so that they can be
# refused without --data)
SPLIT, BATCH_SIZE = "val", 8


def cross_entropy(model, tokenizer, data: Path, split: str, max_seq_len: int, batch_size: int,
                  batches: int, sequence_id: dict | None = None) -> dict:
    """{cross_entropy, perplexity, samples, tokens} of `model` on the split, its first `batches` batches (-1: all);
    `sequence_id`: {eos_token_id: N} or {bos_token_id: N} to give the model each sample's documents apart."""
    spec = _loader(tokenizer, batch_size, {"local": str(data), "remote": None, "split": split,
                                           "max_seq_len": max_seq_len, **(sequence_id or {})})
    taken = spec.dataloader if batches < 0 else itertools.islice(spec.dataloader, batches)
    return {**_score(model, taken, f"{data}/{split}"), "data": str(Path(data) / split), "max_seq_len": max_seq_len}


def trainer_eval(model, tokenizer, label: str, reads: dict) -> dict:
    """cross_entropy on exactly the samples the run's evaluator `label` read on each of its ranks (`reads`: what
    train/task/run_report.py recorded of it in metrics.json)."""
    [stream] = reads["streams"]  # one: run_problems
    data = str(Path(stream["local"]) / stream["split"])
    spec = _loader(tokenizer, reads["batch_size"], {
        "local": stream["local"], "remote": stream["remote"], "split": stream["split"] or None,
        "max_seq_len": reads["max_seq_len"], "partition_algo": reads["partition_algo"],
        "batching_method": reads["batching_method"], "shuffle_algo": reads["shuffle_algo"],
        **({"token_encoding_type": reads["token_encoding_type"]} if reads.get("token_encoding_type") else {}),
        **reads.get("sequence_id", {})})  # the documents of a sample apart, as the run's loader gave them
    ids = trainer_batches(spec.dataloader.dataset, reads)
    collate = spec.dataloader.collate_fn
    dataset = spec.dataloader.dataset
    return {**_score(model, (collate([dataset[i] for i in batch]) for batch in ids), data), "data": data,
            "max_seq_len": reads["max_seq_len"], "nodes": reads["nodes"], "ranks_per_node": reads["ranks_per_node"],
            "batches_per_rank": reads["batches"], "batch_size": reads["batch_size"], "drop_last": reads["drop_last"]}


def trainer_batches(dataset, reads: dict) -> list:
    """The sample ids of every batch the run's evaluator read, rank after rank: streaming's own partition
    (`generate_work`) at the run's nodes, ranks and loader workers, each rank's first `batches` batches."""
    from streaming.base.batching import generate_work
    from streaming.base.world import World

    nodes, ranks, size = reads["nodes"], reads["ranks_per_node"], reads["batch_size"]
    workers = max(1, reads["workers"])  # 0 workers: the rank's own process reads, as one worker
    # unset, streaming takes one canonical node per physical node (64 for the py1s/py2s shuffles) when a loader
    # first iterates (StreamingDataset._resume), in the process that iterates: with loader workers, not the
    # trainer's own object, which metrics.json's record was read from
    dataset.num_canonical_nodes = reads["num_canonical_nodes"] or (
        64 * nodes if reads["shuffle_algo"] in ("py1s", "py2s") else nodes)
    work = generate_work(dataset.batching_method, dataset, World(nodes, ranks, workers, 0), 0, 0)
    found = []
    for node, rank in itertools.product(range(nodes), range(ranks)):
        per_worker = []
        for worker in range(workers):
            ids = work[node, rank, worker].flatten()
            ids = ids[ids != -1].tolist()  # streaming's padding, skipped as its iterator skips it
            batches = [ids[i:i + size] for i in range(0, len(ids), size)]
            # drop_last: torch's DataLoader drops each worker's last batch short of the batch size
            per_worker.append([b for b in batches if len(b) == size or not reads.get("drop_last")])
        # torch's DataLoader takes its workers' batches in turn, passing over a worker that has run out
        mine = [b for turn in itertools.zip_longest(*per_worker) for b in turn if b is not None]
        found += mine if reads["batches"] < 0 else mine[:reads["batches"]]
    return found


def run_problems(evaluators: dict, uses_sequence_id: bool) -> list:
    """What keeps the samples each of the run's evaluators read from being read again here, before the model loads
    (`uses_sequence_id`: the export's model attends within each document of a sample, attn_uses_sequence_id)."""
    fix = "score a split of your choosing: --data=<MDS folder> [--split, --batch-size, --batches, --eos-token-id]"
    found = []
    for label, reads in evaluators.items():
        why = None
        if len(reads["streams"]) != 1:
            why = f"reads {len(reads['streams'])} streams"
        elif reads["shuffle"]:
            why = "shuffles (eval_loader.dataset.shuffle=true: other samples at each evaluation)"
        elif reads["replication"] not in (None, 1):
            why = f"replicates samples over ranks (replication={reads['replication']})"
        elif "epoch_size" not in reads:
            why = "ran before metrics.json recorded whether it read a resampled epoch or dropped its last batches"
        elif reads["epoch_size"] != reads["samples"]:
            why = (f"read a resampled epoch of {reads['epoch_size']} samples of the split's {reads['samples']} "
                   "(eval_loader.dataset.epoch_size, or its stream's choose, repeat or proportion)")
        elif "sequence_id" not in reads and uses_sequence_id:
            why = ("ran before metrics.json recorded whether it gave the model sequence ids, which this model uses "
                   "(attn_uses_sequence_id)")
        if why:
            found.append(Problem("--data", f"the run's evaluator {label!r} {why}, so the samples it read cannot be "
                                 "rebuilt here", fix))
            continue
        [stream] = reads["streams"]
        data = Path(stream["local"]) / stream["split"]
        if stream["remote"] is None and not (data / "index.json").is_file():
            found.append(Problem("--data", f"the run's evaluator {label!r} read {data}, which holds no index.json "
                                 "now", "--data=<where that MDS folder is now> [--split, --batch-size, --batches]"))
    return found


def _loader(tokenizer, batch_size: int, dataset: dict):
    """llm-foundry's `text` loader, as the trainer's eval_loader (conf/recipe/mpt.yaml): the split in order, no
    shuffling, every sample kept, read in this process."""
    from llmfoundry.data.text_data import build_text_dataloader

    from train.task import shm_registry

    with shm_registry.registering():  # a job starting beside us would pick the same shared-memory prefix
        return build_text_dataloader(tokenizer, batch_size, dataset={**dataset, "shuffle": False}, drop_last=False,
                                     num_workers=0, prefetch_factor=None, persistent_workers=False, pin_memory=False)


def _score(model, batches, where: str) -> dict:
    """composer's LanguageCrossEntropy (the trainer's `eval/LanguageCrossEntropy`) over the batches."""
    import torch
    from composer.metrics.nlp import LanguageCrossEntropy

    metric = LanguageCrossEntropy()
    samples = 0
    with torch.no_grad():
        for batch in batches:
            # sequence_id as the trainer passes it to an MPT: with attn_uses_sequence_id each document of a sample
            # apart (composer hands a transformers architecture only the arguments its forward names)
            extra = {"sequence_id": batch.get("sequence_id")} if model.config.model_type == "mpt" else {}
            logits = model(input_ids=batch["input_ids"], attention_mask=batch.get("attention_mask"), **extra).logits
            # as llm-foundry's ComposerMPTCausalLM and ComposerHFCausalLM (shift_labels): token t predicts label
            # t+1, the last position has no target
            targets = torch.roll(batch["labels"], shifts=-1, dims=1)
            targets[:, -1] = -100
            metric.update(logits.float(), targets)
            samples += batch["input_ids"].shape[0]
    if not samples:
        raise UserError("data", f"{where} gave no samples", "check --data and --split (an MDS split with "
                        "index.json)")
    ce = float(metric.compute())
    return {"cross_entropy": ce, "perplexity": math.exp(ce), "samples": samples, "tokens": int(metric.total_items)}


def icl(folder: Path, task_file: Path, task_type: str, max_seq_len: int, batch_size: int, fewshot: int,
        delimiter: str = " ") -> dict:
    """llm-foundry's in-context-learning evaluation (`llmfoundry.command_utils.evaluate`) of the exported model on
    one task file; {metric name: value}."""
    from common.collector import imported_without_collections

    imported_without_collections("llmfoundry.command_utils")
    from llmfoundry.command_utils import evaluate
    from omegaconf import OmegaConf

    from common.compat import patch_composer_cpu_model_from_proc

    patch_composer_cpu_model_from_proc()  # llm-foundry's evaluate builds a Trainer: the CPU's name, no py-cpuinfo

    cfg = OmegaConf.create({
        "seed": 17, "max_seq_len": max_seq_len, "device_eval_batch_size": batch_size, "precision": "fp32",
        "models": [{
            "model_name": folder.name,
            "model": {"name": "hf_causal_lm", "pretrained_model_name_or_path": str(folder), "pretrained": True,
                      "trust_remote_code": True, "use_auth_token": False},
            "tokenizer": {"name": str(folder), "kwargs": {"model_max_length": max_seq_len}},
        }],
        "icl_tasks": [{"label": task_file.stem, "dataset_uri": str(task_file), "icl_task_type": task_type,
                       "num_fewshot": [fewshot], "continuation_delimiter": delimiter}],
        "loggers": {}, "log_config": False, "python_log_level": None,
    })
    # llm-foundry links each task's file into the working directory as <label>-<shots>.jsonl, removing a file of
    # that name first, and leaves the links in the directory the command ran in: a directory of its own instead
    here = os.getcwd()
    with tempfile.TemporaryDirectory(prefix="icl-") as scratch:
        os.chdir(scratch)
        try:
            trainers, _ = evaluate(cfg)
        finally:
            os.chdir(here)
    return {f"{label}/{name}": float(metric.compute()) for trainer in trainers
            for label, named in trainer.state.eval_metrics.items() for name, metric in named.items()}


def parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="python -m train.evaluate", description=__doc__.split("\n\n")[0])
    parser.add_argument("model", help="an exported Hugging Face folder, or a run name")
    parser.add_argument("--data", type=Path, help="an MDS folder (the run's variables.data_local)")
    parser.add_argument("--split", help=f"the split of --data (default: {SPLIT})")
    parser.add_argument("--max-seq-len", type=int, help="tokens per sample (default: the model's max_seq_len)")
    parser.add_argument("--batch-size", type=int, help=f"samples a batch (default: {BATCH_SIZE})")
    parser.add_argument("--batches", type=int, help="score only the first N batches of --data (default -1: all)")
    where = parser.add_mutually_exclusive_group()  # llm-foundry's eval_loader.dataset keys
    where.add_argument("--eos-token-id", type=int, help="documents of --data end with this token: the model gets "
                       "sequence ids (needed by a model with attn_uses_sequence_id, as its training had)")
    where.add_argument("--bos-token-id", type=int, help="documents of --data start with this token (as above)")
    parser.add_argument("--icl-tasks", type=Path, help="a JSON-lines task file for llm-foundry's ICL evaluation")
    parser.add_argument("--icl-type", choices=ICL_TYPES, help=f"the task file's type (ICL; default {ICL_TYPES[0]})")
    parser.add_argument("--fewshot", type=int, help="in-context examples per question (ICL; default 0)")
    parser.add_argument("--icl-delimiter", help="put between context and continuation (ICL; default ' ')")
    parser.add_argument("--json", action="store_true", help="print the result as one JSON object")
    return parser


def main(argv=None) -> int:
    from train.config.storage_args import roots, take

    argv, storage = take(sys.argv[1:] if argv is None else list(argv))
    args = parser().parse_args(argv)
    logging.basicConfig(level=logging.INFO, format="%(levelname)s: %(message)s")
    try:
        problems = _problems(args)
        if problems:
            raise UserError(problems=problems)
        from train import hf_model

        folder = hf_model.find_folder(args.model, roots(storage))
        config = json.loads((folder / "config.json").read_text())
        seq = args.max_seq_len or hf_model.max_seq_len(config) or 2048  # the model's (MPT's, or its positions)
        # MPT's attn_config.attn_uses_sequence_id: the model attends within each document of a sample
        uses_sequence_id = bool((config.get("attn_config") or {}).get("attn_uses_sequence_id"))
        if args.icl_tasks:
            result = icl(folder, args.icl_tasks.resolve(), args.icl_type or ICL_TYPES[0], seq,
                         args.batch_size or BATCH_SIZE, args.fewshot or 0,
                         " " if args.icl_delimiter is None else args.icl_delimiter)
            text = "\n".join(f"{k} {v:.4f}" for k, v in result.items()) + f"\nmodel {folder}"
        elif args.data is None:
            metrics_path, metrics = _run_metrics(folder)
            problems = run_problems(metrics["evaluators"], uses_sequence_id)
            if problems:
                raise UserError(problems=problems)
            model, tokenizer = hf_model.load(folder)
            batch = hf_model.export_batch(folder)
            result = {"evaluators": {label: {**trainer_eval(model, tokenizer, label, reads),
                                             "trainer": _trainers(metrics, label, batch)}
                                     for label, reads in metrics["evaluators"].items()}, "metrics": str(metrics_path)}
            text = "\n".join(_line(label, r) for label, r in result["evaluators"].items()) + f"\nmodel {folder}"
            _warn_if_apart(batch, result["evaluators"], str(model.config.torch_dtype))
        else:
            sequence_id = {k: v for k, v in (("eos_token_id", args.eos_token_id), ("bos_token_id", args.bos_token_id))
                           if v is not None}
            if uses_sequence_id and not sequence_id:
                raise UserError("--eos-token-id", f"the model of {folder} attends within each document of a sample "
                                "(attn_uses_sequence_id): without the token that separates documents it scores "
                                "otherwise than its training evaluated", "--eos-token-id=<the run's "
                                "eval_loader.dataset.eos_token_id> (or --bos-token-id), or score the run's own "
                                "evaluation without --data")
            _same_tokens(folder, args.data / (args.split or SPLIT), seq, given=args.max_seq_len is not None)
            model, tokenizer = hf_model.load(folder)
            result = cross_entropy(model, tokenizer, args.data.resolve(), args.split or SPLIT, seq,
                                   args.batch_size or BATCH_SIZE, -1 if args.batches is None else args.batches,
                                   sequence_id)
            text = f"{_scored(result)}\nmodel {folder}"
    except UserError as err:
        print(err, file=sys.stderr)
        return 2
    print(json.dumps({"model": str(folder), **result}) if args.json else text)
    return 0


def _run_metrics(folder: Path) -> tuple[Path, dict]:
    """The newest metrics.json of the run that exported `folder` (<output_root>/<run>/huggingface/ba{B}), which
    says what its evaluators read: a plain run's is beside the export, a sweep point's in its folder under
    <output_root>/sweeps/."""
    from train.config.storage_args import export_run

    run = export_run(folder)
    found = []
    if run is not None:
        found = sorted([p for p in (run / "metrics.json", *run.parent.glob("sweeps/*/*/metrics.json")) if p.is_file()],
                       key=lambda p: p.stat().st_mtime, reverse=True)
    for path in found:
        metrics = files.read_json(path)
        if metrics.get("run_name") != run.name:
            continue
        if "evaluators" not in metrics:
            raise UserError("--data", f"{path} does not say what the run's evaluation read (a run from before "
                            "metrics.json recorded it)", "--data=<the run's variables.data_local> and its "
                            "--batch-size and --batches (see docs/after-training.md)")
        if not metrics["evaluators"]:
            raise UserError("--data", f"the run evaluated no MDS split ({path})", "--data=<MDS folder>")
        return path, metrics
    where = f"{run}/metrics.json or {run.parent}/sweeps/*/*/metrics.json" if run else "a run's outputs above it"
    raise UserError("--data", f"no data to score on: no metrics.json of the run that exported {folder} (looked "
                    f"in {where})", "--data=<MDS folder> (a run's variables.data_local), or the export of a run "
                    "that has finished")


def _trainers(metrics: dict, label: str, batch: int | None = None) -> dict | None:
    """The run's reported cross-entropy of that evaluator at `batch` (the export's) where the run evaluated there on
    the samples scored here (by its last start: `evaluators_since`), else its last, with the batch it was evaluated
    at: an export of an earlier batch beside the run's final number would read as the same weights scoring
    apart."""
    key = f"{label}/LanguageCrossEntropy"
    history = [(b, values[key]) for b, values in metrics.get("eval", []) if key in values]
    since = metrics.get("evaluators_since")
    at = [(b, v) for b, v in history if b == batch and isinstance(since, int) and b > since]
    if at:
        return {"metric": key, "cross_entropy": at[-1][1], "batch": batch}
    value = (metrics.get("final_eval") or {}).get(key)
    last = history[-1][0] if history else None
    return None if value is None else {"metric": key, "cross_entropy": value, "batch": last}


def _warn_if_apart(batch: int | None, scored: dict, dtype: str) -> None:
    """A float32 export of the batch the run last evaluated (`batch`: the export's) scores the run's own number on
    its samples (the sums add in another order: ~1e-7 apart); further apart, these are not the weights the run
    evaluated."""
    for label, r in scored.items():
        t = r["trainer"]
        if (t and t["batch"] == batch and dtype.endswith("float32")
                and abs(r["cross_entropy"] - t["cross_entropy"]) > 1e-4 * abs(t["cross_entropy"])):
            log.warning("%s: the export of batch %s scores %.6f where the run reported %.6f at that batch on the same "
                        "samples: it does not hold the weights the run evaluated", label, batch, r["cross_entropy"],
                        t["cross_entropy"])


def _scored(r: dict) -> str:
    return (f"cross-entropy {r['cross_entropy']:.4f}  perplexity {r['perplexity']:.2f}  "
            f"({r['samples']} samples, {r['tokens']:,} tokens of {r['data']})")


def _line(label: str, r: dict) -> str:
    each = "all batches" if r["batches_per_rank"] < 0 else f"its first {r['batches_per_rank']} batches"
    each = each.replace("batches", "full batches") if r.get("drop_last") else each
    ranks = r["nodes"] * r["ranks_per_node"]
    where = f"on each of {ranks} ranks ({r['nodes']} node{'s' * (r['nodes'] > 1)})" if ranks > 1 else "on its one rank"
    text = f"{label}: {_scored(r)}\n  the samples the run evaluated: {each} of {r['batch_size']} {where}"
    t = r["trainer"]
    return text + (f"\n  the run reported {t['metric']} {t['cross_entropy']:.4f} at batch {t['batch']}" if t else "")


def _problems(args) -> list:
    found = []
    if args.icl_tasks:
        from train.checks.node import icl_task_lines

        if not args.icl_tasks.is_file():
            found.append(Problem("--icl-tasks", f"{args.icl_tasks} is not a file", "a JSON-lines task file (see "
                                 "docs/after-training.md, \"Evaluate\")"))
        else:
            found += icl_task_lines(args.icl_tasks, {"icl_task_type": args.icl_type or ICL_TYPES[0]}, "--icl-tasks")
        for key, v in (("--data", args.data), ("--split", args.split), ("--batches", args.batches),
                       ("--eos-token-id", args.eos_token_id), ("--bos-token-id", args.bos_token_id)):
            if v is not None:  # the ICL evaluation would take it and ignore it, exit 0
                found.append(Problem(key, "applies to scoring --data; --icl-tasks scores the task file", "run the "
                                     f"two apart, or leave {key} out"))
        if args.fewshot is not None and args.fewshot < 0:
            found.append(Problem("--fewshot", f"must be 0 or more, got {args.fewshot} (it ran as 0-shot, labelled "
                                 f"{args.fewshot}-shot)", "--fewshot=0"))
        found += _positive(args)
        return found
    for key, v in (("--icl-type", args.icl_type), ("--fewshot", args.fewshot), ("--icl-delimiter", args.icl_delimiter)):
        if v is not None:
            found.append(Problem(key, "applies to --icl-tasks, not given", f"add --icl-tasks=<file>, or leave {key} out"))
    if args.data is None:
        for key, v in (("--batches", args.batches), ("--split", args.split), ("--max-seq-len", args.max_seq_len),
                       ("--batch-size", args.batch_size), ("--eos-token-id", args.eos_token_id),
                       ("--bos-token-id", args.bos_token_id)):
            if v is not None:
                found.append(Problem(key, "applies to --data; without --data the run's own evaluation is scored, "
                                     "as it read", f"add --data=<MDS folder>, or leave {key} out"))
    elif not (args.data / (args.split or SPLIT) / "index.json").is_file():
        found.append(Problem("--data", f"{args.data / (args.split or SPLIT)} is not an MDS split (no index.json)",
                             "the folder data_prep wrote (holding train/ and val/), and --split"))
    return found + _positive(args)


def _positive(args) -> list:
    return [Problem(key, f"must be positive, got {v}", f"e.g. {key}=8") for key, v in (
        ("--batch-size", args.batch_size), ("--max-seq-len", args.max_seq_len)) if v is not None and v <= 0]


def _same_tokens(folder: Path, split: Path, seq: int, given: bool = False) -> None:
    """--data tokenized with another vocabulary than the model's is refused, as a training on it is (it would print
    a cross-entropy of another tokenizer's ids, exit 0); samples longer than the model's sequence warned:
    each is scored on its first `seq` tokens. What data_prep recorded beside the split says (data_prep/facts.py)."""
    from data_prep.facts import dataset_facts, tokenizer_fingerprint

    facts = dataset_facts(split)
    theirs, ours = facts.get("tokenizer_fingerprint"), tokenizer_fingerprint(str(folder))
    if theirs and ours and theirs != ours:
        raise UserError("--data", f"{split} was tokenized with {facts.get('tokenizer')}, not with the tokenizer of "
                        f"{folder}: its token ids mean other words to this model", "data made by data_prep with the "
                        "run's tokenizer (the one saved in the export)")
    length = facts.get("sample_tokens")
    if isinstance(length, int) and length > seq:
        log.warning("%s holds samples of %d tokens: each is scored on its first %d (%s)", split, length, seq,
                    "--max-seq-len" if given else "the model's max_seq_len; --max-seq-len to set it")


if __name__ == "__main__":
    sys.exit(main())
