"""`python -m train.consolidate PATH [--out FILE]`: a sharded checkpoint -> one full checkpoint file.

PATH is a sharded checkpoint folder (`ep{E}-ba{B}/`) or a run's save folder (its newest complete checkpoint).
Runs on one machine, on CPU, without the cluster that trained it; the file it writes is a monolithic composer
checkpoint (the whole training state: model, optimizer, schedulers, data position, the run's loss history) that
`load_path=FILE` loads at any world size. Prints the file's path.
"""
import argparse
import logging
import sys
import zipfile
from pathlib import Path


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(prog="python -m train.consolidate", description=__doc__.split("\n\n")[0])
    parser.add_argument("path", type=Path, help="a sharded checkpoint folder ep{E}-ba{B}/, or a save folder")
    parser.add_argument("--out", type=Path, help="the file to write (default: ep{E}-ba{B}-rank0.pt beside it)")
    args = parser.parse_args(argv)
    logging.basicConfig(level=logging.INFO, format="%(levelname)s: %(message)s")

    from train.checkpoint import resume  # light; torch is imported only to convert

    path = args.path.resolve()
    [ckpt] = [c for c in resume.find(path.parent) if c.path == path] or [None]
    if ckpt is None:  # a save folder: its newest checkpoint that verifies (nothing is moved: a run may be writing)
        ckpt = resume.newest_complete(path, reads_sharded=False, verify=True)
        if ckpt is None:
            print(f"error: {args.path}: no complete checkpoint there (expected an ep{{E}}-ba{{B}}/ folder with "
                  f".metadata, or a save folder holding one)", file=sys.stderr)
            return 2
        why = None
    else:
        why = resume.unreadable(ckpt)  # a checkpoint named by its path is verified too: never write damaged weights
    if why:
        print(f"error: {ckpt.path}: {why}", file=sys.stderr)
        return 2
    if not ckpt.sharded:
        print(f"{ckpt.path} is already one full checkpoint file", file=sys.stderr)
        print(ckpt.path)
        return 0
    out = (args.out or ckpt.path.parent / f"{ckpt.stem}-rank0.pt").resolve()
    if out.is_dir() or out.exists() and not zipfile.is_zipfile(out):  # replaced whole: only an earlier checkpoint
        print(f"error: --out: {out} exists and is not a checkpoint file; writing there would replace it",
              file=sys.stderr)
        return 2
    out.parent.mkdir(parents=True, exist_ok=True)
    print(resume.consolidate(ckpt.path, out))
    return 0


if __name__ == "__main__":
    sys.exit(main())
