"""Rules about this node's files: mounts, the container image, checkpoints, the tokenizer and the data.

They fail a run or a submission that would start here; in a plan they are warnings (a plan is often made from a
laptop, for a cluster whose mounts it does not have)."""
import functools
import os
import socket
from pathlib import Path
from urllib.parse import urlparse

from omegaconf import ListConfig, OmegaConf

from common import image as contract
from common.paths import PROJECT, hub_switched_off_by, is_remote
from data_prep import facts
from train.checks.core import ERROR, WARNING, Problem, split_folder, value
from train.config import vocab
from train.config.loaders import mds_sources
from train.launch.executor import topology_file
from train.plan import estimate

# What AutoTokenizer can build a tokenizer from, beside tokenizer_config.json.
_TOKENIZER_FILES = ("tokenizer.json", "tokenizer.model", "spiece.model", "vocab.json", "vocab.txt")


def mounts(cfg, ctx):
    found = [("storage.mounts", str(m).split(":")[0]) for m in value(cfg, "storage.mounts") or []]
    found += [("cluster.container.mounts", str(m).split(":")[0]) for m in value(cfg, "cluster.container.mounts") or []]
    for key, path in found:
        if not os.path.exists(path):  # a folder or a file: pyxis mounts both
            yield Problem(key, f"{path} does not exist on this node ({os.uname().nodename})",
                          f"mount it (e.g. the {ctx.group('storage')} file system) on every node, or run with a "
                          "storage preset this node has (storage=local)")
        elif key == "storage.mounts" and not os.path.ismount(path):
            # an empty folder where the file system should be (its client failed): writes land on this node's disk
            yield Problem(key, f"{path} is not a mount point on this node ({os.uname().nodename}): nothing is mounted "
                          "there, so data would be missing and checkpoints would land on this node's own disk",
                          f"mount the {ctx.group('storage')} file system at {path} (and on every node: each job "
                          "checks again as it starts), or list the file system's own mount point in storage.mounts, "
                          "or use storage=local")


def container(cfg, ctx):
    image = value(cfg, "cluster.container.image")
    if not image:
        return
    image = str(image)
    topo = value(cfg, "cluster.env.NCCL_TOPO_FILE")
    if ctx.mode != "run" and topo and topology_file(cfg) is None:
        yield Problem("cluster.env.NCCL_TOPO_FILE", f"{topo!r} is not mounted into the container (only one plain "
                      "absolute path is: no `$`, `,` or `:`), so NCCL in the job may not find it",
                      "give the file's absolute path on the nodes, e.g. /opt/microsoft/ndv5-topo.xml", WARNING)
    is_file = (image.endswith(".sqsh") or image.startswith(("/", ".", "~"))) and not is_remote(image)
    if is_file and not os.path.isfile(os.path.expanduser(image)):
        yield Problem("cluster.container.image", f"{image} does not exist (pyxis would fail every task)",
                      "import it first (enroot import -o /shared/images/x.sqsh docker://...), point at an existing "
                      ".sqsh, or give a registry image: 'cluster.container.image=\"nvcr.io#nvidia/pytorch:24.05-py3\"'")
    elif ctx.mode != "run":  # a plain run trains in this process: the image is for jobs
        yield from _image_contract(cfg, image, is_file)


# How to build an image that keeps the contract (common/image.py), as docs/cluster-run.md's "The image" does.
_BUILD = (f"build and import it from this checkout: {contract.STEPS}; write its marker beside it: "
          f"{contract.SIDECAR}; then cluster.container.image=/data/images/pretrain.sqsh (docs/cluster-run.md: The image)")


