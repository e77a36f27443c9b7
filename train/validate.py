"""Checks a composed config before anything starts or is submitted. Light: no torch, no llm-foundry.

Each rule raises ConfigError naming the key, what is wrong and the fix, so that a mistake costs seconds on
the login node instead of a day in the queue. The first failing rule wins: one message, exit code 2.

Which world size a rule sees (`world_size`): a plain `python -m train` trains in this one process (or in the
WORLD_SIZE processes a distributed launcher already started); `-m` and `plan` mean the job that would be
submitted: cluster.nodes x cluster.tasks_per_node ranks.

Rules about this node's files (NODE_RULES: storage mounts, container image, load_path, tokenizer folder, data
folder) and the memory estimate (FIT_RULES) only fail a run or a submission that would actually start. Under
`plan` they become warnings in the plan instead: a plan is often made from a laptop, for a cluster whose
mounts it does not have, and is asked precisely whether a model fits.
"""
import difflib
import json
import os
import re
from pathlib import Path

from omegaconf import DictConfig, OmegaConf
from omegaconf.errors import InterpolationResolutionError, MissingMandatoryValue

from train import estimate

# Ours; removed before llm-foundry sees the config (train/foundry.py).
PRODUCT_KEYS = frozenset({"cluster", "storage", "data", "checkpoint", "plan"})
# llm-foundry 0.22's TrainConfig fields (tests/test_config.py checks this list against the library).
FOUNDRY_KEYS = frozenset("""
model tokenizer optimizer scheduler train_loader device_train_batch_size device_eval_batch_size max_duration
max_seq_len seed precision code_paths max_split_size_mb expandable_segments cuda_load_lazy dist_timeout
fsdp_config tp_config accumulate_train_batch_on_tokens eval_interval eval_loader eval_loaders icl_tasks
icl_tasks_str eval_gauntlet eval_gauntlet_str icl_subset_num_batches icl_seq_len loggers progress_bar
log_to_console python_log_level console_log_interval log_config callbacks algorithms save_folder
save_latest_filename save_overwrite save_weights_only save_filename save_interval save_num_checkpoints_to_keep
load_path load_weights_only load_strict_model_weights load_ignore_keys save_ignore_keys only_hf_checkpoint
only_composer_checkpoint train_subset_num_batches device_train_microbatch_size global_train_batch_size
spin_dataloaders eval_subset_num_batches eval_first compile_config metadata flatten_metadata run_name
autoresume profiler variables n_gpus device_train_grad_accum
""".split())

_DURATION = re.compile(r"^\d+(ba|ep|tok|sp|dur)$")
_TIME_UNITS = "ba (batches), ep (epochs), tok (tokens) or sp (samples), e.g. 1000ba"
PRECISIONS = ("fp32", "amp_bf16", "amp_fp16", "amp_fp8")
STATE_DICT_TYPES = ("full", "sharded")
# Token ids of tokenizers named by hub name, so the vocabulary rule needs no download (len(tokenizer)).
KNOWN_TOKENIZERS = {"EleutherAI/gpt-neox-20b": 50277, "gpt2": 50257, "openai-community/gpt2": 50257}
MOCK_TOKENIZER_IDS = 257  # train/mock_data.py: 256 byte ids and EOS
_URI = re.compile(r"^[a-zA-Z][a-zA-Z0-9+.-]*://")


class ConfigError(ValueError):
    def __init__(self, key: str, problem: str, fix: str):
        self.key, self.problem, self.fix = key, problem, fix
        super().__init__(f"error: {key}: {problem}\n  fix: {fix}")


def close_match(word: str, options) -> str:
    found = difflib.get_close_matches(word, sorted(options), n=1)
    return f"did you mean `{found[0]}`?" if found else ""


def value(cfg: DictConfig, key: str, default=None):
    """The resolved value at a dotted key, turning OmegaConf's errors into ours."""
    try:
        return OmegaConf.select(cfg, key, default=default, throw_on_missing=True)
    except MissingMandatoryValue:
        raise ConfigError(key, "has no value", f"pass it on the command line: {key}=<value>") from None
    except InterpolationResolutionError as err:
        raise ConfigError(key, f"cannot be resolved ({err.__cause__ or err})".splitlines()[0],
                          "set the keys it refers to, or give it a value directly") from None


def _is_int(v) -> bool:
    return isinstance(v, int) and not isinstance(v, bool)


