"""What each task checks as it starts, before it writes or trains: the storage is mounted on this node, and the
shards it will read (train and val) are the bytes data_prep wrote.

Mounts: a mount point with nothing mounted on it is an empty folder on the node's root disk; data read from it is
missing and checkpoints written to it are lost with the node. The login node checked the same before submitting
(train/checks/node.py); a compute node whose mount failed is only seen here. Every rank looks (a stat each).

Shards: data_prep records every shard file's hash in index.json (`raw_data.hashes`, `zip_data.hashes`, as
streaming's MDSWriter does). A flipped byte in a sample trains silently; a damaged val shard fails at the first
evaluation, after eval_interval of training, on every retry. So the shards of each split are hashed here, spread
over every rank of the job (each rank hashes every world-size-th shard), and the job stops naming the damaged
ones, a plain run leaving nothing behind (train/task/refusal.py). Folders without hashes (streaming's writer
without `hashes=`, llm-foundry's converter) are left as they are; remote data (variables.data_remote) is streamed
and checked by streaming as it downloads it.
"""
import logging
import os
import sys
import time
from pathlib import Path

from common.errors import Problem, UserError
from data_prep.facts import index_shards, samples_in, shard_file
from data_prep.mds import file_hashes
from train.config.loaders import mds_sources
from train.task import refusal
from train.task.distributed import node_name

log = logging.getLogger(__name__)


class NotMounted(UserError):
    """A storage mount point with no file system on it, on this node."""


class DamagedShard(UserError):
    """A shard file whose bytes are not the ones its index.json records."""


def unmounted(paths) -> list:
    """The mount points among `paths` (`src` or `src:dst`) that are not mounted on this node."""
    found = []
    for entry in paths or []:
        path = str(entry).split(":")[0]
        if path and not os.path.ismount(path):
            found.append(path)
    return found


def check_mounts(cfg) -> None:
    """Refuse to start on a node where a storage mount point has nothing mounted on it."""
    node = node_name()
    missing = unmounted(cfg.storage.mounts)
    if missing:
        refusal.take_back()
        raise NotMounted(problems=[
            Problem("storage.mounts", f"{path} is not a mount point on {node} (nothing is mounted there: reads "
                    "would find nothing and writes would land on the node's own disk)",
                    "mount the file system on every node (or exclude this node: --exclude in "
                    "cluster.sbatch_extra), or use a storage preset this cluster has")
            for path in missing])


def _split_folders(fcfg) -> list:
    """(key, folder) of each local split the loaders will read, where no remote is streamed into it: a loader's
    dataset, or each stream of a mixture, each folder as streaming opens it (train/config/loaders.py: mds_sources)."""
    found = []
    for source in mds_sources(fcfg):
        if source.remote or not source.local:
            continue
        if (source.folder / "index.json").is_file() and source.folder not in [f for _, f in found]:
            found.append((source.key, source.folder))
    return found


class OtherData(UserError):
    """A run resumed on training data that is not the data it trained on."""


def train_data(fcfg) -> dict | None:
    """What the training split is, for a resumed run to compare with its start: its index.json's hash (data_prep's
    index records every shard's size and hash, so equal indexes are equal data) and its sample count; not where it
    is (the same data on another mount is the same data, as in the run's identity). None where
    the data is streamed from a remote (streaming fetches the index as it starts) or not a local MDS split."""
    import hashlib

    indexes = _train_indexes(fcfg)
    if not indexes:
        return None
    raws = [index.read_bytes() for index in indexes]
    counts = [samples_in(index.parent, raw) for index, raw in zip(indexes, raws)]
    samples = None if None in counts else sum(counts)
    # one split: its index's own hash (the form a record of one split keeps); a mixture: every stream's, in order
    digest = hashlib.sha256(raws[0]).hexdigest() if len(raws) == 1 else \
        hashlib.sha256(b"".join(hashlib.sha256(raw).digest() for raw in raws)).hexdigest()
    return {"sha256": digest, "samples": samples}


def _train_indexes(fcfg) -> list:
    return [folder / "index.json" for key, folder in _split_folders(fcfg) if key.startswith("train_loader.dataset")]


