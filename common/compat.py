"""Every place this project reaches into another library: a private function, class or attribute it uses, or a
function of the library it replaces in this process (a patch). Nothing else in the project does
(tests/test_compat.py scans for it).

Each is written against exact versions of the libraries it reaches into (`written_against`), read from the
installed distributions when it is called: another version stops it before it touches the library, naming the
package, the version found, the versions it was written against and the test that pins what it does (run that
test against the new version, then add the version). A local version label (`2.7.0+cu126`) is the version it
builds. Light: the libraries are imported by the function that needs them."""
import functools

from common.errors import UserError

GUARDED: dict = {}  # name: each guarded function, for the tests
HYDRA = {"hydra-core": ("1.3.2",)}
OMEGACONF = {"omegaconf": ("2.3.1",)}
SUBMITIT = {"submitit": ("1.5.4",)}
COMPOSER = {"mosaicml": ("0.32.1",)}
STREAMING = {"mosaicml-streaming": ("0.12.0",)}
TORCH = {"torch": ("2.7.0",)}


class UnsupportedVersion(UserError):
    """A library installed at a version a use of its insides was not written against."""


@functools.cache
def installed(package: str) -> str:
    from importlib.metadata import version

    return version(package)


def check(what: str, versions: dict, pinned_by: str) -> None:
    """Raise UnsupportedVersion unless every package of `versions` ({name: (version, ...)}) is installed at one of
    its versions."""
    for package, supported in versions.items():
        found = installed(package)
        if found.split("+", 1)[0] not in supported:
            raise UnsupportedVersion(
                package, f"{found} is installed; common/compat.py: {what} was written against {package} "
                f"{' or '.join(supported)} only", f"install {package}=={supported[-1]} (requirements.lock); or run "
                f"{pinned_by} with {package} {found} and, where it passes, add {found} to {what}'s versions")


def written_against(versions: dict, pinned_by: str):
    """The decorated function checks `versions` each time it is called, before it runs. `pinned_by`: the test
    (tests/<file>.py::<test>) that shows what it does."""
    def wrap(fn):
        @functools.wraps(fn)
        def guarded(*args, **kwargs):
            check(fn.__name__, versions, pinned_by)
            return fn(*args, **kwargs)

        guarded.versions, guarded.pinned_by = versions, pinned_by
        GUARDED[fn.__name__] = guarded
        return guarded

    return wrap


# ------------------------------------------------------------------------------------------------------ Hydra


@written_against(HYDRA, "tests/test_compose.py::test_each_point_equals_hydras_own_composition")
def hydra_caching_repo(loader, config_name: str, overrides=()):
    """The config repository Hydra's `loader` composes `config_name` with (the primary config read for its
    `hydra.searchpath`: yaml=PATH's source): ConfigLoaderImpl._parse_overrides_and_create_caching_repo."""
    return loader._parse_overrides_and_create_caching_repo(config_name, list(overrides))[1]


@written_against(HYDRA, "tests/test_compose.py::test_each_point_equals_hydras_own_composition")
def hydra_with_value_overrides(base, parsed: list, values: list):
    """A copy of `base` (Hydra's composition of the group choices among `parsed`) with the value overrides applied
    by Hydra's own function, and Hydra's record of all the overrides, in the order given: what Hydra composes from
    scratch for `parsed` (ConfigLoaderImpl._load_configuration_impl's second step)."""
    from hydra._internal.config_loader_impl import ConfigLoaderImpl, get_overrides_dirname
    from omegaconf import open_dict, read_write

    cfg = _copied(base)
    ConfigLoaderImpl._apply_overrides_to_config(values, cfg)
    job = cfg.hydra.job
    with open_dict(cfg.hydra), read_write(cfg.hydra):
        cfg.hydra.overrides.task = [o.input_line for o in parsed]
        job.override_dirname = get_overrides_dirname(
            overrides=parsed, kv_sep=job.config.override_dirname.kv_sep,
            item_sep=job.config.override_dirname.item_sep,
            exclude_keys=job.config.override_dirname.exclude_keys)
    return cfg