def _positive_int(cfg, key, example=8):
    v = value(cfg, key)
    if not _is_int(v) or v <= 0:
        raise ConfigError(key, f"must be a positive whole number, got {v!r}", f"e.g. {key}={example}")
    return v


def _duration(cfg, key):
    v = value(cfg, key)
    if _is_int(v) and v > 0:
        raise ConfigError(key, f"{v} has no unit (composer would read a bare number as epochs)",
                          f"add one: {key}={v}ba for batches, or {_TIME_UNITS}")
    if not isinstance(v, str) or not _DURATION.match(v):
        raise ConfigError(key, f"{v!r} is not a duration with a unit", f"use {_TIME_UNITS}: {key}=1000ba")
    return v


def _batches(duration) -> int | None:
    return int(duration[:-2]) if isinstance(duration, str) and duration.endswith("ba") else None


# ---------------------------------------------------------------------------------------------------- mode


def planning(cfg) -> bool:
    return bool(OmegaConf.select(cfg, "plan", default=None))


def _hydra_multirun() -> bool:
    try:
        from hydra.core.hydra_config import HydraConfig
        from hydra.types import RunMode

        return HydraConfig.initialized() and HydraConfig.get().mode == RunMode.MULTIRUN
    except Exception:
        return False


def world_size(cfg, multirun: bool | None = None) -> int:
    """Ranks the run will have: nodes x tasks_per_node for a `-m` job or a plan; 1 (or the WORLD_SIZE a
    distributed launcher set) for a plain run, which trains in this process."""
    if multirun is None:
        multirun = _hydra_multirun()
    if multirun or planning(cfg):
        return value(cfg, "cluster.nodes") * value(cfg, "cluster.tasks_per_node")
    return int(os.environ.get("WORLD_SIZE", "1") or 1)


def _world_words(cfg, multirun) -> str:
    ws = world_size(cfg, multirun)
    if multirun or planning(cfg) or multirun is None and _hydra_multirun():
        return f"world size {ws} (cluster.nodes={cfg.cluster.nodes} x cluster.tasks_per_node=" \
               f"{cfg.cluster.tasks_per_node})"
    return f"world size {ws} (a plain run trains in this process; `-m` runs cluster.nodes x tasks_per_node ranks)"


# --------------------------------------------------------------------------------------------------- rules


def check_plan(cfg, multirun=None):
    v = value(cfg, "plan")
    if v not in (None, False, True, "json"):
        raise ConfigError("plan", f"{v!r} is not a plan form", "plan=true for the report, plan=json for JSON, or "
                          "leave it out to run")


def check_keys(cfg, multirun=None):
    for key in cfg:
        if key not in FOUNDRY_KEYS | PRODUCT_KEYS:
            hint = close_match(key, FOUNDRY_KEYS | PRODUCT_KEYS)
            raise ConfigError(key, "is not a key llm-foundry or this tool knows",
                              hint or "remove it, or put your own values under `variables.`")


def check_numbers(cfg, multirun=None):
    _positive_int(cfg, "cluster.nodes", 1)
    _positive_int(cfg, "cluster.tasks_per_node", 8)
    for key in ("max_seq_len", "global_train_batch_size", "model.d_model", "model.n_heads", "model.n_layers",
                "model.vocab_size", "device_eval_batch_size"):
        _positive_int(cfg, key)
    mb = value(cfg, "device_train_microbatch_size")
    if mb != "auto":
        _positive_int(cfg, "device_train_microbatch_size")
    for key in ("max_duration", "eval_interval", "save_interval"):
        _duration(cfg, key)
    lr = value(cfg, "optimizer.lr")
    if not isinstance(lr, (int, float)) or isinstance(lr, bool) or lr <= 0:
        raise ConfigError("optimizer.lr", f"must be a positive number, got {lr!r}", "e.g. optimizer.lr=6.0e-4")
    if value(cfg, "model.d_model") % value(cfg, "model.n_heads"):
        raise ConfigError("model.n_heads", f"{cfg.model.n_heads} does not divide model.d_model={cfg.model.d_model}",
                          "pick a head count that divides d_model (head size 128 suits flash attention)")