def _image_contract(cfg, name: str, is_file: bool):
    """Whether the image is one of ours: its marker (common/image.py) against this checkout's pins. What surely
    fails a job's first seconds is an error (a plan warns); what cannot be known here is a warning: each task
    checks its image again as it starts."""
    key = "cluster.container.image"
    unknown = ("each task checks its Python, the pinned packages and this checkout as it starts, and stops "
               "saying what is missing")
    if not is_file:
        yield Problem(key, f"{name} is a registry image: this node cannot tell whether it holds what jobs need "
                      f"(Python, requirements.lock's packages); {unknown}", _BUILD, WARNING)
        return
    path = os.path.expanduser(name)
    found, where = _marker(path, os.stat(path).st_mtime, _mtime(path + ".json"))
    if found is None:
        yield Problem(key, f"cannot confirm {name} is built from this project's Dockerfile ({where}); {unknown}",
                      _BUILD, WARNING)
    elif found.get("project") != contract.NAME or "unreadable" in found or not isinstance(found.get("packages"), dict):
        yield Problem(key, f"{name} is not this project's image ({where}: "
                      f"{found.get('unreadable') or 'not a marker of ' + contract.NAME}); {unknown}", _BUILD, WARNING)
    else:
        errors, warnings = contract.verdict(str(found.get("python", "")), found["packages"], PROJECT, flash=False)
        for e in errors:
            yield Problem(key, f"{name} ({where}): {e}; every task would stop in its first seconds", _BUILD)
        for w in warnings:
            yield Problem(key, f"{name} ({where}): {w}", _BUILD, WARNING)
        impl = value(cfg, "model.attn_config.attn_impl")
        if impl == "flash" and contract.FLASH not in found["packages"]:
            yield Problem(key, f"{name} ({where}) has no {contract.FLASH}, which model.attn_config.attn_impl=flash "
                          "needs: the model would fail to build in every task",
                          f"{_BUILD}; or train without it: model.attn_config.attn_impl=torch")


@functools.lru_cache(maxsize=16)
def _marker(path: str, mtime: float, sidecar_mtime: float | None):
    """Read once per image and version of it (the points of a sweep share one)."""
    return contract.read_marker(path)


def _mtime(path: str) -> float | None:
    try:
        return os.stat(path).st_mtime
    except OSError:
        return None


_LOAD_FIX = ("point it at a checkpoint file (full) or an ep{E}-ba{B} directory (sharded), or drop it (load_path=null) "
             "and let autoresume find the latest")


def _load_path_format(cfg, ctx, path, local: Path):
    """A checkpoint in the format this run cannot read (composer fails as the trainer is built, after the queue): a
    sharded folder where the run reads one file (one rank: no FSDP; IsADirectoryError), one file where it reads
    shards (FSDP with state_dict_type=sharded: "load_path must be a directory when using sharded state dict").
    Not asked of a run that resumes its own checkpoints: load_path is not read then (train/task/main.py)."""
    from train.checkpoint.resume import find

    folder = value(cfg, "save_folder")
    if folder and not is_remote(folder) and find(folder):
        return
    sharded = estimate.sharded_checkpoints(cfg, ctx.world_size(cfg))
    if local.is_dir() and not sharded:
        yield Problem("load_path", f"{path} is a sharded checkpoint, and this run reads one file "
                      f"({ctx.world_words(cfg)}, fsdp_config.state_dict_type="
                      f"{value(cfg, 'fsdp_config.state_dict_type')}): composer would fail to load it",
                      f"python -m train.consolidate {path}, then load_path=<the file it prints>")
    elif local.is_file() and sharded:
        yield Problem("load_path", f"{path} is one checkpoint file, and this run reads sharded checkpoints "
                      f"({ctx.world_words(cfg)}, fsdp_config.state_dict_type=sharded): composer refuses it (a "
                      "sharded load_path must be a folder)", "checkpoint=full for this run (it loads one file at "
                      "any world size)")