@written_against({**HYDRA, **OMEGACONF}, "tests/test_compose.py::test_each_point_equals_hydras_own_composition")
def hydra_context_moving_its_node(cfg) -> None:
    """HydraConfig.set_config(cfg) for a config whose `hydra` node is dropped next (a sweep point, composed as its
    own copy): the node moves into Hydra's singleton instead of being deep-copied there (set_config's
    OmegaConf.masked_copy; OmegaConf copies a node set into a container unless `no_deepcopy_set_nodes`). Hydra's
    own checks, and the node's parent (the config, for `${hydra:...}` and the keys it interpolates), as set_config
    makes them."""
    from hydra.conf import HydraConf
    from hydra.core.hydra_config import HydraConfig
    from omegaconf import DictConfig, OmegaConf

    OmegaConf.set_readonly(cfg.hydra, True)
    kind = OmegaConf.get_type(cfg, "hydra")
    assert kind is not None and issubclass(kind, HydraConf)
    node = cfg._get_node("hydra")
    hidden = DictConfig(content={"hydra": node}, flags={"no_deepcopy_set_nodes": True})
    assert hidden._get_node("hydra") is node
    node._set_parent(cfg)
    HydraConfig.instance().cfg = hidden


NAMING = ("tests/test_identity.py::"
          "test_the_plan_names_the_run_that_m_submits_and_scaling_points_are_runs_of_their_own")


@written_against(HYDRA, NAMING)
def hydra_context_now():
    """The Hydra context set now (HydraConfig's node), to be set again by hydra_context_again while another
    point's config is made in between."""
    from hydra.core.hydra_config import HydraConfig

    return HydraConfig.instance().cfg


@written_against(HYDRA, NAMING)
def hydra_context_again(node) -> None:
    """Set again a Hydra context hydra_context_now returned."""
    from hydra.core.hydra_config import HydraConfig

    HydraConfig.instance().cfg = node


_PICKLED: dict = {}  # id(base): (base, its pickle), the base kept so that its id is not another's


def _copied(base):
    """A copy of a composed config, as deepcopy makes it, from its pickle (made once per base): OmegaConf's deepcopy
    walks every node in Python, far slower than loading a pickle made once, and a sweep copies one base per
    point."""
    import copy
    import pickle

    if id(base) not in _PICKLED:
        try:
            _PICKLED[id(base)] = (base, pickle.dumps(base, protocol=pickle.HIGHEST_PROTOCOL))
        except Exception:  # noqa: BLE001 -- a value pickle cannot write: deepcopy copies it
            _PICKLED[id(base)] = (base, None)
    data = _PICKLED[id(base)][1]
    return copy.deepcopy(base) if data is None else pickle.loads(data)


