"""data_prep vs llm-foundry's convert_dataset_json vs the raw tokenizer ceilings, on identical input.

    .venv/bin/python bench/bench_data_prep.py [--docs 15000] [--repeats 3] [--smoke]

--smoke: 200 documents, one run of each, every comparison and the sample check as usual, to see that it runs
(start-up dominates at that size: the ratios mean little).

Input: the two C4 files in ../shared/data/c4/en repeated to --docs documents, written as one gzip JSON-lines
file in a temporary folder (removed afterwards). Settings for both converters: concat_tokens 2048,
eos_text '<|endoftext|>', no bos, no compression, the GPT-NeoX-20B tokenizer folder.

Both converters run as whole processes, timed from outside (a user waits for the whole process, imports
included); data_prep twice: with its fast encoder (data_prep/fast_bpe.py, tiktoken) and with HF tokenizers
(DATA_PREP_ENCODER=tokenizers, what it did before the fast encoder). Runs are interleaved so a busy machine
slows all of them alike; the best run of each is reported, the median beside it. Two ceilings, each over the
same documents on every core, timed inside the call: `Tokenizer.encode_batch` (the old one) and the fast
encoder's `encode_docs` in one forked process per core (the new one). Finally the outputs are compared sample
by sample: the speed-up only counts if the samples are identical to llm-foundry's and to data_prep's with HF
tokenizers.
"""
from __future__ import annotations

import argparse
import gzip
import itertools
import json
import os
import resource
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
DATA = REPO.parent / "shared" / "data"
C4 = DATA / "c4" / "en"
TOKENIZER = DATA / "tokenizers" / "gpt-neox-20b"
PY = sys.executable
ENCODER_ENV = "DATA_PREP_ENCODER"  # data_prep/tokenizer.py: "tokenizers" turns the fast encoder off

CEILING = """
import json, gzip, sys, time
from tokenizers import Tokenizer
docs = [json.loads(line)["text"] for line in gzip.open(sys.argv[1])]
tok = Tokenizer.from_file(sys.argv[2] + "/tokenizer.json")
start, cpu = time.perf_counter(), time.process_time()
encodings = tok.encode_batch(docs)
seconds, cpu = time.perf_counter() - start, time.process_time() - cpu
print(json.dumps({"seconds": seconds, "cpu": cpu, "tokens": sum(len(e.ids) for e in encodings)}))
"""

# The fast encoder's ceiling: documents already in memory, one forked process per core, ids counted, not kept.
FAST_CEILING = """
import json, gzip, multiprocessing, os, sys, time
from tokenizers import Tokenizer
from data_prep import fast_bpe
docs = [json.loads(line)["text"] for line in gzip.open(sys.argv[1])]
path = sys.argv[2] + "/tokenizer.json"
enc = fast_bpe.build(Tokenizer.from_file(path), open(path, "rb").read())
workers = len(os.sched_getaffinity(0))
step = -(-len(docs) // (4 * workers))
slices = [docs[i:i + step] for i in range(0, len(docs), step)]
def work(texts):
    cpu, before = time.process_time(), enc.hf_docs
    tokens = len(enc.encode_docs(texts))
    return tokens, enc.hf_docs - before, time.process_time() - cpu
start = time.perf_counter()
with multiprocessing.get_context("fork").Pool(workers) as pool:
    results = pool.map(work, slices, chunksize=1)
seconds = time.perf_counter() - start
print(json.dumps({"seconds": seconds, "cpu": sum(r[2] for r in results), "tokens": sum(r[0] for r in results),
                  "hf_docs": sum(r[1] for r in results), "docs": len(docs)}))
"""

FOUNDRY = """
import sys, time
from llmfoundry.command_utils.data_prep.convert_dataset_json import convert_dataset_json_from_args
start = time.perf_counter()
convert_dataset_json_from_args(path=sys.argv[1], out_root=sys.argv[2], compression=None, concat_tokens=2048,
                               split="train", tokenizer=sys.argv[3], bos_text="", eos_text="<|endoftext|>")
print("IN_CALL_SECONDS", time.perf_counter() - start)
"""