def load_path(cfg, ctx):
    path = value(cfg, "load_path")
    if not path or is_remote(str(path)):
        return
    local = Path(os.path.expanduser(str(path)))
    if not local.exists():
        yield Problem("load_path", f"{path} does not exist (composer would fail to load it)", _LOAD_FIX)
        return
    from train.checkpoint.head import head_problem  # the task's own decision, from the files alone (no torch)

    why = head_problem(local)
    if why:
        yield Problem("load_path", f"{path}: {why}; composer would fail to load it (the task refuses it)", _LOAD_FIX)
        return
    yield from _load_path_format(cfg, ctx, path, local)
    # a checkpoint of one of our runs: its folder records the model it holds
    from train.checkpoint.integrity import run_of
    from train.checks.checkpoints import other_function, other_shape
    from train.config.identity import identity, read_record

    # the record it carries in its manifest, else its folder's
    theirs = (run_of(local) or read_record(local.parent) or {}).get("identity")
    partial = value(cfg, "load_strict_model_weights") is False or value(cfg, "load_ignore_keys")
    shape = other_shape(theirs, identity(cfg)) if isinstance(theirs, dict) and not partial else ""
    function = other_function(theirs, identity(cfg)) if isinstance(theirs, dict) and not partial and not shape else ""
    if function:
        yield Problem("load_path", f"{path} holds weights trained under other model settings ({function}, as "
                      "the run that wrote it records): they load (the same sizes) but compute something "
                      "else in this model", "the model settings of the run that wrote it, unless another function is "
                      "what you mean to train from these weights", WARNING)
    if shape:
        yield Problem("load_path", f"{path} holds a model of another shape than this one ({shape}, as "
                      "the run that wrote it records): loading it would fail (torch refuses missing or "
                      "differently sized weights) or leave weights out", "the model settings of the run that wrote it; or "
                      "+load_strict_model_weights=false +load_weights_only=true to load the weights that match (a grown "
                      "model; its optimizer state has no entry for the new weights)")


def icl_files(cfg, ctx):
    """The in-context learning tasks' files, which llm-foundry opens as the trainer is built on every rank: the
    YAML file `icl_tasks` names (its tasks are then checked as an inline list is: foundry_values.icl_task), each
    task's local `dataset_uri`, and the `eval_gauntlet` file."""
    from train.checks.foundry_values import icl_task

    gauntlet = value(cfg, "eval_gauntlet")
    if isinstance(gauntlet, str) and not Path(os.path.expanduser(gauntlet)).is_file():
        yield Problem("eval_gauntlet", f"{gauntlet} is not a file (llm-foundry opens it, a local file only, as the "
                      "trainer is built)", "the path of a YAML file with an `eval_gauntlet:` section (as "
                      "llm-foundry's scripts/eval/yamls/eval_gauntlet_v0.3.yaml)")
    tasks = value(cfg, "icl_tasks")
    where = "icl_tasks"
    if isinstance(tasks, str):
        if is_remote(tasks):  # a task's dataset_uri may be remote; the file of tasks is opened with open()
            yield Problem("icl_tasks", f"{tasks} is a URI; llm-foundry opens the file of tasks with open() as the "
                          "trainer is built (a local file only, as eval_gauntlet's)", "download it and give its "
                          "local path, or list the tasks inline: icl_tasks=[{label: ..., dataset_uri: s3://..., "
                          "icl_task_type: ..., num_fewshot: [0]}]")
            return
        path = Path(os.path.expanduser(tasks))
        try:
            tasks = OmegaConf.to_container(OmegaConf.load(path).icl_tasks, resolve=True)
        except Exception as err:  # missing, unreadable, not YAML, or no icl_tasks list in it
            yield Problem("icl_tasks", f"cannot read a list of tasks from {tasks} ({type(err).__name__}: {err}); "
                          "llm-foundry opens it as the trainer is built", "the path of a YAML file with an "
                          "`icl_tasks:` list (as llm-foundry's scripts/eval/yamls/tasks_v0.3.yaml)")
            return
        if not isinstance(tasks, list):
            yield Problem("icl_tasks", f"{path}: its icl_tasks is not a list of tasks", "icl_tasks: [{label: ..., "
                          "dataset_uri: ..., icl_task_type: ..., num_fewshot: [0]}, ...]")
            return
        where = f"icl_tasks ({path})"
        for i, task in enumerate(tasks):
            yield from icl_task(task, f"{where}[{i}]")
    elif isinstance(tasks, ListConfig):
        tasks = OmegaConf.to_container(tasks, resolve=True)
    else:
        return
    for i, task in enumerate(tasks):
        uri = task.get("dataset_uri") if isinstance(task, dict) else None
        if not isinstance(uri, str) or is_remote(uri):
            continue
        if not Path(os.path.expanduser(uri)).is_file():
            yield Problem(f"{where}[{i}].dataset_uri", f"{uri} is not a file (llm-foundry reads the task from it as "
                          "the trainer is built)", "the path of the task's .jsonl file, or a URI (s3://..., hf://...)")
        else:
            yield from icl_task_lines(Path(os.path.expanduser(uri)), task, f"{where}[{i}].dataset_uri")