@written_against(HYDRA, "tests/test_compose.py::test_a_command_composes_once_what_hydra_composes_twice")
def patch_hydra_compose_once_per_command(args: list):
    """Make a command's Hydra compose its config once, not twice (`args`: the command line Hydra reads, -m and all).
    Hydra's main composes the whole config to read `hydra.mode` (Hydra.get_mode: in MULTIRUN mode, the overrides
    unchecked), then composes it again to run or sweep. Here get_mode composes in the mode the command runs in (RUN
    without -m) and keeps that composition for the next one asked for with the same config name, overrides and mode
    (and the `hydra.mode=<mode>` Hydra adds when the config sets none), after Hydra's own check of the overrides.
    The config is the one Hydra would compose: RUN and MULTIRUN differ only where a group choice is `???` (MULTIRUN
    leaves it out, RUN refuses it); where RUN refuses, Hydra's own get_mode answers and nothing is kept. A kept
    composition is handed out once: a process that composes many configs keeps nothing between its own calls.
    `--help` lists its groups from one copy of the config repository
    (tests/test_compose.py::test_a_commands_help_lists_what_hydras_lists_from_one_copy_of_the_repository).
    Returns the undo (tests)."""
    from hydra._internal.config_loader_impl import ConfigLoaderImpl
    from hydra._internal.hydra import Hydra
    from hydra.core.object_type import ObjectType
    from hydra.core.override_parser.overrides_parser import OverridesParser
    from hydra.types import RunMode

    mode = RunMode.MULTIRUN if {"-m", "--multirun"} & set(args) else RunMode.RUN
    kept = {}
    hydras_get_mode, hydras_load = Hydra.get_mode, ConfigLoaderImpl.load_configuration

    def get_mode(self, config_name, overrides):
        try:
            cfg = hydras_load(self.config_loader, config_name=config_name, overrides=overrides, run_mode=mode,
                              validate_sweep_overrides=False)  # unchecked, as Hydra's get_mode
        except Exception:  # noqa: BLE001 -- Hydra's own answer, and its own error when it runs
            return hydras_get_mode(self, config_name, overrides)
        kept[(config_name, tuple(overrides), mode)] = cfg
        return cfg.hydra.mode

    def load_configuration(self, config_name, overrides, run_mode, from_shell=True, validate_sweep_overrides=True):
        given, added = list(overrides), []
        cfg = kept.pop((config_name, tuple(given), run_mode), None)
        if cfg is None and given[-1:] == [f"hydra.mode={run_mode.name}"]:
            # where the config sets no hydra.mode, Hydra's main adds `hydra.mode=<mode>` after get_mode
            added = given[-1:]
            cfg = kept.pop((config_name, tuple(given[:-1]), run_mode), None)
        if cfg is None:
            return hydras_load(self, config_name, overrides, run_mode, from_shell, validate_sweep_overrides)
        parser = OverridesParser.create()
        if validate_sweep_overrides:  # what _load_configuration_impl checks before it composes
            self.validate_sweep_overrides_legal(parser.parse_overrides(given), run_mode=run_mode, from_shell=from_shell)
        if added:  # a value override, applied last and recorded last, as _load_configuration_impl does
            ConfigLoaderImpl._apply_overrides_to_config(parser.parse_overrides(added), cfg)
            cfg.hydra.overrides.hydra.append(added[0])
        return cfg

    # `--help` lists each config group's options: Hydra makes a copy of the whole config repository for each
    # question it asks (ConfigLoaderImpl.get_group_options), most of the command's time. One copy answers all.
    hydras_options, repos = ConfigLoaderImpl.get_group_options, {}

    def get_group_options(self, group_name, results_filter=ObjectType.CONFIG, config_name=None, overrides=None):
        key = (config_name, tuple(overrides or ()))
        if key not in repos:
            repos[key] = self._parse_overrides_and_create_caching_repo(config_name, list(key[1]))[1]
        return repos[key].get_group_options(group_name, results_filter)

    Hydra.get_mode, ConfigLoaderImpl.load_configuration = get_mode, load_configuration
    ConfigLoaderImpl.get_group_options = get_group_options

    def undo():
        Hydra.get_mode, ConfigLoaderImpl.load_configuration = hydras_get_mode, hydras_load
        ConfigLoaderImpl.get_group_options = hydras_options

    return undo


@written_against(HYDRA, "tests/test_validate.py::"
                 "test_the_storage_root_a_near_miss_under_a_group_and_a_yaml_folder_are_named_for_what_they_are")
def patch_hydra_composition_errors_answered_first(answer):
    """Hydra's main composes inside hydra._internal.utils.run_and_report, which prints its own error for an
    override it cannot apply (its ConfigCompositionException) and exits 1. Here `answer(err)` sees each such
    error first (it may exit); where it returns, Hydra reports the error as before. Returns the undo (a process
    that runs many command lines answers each with its own)."""
    import hydra._internal.utils as hydra_utils
    from hydra.errors import ConfigCompositionException

    hydras = hydra_utils.run_and_report

    def run_and_report(func):
        def composed():
            try:
                return func()
            except ConfigCompositionException as err:
                answer(err)
                raise

        return hydras(composed)

    hydra_utils.run_and_report = run_and_report

    def undo():
        hydra_utils.run_and_report = hydras

    return undo


