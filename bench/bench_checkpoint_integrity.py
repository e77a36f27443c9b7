"""What checkpoint manifests cost (train/checkpoint/integrity.py): a real 2-rank sharded checkpoint (torch distributed
checkpoint over gloo, as composer writes it under FSDP2), its save and load timed beside hashing it into a
manifest (each rank its own shard, right after writing it, as a run does) and verifying it (each rank its share,
as a resume does), as ratios from one run on this machine.

    .venv/bin/python bench/bench_checkpoint_integrity.py [--mb 400] [--smoke]

As root the page cache is dropped before the load and before the verification, as a resume on another day finds
it (the figures say whether it was).
"""
import argparse
import os
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))


def _drop_caches() -> bool:
    try:
        os.sync()
        Path("/proc/sys/vm/drop_caches").write_text("3\n")
        return True
    except OSError:
        return False


def _rank(rank: int, world: int, folder: str, mb: int, port: int, out) -> None:
    import torch
    import torch.distributed as dist
    import torch.distributed.checkpoint as dcp

    from train.checkpoint import integrity

    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port))
    dist.init_process_group("gloo", rank=rank, world_size=world)
    torch.manual_seed(rank)
    per_rank = mb * (1 << 20) // world // 4  # fp32 values of this rank's shard
    state = {f"layer{i}.rank{rank}": torch.randn(per_rank // 8) for i in range(8)}
    times = {}

    def timed(name, fn):
        dist.barrier()
        t = time.perf_counter()
        result = fn()
        dist.barrier()
        times[name] = time.perf_counter() - t
        return result

    timed("save", lambda: dcp.save(state, storage_writer=dcp.FileSystemWriter(folder)))
    names = integrity.files_of(folder)
    hashed = timed("hash", lambda: integrity.hash_files(folder, [n for n in names if integrity.owner(n, world) ==
                                                                     rank]))
    gathered = [None] * world
    dist.all_gather_object(gathered, hashed)
    if rank == 0:
        integrity.write_manifest(folder, {k: v for part in gathered for k, v in part.items()})
    dist.barrier()
    cold = _drop_caches() if rank == 0 else None
    timed("load", lambda: dcp.load(state, storage_reader=dcp.FileSystemReader(folder)))
    manifest = integrity.read_manifest(folder)
    if rank == 0:
        _drop_caches()
    # a resume: verify (reading the files once), then load (now from the page cache)
    why = timed("verify", lambda: integrity.share_differs(folder, manifest, world, rank))
    assert why is None, why
    timed("load_after", lambda: dcp.load(state, storage_reader=dcp.FileSystemReader(folder)))
    if rank == 0:
        size = sum((Path(folder) / n).stat().st_size for n in names)
        out.put({**times, "bytes": size, "cold": cold})
    dist.destroy_process_group()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--mb", type=int, default=400, help="the checkpoint's size in MiB (both ranks together)")
    parser.add_argument("--smoke", action="store_true", help="a small checkpoint, to see that it runs")
    args = parser.parse_args()
    mb = 16 if args.smoke else args.mb
    import torch.multiprocessing as mp

    ctx = mp.get_context("spawn")
    out = ctx.Queue()
    with tempfile.TemporaryDirectory() as tmp:
        folder = str(Path(tmp) / "ep0-ba100")
        port = 29500 + os.getpid() % 1000
        procs = [ctx.Process(target=_rank, args=(r, 2, folder, mb, port, out)) for r in range(2)]
        for p in procs:
            p.start()
        fig = out.get(timeout=600)
        for p in procs:
            p.join()
    gb = fig["bytes"] / 1e9
    cache = "page cache dropped" if fig["cold"] else "page cache kept (not root)"
    print(f"2-rank sharded checkpoint, {fig['bytes'] / (1 << 20):.0f} MiB, on this machine ({cache} before load/verify)")
    print(f"  save   {fig['save']:7.3f} s  ({gb / fig['save']:.2f} GB/s)")
    print(f"  hash   {fig['hash']:7.3f} s  = {fig['hash'] / fig['save']:.1%} of the save (each rank its shard, just written)")
    print(f"  load   {fig['load']:7.3f} s  ({gb / fig['load']:.2f} GB/s)")
    print(f"  verify {fig['verify']:7.3f} s  (each rank its share, reading it from disk)")
    resume = fig["verify"] + fig["load_after"]
    print(f"  resume {resume:7.3f} s  = verify + load {fig['load_after']:.3f} s from the page cache it filled: "
          f"{resume / fig['load']:.2f}x a load alone")


if __name__ == "__main__":
    main()
