"""What a run *is*: the settings that decide what is trained. Its name, and so its checkpoint and output folders,
derive from them alone, so the same training under another cluster, image, environment variable, node count or
spelling of a number is the same run, and running the same command again resumes it.

The rule, in one place (docs/resume.md "Runs, resume, outputs" shows it as a table): every key of the resolved config
counts, except those in HOW below: where and how it runs (our cluster, storage, checkpoint, export and logger
groups, the microbatch, the evaluation, FSDP's sharding), how it is reported (loggers, monitoring callbacks,
console settings) and its own name and folders. Values are compared resolved and typed, so `3e-3`, `0.003` and
`0.0030` are one number, `[0.9,0.95]` and `[0.9, 0.95]` one list, and a preset's default spelled out on the
command line is the default. `max_duration` counts: it shapes the learning-rate schedule of every step, so a
longer run is another training; continue a run past its max_duration with `run_name=<its name>`.

Light: no torch, no llm-foundry.
"""
import hashlib
import json
import logging
import threading
from pathlib import Path

from omegaconf import DictConfig, ListConfig, OmegaConf

from common.paths import is_remote

log = logging.getLogger(__name__)

# What is evaluated, and how: a run's reported numbers, not what it trains (a finished sweep point run again under
# others says its numbers are the earlier run's: train/launch/sweep_app.py).
EVALUATION = ("eval_loader", "eval_loaders", "eval_interval", "eval_first", "eval_subset_num_batches",
              "device_eval_batch_size", "icl_tasks", "icl_tasks_str", "icl_subset_num_batches", "icl_seq_len",
              "eval_gauntlet", "eval_gauntlet_str")
# Top-level keys that never decide what is trained.
HOW_TOP = {
    # ours: where and how it runs (cluster: nodes, tasks, env, container, time limit, partition, preflight, wait,
    # setup lines; storage: roots and mounts; checkpoint: format and folder), what is exported, the plan
    "cluster", "storage", "checkpoint", "export", "plan", "hydra", "objective",
    # what a loss spike does (train/task/spike.py): a recovery policy; the same command with another spike.action
    # resumes the same run (its rollbacks are recorded in its folder)
    "spike",
    # the run's own name and folders, and its checkpoint policy (what is kept, not what is trained)
    "run_name", "save_folder", "save_interval", "save_num_checkpoints_to_keep", "save_overwrite", "save_filename",
    "save_latest_filename", "save_weights_only", "save_ignore_keys", "autoresume",
    # how it is reported and followed
    "loggers", "progress_bar", "log_to_console", "console_log_interval", "python_log_level", "metadata",
    "log_config", "flatten_metadata", "profiler",
    # how each step is computed: the global batch fixes the maths, the microbatch only splits it
    "device_train_microbatch_size", "device_train_batch_size", "dist_timeout",
    "compile_config", "max_split_size_mb", "expandable_segments", "cuda_load_lazy", "code_paths",
    "only_hf_checkpoint", "only_composer_checkpoint",
    # what is evaluated, and how often: the reported numbers, not the trained weights
    *EVALUATION,
    # values of the user's own: their effect counts where they are interpolated
    "variables",
}
# Dotted keys (and everything under them) inside the keys that count, which do not.
HOW_SUB = (
    "model.init_device", "model.attn_config.attn_impl", "model.loss_fn",  # the same maths on another device
    "train_loader.num_workers", "train_loader.prefetch_factor", "train_loader.pin_memory",
    "train_loader.persistent_workers", "train_loader.timeout",
    "train_loader.dataset.download_retry", "train_loader.dataset.download_timeout",
    "train_loader.dataset.validate_hash", "train_loader.dataset.predownload", "train_loader.dataset.cache_limit",
    "train_loader.dataset.keep_zip",
    # FSDP: how the model is sharded and recomputed; its mixed precision (below) changes the numbers
    "fsdp_config.sharding_strategy", "fsdp_config.activation_checkpointing",
    "fsdp_config.activation_checkpointing_reentrant", "fsdp_config.activation_cpu_offload",
    "fsdp_config.limit_all_gathers", "fsdp_config.state_dict_type", "fsdp_config.forward_prefetch",
    "fsdp_config.backward_prefetch", "fsdp_config.cpu_offload", "fsdp_config.sync_module_states",
    "fsdp_config.use_orig_params", "fsdp_config.verbose", "fsdp_config.load_monolith_rank0_only",
    "fsdp_config.data_parallel_shard_degree", "fsdp_config.data_parallel_replicate_degree",
    # monitoring and export callbacks: they watch or copy the run, they do not change it
    *(f"callbacks.{name}" for name in (
        "speed_monitor", "lr_monitor", "runtime_estimator", "memory_monitor", "run_report", "hf_checkpointer", "tracking",
        "optimizer_monitor", "memory_snapshot", "oom_observer", "mono_checkpoint_saver", "scheduled_gc",
        "generate_callback", "log_model_parameters", "system_metrics_monitor", "nan_monitor",
        "activation_monitor",
        # they report, score or time the run (async_eval launches other runs on its checkpoints; run_timeout ends
        # a start, which resumes): composer's load_checkpoint is not here, it loads weights
        "eval_output_logging", "loss_perp_v_len", "env_logging", "fdiff_metrics", "mbmoe_tok_per_expert",
        "async_eval", "run_timeout",
        # it watches the loss; what a spike does is spike.* (above)
        "kill_loss_spike")),
)