def check_schedule(cfg, multirun=None):
    warmup = _batches(value(cfg, "scheduler.t_warmup"))
    total = _batches(value(cfg, "max_duration"))
    if warmup is not None and total is not None and warmup > total:
        raise ConfigError("scheduler.t_warmup", f"{warmup}ba of warmup is longer than max_duration={total}ba "
                          "(composer refuses the schedule)",
                          f"shorten it, e.g. scheduler.t_warmup={max(1, total // 10)}ba, or train longer")


def check_seq_len(cfg, multirun=None):
    model_len = value(cfg, "model.max_seq_len")
    if not _is_int(model_len) or model_len <= 0:
        raise ConfigError("model.max_seq_len", f"must be a positive whole number, got {model_len!r}",
                          "leave it to follow max_seq_len")
    for key in ("max_seq_len", "train_loader.dataset.max_seq_len", "eval_loader.dataset.max_seq_len"):
        seq = value(cfg, key)
        if _is_int(seq) and seq > model_len:
            raise ConfigError(key, f"{seq} is above the model's model.max_seq_len={model_len}",
                              f"use {key}={model_len} or less, or raise model.max_seq_len (it follows "
                              "max_seq_len unless set)")


def check_device(cfg, multirun=None):
    gpus = value(cfg, "cluster.gpus_per_node") or 0
    name = value(cfg, "cluster.name")
    if not gpus:
        precision = value(cfg, "precision")
        if precision != "fp32":
            raise ConfigError("precision", f"{precision} needs a GPU and cluster={name} has none "
                              "(cluster.gpus_per_node=0)", "precision=fp32 (cluster.precision=fp32) on CPU, or a "
                              "GPU cluster")
        if value(cfg, "model.attn_config.attn_impl") == "flash":
            raise ConfigError("model.attn_config.attn_impl", f"flash attention needs a GPU and cluster={name} has "
                              "none", "model.attn_config.attn_impl=torch (cluster.attn_impl=torch) on CPU")
        if value(cfg, "model.loss_fn") == "fused_crossentropy":
            raise ConfigError("model.loss_fn", f"fused_crossentropy needs flash-attn on a GPU; cluster={name} has "
                              "none", "model.loss_fn=torch_crossentropy (cluster.loss_fn=torch_crossentropy)")
    else:
        tasks = value(cfg, "cluster.tasks_per_node")
        if tasks > gpus:
            raise ConfigError("cluster.tasks_per_node", f"{tasks} tasks on {gpus} GPUs per node: ranks would "
                              "share a GPU", f"cluster.tasks_per_node={gpus} (one task per GPU)")
    precision = value(cfg, "precision")
    if precision not in PRECISIONS:
        raise ConfigError("precision", f"{precision!r} is not a composer precision",
                          close_match(str(precision), PRECISIONS) or f"one of {', '.join(PRECISIONS)}")


def check_fsdp(cfg, multirun=None):
    fsdp = value(cfg, "fsdp_config")
    kind = value(cfg, "checkpoint.state_dict_type")
    if not fsdp:
        if kind == "sharded" or value(cfg, "fsdp_config.state_dict_type") == "sharded":
            raise ConfigError("checkpoint", "checkpoint=sharded writes FSDP shards, but FSDP is off (fsdp_config "
                              "is null)", "use checkpoint=full, or keep fsdp_config (e.g. "
                              "fsdp_config.sharding_strategy=FULL_SHARD)")
        return
    strategy = value(cfg, "fsdp_config.sharding_strategy")
    if strategy is not None and strategy not in estimate.SHARDING_STRATEGIES:
        raise ConfigError("fsdp_config.sharding_strategy", f"{strategy!r} is not an FSDP sharding strategy",
                          close_match(str(strategy), estimate.SHARDING_STRATEGIES)
                          or f"one of {', '.join(estimate.SHARDING_STRATEGIES)}")
    sd = value(cfg, "fsdp_config.state_dict_type")
    if sd is not None and sd not in STATE_DICT_TYPES:
        raise ConfigError("fsdp_config.state_dict_type", f"{sd!r} is not a state dict type",
                          "checkpoint=sharded or checkpoint=full")


def check_checkpoint(cfg, multirun=None):
    if value(cfg, "autoresume") and not value(cfg, "save_folder"):
        raise ConfigError("autoresume", "autoresume needs a save_folder to find its checkpoints in, and there is "
                          "none", "pick a checkpoint group with a folder (checkpoint=sharded), or autoresume=false")
    keep = value(cfg, "save_num_checkpoints_to_keep")
    if keep is not None and (not _is_int(keep) or keep < -1):
        raise ConfigError("save_num_checkpoints_to_keep", f"{keep!r} is not -1 (keep all) or a count",
                          "e.g. save_num_checkpoints_to_keep=10")