def same_train_data(then: dict | None, now: dict | None, fcfg, checkpoint) -> None:
    """Stop a resume on other training data. The same run name means the same settings, and the data is named by
    its folder: data made again in that folder (more files, another tokenizer, a wrong copy) would go on from
    streaming's place in the old data (its epoch and sample offset) in other samples, and end with exit 0."""
    if not then or not now or then.get("sha256") == now.get("sha256"):
        return
    refusal.take_back()
    counts = f"{now.get('samples')} samples now, {then.get('samples')} when the run started"
    indexes = " and ".join(map(str, _train_indexes(fcfg)))
    raise OtherData("train_loader.dataset", f"{indexes} is not the data this run trained on ({counts}; its "
                    f"index.json hashes {now['sha256'][:16]} now, {then['sha256'][:16]} then): resuming from "
                    f"{checkpoint} would go on from its place in the old data, in other samples",
                    "put back the data it trained on; or train on this data from its weights as another run: "
                    f"run_name=<a new name> load_path={checkpoint} load_weights_only=true")


def shard_files(folder: Path) -> list:
    """(file, {algo: digest}) of every shard file of a split whose index.json records a hash: the compressed file
    where it is there, else the raw one. A file named outside the split's folder is (its name as recorded, None):
    not hashed, and damaged says why."""
    files = []
    for shard in index_shards(folder) or []:
        for kind in ("zip_data", "raw_data"):
            info = shard.get(kind)
            if not info or not info.get("hashes"):
                continue
            file = shard_file(folder, info)
            if file is None:
                files.append((Path(str(info["basename"])), None))
                break
            if file.is_file():
                files.append((file, info["hashes"]))
                break
    return files


def damaged(file: Path, hashes: dict | None) -> str | None:
    """Why this shard file is not the one recorded, or None."""
    if hashes is None:
        return "index.json names it outside the dataset folder (streaming would read a file that is not this data's)"
    known = {a: h for a, h in hashes.items() if a in _supported()}
    if not known:
        return None
    algo = sorted(known)[0]
    try:
        with open(file, "rb") as fh:
            got = file_hashes(iter(lambda: fh.read(1 << 24), b""), [algo])[algo]
    except OSError as err:
        return f"cannot be read ({err.strerror})"
    return None if got == known[algo] else f"its {algo} is {got}, index.json records {known[algo]}"


def _supported() -> set:
    import hashlib

    import xxhash

    return {a for a in hashlib.algorithms_available if hasattr(hashlib, a)} | set(xxhash.algorithms_available)


def verify(fcfg, rank: int = 0, world: int = 1) -> list:
    """This rank's share of the check: (key, file, why) of each damaged shard among every world-th file."""
    found = []
    for key, folder in _split_folders(fcfg):
        for num, (file, hashes) in enumerate(shard_files(folder)):
            if num % world == rank:
                why = damaged(file, hashes)
                if why:
                    found.append((key, str(file), why))
    return found


def verify_shards(fcfg) -> None:
    """Every shard the run will read, hashed once across the job's ranks; the job stops (every rank, with the same
    error) naming each damaged shard, before the trainer is built."""
    start = time.perf_counter()
    world, rank = 1, 0
    dist = sys.modules.get("composer.utils.dist")  # the task joined the process group through it; not imported here
    if dist is not None and dist.is_initialized():
        world, rank = dist.get_world_size(), dist.get_global_rank()
    mine = verify(fcfg, rank, world)
    if world > 1:
        gathered = dist.all_gather_object(mine)
        mine = [d for part in gathered for d in part]
    if mine:
        refusal.take_back()  # a plain run leaves nothing: its run folder's files, its claim (train/task/refusal.py)
        raise DamagedShard(problems=[
            Problem(key, f"shard {file} is damaged: {why} (streaming would read wrong tokens, or fail mid-run)",
                    "copy the data again (or make it again with data_prep), or point variables.data_local at an "
                    "intact copy")
            for key, file, why in sorted(mine)])
    if _split_folders(fcfg):
        log.info("shards checked against index.json in %.1f s", time.perf_counter() - start)
