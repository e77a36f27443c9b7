"""`python -m train.evaluate MODEL --data MDS [--split val] [--max-seq-len L] [--batch-size B] [--batches N]`:
cross-entropy and perplexity of an exported model on an MDS split; `--icl-tasks FILE` runs llm-foundry's
in-context-learning evaluation on a task file instead.

MODEL is an exported Hugging Face folder, or a run name (its newest export). The split is read with the loader
training evaluates with (llm-foundry's `text` loader, unshuffled, samples of `max_seq_len` tokens) and scored with
composer's `LanguageCrossEntropy`, the metric the trainer reports as `eval/LanguageCrossEntropy`: the same samples
give the same number. To score the samples a run evaluated on, pass its `variables.data_local`, `--batch-size` its
`device_eval_batch_size` and `--batches` its `eval_subset_num_batches` x its world size (composer counts those
batches per rank; -1: the whole split).
"""
import argparse
import json
import logging
import math
import sys
from pathlib import Path

from common.errors import UserError

log = logging.getLogger(__name__)

ICL_TYPES = ("language_modeling", "multiple_choice", "schema", "generation_task_with_answers")


def cross_entropy(model, tokenizer, data: Path, split: str, max_seq_len: int, batch_size: int,
                  batches: int) -> dict:
    """{cross_entropy, perplexity, samples, tokens} of `model` on the split, `batches` batches of it (-1: all)."""
    import torch
    from composer.metrics.nlp import LanguageCrossEntropy
    from llmfoundry.data.text_data import build_text_dataloader

    # As the trainer's eval_loader (conf/recipe/mpt.yaml): the split in order, no shuffling, every sample kept.
    # One process reads it; no worker processes are needed for a few batches.
    spec = build_text_dataloader(tokenizer, batch_size, dataset={
        "local": str(data), "remote": None, "split": split, "shuffle": False, "max_seq_len": max_seq_len},
        drop_last=False, num_workers=0, prefetch_factor=None, persistent_workers=False, pin_memory=False)
    metric = LanguageCrossEntropy()
    samples = 0
    with torch.no_grad():
        for i, batch in enumerate(spec.dataloader):
            if 0 <= batches <= i:
                break
            logits = model(input_ids=batch["input_ids"], attention_mask=batch.get("attention_mask")).logits
            # as llm-foundry's ComposerMPTCausalLM: token t predicts label t+1, the last position has no target
            targets = torch.roll(batch["labels"], shifts=-1, dims=1)
            targets[:, -1] = -100
            metric.update(logits.float(), targets)
            samples += batch["input_ids"].shape[0]
    if not samples:
        raise UserError("data", f"{data}/{split} gave no samples", "check --data and --split (an MDS split with "
                        "index.json)")
    ce = float(metric.compute())
    return {"cross_entropy": ce, "perplexity": math.exp(ce), "samples": samples,
            "tokens": int(metric.total_items), "data": str(Path(data) / split), "max_seq_len": max_seq_len}


def icl(folder: Path, task_file: Path, task_type: str, max_seq_len: int, batch_size: int, fewshot: int,
        delimiter: str = " ") -> dict:
    """llm-foundry's in-context-learning evaluation (`llmfoundry.command_utils.evaluate`) of the exported model on
    one task file; {metric name: value}."""
    from llmfoundry.command_utils import evaluate
    from omegaconf import OmegaConf

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
    trainers, _ = evaluate(cfg)
    return {f"{label}/{name}": float(metric.compute()) for trainer in trainers
            for label, named in trainer.state.eval_metrics.items() for name, metric in named.items()}


def parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="python -m train.evaluate", description=__doc__.split("\n\n")[0])
    parser.add_argument("model", help="an exported Hugging Face folder, or a run name")
    parser.add_argument("--data", type=Path, help="an MDS folder (the run's variables.data_local)")
    parser.add_argument("--split", default="val")
    parser.add_argument("--max-seq-len", type=int, help="tokens per sample (default: the model's max_seq_len)")
    parser.add_argument("--batch-size", type=int, default=8)
    parser.add_argument("--batches", type=int, default=-1, help="score only the first N batches (default -1: all)")
    parser.add_argument("--icl-tasks", type=Path, help="a JSON-lines task file for llm-foundry's ICL evaluation")
    parser.add_argument("--icl-type", choices=ICL_TYPES, default="language_modeling")
    parser.add_argument("--fewshot", type=int, default=0, help="in-context examples per question (ICL)")
    parser.add_argument("--icl-delimiter", default=" ", help="put between context and continuation (ICL; default ' ')")
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

        folder = hf_model.find_folder(args.model, *reversed(roots(storage)))
        if args.icl_tasks:
            result = icl(folder, args.icl_tasks.resolve(), args.icl_type, args.max_seq_len or _model_seq(folder),
                         args.batch_size, args.fewshot, args.icl_delimiter)
            text = "\n".join(f"{k} {v:.4f}" for k, v in result.items()) + f"\nmodel {folder}"
        else:
            model, tokenizer = hf_model.load(folder)
            result = cross_entropy(model, tokenizer, args.data.resolve(), args.split,
                                   args.max_seq_len or model.config.max_seq_len, args.batch_size, args.batches)
            text = (f"cross-entropy {result['cross_entropy']:.4f}  perplexity {result['perplexity']:.2f}  "
                    f"({result['samples']} samples, {result['tokens']:,} tokens of {result['data']})\n"
                    f"model {folder}")
    except UserError as err:
        print(err, file=sys.stderr)
        return 2
    print(json.dumps({"model": str(folder), **result}) if args.json else text)
    return 0


def _problems(args) -> list:
    from common.errors import Problem

    found = []
    if args.icl_tasks:
        if not args.icl_tasks.is_file():
            found.append(Problem("--icl-tasks", f"{args.icl_tasks} is not a file", "a JSON-lines task file (see "
                                 "docs/after-training.md, \"Evaluate\")"))
    elif args.data is None:
        found.append(Problem("--data", "no data to score on", "--data=<MDS folder> (the run's variables.data_local)"))
    elif not (args.data / args.split / "index.json").is_file():
        found.append(Problem("--data", f"{args.data / args.split} is not an MDS split (no index.json)",
                             "the folder data_prep wrote (holding train/ and val/), and --split"))
    for key, v in (("--batch-size", args.batch_size), ("--max-seq-len", args.max_seq_len)):
        if v is not None and v <= 0:
            found.append(Problem(key, f"must be positive, got {v}", f"e.g. {key}=8"))
    return found


def _model_seq(folder: Path) -> int:
    return int(json.loads((folder / "config.json").read_text()).get("max_seq_len", 2048))


if __name__ == "__main__":
    sys.exit(main())
