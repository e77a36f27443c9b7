"""`python -m train.consolidate PATH [--out FILE]`: a sharded checkpoint -> one full checkpoint file.

PATH is a sharded checkpoint folder (`ep{E}-ba{B}/`) or a run's save folder (its newest complete checkpoint).
Runs on one machine, on CPU, without the cluster that trained it; the file it writes is a monolithic composer
checkpoint (the whole training state: model, optimizer, schedulers, data position, the run's loss history) that
`load_path=FILE` loads at any world size. Prints the file's path.
"""
import argparse
import logging
import sys
from pathlib import Path


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(prog="python -m train.consolidate", description=__doc__.split("\n\n")[0])
    parser.add_argument("path", type=Path, help="a sharded checkpoint folder ep{E}-ba{B}/, or a save folder")
    parser.add_argument("--out", type=Path, help="the file to write (default: ep{E}-ba{B}-rank0.pt beside it)")
    args = parser.parse_args(argv)
    logging.basicConfig(level=logging.INFO, format="%(levelname)s: %(message)s")

    from train.checkpoint import resume  # light; torch is imported only to convert

    ckpt, why = resume.at_path(args.path.resolve(), reads_sharded=False)
    if ckpt is None:
        print(f"error: {args.path}: no complete checkpoint there (expected an ep{{E}}-ba{{B}}/ folder with "
              f".metadata, or a save folder holding one)", file=sys.stderr)
        return 2
    if why:
        print(f"error: {ckpt.path}: {why}", file=sys.stderr)
        return 2
    if not ckpt.sharded:
        if args.out and args.out.resolve() != ckpt.path:  # else: this path printed, exit 0, nothing written there
            print(f"error: --out: {ckpt.path} is already one full checkpoint file: nothing is converted, and "
                  f"{args.out} would not be written (load_path= takes the file as it is)", file=sys.stderr)
            return 2
        print(f"{ckpt.path} is already one full checkpoint file", file=sys.stderr)
        print(ckpt.path)
        return 0
    default = ckpt.path.parent / f"{ckpt.stem}-rank0.pt"
    out = (args.out or default).resolve()
    problem = _out_problem(out, default.resolve())
    if problem:
        print(f"error: --out: {out} {problem}", file=sys.stderr)
        return 2
    out.parent.mkdir(parents=True, exist_ok=True)
    print(resume.consolidate(ckpt.path, out))
    return 0


def _out_problem(out: Path, default: Path) -> str | None:
    """Why the conversion must not be written to `out`, which it replaces whole: only this checkpoint's own file
    beside it (an earlier conversion) is replaced (not any zip: another run's ep0-ba40-rank0.pt could be replaced
    by a batch-20 state whose manifest then verifies); a name composer gives a checkpoint would be resumed from by
    whatever run's save folder holds it; a file inside a checkpoint folder fails its manifest."""
    from train.checkpoint.resume import batch_of, holding_checkpoint

    inside = holding_checkpoint(out.parent)
    if inside is not None:
        return (f"is inside the checkpoint {inside}: a file added there fails its manifest, and resumes set the "
                "checkpoint aside")
    if out.is_dir():
        return "is a folder"
    if out.exists() and out != default:
        return "exists; the conversion replaces it whole: give a new --out, or delete that file first"
    named = batch_of(out.name)
    if named is not None and out != default:
        # in a save folder, a run's next start takes it for its own checkpoint of that batch (another run's state
        # continued as this one's, or this one's as another batch)
        return (f"is named as composer names a checkpoint (batch {named}): a run whose save folder holds it would "
                "resume from it as its own; give a name of your own (or no --out: beside the shards)")
    return None


if __name__ == "__main__":
    sys.exit(main())