@written_against(HYDRA, "tests/test_launcher_outcomes.py::test_each_failed_rank_shows_its_own_exception_and_log_tail")
def hydra_job_return_value(ret):
    """What a Hydra JobReturn holds: its task's value, or its error where it failed (JobReturn._return_value;
    its public `return_value` raises that error instead, after printing it). Set it by that property."""
    return ret._return_value


SWEEPS = ("tests/test_hydra_sweeps.py::"
          "test_a_grid_declared_as_config_is_every_combination_planned_and_nothing_is_written")


@written_against(HYDRA, SWEEPS)
def hydra_basic_sweeper():
    """Hydra's basic sweeper class (hydra._internal.core_plugins.basic_sweeper.BasicSweeper), for a plugin class
    over it."""
    from hydra._internal.core_plugins.basic_sweeper import BasicSweeper

    return BasicSweeper


@written_against(HYDRA, SWEEPS)
def hydra_basic_sweeper_params(sweeper) -> list:
    """The overrides `hydra.sweeper.params` sweeps (`key=value,value`), as BasicSweeper._parse_config makes them
    for `sweeper`, one of its subclasses."""
    return sweeper._parse_config()


# --------------------------------------------------------------------------------------------------- OmegaConf


@written_against(OMEGACONF, "tests/test_compose.py::test_an_interpolation_parsed_once_reads_the_same_after_others")
def patch_omegaconf_parse_each_interpolation_once() -> None:
    """OmegaConf parses a value's `${...}` with its ANTLR grammar (pure Python) each time the value is read, and
    a composed config is read whole many times (checks, the run's name, the plan), so parsing the same texts
    again would be a large share of composing and resolving one. A parse tree depends
    on the text alone and nothing changes it once made (its tokens keep their own input), so each text is parsed
    once per process. OmegaConf 2.3 reads `parse` by name in base.py and _utils.py."""
    import omegaconf._utils
    import omegaconf.base
    from omegaconf import grammar_parser

    if not hasattr(omegaconf.base.parse, "cache_info"):
        once = functools.lru_cache(maxsize=4096)(grammar_parser.parse)
        omegaconf.base.parse = omegaconf._utils.parse = once


# ---------------------------------------------------------------------------------------------------- submitit


@written_against(SUBMITIT, "tests/test_common.py::"
                 "test_a_repeated_usr2_requeues_once_and_a_cut_short_dump_does_not_fail_the_next_allocation")
def patch_submitit_slurm_requeue(requeue) -> int:
    """submitit's handler of its USR signal (a time limit's or a preemption's warning) requeues a Slurm job by
    SlurmJobEnvironment._requeue(env, countdown), `scontrol requeue` inside the task: `requeue` does it instead,
    in this process. Returns that signal, as submitit registered its handler for it (SlurmJobEnvironment._usr_sig)."""
    from submitit.slurm.slurm import SlurmJobEnvironment

    SlurmJobEnvironment._requeue = requeue
    return SlurmJobEnvironment._usr_sig()


@written_against(SUBMITIT, "tests/test_security.py::"
                 "test_the_plan_shows_exactly_the_script_that_is_submitted_and_a_credential_reaches_the_job_unwritten")
def submitit_sbatch_script(executor, command: str, array_size: int = 1) -> str:
    """The sbatch script submitit writes to run `command` for one job of `executor` (an AutoExecutor for Slurm),
    or for a job array of `array_size`. submitit has no public way to render it: this is its Slurm executor's
    (AutoExecutor._executor) private `_make_submission_file_text`, with the `map_count` its array submission
    sets. Changes `executor`."""
    slurm = executor._executor
    if array_size > 1:
        slurm.parameters["map_count"] = array_size
    return slurm._make_submission_file_text(command, "plan")


@written_against(SUBMITIT, "tests/test_launcher_outcomes.py::"
                 "test_a_local_job_has_ended_once_its_controller_has_also_seen_from_another_process")