def _plain(value):
    """A JSON value that compares equal for equal settings: 1.0 and 1 are one number, containers made plain."""
    if isinstance(value, (DictConfig, ListConfig)):
        value = OmegaConf.to_container(value, resolve=True)
    if isinstance(value, dict):
        return {str(k): _plain(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [_plain(v) for v in value]
    if isinstance(value, float) and value.is_integer() and abs(value) < 2 ** 53:
        return int(value)
    if isinstance(value, str):
        return _time(value)
    return value


def same_time(a, b) -> bool:
    """Two composer times that are one (20ba, 2e1ba, 20.0ba), as a run's identity reads them."""
    return a is not None and b is not None and _plain(str(a)) == _plain(str(b))


def _time(text: str) -> str:
    """A composer time written with a number in another spelling (2e1ba, 20.0ba and 20ba are 20 batches) spelt one
    way, as composer reads it (train/checks/core.py: time_of), so that they are one run, not three; any other
    text, a wall-clock time too (`1h30m`, `10`: kept as written), as it is."""
    from train.checks.core import time_of

    found = time_of(text.strip())
    if found is None or found[1] == "sec":
        return text
    n, unit = found
    return f"{float(n)!r}{unit}" if unit == "dur" else f"{n}{unit}"


def _walk(node: DictConfig, prefix: str, out: dict) -> None:
    """Resolve only what counts: a key left out is never read (the run's folders interpolate the run's name)."""
    for k in node.keys():
        full = f"{prefix}.{k}" if prefix else str(k)
        if (not prefix and k in HOW_TOP) or not _counted(full):
            continue
        try:
            value = node[k]
        except Exception:  # a missing or broken value: the checks name it; here it is just that key's text
            value = "???"
        if isinstance(value, DictConfig) and len(value):
            _walk(value, full, out)
        else:
            out[full] = _plain(value)


def _counted(key: str) -> bool:
    return key not in HOW_SUB and not key.startswith(_HOW_SUB_PREFIXES)


_HOW_SUB_PREFIXES = tuple(h + "." for h in HOW_SUB)


# Where the storage is mounted is where, not what: a path under one of these roots is named by the root's key.
_ROOTS = ("storage.data_local_root", "storage.data_remote_root", "storage.data_root", "storage.checkpoint_root",
          "storage.output_root", "storage.root")


def _relative_to_roots(cfg, flat: dict) -> None:
    roots = []
    for key in _ROOTS:
        try:
            root = OmegaConf.select(cfg, key)
        except Exception:
            continue
        if isinstance(root, str) and root.strip("/"):
            roots.append((_path(root), "<data>" if key.startswith("storage.data_") else f"<{key}>"))
    roots.sort(key=lambda r: len(r[0]), reverse=True)
    for k, v in flat.items():
        if isinstance(v, str):
            for root, label in roots:
                if v == root or v.startswith(root + "/"):
                    flat[k] = label + v[len(root):]
                    break


def identity(cfg) -> dict:
    """{dotted key: value} of every setting that decides what is trained, resolved and normalised; paths under
    the storage's roots relative to them (the same data on another mount is the same data)."""
    flat: dict = {}
    _walk(cfg, "", flat)
    # What is read, wherever it is read from: the remote when there is one (the local folder is then a node-local
    # cache of it), else the local folder.
    dataset = "train_loader.dataset"
    remote, local = flat.pop(f"{dataset}.remote", None), flat.pop(f"{dataset}.local", None)
    flat[f"{dataset}.source"] = remote if remote not in (None, "") else local
    # continue_from counts where it is set (another run's checkpoint to go on from: train/config/continuation.py),
    # spelt one way; left out where it is not, so that every other run keeps its name
    given = flat.pop("continue_from", None)
    if given not in (None, ""):
        from train.config.continuation import spelt

        flat["continue_from"] = spelt(given, OmegaConf.select(cfg, "storage.checkpoint_root", default=None))
    for k, v in flat.items():
        if _is_path_key(k):
            flat[k] = _path(v)
    _relative_to_roots(cfg, flat)
    return spelt_once(flat)


def spelt_once(flat: dict) -> dict:
    """One spelling of each value, also of a record written under an earlier rule (renormalised): local paths,
    composer's times, mixed precision's case; keys the rule does not count left out."""
    out = {}
    for k, v in flat.items():
        if not counts(k):
            continue
        v = _plain(v)
        if _is_path_key(k):
            v = _path(v)
        elif k == "fsdp_config.mixed_precision" and isinstance(v, str):  # composer upper-cases it: pure is PURE
            v = v.upper()
        out[k] = v
    return dict(sorted(out.items()))


def counts(key: str) -> bool:
    return key.split(".")[0] not in HOW_TOP and _counted(key)


def _is_path_key(key: str) -> bool:
    return key in ("tokenizer.name", "load_path") or (
        key.startswith("train_loader.") and key.rpartition(".")[2] in ("local", "remote", "source"))


def _path(value):
    """One spelling of a local path: /data/c4/, /data//c4 and /data/./c4 are one folder (each would otherwise be
    another run from batch 0, unwarned, since the data differs by its text). A URL (s3://...) and a hub name are
    kept."""
    import posixpath

    if not isinstance(value, str) or not value or is_remote(value):
        return value
    normal = posixpath.normpath(value)
    return "/" + normal.lstrip("/") if normal.startswith("//") else normal


def digest(ident: dict) -> str:
    return hashlib.sha1(json.dumps(ident, sort_keys=True, default=str).encode()).hexdigest()[:8]


def name(model: str, cfg) -> str:
    return f"{model}-{digest(identity(cfg))}"


_naming = threading.local()


def label(choices) -> str:
    """What a run's name starts with: the stem of its `yaml=` file, else its model preset."""
    recipe = choices.get("yaml")
    return Path(str(recipe)).stem if recipe else str(choices.get("model"))


def run_id(model: str, recipe=None, _root_=None) -> str:
    """The default run_name (conf/train.yaml): `<model>-<hash of the identity>`, `<yaml stem>-<hash>` with
    yaml=PATH: a function of the resolved config alone (nothing on disk, nothing of Hydra's is read)."""
    model = label({"model": model, "yaml": recipe})
    if getattr(_naming, "busy", False):
        return "<run_name>"  # a value that holds the name (a node-local cache folder) while the name is computed
    _naming.busy = True
    try:
        ident = identity(_root_)
    finally:
        _naming.busy = False
    return f"{model}-{digest(ident)}"


# ---- the identity a run leaves in its checkpoint folder, and the runs found beside a new one ----

RECORD = "identity.json"


def read_record(folder) -> dict:
    from common.files import read_json

    return read_json(Path(folder) / RECORD)


def write_record(folder, run_name: str, model: str | None, ident: dict, **extra) -> None:
    """<save_folder>/identity.json: what this run trains, so that a later command that trains something else
    with the same model and data can name it; `extra`: what the run keeps beside it (train_data: its training
    split's index, which a resume compares, train/task/shards.py)."""
    from common.files import atomic_write

    body = {"run_name": run_name, "model": model, **extra, "identity": ident}
    if read_record(folder) != json.loads(json.dumps(body)):  # a finished run started again changes no file
        atomic_write(Path(folder) / RECORD, json.dumps(body, indent=1).encode())


DATA_KEYS = ("data.kind", "train_loader.dataset.source", "tokenizer.name")


def same_model_and_data(root, run_name: str, model: str, ident: dict) -> list:
    """Runs under the checkpoint root `root` (other than `run_name`) of the same model preset on the same data:
    [(name, {key: (theirs, ours)} of what differs)], most recently written first."""
    root = Path(root)
    if not root.is_dir():
        return []
    found = []
    for rec in root.glob(f"*/{RECORD}"):
        try:
            theirs = json.loads(rec.read_text())
        except (OSError, ValueError):
            continue
        other = spelt_once(theirs.get("identity") or {})  # as this rule spells it: spellings are no difference
        if theirs.get("run_name") == run_name or theirs.get("model") != model:
            continue
        if any(other.get(k) != ident.get(k) for k in DATA_KEYS):
            continue
        # by their JSON, as the name hashes them (shuffle=1 and true: two names, but 1 == True in Python, so a
        # comparison in Python would name no difference)
        differs = {k: (other.get(k), ident.get(k)) for k in sorted(set(other) | set(ident))
                   if json.dumps(other.get(k), sort_keys=True) != json.dumps(ident.get(k), sort_keys=True)}
        found.append((rec.stat().st_mtime, theirs["run_name"], differs))
    return [(n, d) for _, n, d in sorted(found, key=lambda f: f[0], reverse=True)]


def distinct_names(points: list, names: list) -> list:
    """Sweep points that train the same thing and differ only in how they run (a node-count scaling sweep:
    `-m cluster.nodes=1,2,4`) are still a run each: each gets `run_name=<name>-<6 hex of its overrides but those
    that never make another run>`, the same for the same command line and for it with such an override added.
    points: each point's overrides; names: their run names (None where a point's does not resolve: the checks
    name its problem). Returns, for each point, the name it gets instead of its own, or None."""
    groups: dict = {}
    for num, (overrides, name) in enumerate(zip(points, names)):
        # named by the user: theirs wins (two points writing one folder are refused by the checks)
        if name is not None and not any(str(o).lstrip("+~").startswith("run_name=") for o in overrides):
            groups.setdefault(name, []).append(num)
    shared = {num for nums in groups.values() if len(nums) > 1 for num in nums}
    # A point's mark: its own overrides but those that never make another run (an env var, the plan, the time
    # limit: hashed, adding cluster.env.NCCL_DEBUG=INFO would start every point again from step 0), whatever the
    # other points are
    return [f"{names[num]}-{_mark(sorted(o for o in map(str, overrides) if not _neutral(o)))}" if num in shared
            else None for num, overrides in enumerate(points)]


def run_name(cfg) -> str | None:
    """A composed point's run name (its interpolation resolved under the point's Hydra context), or None where it
    does not resolve."""
    try:
        return str(cfg.run_name)
    except Exception:  # noqa: BLE001 -- a point that does not resolve: the checks name its problem
        return None


# Overrides of a sweep point that never make another run, left out of its mark (distinct_names).
_NEUTRAL = ("hydra", "plan", "cluster.timeout_min", "cluster.partition", "cluster.account", "cluster.qos",
            "cluster.dist_timeout", "dist_timeout", "logger", "loggers", "export", "cluster.env", "cluster.wait", "cluster.preflight", "cluster.container", "cluster.setup",
            "cluster.sbatch_extra", "progress_bar", "console_log_interval", "log_to_console", "python_log_level")


def _neutral(override: str) -> bool:
    key = override.lstrip("+~").split("=", 1)[0]
    return key in _NEUTRAL or key.startswith(tuple(n + "." for n in _NEUTRAL))


def _mark(overrides: list) -> str:
    return hashlib.sha1("\n".join(overrides).encode()).hexdigest()[:6]