def icl_fields(task: dict) -> tuple[tuple, str | None]:
    """(the fields llm-foundry's ICL dataset of this task reads of each record, the one `gold` indexes), by task
    type and the task's own key names (llmfoundry/eval/datasets/in_context_learning_evaluation.py)."""
    kind, get = task.get("icl_task_type"), task.get
    if kind == "language_modeling":
        return (get("context_key") or "context", "continuation"), None
    if kind == "multiple_choice":
        return (get("context_key") or "query", get("choices_key") or "choices", "gold"), get("choices_key") or "choices"
    if kind == "schema":
        return (get("choices_key") or "context_options", "continuation", "gold"), get("choices_key") or "context_options"
    if kind == "generation_task_with_answers":
        return (get("context_key") or "context", get("answer_key") or "answer"), None
    return (), None


def icl_task_lines(path: Path, task: dict, key: str):
    """Each record of a local ICL task file has the fields its task reads: llm-foundry finds a bad one only as the
    trainer is built, on every rank (a DatasetGenerationError, a ValueError, an IndexError of a gold past its
    choices, none naming the line). The file as llm-foundry reads it (Hugging Face's JSON reader): JSON lines,
    or one JSON list of records; a byte-order mark allowed. Read once per file and fields, however many points."""
    fields, gold_of = icl_fields(task)
    try:
        st = path.stat()
    except OSError as err:
        yield Problem(key, f"{path}: cannot be read ({err})", "a UTF-8 JSON-lines task file")
        return
    bad = _icl_records(str(path), st.st_size, st.st_mtime_ns, fields, gold_of)
    if bad:
        shown = 3
        more = f"; and {len(bad) - shown} more" if len(bad) > shown else ""
        need = f" (a {task.get('icl_task_type')} task reads {', '.join(fields)} of each record)" if fields else ""
        yield Problem(key, f"{path}: {'; '.join(bad[:shown])}{more}{need}", "one JSON object per line with those "
                      "fields (llm-foundry reads them as the trainer is built)")


@functools.lru_cache(maxsize=64)
def _icl_records(path: str, size: int, mtime_ns: int, fields: tuple, gold_of: str | None) -> tuple:
    """What is wrong with the file's records, each with its line (or list index): () when nothing is."""
    import json

    bad = []

    def check(where, row):
        if not isinstance(row, dict):
            bad.append(f"{where}: not a JSON object")
            return
        missing = [k for k in fields if row.get(k) is None]
        if missing:
            bad.append(f"{where}: no {', '.join(missing)}")
        elif gold_of:
            gold, options = row["gold"], row[gold_of]
            if not isinstance(options, list) or isinstance(gold, bool) or not isinstance(gold, int) \
                    or not 0 <= gold < len(options):
                bad.append(f"{where}: gold {gold!r} is not an index of its {gold_of}")

    try:
        text = Path(path).read_text(encoding="utf-8-sig")
    except (OSError, UnicodeDecodeError) as err:
        return (f"cannot be read ({err})",)
    if text.lstrip().startswith("["):  # one JSON list of records, which Hugging Face's reader takes too
        try:
            rows = json.loads(text)
        except ValueError as err:
            return (f"not JSON ({err})",)
        for i, row in enumerate(rows if isinstance(rows, list) else [rows]):
            check(f"record {i}", row)
        return tuple(bad)
    for n, line in enumerate(text.splitlines(), 1):
        if line.strip():
            try:
                row = json.loads(line)
            except ValueError as err:
                bad.append(f"line {n}: not JSON ({err})")
                continue
            check(f"line {n}", row)
    return tuple(bad)