def check_no_overwrite(cfg, multirun=None):
    """A run that does not resume must not start over the checkpoints of an earlier run: composer refuses a
    folder of full checkpoints only once it is running, and rewrites sharded ones without a word."""
    folder = value(cfg, "save_folder")
    if (not folder or "://" in str(folder) or value(cfg, "autoresume") or value(cfg, "save_overwrite")
            or value(cfg, "save_filename")):
        return
    from train.resume import find

    found = find(folder)
    if found:
        names = ", ".join(c.path.name for c in found[-3:])
        raise ConfigError("autoresume", f"false, but save_folder {folder} already holds {len(found)} checkpoint(s) "
                          f"(… {names}): this run would start from batch 0 and overwrite them",
                          f"autoresume=true continues that run; another run_name (or save_folder) starts afresh "
                          f"beside it; save_overwrite=true replaces them")


def check_storage(cfg, multirun=None):
    tiers = value(cfg, "storage.tiers")
    if tiers:
        tier = value(cfg, "storage.tier")
        if tier not in tiers:
            raise ConfigError("storage.tier", f"{tier!r} is not a tier of storage={_storage_name(cfg)}",
                              f"one of {', '.join(tiers)} (or give storage.write_GBps directly)")
    for key in ("storage.write_GBps", "storage.file_GBps"):
        bw = value(cfg, key)
        if bw is not None and (isinstance(bw, bool) or not isinstance(bw, (int, float)) or bw <= 0):
            raise ConfigError(key, f"must be a positive bandwidth in GB/s, got {bw!r}", f"e.g. {key}=19.2")
    remote = value(cfg, "variables.data_remote")
    remote_root = value(cfg, "storage.data_remote_root")
    if remote_root and not value(cfg, "storage.data_local_root"):
        raise ConfigError("storage.data_local_root", f"storage={_storage_name(cfg)} streams data from "
                          f"{remote_root} and needs a node-local cache, but storage.data_local_root is null",
                          "storage.data_local_root=/tmp/local-storage/${run_name} (node-local NVMe)")
    if remote:
        local = value(cfg, "variables.data_local")
        if not local or str(local).startswith("None/"):
            raise ConfigError("variables.data_local", f"data is streamed from {remote} but there is no local "
                              "cache to stream it into", "variables.data_local=/tmp/local-storage/<run> "
                              "(node-local NVMe)")
        shared = [str(m).split(":")[0].rstrip("/") for m in value(cfg, "storage.mounts") or []]
        if remote_root:  # a streaming preset (blob): its root is the shared storage
            shared.append(str(value(cfg, "storage.root")))
        if _same_or_under(local, remote) or any(_same_or_under(local, m) for m in shared if m):
            raise ConfigError("variables.data_local", f"the cache {local} is on the shared storage it streams "
                              f"from ({remote}), not on the node", "variables.data_local=/tmp/local-storage/<run> "
                              "(node-local NVMe)")


def _storage_name(cfg) -> str:
    try:
        from hydra.core.hydra_config import HydraConfig

        return HydraConfig.get().runtime.choices.get("storage", "?")
    except Exception:
        return str(value(cfg, "storage.root"))


def _same_or_under(path, root) -> bool:
    path, root = str(path).rstrip("/"), str(root).rstrip("/")
    return bool(root) and (path == root or path.startswith(root + "/"))


# Environment variable names that hold credentials: never written into a script, a config copy or a plan.
_CREDENTIAL = re.compile(r"(_KEY|_TOKEN|_SECRET|PASSWORD|PASSWD|_CREDENTIALS?)$|^AZURE_STORAGE_|SECRET|PASSWORD",
                         re.IGNORECASE)
_ENV_NAME = re.compile(r"^[A-Za-z_][A-Za-z0-9_]*$")
_CONTROL = re.compile(r"[\x00-\x1f\x7f]")