def build_input(folder: Path, docs: int) -> Path:
    lines = []
    for path in sorted(C4.glob("c4-train.*.json.gz")):
        with gzip.open(path, "rb") as fh:
            lines += fh.read().splitlines(keepends=True)
    out = folder / "c4-train.bench.json.gz"
    with gzip.open(out, "wb", compresslevel=6) as fh:
        fh.writelines(itertools.islice(itertools.cycle(lines), docs))
    return out


def timed(cmd: list[str], env: dict, cpu: list | None = None) -> tuple[float, str]:
    """Wall seconds of a whole process; its CPU seconds (all its processes) are appended to `cpu`."""
    before = resource.getrusage(resource.RUSAGE_CHILDREN)
    start = time.perf_counter()
    proc = subprocess.run(cmd, cwd=REPO, env=env, capture_output=True, text=True)
    seconds = time.perf_counter() - start
    after = resource.getrusage(resource.RUSAGE_CHILDREN)
    if proc.returncode:
        sys.exit(f"failed ({proc.returncode}): {' '.join(cmd)}\n{proc.stdout[-3000:]}\n{proc.stderr[-3000:]}")
    if cpu is not None:
        cpu.append(after.ru_utime + after.ru_stime - before.ru_utime - before.ru_stime)
    return seconds, proc.stdout