def no_overwrite(cfg, ctx):
    """A run that does not resume must not start over the checkpoints of an earlier run without a word: composer
    refuses a folder of full checkpoints only once it is running, and rewrites sharded ones silently; with
    save_overwrite=true (llm-foundry's own examples set it beside autoresume=false) it trains from batch 0 over
    them. A requeue of its job continues its own checkpoints (train/task/main.py); the first start is what this
    says, and on Slurm it is refused unless the command line asks for it."""
    folder = value(cfg, "save_folder")
    if not folder or is_remote(folder) or value(cfg, "autoresume") or value(cfg, "save_filename"):
        return
    from train.checkpoint.resume import find

    found = find(folder)
    if not found:
        return
    held = (f"save_folder {folder} already holds {len(found)} checkpoint(s) (… "
            f"{', '.join(c.path.name for c in found[-3:])}, up to batch {found[-1].batch})")
    if not value(cfg, "save_overwrite"):
        yield Problem("autoresume", f"false, but {held}: this run would start from batch 0 and overwrite them",
                      "autoresume=true continues that run; another run_name (or save_folder) starts afresh beside "
                      "it; save_overwrite=true replaces them")
        return
    asked = str(ctx.given("save_overwrite") or "").lower() in ("true", "1", "yes")
    yield Problem("autoresume", f"false with save_overwrite=true, and {held}: this start trains from batch 0 and "
                  "overwrites them as it goes (a requeue of its own job continues its own checkpoints)",
                  "autoresume=true continues that run; another run_name (or save_folder) starts afresh beside it"
                  + ("" if asked else "; save_overwrite=true on the command line starts over them on purpose"),
                  WARNING if asked or not ctx.slurm else ERROR)


@functools.lru_cache(maxsize=None)  # once per command, however many sweep points ask
def _reachable(url: str, timeout: float = 3.0) -> bool:
    parsed = urlparse(url)
    try:
        with socket.create_connection((parsed.hostname, parsed.port or 443), timeout=timeout):
            return True
    except OSError:
        return False


def _mock_folder(cfg):
    """The folder data=mock writes its splits and tokenizer into when the run starts (train/task/mock_data.py)."""
    return Path(str(value(cfg, "variables.data_local"))).expanduser() if value(cfg, "data.kind") == "mock" else None


def tokenizer(cfg, ctx):
    name = str(value(cfg, "tokenizer.name"))
    mock = _mock_folder(cfg)
    if mock is not None and Path(name).expanduser() == mock / "tokenizer":
        return  # written beside the mock data when the run starts
    if vocab.looks_like_path(name):
        folder = Path(name).expanduser()
        if not folder.is_dir():
            yield Problem("tokenizer.name", f"{folder} does not exist", "point it at a folder saved by "
                          "save_pretrained, or use a hub name such as EleutherAI/gpt-neox-20b")
        elif not any((folder / f).is_file() for f in _TOKENIZER_FILES):
            has_config = (folder / "tokenizer_config.json").is_file()
            yield Problem("tokenizer.name", f"{folder} is not a tokenizer folder: "
                          + ("tokenizer_config.json but no tokenizer.json or vocabulary file" if has_config else
                             "no tokenizer.json") + " (transformers' AutoTokenizer cannot load it)",
                          "save the whole tokenizer there (tokenizer.save_pretrained(folder) writes tokenizer.json), "
                          "or point at a folder that has it")
        return
    why = facts.not_a_hub_name(name)
    if why:
        yield Problem("tokenizer.name", f"{name} is neither a folder here ({Path(name).absolute()} does not exist) nor "
                      f"a Hugging Face hub name ({why}): transformers' AutoTokenizer would fail as the run starts",
                      "the path of a folder saved by save_pretrained (holding tokenizer.json), e.g. ./" + name
                      + " if it is under this folder, or a hub name such as EleutherAI/gpt-neox-20b")
        return
    if facts.tokenizer_file(name):
        return  # in the hub cache
    cache = facts.hub_cache()
    endpoint = os.environ.get("HF_ENDPOINT", "https://huggingface.co")
    off = hub_switched_off_by()
    why = (f"{off} is set" if off else
           f"{endpoint} cannot be reached from {os.uname().nodename}" if not _reachable(endpoint) else None)
    if why:
        yield Problem("tokenizer.name", f"{name} is a Hugging Face hub name, not in the cache ({cache}), and {why}: "
                      "llm-foundry would fail to download it when the run starts",
                      f"point tokenizer.name at a local folder (e.g. one saved with save_pretrained), or download it "
                      f"where the hub is reachable into {cache} (huggingface-cli download {name})")