def check_credentials(cfg, multirun=None):
    """A credential in cluster.env would be written into the sbatch script, `.hydra/` and the plan."""
    for name in value(cfg, "cluster.env") or {}:
        if _CREDENTIAL.search(str(name)):
            raise ConfigError(f"cluster.env.{name}", "looks like a credential: it would be written in plain text "
                              "into the sbatch script, the run's .hydra/ config and the plan",
                              f"remove it here and `export {name}=...` in the shell you submit from: Slurm passes "
                              f"that environment to every task (--export=ALL), and local runs inherit it")


def check_shell_safety(cfg, multirun=None):
    """Values that land in the sbatch script stay data: sbatch reads `#SBATCH` lines up to a newline (the rest
    would run as a command, and sbatch would silently ignore every directive after it); the run name is a path
    component of the checkpoint and output folders and the job name."""
    name = value(cfg, "run_name")
    if not isinstance(name, str) or not name or "/" in name or "\\" in name or name in (".", "..") \
            or ".." in name.split(".") or _CONTROL.search(name):
        raise ConfigError("run_name", f"{name!r} is not a plain folder name (it names the checkpoint and output "
                          "folders: no path separators, `..` or control characters)",
                          "e.g. run_name=mpt-30b-c4-v2")
    for key in ("cluster.account", "cluster.partition", "cluster.qos", "cluster.constraint",
                "cluster.container.image"):
        v = value(cfg, key)
        if isinstance(v, str) and _CONTROL.search(v):
            raise ConfigError(key, f"{v!r} holds a control character (a newline would end its #SBATCH line and "
                              "run the rest as a shell command)", "remove it")
    for k, v in (value(cfg, "cluster.sbatch_extra") or {}).items():
        if _CONTROL.search(f"{k}{v}") or not re.match(r"^[A-Za-z0-9_-]+$", str(k)):
            raise ConfigError(f"cluster.sbatch_extra.{k}", f"{k}={v!r} is not a plain sbatch flag and value (a "
                              "newline would end the #SBATCH line and run the rest as a command)",
                              "a flag name of letters, digits and dashes, and a value on one line")
    for key in ("cluster.srun_extra", "cluster.container.mounts", "storage.mounts"):
        for v in value(cfg, key) or []:
            if _CONTROL.search(str(v)):
                raise ConfigError(key, f"{v!r} holds a control character", "remove it")
    for k, v in (value(cfg, "cluster.env") or {}).items():
        if not _ENV_NAME.match(str(k)):
            raise ConfigError(f"cluster.env.{k}", "is not an environment variable name",
                              "letters, digits and underscores, not starting with a digit")
        if _CONTROL.search(str(v)):
            raise ConfigError(f"cluster.env.{k}", f"{v!r} holds a control character", "put the value on one line")


def check_cluster_figures(cfg, multirun=None):
    mfu = value(cfg, "cluster.mfu")
    if mfu is not None and (isinstance(mfu, bool) or not isinstance(mfu, (int, float)) or not 0 < mfu <= 1):
        raise ConfigError("cluster.mfu", f"must be a fraction in (0, 1], got {mfu!r}", "e.g. cluster.mfu=0.42")
    peak = value(cfg, "cluster.peak_flops")
    if peak is not None and (isinstance(peak, bool) or not isinstance(peak, (int, float)) or peak <= 0):
        raise ConfigError("cluster.peak_flops", f"must be a positive FLOP/s figure, got {peak!r}",
                          "e.g. cluster.peak_flops=989e12 (H100 dense bf16)")


def check_batch(cfg, multirun=None):
    gbs = value(cfg, "global_train_batch_size")
    mb = value(cfg, "device_train_microbatch_size")
    ws = world_size(cfg, multirun)
    step = ws * (mb if _is_int(mb) else 1)
    if gbs % step == 0:
        return
    what = f"{_world_words(cfg, multirun)}" + (f" x device_train_microbatch_size={mb}" if _is_int(mb) else "")
    lower, upper = gbs // step * step, (gbs // step + 1) * step
    tasks = value(cfg, "cluster.tasks_per_node")
    nodes_ok = [n for n in range(1, 257) if gbs % (n * tasks * (mb if _is_int(mb) else 1)) == 0]
    alternatives = f"global_train_batch_size={upper}" + (f" or {lower}" if lower else "")
    if nodes_ok:
        alternatives += f", or cluster.nodes in {nodes_ok[:8]} (with -m)"
    raise ConfigError("global_train_batch_size", f"{gbs} is not divisible by {what} = {step}",
                      f"{alternatives}, or another device_train_microbatch_size")