def read_samples(folder: Path):
    import numpy as np
    from streaming import StreamingDataset

    from train.task import shm_registry

    with shm_registry.registering():  # a training job starting beside it would pick the same shared-memory prefix
        ds = StreamingDataset(local=str(folder), shuffle=False, batch_size=1)
    return np.stack([np.asarray(ds[i]["tokens"]).view(np.int32) if not isinstance(ds[i]["tokens"], bytes)
                     else np.frombuffer(ds[i]["tokens"], np.int32) for i in range(len(ds))])


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--docs", type=int, default=15000)
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--smoke", action="store_true", help="200 documents, one run, to see that it runs")
    args = parser.parse_args()
    if args.smoke:  # 200 C4 documents still fill tens of 2048-token samples to compare
        args.docs, args.repeats = 200, 1
    if not C4.is_dir() or not TOKENIZER.is_dir():
        sys.exit(f"../shared/data is missing (looked for {C4} and {TOKENIZER})")

    with tempfile.TemporaryDirectory(prefix="bench-data-prep-") as tmp:
        tmp = Path(tmp)
        src = build_input(tmp, args.docs)
        encoders: dict[str, str] = {}
        env = dict(os.environ, HF_DATASETS_CACHE=str(tmp / "hf-datasets"), HF_HUB_OFFLINE="1",
                   TRANSFORMERS_OFFLINE="1", HF_DATASETS_OFFLINE="1")
        ceiling, fast_ceiling, foundry, ours, old, foundry_in_call, ours_in_run, old_in_run = ([] for _ in range(8))
        ceiling_cpu, fast_ceiling_cpu, foundry_cpu, ours_cpu, old_cpu = [], [], [], [], []
        tokens = None
        for r in range(args.repeats):
            _, out = timed([PY, "-c", CEILING, str(src), str(TOKENIZER)], env)
            result = json.loads(out.strip().splitlines()[-1])
            ceiling.append(result["tokens"] / result["seconds"])
            ceiling_cpu.append(result["cpu"])

            _, out = timed([PY, "-c", FAST_CEILING, str(src), str(TOKENIZER)], env)
            result = json.loads(out.strip().splitlines()[-1])
            fast_ceiling.append(result["tokens"] / result["seconds"])  # documents only, like encode_batch: no EOS
            fast_ceiling_cpu.append(result["cpu"])
            hf_docs = f"{result['hf_docs']:,} of {result['docs']:,} documents went through tokenizers (guards)"

            foundry_out = tmp / f"foundry-{r}"
            seconds, out = timed([PY, "-c", FOUNDRY, str(src), str(foundry_out), str(TOKENIZER)], env, foundry_cpu)
            foundry.append(seconds)
            foundry_in_call.append(float(out.split("IN_CALL_SECONDS")[-1]))

            for encoder, runs, in_run, cpu in (("tokenizers", old, old_in_run, old_cpu),
                                               ("fast", ours, ours_in_run, ours_cpu)):
                out_root = tmp / f"{encoder}-{r}"
                seconds, _ = timed([PY, "-m", "data_prep", "dataset=jsonl", f"input={src}", f"out_root={out_root}",
                                    f"tokenizer={TOKENIZER}", "concat_tokens=2048", "eos_text='<|endoftext|>'",
                                    "bos_text=''", "compression=null", "split=train", "progress=false"],
                                   {**env, ENCODER_ENV: encoder}, cpu)
                runs.append(seconds)
                summary = json.loads((out_root / "train" / "data_prep_summary.json").read_text())
                tokens = summary["tokens"]
                in_run.append(summary["this_run"]["wall_seconds"])
                encoders[encoder] = summary["this_run"]["encoder"]
            print(f"run {r + 1}/{args.repeats}: ceilings {ceiling[-1] / 1e6:.3f} / {fast_ceiling[-1] / 1e6:.3f}M "
                  f"tokens/s, llm-foundry {foundry[-1]:.1f} s, data_prep {old[-1]:.1f} s with tokenizers, "
                  f"{ours[-1]:.1f} s fast", file=sys.stderr)

        import numpy as np

        ours_samples = read_samples(tmp / f"fast-{args.repeats - 1}" / "train")
        same_foundry = np.array_equal(read_samples(foundry_out), ours_samples)
        same_old = np.array_equal(read_samples(tmp / f"tokenizers-{args.repeats - 1}" / "train"), ours_samples)

    # Best of the interleaved runs: on a shared machine the fastest run is the one least disturbed by others.
    med = statistics.median
    print(f"input: {args.docs:,} C4 documents (the two files in ../shared/data/c4/en, repeated), gzip JSON lines; "
          f"{tokens:,} tokens with EOS; concat_tokens 2048, no compression; {os.cpu_count()} CPUs; "
          f"best (and median) of {args.repeats} interleaved runs")
    print(f"{'':58}{'seconds':>16}{'M tokens/s':>16}")
    for name, rates in (("tokenizers encode_batch, in the call (old ceiling)", ceiling),
                        ("fast encoder (tiktoken), in the call (new ceiling)", fast_ceiling)):
        print(f"{name:58}{'':>16}{max(rates) / 1e6:>9.3f} ({med(rates) / 1e6:.3f})")
    for name, runs, in_call in (("llm-foundry convert_dataset_json", foundry, foundry_in_call),
                                ("data_prep with tokenizers (before)", old, old_in_run),
                                ("data_prep with the fast encoder", ours, ours_in_run)):
        print(f"{name + ', whole process':58}{min(runs):>9.2f} ({med(runs):.2f})"
              f"{tokens / min(runs) / 1e6:>9.3f} ({tokens / med(runs) / 1e6:.3f})"
              f"   inside: {min(in_call):.2f} s")
    print(f"data_prep / llm-foundry, whole processes: {min(foundry) / min(ours):.2f}x (median "
          f"{med(foundry) / med(ours):.2f}x); with tokenizers: {min(foundry) / min(old):.2f}x "
          f"(median {med(foundry) / med(old):.2f}x)")
    print(f"data_prep whole process / fast encoder ceiling: {tokens / min(ours) / max(fast_ceiling):.0%}; inside the "
          f"run: {tokens / min(ours_in_run) / max(fast_ceiling):.0%} (with tokenizers / encode_batch ceiling: "
          f"{tokens / min(old) / max(ceiling):.0%}, inside {tokens / min(old_in_run) / max(ceiling):.0%})")
    print(f"CPU seconds (least of the runs): encode_batch {min(ceiling_cpu):.1f} and fast encoder "
          f"{min(fast_ceiling_cpu):.1f} in the call; llm-foundry {min(foundry_cpu):.1f}, data_prep with tokenizers "
          f"{min(old_cpu):.1f}, with the fast encoder {min(ours_cpu):.1f} (whole processes)")
    print(f"fast encoder: {hf_docs}; data_prep's summary says encoder: {encoders['fast']!r}")
    print(f"identical samples: {same_foundry and same_old} (data_prep vs llm-foundry: {same_foundry}; vs data_prep "
          f"with tokenizers: {same_old})")
    if not (same_foundry and same_old):
        sys.exit("the converters wrote different samples")


if __name__ == "__main__":
    main()