def submitit_local_controller(job):
    """The Popen of a local job's controller (LocalJob._process) in the process that started it, else None (a job
    read back from its folder, another process's)."""
    return getattr(job, "_process", None)


# ---------------------------------------------------------------------------------------------------- composer


@written_against(COMPOSER, "tests/test_train_runs.py::"
                 "test_composers_record_names_the_cpu_as_py_cpuinfo_does_without_its_process")
def patch_composer_cpu_model_from_proc() -> None:
    """composer's environment record (get_composer_env_dict: the trainer reads its version from it when built)
    names the CPU through py-cpuinfo, which starts a Python process to probe it on every rank of every run, for a
    name the trainer does not log. The same name from /proc/cpuinfo ("model name", what cpuinfo reports
    as brand_raw on Linux), else the platform's; composer's record keeps its other fields."""
    from pathlib import Path

    from composer.utils import collect_env

    def cpu_model() -> str:
        try:
            for line in Path("/proc/cpuinfo").read_text().splitlines():
                if line.partition(":")[0].strip() in ("model name", "Model", "cpu model"):
                    return line.partition(":")[2].strip()
        except OSError:
            pass
        import platform

        return platform.processor() or "CPU"

    collect_env.get_cpu_model = cpu_model


@written_against({**COMPOSER, "llm-foundry": ("0.22.0",), "transformers": ("4.51.3",)}, "tests/test_train_runs.py::"
                 "test_mpt_is_known_to_be_no_registered_causal_lm_without_importing_them_all")
def patch_composer_skip_causal_lm_registry_scan() -> None:
    """composer's HuggingFaceModel asks whether the model is one of transformers' registered causal LMs
    (huggingface._is_registered_causal_lm) by importing every class of MODEL_FOR_CAUSAL_LM_MAPPING (every model
    module, on every rank of every run). llm-foundry's MPTForCausalLM is in no such mapping and subclasses none of
    them (PreTrainedModel directly): for it the answer is False without the imports (llm-foundry sets
    shift_labels itself); any other model is asked as composer asks."""
    from composer.models import huggingface
    from llmfoundry.models.mpt import MPTForCausalLM

    asked = huggingface._is_registered_causal_lm
    if getattr(asked, "knows_mpt", False):
        return

    def registered(model) -> bool:
        if type(huggingface.maybe_get_underlying_model(model)) is MPTForCausalLM:
            return False
        return asked(model)

    registered.knows_mpt = True
    huggingface._is_registered_causal_lm = registered


@written_against({**COMPOSER, "llm-foundry": ("0.22.0",)},
                 "tests/test_spike.py::test_kill_loss_spike_is_llm_foundrys_callback_deciding_on_every_rank_alike")
def patch_llmfoundry_kill_loss_spike(behaviour) -> type:
    """llm-foundry's `kill_loss_spike` (llmfoundry.callbacks.KillLossSpike), registered again under its own name as
    a subclass whose methods are `behaviour`'s (train/task/spike.py: SpikeRule): the same keys, decided on
    composer's all-reduced loss on every rank alike. Its own __init__ (which enables it on rank 0 alone and keeps
    its 100-batch minimum window) and batch_end (each rank's own unreduced `state.loss`, its own exceptions) are
    replaced; the class stays llm-foundry's (isinstance, its name in composer's checkpoints). Returns the class."""
    from llmfoundry.callbacks import KillLossSpike
    from llmfoundry.registry import callbacks

    registered = callbacks.get("kill_loss_spike")
    if getattr(registered, "behaviour", None) is behaviour:
        return registered
    adapted = type("KillLossSpike", (behaviour, KillLossSpike), {"behaviour": behaviour,
                                                                  "__module__": behaviour.__module__})
    callbacks.register("kill_loss_spike", func=adapted)
    return adapted


# --------------------------------------------------------------------------------------------------- streaming


