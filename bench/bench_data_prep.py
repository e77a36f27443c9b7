"""data_prep vs llm-foundry's convert_dataset_json vs the raw tokenizer ceiling, on identical input.

    .venv/bin/python bench/bench_data_prep.py [--docs 15000] [--repeats 3]

Input: the two C4 files in ../shared/data/c4/en repeated to --docs documents, written as one gzip JSON-lines
file in a temporary folder (removed afterwards). Settings for both converters: concat_tokens 2048,
eos_text '<|endoftext|>', no bos, no compression, the GPT-NeoX-20B tokenizer folder.

Both converters run as whole processes, timed from outside (a user waits for the whole process, imports
included). Runs are interleaved so a busy machine slows all three alike; the best run of each is reported,
the median beside it. The ceiling is `Tokenizer.encode_batch` over the same documents on every core, timed
inside the call. Finally the two outputs are compared sample by sample: the speed-up only counts if the
samples are identical.
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

    ds = StreamingDataset(local=str(folder), shuffle=False, batch_size=1)
    return np.stack([np.asarray(ds[i]["tokens"]).view(np.int32) if not isinstance(ds[i]["tokens"], bytes)
                     else np.frombuffer(ds[i]["tokens"], np.int32) for i in range(len(ds))])


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--docs", type=int, default=15000)
    parser.add_argument("--repeats", type=int, default=3)
    args = parser.parse_args()
    if not C4.is_dir() or not TOKENIZER.is_dir():
        sys.exit(f"../shared/data is missing (looked for {C4} and {TOKENIZER})")

    with tempfile.TemporaryDirectory(prefix="bench-data-prep-") as tmp:
        tmp = Path(tmp)
        src = build_input(tmp, args.docs)
        env = dict(os.environ, HF_DATASETS_CACHE=str(tmp / "hf-datasets"), HF_HUB_OFFLINE="1",
                   TRANSFORMERS_OFFLINE="1", HF_DATASETS_OFFLINE="1")
        ceiling, foundry, ours, foundry_in_call, ours_in_run = [], [], [], [], []
        ceiling_cpu, foundry_cpu, ours_cpu = [], [], []
        tokens = None
        for r in range(args.repeats):
            _, out = timed([PY, "-c", CEILING, str(src), str(TOKENIZER)], env)
            result = json.loads(out.strip().splitlines()[-1])
            ceiling.append(result["tokens"] / result["seconds"])
            ceiling_cpu.append(result["cpu"])

            foundry_out = tmp / f"foundry-{r}"
            seconds, out = timed([PY, "-c", FOUNDRY, str(src), str(foundry_out), str(TOKENIZER)], env, foundry_cpu)
            foundry.append(seconds)
            foundry_in_call.append(float(out.split("IN_CALL_SECONDS")[-1]))

            ours_out = tmp / f"ours-{r}"
            seconds, _ = timed([PY, "-m", "data_prep", "dataset=jsonl", f"input={src}", f"out_root={ours_out}",
                                f"tokenizer={TOKENIZER}", "concat_tokens=2048", "eos_text='<|endoftext|>'",
                                "bos_text=''", "compression=null", "split=train", "progress=false"], env, ours_cpu)
            ours.append(seconds)
            summary = json.loads((ours_out / "train" / "data_prep_summary.json").read_text())
            tokens = summary["tokens"]
            ours_in_run.append(summary["this_run"]["wall_seconds"])
            print(f"run {r + 1}/{args.repeats}: ceiling {ceiling[-1] / 1e6:.3f}M tokens/s, llm-foundry {foundry[-1]:.1f} s, "
                  f"data_prep {ours[-1]:.1f} s", file=sys.stderr)

        import numpy as np

        same = np.array_equal(read_samples(foundry_out), read_samples(ours_out / "train"))

    # Best of the interleaved runs: on a shared machine the fastest run is the one least disturbed by others.
    best_ceiling, best_foundry, best_ours = max(ceiling), min(foundry), min(ours)
    print(f"input: {args.docs:,} C4 documents (the two files in ../shared/data/c4/en, repeated), gzip JSON lines; "
          f"{tokens:,} tokens with EOS; concat_tokens 2048, no compression; {os.cpu_count()} CPUs; "
          f"best (and median) of {args.repeats} interleaved runs")
    print(f"{'':50}{'seconds':>16}{'M tokens/s':>16}")
    print(f"{'tokenizers encode_batch, in the call':50}{'':>16}"
          f"{best_ceiling / 1e6:>9.3f} ({statistics.median(ceiling) / 1e6:.3f})")
    for name, runs, in_call in (("llm-foundry convert_dataset_json", foundry, foundry_in_call),
                                ("data_prep", ours, ours_in_run)):
        print(f"{name + ', whole process':50}{min(runs):>9.2f} ({statistics.median(runs):.2f})"
              f"{tokens / min(runs) / 1e6:>9.3f} ({tokens / statistics.median(runs) / 1e6:.3f})"
              f"   inside: {min(in_call):.2f} s")
    print(f"data_prep / llm-foundry, whole processes: {best_foundry / best_ours:.2f}x "
          f"(median {statistics.median(foundry) / statistics.median(ours):.2f}x)")
    print(f"data_prep whole process / encode_batch ceiling: {tokens / best_ours / best_ceiling:.0%}; "
          f"inside the run: {tokens / min(ours_in_run) / best_ceiling:.0%}")
    print(f"CPU seconds (least of the runs): encode_batch {min(ceiling_cpu):.1f} in the call, "
          f"llm-foundry {min(foundry_cpu):.1f}, data_prep {min(ours_cpu):.1f} (whole processes)")
    print(f"identical samples: {same}")
    if not same:
        sys.exit("the two converters wrote different samples")


if __name__ == "__main__":
    main()