# ------------------------------------------------------------------------------------- this node's files


def check_mounts(cfg, multirun=None):
    paths = [("storage.mounts", str(m).split(":")[0]) for m in value(cfg, "storage.mounts") or []]
    paths += [("cluster.container.mounts", str(m).split(":")[0])
              for m in value(cfg, "cluster.container.mounts") or []]
    for key, path in paths:
        if not os.path.isdir(path):
            raise ConfigError(key, f"{path} is not mounted on this node ({os.uname().nodename})",
                              f"mount it (e.g. the {_storage_name(cfg)} file system) on every node, or run with a "
                              "storage preset this node has (storage=local)")


def check_container(cfg, multirun=None):
    image = value(cfg, "cluster.container.image")
    if not image:
        return
    image = str(image)
    is_file = image.endswith(".sqsh") or image.startswith(("/", ".", "~"))
    if is_file and not _URI.match(image) and not os.path.isfile(os.path.expanduser(image)):
        raise ConfigError("cluster.container.image", f"{image} does not exist",
                          "import it first (enroot import -o /shared/images/x.sqsh docker://...), point at an "
                          "existing .sqsh, or give a registry image (nvcr.io#nvidia/pytorch:24.05-py3)")


def check_load_path(cfg, multirun=None):
    path = value(cfg, "load_path")
    if not path or _URI.match(str(path)):
        return
    if not os.path.exists(os.path.expanduser(str(path))):
        raise ConfigError("load_path", f"{path} does not exist",
                          "point it at a checkpoint file (full) or an ep{E}-ba{B} directory (sharded), or drop "
                          "it (load_path=null) and let autoresume find the latest")


def _looks_like_path(name: str) -> bool:
    return name.startswith(("/", ".", "~")) or os.path.exists(name)


def check_tokenizer(cfg, multirun=None):
    if value(cfg, "data.kind") == "mock":
        return  # written beside the mock data when the run starts
    name = str(value(cfg, "tokenizer.name"))
    if _looks_like_path(name):
        folder = Path(name).expanduser()
        if not (folder / "tokenizer.json").is_file() and not (folder / "tokenizer_config.json").is_file():
            raise ConfigError("tokenizer.name", f"{folder} is not a tokenizer folder (no tokenizer.json)",
                              "point it at a folder saved by save_pretrained, or use a hub name such as "
                              "EleutherAI/gpt-neox-20b")


def check_data(cfg, multirun=None):
    kind = value(cfg, "data.kind")
    local = value(cfg, "variables.data_local")
    if kind == "mock":
        return
    if value(cfg, "variables.data_remote"):
        return  # streamed into data_local when the run starts
    for split_key in ("train_loader.dataset.split", "eval_loader.dataset.split"):
        split = value(cfg, split_key)
        index = Path(local) / split / "index.json"
        if not index.is_file():
            where = "does not exist" if not Path(local).exists() else f"has no {split}/index.json"
            raise ConfigError("variables.data_local", f"{local} {where}",
                              f"make it with `python -m data_prep out_root={local} split={split} ...`, or point "
                              "variables.data_local at an MDS folder (or set variables.data_remote to stream one)")


# ------------------------------------------------------------------------------------------- vocabulary


def tokenizer_size(cfg) -> tuple[int | None, str]:
    """(ids the tokenizer produces, where that figure comes from); None when it cannot be known here."""
    if value(cfg, "data.kind") == "mock":
        return MOCK_TOKENIZER_IDS, "the mock byte tokenizer"
    name = str(value(cfg, "tokenizer.name"))
    if name in KNOWN_TOKENIZERS:
        return KNOWN_TOKENIZERS[name], name
    path = Path(name).expanduser() / "tokenizer.json"
    if not path.is_file():
        hub = os.environ.get("HF_HUB_CACHE") or os.path.join(
            os.environ.get("HF_HOME", os.path.expanduser("~/.cache/huggingface")), "hub")
        cached = sorted(Path(hub).glob(f"models--{name.replace('/', '--')}/snapshots/*/tokenizer.json"))
        if not cached:
            return None, name
        path = cached[-1]
    try:
        data = json.loads(path.read_text())
        vocab = data["model"]["vocab"]  # {token: id} (BPE, WordPiece) or [[token, score], ...] (Unigram)
        top = max(vocab.values()) if isinstance(vocab, dict) else len(vocab) - 1
        for added in data.get("added_tokens") or []:
            top = max(top, added["id"])
        return top + 1, str(path.parent)
    except (OSError, ValueError, KeyError, TypeError):
        return None, name