@written_against(STREAMING, "tests/test_train_runs.py::test_a_training_in_the_test_process_leaves_the_process_as_it_was")
def streaming_threads_ended() -> None:
    """Every StreamingDataset alive in this process told to stop its two prefetching threads (its `_event`, which
    streaming itself sets when its iteration fails), and its thread pool shut down, waiting for them. A training
    that stops before its epoch's end leaves them polling until the process exits: a process that trains again
    (the tests' in-process trainings) would keep every earlier training's."""
    import gc

    from streaming import StreamingDataset

    for dataset in [o for o in gc.get_objects() if isinstance(o, StreamingDataset)]:
        if hasattr(dataset, "_event"):
            dataset._event.set()
        if hasattr(dataset, "_executor"):
            dataset._executor.shutdown(wait=True)


@written_against(STREAMING, "tests/test_shm.py::test_a_rank_that_attaches_before_the_block_is_sized_waits_for_it")
def patch_streaming_shared_memory_attach_waits() -> None:
    """streaming's SharedMemory (create=None, as every rank of a dataset's load_state_dict asks for its `_resume`
    block) creates the block or, where another rank just did, attaches after one 7 ms tick: a rank that attaches
    before the creator has sized the block (a resume of several ranks on a loaded machine) fails the job (ValueError:
    cannot mmap an empty file). An attach to a block not sized yet is tried again, for up to 30 s."""
    import time

    from streaming.base.shared import memory

    builtin = memory.BuiltinSharedMemory
    if getattr(builtin, "waits_to_be_sized", False):
        return

    class WaitsToBeSized(builtin):
        waits_to_be_sized = True

        def __init__(self, name=None, create=False, size=0):
            deadline = time.monotonic() + 30
            while True:
                try:
                    super().__init__(name, create, size)
                    return
                except ValueError as err:
                    if create or "empty file" not in str(err) or time.monotonic() > deadline:
                        raise
                    time.sleep(0.01)

    memory.BuiltinSharedMemory = WaitsToBeSized


@written_against(STREAMING, "tests/test_shm.py::test_the_ranks_of_a_job_take_their_leaders_prefix")
def patch_streaming_shm_prefix_from_local_leader() -> None:
    """Every dataset's shared-memory prefix is its local leader's (train/task/shm_registry.py says why):
    StreamingDataset looks get_shm_prefix up in its module, streaming_shm_prefix_from_local_leader answers."""
    from streaming.base import dataset

    dataset.get_shm_prefix = streaming_shm_prefix_from_local_leader


@written_against(STREAMING, "tests/test_shm.py::test_the_ranks_of_a_job_take_their_leaders_prefix")
def streaming_shm_prefix_from_local_leader(streams_local: list, streams_remote: list, world, retry: int = 100):
    """streaming's get_shm_prefix (streaming.base.shared.prefix) with one walk of the registry per node, the local
    leader's, whose number the other ranks of the node take (one all-gather where streaming has a barrier), by its
    private steps: _check_self, _check_and_find_retrying, _get_path, _pack_locals, _unpack_locals."""
    import torch.distributed as dist
    from streaming.base.constant import LOCALS, SHM_TO_CLEAN
    from streaming.base.shared import SharedMemory
    from streaming.base.shared import prefix as shared

    if not (dist.is_available() and dist.is_initialized()):
        return shared.get_shm_prefix(streams_local, streams_remote, world, retry)
    shared._check_self(streams_local)
    found = None
    for _ in range(retry if world.is_local_leader else 0):
        # a prefix found free, registered at once; another job's leader may take it in between (streaming's
        # own walk has the same gap): then the next free one
        found = max(shared._check_and_find_retrying(streams_local, streams_remote, shm_name=name, retry=retry)
                    for name in SHM_TO_CLEAN)
        data = shared._pack_locals(streams_local, found)
        try:
            shm = SharedMemory(shared._get_path(found, LOCALS), True, len(data))
        except FileExistsError:
            continue
        shm.buf[:len(data)] = data
        break
    else:
        if world.is_local_leader:
            raise RuntimeError(f"streaming's shared memory: every free prefix found was taken before it could be "
                               f"registered, {retry} times")
    every = [None] * dist.get_world_size()
    dist.all_gather_object(every, (world.node, found))
    prefix_int = next(n for node, n in every if node == world.node and n is not None)
    name = shared._get_path(prefix_int, LOCALS)
    dist.barrier()
    if not world.is_local_leader:
        shm = SharedMemory(name, False)  # made by the leader before the barrier
        their_locals, _ = shared._unpack_locals(bytes(shm.buf))
        if their_locals != streams_local:
            raise RuntimeError(f"streaming's shared memory {name} holds the local folders {their_locals}, this "
                               f"rank's are {streams_local}: the ranks of a node build their datasets alike")
    return prefix_int, shm