def vocabulary(cfg, ctx):
    name = "mock" if value(cfg, "data.kind") == "mock" else str(value(cfg, "tokenizer.name"))
    size, source = (vocab.MOCK_IDS, "the mock byte tokenizer") if name == "mock" else vocab.tokenizer_ids(name)
    model_vocab = value(cfg, "model.vocab_size")
    key = "model.vocab_size"
    if value(cfg, "model.name") == "hf_causal_lm":  # its architecture's (config_overrides, or its base config's)
        from train.config import hf_arch

        try:
            model_vocab = hf_arch.shape(hf_arch.attributes(value(cfg, "model")))["vocab_size"]
        except hf_arch.ArchError:
            return  # said by the architecture's own rule
        key = "model.config_overrides.vocab_size"
    if model_vocab is None and value(cfg, "model.name") == "mpt_causal_lm":  # left out: MPTConfig's default
        model_vocab = vocab.MPT_VOCAB
    if size is not None and isinstance(model_vocab, int) and size > model_vocab:
        yield Problem(key, f"{model_vocab} is smaller than the tokenizer's {size} ids ({source}): "
                      "token ids past it would index outside the embedding (an IndexError, a device-side assert on "
                      "GPU)", f"{key}={vocab.padded(size)} (the tokenizer's size rounded up to a multiple "
                      "of 64)")


def _mds_fix(key: str, local: Path, split: str, tokenizer: str) -> str:
    """Where the data most likely is, or how to make it: a split folder given for the root, raw files given for
    the MDS folder, or nothing there yet."""
    if (local / "index.json").is_file():
        return f"{key}={local.parent} (the folder holding {local.name}/; each split is a subfolder)"
    if local.is_dir() and any(local.iterdir()):
        fresh = local.parent / f"{local.name}-mds"
        return (f"it holds no MDS data: if these are raw JSON lines, make MDS shards beside them with `python -m "
                f"data_prep dataset=jsonl input={local} out_root={fresh} split={split} tokenizer={tokenizer}` and "
                f"set {key}={fresh}")
    return (f"make it with `python -m data_prep input=<raw files> out_root={local} split={split} "
            f"tokenizer={tokenizer}`, or point {key} at an MDS folder (or set variables.data_remote "
            "to stream one)")


def _mock_counts(cfg):
    """The mock set already in its folder is the one a run reads (train/task/mock_data.py keeps it): asked for
    other counts, the run would train on the folder's and report the asked ones, exit 0."""
    from train.task.mock_data import other_counts

    folder = value(cfg, "variables.data_local")
    if not folder:
        return
    for key, asked, has in other_counts(folder, value(cfg, "data.train_samples"), value(cfg, "data.val_samples")):
        yield Problem(key, f"{asked} asked, but the mock set in {folder} holds {has} (it is written once, and "
                      "kept)", f"{key}={has}; or storage.data_local_root=<another folder> for a set of {asked} "
                      f"there; or delete {folder} (synthetic: it is written again with the counts asked)")