def check_vocab(cfg, multirun=None):
    size, source = tokenizer_size(cfg)
    vocab = value(cfg, "model.vocab_size")
    if size is not None and size > vocab:
        padded = -(-size // 64) * 64
        raise ConfigError("model.vocab_size", f"{vocab} is smaller than the tokenizer's {size} ids ({source}): "
                          "token ids past it would index outside the embedding",
                          f"model.vocab_size={padded} (the tokenizer's size rounded up to a multiple of 64)")


# ----------------------------------------------------------------------------------------------- memory


def memory_figures(cfg, world: int) -> dict | None:
    """The plan's memory estimate at this world size; None without a known GPU memory (CPU clusters)."""
    gpus = value(cfg, "cluster.gpus_per_node") or 0
    gpu_gb = value(cfg, "cluster.gpu_memory_gb")
    if not gpus or not gpu_gb:
        return None
    model = OmegaConf.to_container(value(cfg, "model"), resolve=True)
    fsdp = value(cfg, "fsdp_config")
    fsdp = OmegaConf.to_container(fsdp, resolve=True) if fsdp else None
    # llm-foundry drops FSDP with world size 1
    fsdp_used = fsdp if world > 1 else None
    common = dict(microbatch=value(cfg, "device_train_microbatch_size"), precision=value(cfg, "precision"))
    tasks = value(cfg, "cluster.tasks_per_node")
    mem = estimate.memory_per_gpu(model, world_size=world, tasks_per_node=tasks, fsdp=fsdp_used,
                                  checkpointing=bool(fsdp_used and fsdp_used.get("activation_checkpointing")),
                                  **common)
    gpu_bytes = int(gpu_gb * estimate.GiB)
    smallest = estimate.min_nodes(model, tasks_per_node=tasks, gpu_memory_bytes=gpu_bytes, fsdp=fsdp, **common)
    return {
        "memory": mem,
        "gpu_memory_bytes": gpu_bytes,
        "usable_bytes": estimate.usable_bytes(gpu_bytes),
        "fits": mem["total"] <= estimate.usable_bytes(gpu_bytes),
        "min_nodes": smallest,
        "min_nodes_batch": _divides_from(cfg, smallest),
    }


def _divides_from(cfg, nodes):
    """The smallest node count >= nodes at which the global batch splits evenly into microbatches."""
    if nodes is None:
        return None
    gbs, mb = value(cfg, "global_train_batch_size"), value(cfg, "device_train_microbatch_size")
    step = value(cfg, "cluster.tasks_per_node") * (mb if _is_int(mb) else 1)
    for n in range(nodes, nodes * 64 + 1):
        if gbs % (n * step) == 0:
            return n
    return None


def _gib(n) -> str:
    return f"{n / estimate.GiB:.1f}"


def check_memory(cfg, multirun=None):
    world = world_size(cfg, multirun)
    fig = memory_figures(cfg, world)
    if fig is None or fig["fits"]:
        return
    m = fig["memory"]
    parts = " + ".join(f"{k} {_gib(m[k])}" for k in ("params", "grads", "optimizer", "gathered", "activations",
                                                       "runtime"))
    gpu = value(cfg, "cluster.gpu")
    problem = (f"the model does not fit: ~{_gib(m['total'])} GiB per GPU at {_world_words(cfg, multirun)}, "
               f"of {_gib(fig['gpu_memory_bytes'])} GiB per {gpu} ({_gib(fig['usable_bytes'])} usable, "
               f"{int(estimate.HEADROOM * 100)}% kept free); GiB: {parts}")
    if fig["min_nodes"] is not None:
        tip = "" if multirun or planning(cfg) else " and submit with -m"
        n, nb = fig["min_nodes"], fig["min_nodes_batch"]
        why = ("the smallest node count that fits" if n == nb or nb is None else
               f"{n} nodes fit, {nb} also divide global_train_batch_size={value(cfg, 'global_train_batch_size')}")
        raise ConfigError("cluster.nodes", problem, f"cluster.nodes={nb or n}{tip} ({why}), or a smaller "
                          "device_train_microbatch_size"
                          + ("" if m["activation_checkpointing"] else
                             ", or fsdp_config.activation_checkpointing=true"))
    raise ConfigError("device_train_microbatch_size", problem + "; no node count fits at this microbatch",
                      "lower device_train_microbatch_size"
                      + ("" if m["activation_checkpointing"] else ", turn on fsdp_config.activation_checkpointing=true")
                      + ", or use GPUs with more memory")


# ------------------------------------------------------------------------------------------------ driver

NODE_RULES = [check_mounts, check_container, check_load_path, check_no_overwrite, check_tokenizer, check_data]
FIT_RULES = [check_memory]
RULES = [check_plan, check_keys, check_credentials, check_shell_safety, check_numbers, check_schedule, check_seq_len, check_device, check_fsdp,
         check_checkpoint, check_storage, check_cluster_figures, check_vocab, check_batch,
         *NODE_RULES, *FIT_RULES]


def validate(cfg: DictConfig, multirun: bool | None = None) -> None:
    """Raise the first ConfigError. `multirun`: whether this is a `-m` job (None: ask Hydra). Under `plan`,
    the rules about this node's files and the memory fit are left to `plan_warnings`."""
    soft = set(NODE_RULES + FIT_RULES) if planning(cfg) else set()
    for rule in RULES:
        if rule not in soft:
            rule(cfg, multirun)


def plan_warnings(cfg: DictConfig, multirun: bool | None = None) -> list:
    """What would stop this config from starting, that a plan reports instead of failing on."""
    found = []
    for rule in NODE_RULES + FIT_RULES:
        try:
            rule(cfg, multirun)
        except ConfigError as err:
            found.append(err)
    return found


def resolve_all(cfg: DictConfig) -> None:
    """Resolve every interpolation in place, naming the key whose interpolation fails."""
    try:
        OmegaConf.resolve(cfg)
    except InterpolationResolutionError as err:
        key = getattr(err, "full_key", None) or "config"
        raise ConfigError(key, f"cannot be resolved ({err.__cause__ or err})".splitlines()[0],
                          "set the keys it refers to, or give it a value directly") from None


def check_sweep(cfgs: list) -> None:
    """Every point of a sweep, before the first is submitted: each valid, and no two sharing a save_folder
    (they would resume from, and overwrite, each other's checkpoints). A sweep that fails here leaves no sweep
    folder behind (Hydra writes its multirun.yaml before the launcher runs)."""
    try:
        _check_points(cfgs)
    except ConfigError:
        discard_sweep_dir(cfgs)
        raise


def _check_points(cfgs: list) -> None:
    folders = {}
    for num, cfg in enumerate(cfgs):
        try:
            validate(cfg, multirun=True)
        except ConfigError as err:
            raise ConfigError(f"[sweep point #{num}] {err.key}", err.problem, err.fix) from None
        folder = cfg.get("save_folder")
        if folder and folder in folders:
            raise ConfigError("save_folder", f"sweep points #{folders[folder]} and #{num} both write to {folder}",
                              "leave save_folder to the checkpoint group (one folder per run_name), or make it "
                              "differ per point, e.g. save_folder=/data/ckpt/${run_name}")
        folders[folder] = num


def discard_fresh_dir(folder, kept_names, root) -> None:
    """Remove `folder` if it holds nothing but `kept_names` (what Hydra wrote before our checks ran), then its
    parents while empty, up to `root` (kept, unless it is a folder below the current directory, like ./runs)."""
    import shutil

    try:
        folder, root = Path(folder).resolve(), Path(str(root)).resolve()
        if root not in folder.parents or not folder.is_dir():
            return
        for p in folder.iterdir():
            if p.name not in kept_names or (p.is_file() and p.suffix == ".log" and p.stat().st_size):
                return
        shutil.rmtree(folder)
        top = root.parent if Path.cwd().resolve() in root.parents else root
        parent = folder.parent
        while parent != top and top in parent.parents and not any(parent.iterdir()):
            parent.rmdir()
            parent = parent.parent
    except OSError:
        pass


def discard_sweep_dir(cfgs: list) -> None:
    try:
        from hydra.core.hydra_config import HydraConfig

        sweep_dir = HydraConfig.get().sweep.dir
    except Exception:
        return
    if cfgs:
        discard_fresh_dir(sweep_dir, {"multirun.yaml"}, value(cfgs[0], "storage.root"))