# ------------------------------------------------------------------------------------------------------- torch


@written_against(TORCH, "tests/test_export.py::"
                 "test_two_rank_sharded_checkpoint_exported_on_one_process_scores_the_trainers_eval")
def torch_dcp_read_keys(keys: set, checkpoint_id: str) -> dict:
    """The named keys of a torch distributed checkpoint (a folder of shards) read into this one process, whatever
    the number of ranks that wrote it, without a process group (collective where one is up: every rank calls it):
    torch's own single-process reader, torch.distributed.checkpoint.state_dict_loader._load_state_dict_from_keys."""
    from torch.distributed.checkpoint.state_dict_loader import _load_state_dict_from_keys

    return _load_state_dict_from_keys(set(keys), checkpoint_id=checkpoint_id)


@written_against(TORCH, "tests/test_resume.py::test_one_rank_and_two_ranks_train_alike_batch_by_batch")
def patch_torch_gloo_reduce_scatter_average() -> None:
    """Make a reduce-scatter asked to average over gloo average (torch.distributed.reduce_scatter_tensor, which
    FSDP2 looks up in its module). torch 2.7's gloo sums instead, without a word (pytorch/pytorch#162338), and FSDP2
    asks for the average of fp32 gradients: a CPU run of more than one rank would train on gradients world_size
    times too large, which AdamW mostly hides and gradient clipping (the default norm 1.0) does not. One
    reduce-scatter at the start (every rank alike) tells whether this torch sums; where it does, that process's
    reduce-scatters with AVG on a gloo group become SUM and a division by the group's size (the average, as NCCL
    computes it). Other backends and ops are untouched."""
    import torch
    import torch.distributed as dist

    if not dist.is_initialized() or dist.get_world_size() < 2 or dist.get_backend() != "gloo":
        return
    if getattr(dist.reduce_scatter_tensor, "averages_over_gloo", False):
        return  # already in place (a second start in this process)
    world = dist.get_world_size()
    probe = torch.empty(1)
    dist.reduce_scatter_tensor(probe, torch.ones(world), op=dist.ReduceOp.AVG)
    if probe.item() == 1.0:
        return  # this torch averages
    if probe.item() != float(world):
        raise RuntimeError(f"gloo's reduce-scatter with AVG of ones over {world} ranks gave {probe.item()}: "
                           "neither the average (1) nor the sum; the gradients of FSDP2 would be wrong")
    summing = dist.reduce_scatter_tensor

    def reduce_scatter_tensor(output, input, op=dist.ReduceOp.SUM, group=None, async_op=False):
        if op != dist.ReduceOp.AVG or dist.get_backend(group) != "gloo":
            return summing(output, input, op=op, group=group, async_op=async_op)
        if async_op:  # the division would have to wait for the work: not needed by FSDP2 on CPU
            raise NotImplementedError("an asynchronous reduce-scatter with AVG over gloo (gloo would sum, "
                                      "pytorch/pytorch#162338)")
        work = summing(output, input, op=dist.ReduceOp.SUM, group=group)
        output.div_(dist.get_world_size(group))
        return work

    reduce_scatter_tensor.averages_over_gloo = True
    dist.reduce_scatter_tensor = reduce_scatter_tensor