def data(cfg, ctx):
    """Each loader's own MDS folder (dataset.local, dataset.split), as streaming will open it: llm-foundry's YAMLs
    set them through variables.data_local, and a command line may set a loader's directly. A loader that streams
    from a remote fills its local folder when it starts, from the remote's split (a folder on this node's file
    systems is checked as the local one is); eval_loader=null evaluates nothing. data=mock writes its train and val
    splits when the run starts: a loader given another folder or split reads what is there."""
    mock = _mock_folder(cfg)
    if mock is not None:
        yield from _mock_counts(cfg)  # written when the run starts, unless a set is there already
    written = {mock / "train", mock / "val"} if mock is not None else set()
    tokenizer_name = str(value(cfg, "tokenizer.name"))
    # this run's tokenizer, by vocabulary (the same tokenizer saved elsewhere is the same), read once if needed
    ours = functools.cache(lambda: facts.tokenizer_fingerprint(tokenizer_name))
    checked, missing, other, unhashed = set(), set(), {}, {}
    # a loader that refers to variables.data_local without a value stops at reading it (value names the key)
    for source in mds_sources(cfg, functools.partial(value, cfg)):
        loader, split, remote = source.loader, source.split, source.remote
        if any(_at_home(p) for p in (source.local, remote)):
            continue  # data_home names it
        if remote:
            if source.local and not is_remote(remote):
                yield from _remote_folder(cfg, source, tokenizer_name, checked, missing)
            continue
        if not source.local:
            continue  # not an MDS loader (llm-foundry's own checks name what it needs)
        # the key to fix: the one most commands set (variables.data_local), unless this loader was given its own
        key, local, folder = source.local_key, Path(source.local), source.folder
        if folder in checked or folder in written:
            continue
        checked.add(folder)
        if not (folder / "index.json").is_file():
            # (a split folder given for the root holds data_prep's block folders, not splits: _mds_fix says so)
            splits = sorted({p.parent.name for p in local.glob("*/index.json")} | {f.name for f in written
                                                                                    if f.parent == local}) \
                if split and not (local / "index.json").is_file() else []
            if splits:  # the data is there, the split is not: the split is what to fix
                yield Problem(f"{loader}.dataset.split", f"{local} holds no split {split!r} (no {split}/index.json; "
                              f"its splits: {', '.join(splits)})", f"{loader}.dataset.split=<one of "
                              f"{', '.join(splits)}>, or make it with `python -m data_prep input=<raw files> "
                              f"out_root={local} split={split} tokenizer={tokenizer_name}`")
            elif local not in missing:  # both splits of a folder that is not there: said once
                missing.add(local)
                where = "does not exist" if not local.exists() else f"has no {split}/index.json" if split else \
                    "has no index.json"
                yield Problem(key, f"{local} {where} (streaming needs an MDS folder per split)",
                              _mds_fix(key, local, split or "train", tokenizer_name))
            continue
        broken = facts.check_index(folder)
        if broken:
            yield Problem(key, f"{folder}: " + "; ".join(broken[:3])
                          + (f" (and {len(broken) - 3} more)" if len(broken) > 3 else "")
                          + " (streaming would fail to read it)",
                          "copy the data again (every shard named in index.json, whole), or make it again with "
                          "data_prep")
            continue
        found = facts.dataset_facts(folder)
        if loader == "train_loader":
            yield from _sample_length(cfg, folder, found.get("sample_tokens"))
        # every split's tokenizer: a validation split of other token ids gives an eval loss over other words
        recorded = found.get("tokenizer_fingerprint")
        if recorded and ours() and ours() != recorded:
            other.setdefault(found.get("tokenizer") or "another tokenizer", []).append(str(folder))
        if not all(any((s.get(kind) or {}).get("hashes") for kind in ("zip_data", "raw_data"))
                   for s in facts.index_shards(folder) or []):  # checked before training where it has them
            unhashed.setdefault(key, []).append(str(folder))
    for key, folders in unhashed.items():
        yield Problem(key, f"{' and '.join(folders)}: index.json records no hash of {'their' if len(folders) > 1 else 'its'}"
                      " shards (streaming's writer without hashes=, llm-foundry's converter): they cannot be checked "
                      "before training, and a damaged shard would train without a word", "prepare the data with "
                      "python -m data_prep (it records every shard's hash), or train on it as it is", WARNING)
    for used, folders in other.items():
        yield Problem("tokenizer.name", f"{' and '.join(folders)} {'was' if len(folders) == 1 else 'were'} tokenized "
                      f"with {used}, not {tokenizer_name}: its token ids mean other words here (and may index "
                      "outside the embedding)", "tokenizer.name=" + (used if used != "another tokenizer" else
                      "<the tokenizer data_prep used>") + ", or prepare the data again with this tokenizer")


