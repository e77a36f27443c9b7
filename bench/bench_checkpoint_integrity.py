"""What checkpoint manifests cost (train/checkpoint/integrity.py): a real 2-rank sharded checkpoint (torch distributed
checkpoint over gloo, as composer writes it under FSDP2), its save and load timed beside hashing it into a
manifest (each rank its own shard, right after writing it, as a run does) and verifying it (each rank its share,
as a resume does), as ratios from one run on this machine.

    .venv/bin/python bench/bench_checkpoint_integrity.py [--mb 400] [--smoke]

As root the page cache is dropped before the load and before the verification, as a resume on another day finds
it (the figures say whether it was); not in --smoke mode, which the test suite runs beside other tests (dropping
the whole machine's cache, and the sync before it, would stall them, and it, for as long as they write).
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


def _rank(rank: int, world: int, folder: str, mb: int, port: int, out, cold: bool) -> None:
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
    cold = _drop_caches() if cold and rank == 0 else None
    timed("load", lambda: dcp.load(state, storage_reader=dcp.FileSystemReader(folder)))
    manifest = integrity.read_manifest(folder)
    if cold and rank == 0:
        _drop_caches()
    # a resume: verify (reading the files once), then load (now from the page cache)
    why = timed("verify", lambda: integrity.share_differs(folder, manifest, world, rank))
    assert why is None, why
    timed("load_after", lambda: dcp.load(state, storage_reader=dcp.FileSystemReader(folder)))
    if rank == 0:
        size = sum((Path(folder) / n).stat().st_size for n in names)
        out.put({**times, "bytes": size, "cold": cold})
        out.close()
        out.join_thread()  # the figures are in the pipe
    # No destroy_process_group(): with torch 2.7 it can deadlock here (~ProcessGroupGloo joins its worker thread
    # while holding the GIL that thread needs to free the last collective's tensor; seen once in the suite and
    # once alone), and so can the same destructor at interpreter exit. Nothing is left to flush: leave at once.
    os._exit(0)


def _free_port() -> int:
    """A port no one listens on now (the OS's choice), for rank 0's store: a fixed or derived one may be taken by
    another job on the machine, and rank 0 would fail while rank 1 waits for it."""
    import socket

    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def _result(out, procs) -> dict:
    """Rank 0's figures; a rank that died first is named instead of waiting for figures that will not come."""
    import queue

    while True:
        try:
            return out.get(timeout=1)
        except queue.Empty:
            dead = [f"rank {r} exited with {p.exitcode}" for r, p in enumerate(procs) if p.exitcode not in (None, 0)]
            if dead:
                for p in procs:
                    p.kill()
                sys.exit(f"bench_checkpoint_integrity: {', '.join(dead)} (its traceback is above)")


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
        port = _free_port()
        procs = [ctx.Process(target=_rank, args=(r, 2, folder, mb, port, out, not args.smoke)) for r in range(2)]
        for p in procs:
            p.start()
        fig = _result(out, procs)
        for p in procs:
            p.join()
    gb = fig["bytes"] / 1e9
    cache = "page cache dropped" if fig["cold"] else f"page cache kept ({'--smoke' if args.smoke else 'not root'})"
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