def _remote_folder(cfg, source, tokenizer_name: str, checked: set, missing: set):
    """A loader's remote that is a folder (not a URI): streaming copies the split's index.json and shards from it
    into the local folder as it starts, and fails there if it holds none, unless the local folder holds the whole
    split already (streaming then reads that)."""
    loader, local, split, remote, key = source.loader, source.local, source.split, source.remote, source.remote_key
    folder, copy = split_folder(remote, split), source.folder
    if folder in checked or (folder / "index.json").is_file():
        return
    checked.add(folder)
    if (copy / "index.json").is_file() and not facts.check_index(copy):
        return  # a whole copy here already
    from train.checks.core import same_or_under

    root = Path(remote)
    mounts = [str(m).split(":")[0] for m in value(cfg, "storage.mounts") or []]
    if any(same_or_under(root, m) and not os.path.exists(m) for m in mounts):
        return  # a storage not mounted on this node: the mounts rule names it
    if not root.exists() and root in missing:
        return  # both splits of a folder that is not there: said once
    missing.add(root)
    where = "does not exist" if not root.exists() else f"has no {split}/index.json" if split else "has no index.json"
    yield Problem(key, f"{root} {where} (streaming copies {loader}'s split from it into {local} as the run "
                  "starts, and stops there with nothing to copy)",
                  f"point {key} at the MDS folder holding {split + '/' if split else ''}index.json (or a URI streaming "
                  f"reads, e.g. s3://bucket/c4), or make it with `python -m data_prep input=<raw files> out_root={root} "
                  f"split={split or 'train'} tokenizer={tokenizer_name}`")


def _at_home(path) -> bool:
    """A folder written from the home folder's `~`, which streaming does not expand."""
    return bool(path) and not is_remote(str(path)) and str(path).startswith("~")


def data_home(cfg, ctx):
    """A loader's folder given as `~/...`: the shell expands `~` only at the start of a word, not in
    `variables.data_local="~/mds"`, and streaming opens os.path.join(local, split) as given, so it would read a
    folder named `~` in the working directory (and find none: "No remote provided, but local file ~/mds/train/index.json
    does not exist either"), after the run folder was claimed. Refused with the expanded path."""
    said = set()
    for source in mds_sources(cfg):
        for key, path in ((source.local_key, source.local), (source.remote_key, source.remote)):
            if _at_home(path) and key not in said:
                said.add(key)
                yield Problem(key, f"{path!r}: streaming does not expand ~ (it would read {os.path.abspath(path)}, "
                              "a folder named ~ in the working directory)", f"{key}={os.path.expanduser(path)}")


def _sample_length(cfg, folder: Path, sample: int | None):
    # the length the text loader cuts samples to is its dataset's max_seq_len (a YAML's interpolates
    # variables.max_seq_len, so a top-level max_seq_len= does not reach it); the top-level one where it is unset
    top, cut = value(cfg, "max_seq_len"), value(cfg, "train_loader.dataset.max_seq_len")
    key, seq = ("train_loader.dataset.max_seq_len", cut) if cut is not None and cut != top else ("max_seq_len", top)
    if sample and isinstance(seq, int) and sample != seq:
        if sample > seq:
            what = (f"samples of {sample} tokens; {key}={seq} keeps the first {seq} of each and drops the "
                    f"rest ({100 * (sample - seq) // sample} % of the prepared tokens never trained on)")
        else:
            what = (f"samples of {sample} tokens, shorter than {key}={seq}: the run trains on {sample}-token "
                    "sequences, not what the plan assumed")
        yield Problem("max_seq_len", f"{folder} holds {what}", f"max_seq_len={sample}, or prepare the data again "
                      f"with concat_tokens={seq}", WARNING)


RULES = [mounts, container, load_path, icl_files, no_overwrite, tokenizer, vocabulary, data_home, data]
# Rules that hold whatever node they run on: not softened in a plan.
EVERYWHERE = {vocabulary, data_home}


def folder_free(cfg, ctx):
    """Another run writing this save_folder now: the task would refuse it once started (train/checkpoint/resume.py claim)."""
    folder = value(cfg, "save_folder")
    if not folder or is_remote(folder):
        return
    from train.checkpoint.resume import holder, in_use

    who = holder(folder)
    if who:  # a sweep's job may start after that run ends
        yield in_use(folder, who).as_warning() if ctx.mode == "sweep" else in_use(folder, who)


RULES.append(folder_free)
