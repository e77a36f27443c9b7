"""What runs inside each task (this process for a plain run, one process per device under `-m`):
distributed environment -> data -> llm-foundry's train()."""
import atexit
import contextlib
import logging
import os
import shutil
import stat
import tempfile
from pathlib import Path

from omegaconf import DictConfig, ListConfig, OmegaConf, open_dict

from common import compat, files
from common.collector import imported_without_collections
from common.console import libraries_to_the_log, library_levels, printed_to_the_log
from common.errors import UserError
from common.paths import is_remote
from common.signals import leave_to_the_task_in_every_fork
from train.checkpoint.integrity import RunStopped
from train.config.loaders import loader_keys
from train.task import shards
from train.task.distributed import decided_on_rank_0, export_from_submitit, job_id, requeues
from train.task.foundry import foundry_config

log = logging.getLogger(__name__)


def run(cfg: DictConfig) -> dict:
    # The config was checked on the login node (train.checks.validate: a plan never reaches here, nor a launcher of
    # another plugin with plan set); this task checks only what its allocation alone can see: the mounts, the
    # socket folder, the shards' hashes, the devices (preflight) and the checkpoint it resumes from.
    # A log file on a full file system must not print a traceback per message (logging's default): the
    # writes that matter say so themselves (common/files.py: DiskFull).
    logging.raiseExceptions = False
    os.environ.update({k: _as_the_shell_expands(str(v)) for k, v in cfg.cluster.env.items()})
    dist_env = export_from_submitit()
    shards.check_mounts(cfg)  # on every node, before anything is written there
    if dist_env:
        leave_to_the_task_in_every_fork()  # dataloader workers: only this process answers Slurm's signals
    only = bool(cfg.cluster.preflight.only)  # the checks alone: no data, no trainer
    if cfg.data.kind == "mock" and not only:
        from train.task.mock_data import ensure

        ensure(cfg.variables.data_local, cfg.max_seq_len, cfg.data.train_samples, cfg.data.val_samples)

    fcfg = foundry_config(cfg)
    short_enough_for_sockets(tempfile.gettempdir(), max(
        int(OmegaConf.select(fcfg, f"{loader}.num_workers", default=0) or 0) for loader in loader_keys(fcfg)))
    if dist_env:
        _node_local_cwd(fcfg, dist_env)
    # the libraries this task runs, imported while the GC is paused (common/collector.py says why)
    imported_without_collections("composer", *(() if only else ("llmfoundry.command_utils",)))
    from composer.utils import dist

    _start_dist(fcfg)
    if not only:
        shards.verify_shards(fcfg)  # train and val shards against index.json's hashes, spread over the ranks
    if only or (cfg.cluster.preflight.enabled and dist_env):  # inside jobs only: never on a login node
        from train.task import preflight

        folder = OmegaConf.select(fcfg, "callbacks.run_report.folder") or os.getcwd()  # the run's outputs
        report = preflight.run(cfg, folder)  # may requeue (exits) or raise
        if only:
            from train.task.preflight_report import problem_lines, table

            if dist.get_global_rank() == 0:
                print(table(report), flush=True)
            if not report["ok"]:  # a check that found a fault is no completed job, nor exit 0
                raise UserError("cluster.preflight.only", f"the check failed: {'; '.join(problem_lines(report))}",
                                "fix what it names, or leave the nodes named out of the job "
                                f"(cluster.sbatch_extra.exclude=<node,...>); each start's report: {folder}/preflight.json")
            return {"preflight": report}
    resumed = _choose_resume_point(cfg, fcfg)  # the run's own checkpoint, or None
    if not resumed and not OmegaConf.select(fcfg, "callbacks.continued_from"):  # verified as it was chosen
        _verify_load_path(fcfg)
    from llmfoundry.command_utils import train

    from train.task import shm_registry, spike, tracking
    from train.task.continuation import register as continuation_register
    from train.task.run_report import register

    register()
    continuation_register()
    spike.register()
    compat.patch_llmfoundry_kill_loss_spike(spike.SpikeRule)  # llm-foundry's kill_loss_spike, decided on every rank
    spike.follows(fcfg)
    tracking.register()  # conf/logger/: one tracking run per training run
    tracking.for_this_training(fcfg, resumed, cfg)
    # what building composer's Trainer does for nothing this run uses
    compat.patch_composer_cpu_model_from_proc()
    compat.patch_composer_skip_causal_lm_registry_scan()
    report = Path(fcfg.callbacks.run_report.folder)
    try:
        # llm-foundry prints the whole resolved config (log_config, which also hands it to the tracking loggers
        # as parameters): to the run's log (common/console.py); stdout holds only the run's answer, printed below
        trained = True  # false: it had reached max_duration already (nothing is written then)
        ended = None  # the batch training ended at
        libraries_to_the_log()
        library_levels(fcfg.get("python_log_level"))
        fcfg.python_log_level = None  # applied above; llm-foundry's own would replace the run's log handlers
        with contextlib.redirect_stdout(printed_to_the_log("llmfoundry.config")):
            shm_registry.hold()  # released at INIT (train/task/run_report.py), once the loaders are built
            try:
                while True:  # again from an earlier checkpoint after each rollback over a loss spike
                    try:
                        trainer = train(fcfg)
                        break
                    except RunStopped as err:
                        if not spike.roll_back(err, cfg, fcfg):
                            raise
                    spike.before_the_next_start(fcfg, cfg)
                    with open_dict(fcfg):  # the run's own checkpoint rolled back to (the newest left), whole
                        fcfg.autoresume = True
                        fcfg.callbacks.pop("continued_from", None)
                    tracking.for_this_training(fcfg, _choose_resume_point(cfg, fcfg), cfg)
                ended = int(trainer.state.timestamp.batch.value)
                trainer.close()
            finally:
                shm_registry.release()
                tracking.after_the_trainer()
    except BaseException as err:  # torch's CheckpointException (a sharded write failed on a rank) is no Exception
        from common.files import is_disk_full

        if isinstance(err, RunStopped) and getattr(err, "went_bad", False):  # its fix: the command that continues it
            # from its last good checkpoint
            from train.task.continuation import offered

            raise offered(err, cfg, fcfg) from None
        if isinstance(err, (KeyboardInterrupt, SystemExit, UserError)):
            raise
        if is_disk_full(err) or _checkpoint_would_not_fit(fcfg):
            raise _checkpoint_disk_full(fcfg) from None  # a checkpoint's write, inside composer
        if not isinstance(err, ValueError) or "No training would occur" not in str(err):
            raise
        # the same command again after the run finished: the newest checkpoint is the final one
        if not resumed and fcfg.get("load_path") and not is_remote(fcfg.get("save_folder") or ""):
            # not this run's own checkpoint (a remote save folder's is composer's autoresume, not known here):
            # load_path= of another, already at this max_duration; this run has trained nothing and has no
            # numbers of its own to print
            raise UserError("max_duration", f"the checkpoint load_path={fcfg.load_path} is already at "
                            f"max_duration={fcfg.max_duration}: nothing would be trained",
                            "a max_duration past that checkpoint's batch (to train on from it)") from None
        trained = False
        from train.checkpoint import resume
        from train.checks.core import batches_in
        from train.config.storage_args import exports

        at, end = resume.batch_of(fcfg.load_path), batches_in(fcfg, str(fcfg.max_duration).strip())
        past = (f" It was trained on past it since (run_name= continued it), to batch {at}." if at is not None
                and end is not None and at > end else "")
        hf = (fcfg.get("callbacks") or {}).get("hf_checkpointer")
        out = str(hf.get("save_folder") or "") if hf else ""
        if out and not is_remote(out) and at is not None and not exports(
                Path(out), at, hf.get("huggingface_folder_name"), fcfg.run_name):
            # export=hf added to a finished run's command: the trainer that would write it does not run
            past += (f" Nothing is exported either (export=hf writes at the end of training): python -m "
                     f"train.export {fcfg.run_name} writes the Hugging Face folder of that checkpoint.")
        log.warning(f"{fcfg.run_name} already trained to max_duration={fcfg.max_duration} (checkpoint "
                    f"{fcfg.load_path}): nothing to do.{past} To train this run longer, add run_name={fcfg.run_name} and "
                    f"a larger max_duration to the command (the run name is kept, so it resumes from this "
                    f"checkpoint; the LR schedule follows the new max_duration). To start afresh, pass another "
                    f"run_name. The numbers printed are that run's, from its own evaluation settings (settings of "
                    f"evaluation do not make another run): to score it under others, python -m train.evaluate "
                    f"{fcfg.run_name} --data <MDS folder>.")
    metrics = files.read_json(report / "metrics.json", strict=True)  # the run's answer: a damaged one is said
    where = report / "metrics.json"
    if dist.get_global_rank() == 0:
        from train.launch import finished

        if trained:  # a sweep run again submits nothing for this point (train/launch/finished.py)
            finished.write(fcfg.save_folder, fcfg.max_duration, report, metrics, ended)
        else:
            # Already trained: the numbers of the start that finished at the checkpoint it stands at, as its
            # finished.json keeps them (whatever max_duration that start had: one continued past this command's).
            # This command's outputs folder may hold an earlier stretch's (a run continued under -m, whose outputs
            # go to the sweep's folder, then run plainly: its report folder holds an earlier batch's numbers).
            # A report folder two runs share (hydra.run.dir= the same) holds the other's metrics.json: the run's own
            # finished.json where it records this batch, else a metrics.json of this run only.
            from train.launch.sweep_app import of_run

            last = finished.last(fcfg.save_folder)  # `at`: the batch of the checkpoint it stands at, found above
            ours = of_run(metrics, fcfg.run_name)
            if last and last.get("batch") == at and last.get("metrics") and (not ours or metrics.get("batches") != at):
                metrics = last["metrics"]
                report = Path(last["report"]) if last.get("report") else report
                where = report / "metrics.json" if ours else Path(fcfg.save_folder) / finished.FILE
            elif metrics and not ours:
                raise RunStopped("hydra.run.dir", f"{report / 'metrics.json'} is run {metrics.get('run_name')}'s (its "
                                 f"report folder is shared with this one), and {fcfg.run_name}'s {finished.FILE} "
                                 f"records no numbers of its checkpoint {fcfg.get('load_path')} (batch {at}): this "
                                 "run's numbers are not known here",
                                 f"python -m train.evaluate {fcfg.run_name} --data <MDS folder> scores that "
                                 "checkpoint; give each run a report folder of its own (hydra.run.dir)")
            if metrics and at is not None and metrics.get("batches") not in (None, at):
                log.warning("the numbers printed are of batch %s (%s), the last this run recorded; its checkpoint "
                            "%s is of batch %s: no start that finished there recorded its own", metrics["batches"],
                            where, fcfg.get("load_path"), at)
            from train.checkpoint.integrity import check_eval

            # a run stopped by its final evaluation's non-finite loss, whose final checkpoint is its only one (none
            # before it to go back to): that checkpoint stands at max_duration, but its numbers are not a result
            check_eval(metrics.get("final_eval") or {}, f"batch {at}", after_fit=True, batch=at)
        print(f"\nfinal train loss {_rounded(metrics.get('final_train_loss'))}, "
              f"eval {_rounded(metrics.get('final_eval'))}\n"
              f"checkpoints: {_shown(fcfg.save_folder) if fcfg.save_folder else 'none (checkpoint=none)'}\n"
              f"loss curve:  {_shown(report / 'loss_curve.png')}\nmetrics:     {_shown(where)}",
              flush=True)  # the run's answer: stdout (metrics.json holds every number unrounded)
    return metrics


def _rounded(value):
    """Numbers as a person reads them: three significant digits (3.33, 26.2, 0.248)."""
    if isinstance(value, dict):
        return {k: _rounded(v) for k, v in value.items()}
    return float(f"{value:.3g}") if isinstance(value, float) else value


def _shown(path) -> str:
    """A path under the working directory as relative to it (runs/checkpoints/...), any other whole."""
    try:
        return str(Path(path).resolve().relative_to(Path.cwd().resolve()))
    except ValueError:
        return str(path)


def _start_dist(fcfg) -> None:
    """Join the process group before llm-foundry does (it reuses it: same device, same timeout), so that rank 0
    can choose the resume point while the others wait."""
    from composer.utils import dist, get_device

    dist.initialize_dist(get_device(None), timeout=float(fcfg.get("dist_timeout") or 600.0))
    compat.patch_torch_gloo_reduce_scatter_average()  # FSDP2's gradients on CPU: the ranks' mean, not their sum


def _choose_resume_point(cfg, fcfg) -> str | None:
    """Claim the save folder for this run (one writer at a time), then resume from the newest checkpoint in it
    that is complete (train/checkpoint/resume.py) and matches its manifest (train/checkpoint/integrity.py), instead of composer's
    `latest` link. Rank 0 claims and moves files; verifying is shared by all ranks, each hashing the files it
    would own. A checkpoint that does not verify is set aside and the one before it tried; when checkpoints
    failed and none verified, the run stops naming them: it never trains from scratch over them. Applies to
    the local save folders and default file names this tool writes; anything else (a remote save_folder, a
    custom save_filename) is left to composer. Returns the checkpoint it resumes from, or None."""
    folder = fcfg.get("save_folder")
    if not folder or is_remote(folder):
        return None
    from composer.utils import dist

    from train.checkpoint import integrity, resume
    from train.config import identity
    from train.plan.estimate import sharded_checkpoints
    from train.task import shards

    rank, world = dist.get_global_rank(), dist.get_world_size()
    # A requeued job (its time limit, a preemption, a node lost) always continues: with autoresume=false (as
    # llm-foundry's examples set it) each allocation would train the same first batches again, exit 0. It continues
    # the checkpoints its own job trained alone: those an earlier run left in the folder are not its own.
    job = job_id() if requeues() > 0 else None  # the form the manifests record (train/checkpoint/integrity.py)
    ours = resume.goes_on(fcfg, job)
    only_job = None if fcfg.get("autoresume") else job
    reads_sharded = sharded_checkpoints(fcfg, world)  # as the login node's check of load_path reads it
    decided_on_rank_0(resume.claim, folder)  # FolderInUse, raised on every rank

    def newest():
        from train.task.spike import finish_pending

        finish_pending(folder)  # a rollback recorded before a kill: its later checkpoints set aside first
        ckpt = resume.newest_complete(folder, reads_sharded, tidy=True, job=only_job)
        return ckpt, integrity.read_manifest(ckpt.path) if ckpt else None

    chosen, rejected, redone = None, [], False
    while ours:
        ckpt, manifest = decided_on_rank_0(newest)
        if ckpt is None:
            break
        # against its manifest; without one (a kill between its last file and its manifest, a copy without
        # them), by the CRCs torch wrote into it: never resumed from, and certified, on its structure alone
        whys = integrity.differs_on_any_rank(ckpt.path, manifest)
        if whys:
            rejected.append((ckpt.path, whys[0]))
            if rank == 0:
                resume.set_aside(ckpt, whys[0])
            continue
        redo = decided_on_rank_0(_end_not_reached, ckpt, fcfg, not rejected and not redone)
        if not redo:
            chosen = ckpt
            break
        redone = True
        if rank == 0:  # every format of that batch (a consolidated file beside its shards), or it is chosen next
            for same in [c for c in resume.find(folder) if c.batch == ckpt.batch]:
                resume.set_aside(same, redo)
    if rejected and chosen is None:
        raise integrity.RunStopped("save_folder", f"no checkpoint in {folder} is what was written: " + "; ".join(
            f"{p.name}: {why}" for p, why in rejected) + f" (set aside in {Path(folder) / resume.SET_ASIDE}, "
            "not deleted); the run did not start from batch 0 over them",
            "restore the checkpoint files from a copy (then move them back), or start afresh under another "
            "run_name")
    parent = None  # continue_from=: another run's checkpoint, for a start with none of its own
    if chosen is None and cfg.get("continue_from"):
        from train.task import continuation

        parent = continuation.choose(cfg, folder, reads_sharded)

    def record_and_load_path():  # a conversion or the record may fail (a full disk): every rank hears it
        # what the run is: the record the checkpoint resumed from carries (it travels with it), else identity.json,
        # else another of its checkpoints' manifests; a checkpoint of a run none of them establishes could be of
        # other data or settings
        before = (integrity.run_of(chosen.path) if chosen else {}) or resume.run_record(folder)
        if chosen and not isinstance(before.get("identity"), dict):
            raise integrity.RunStopped(
                "save_folder", f"what run {chosen.path} belongs to cannot be established: "
                f"{Path(folder) / identity.RECORD} is missing or unreadable and no manifest carries the run's record; "
                "continuing it could go on with other data or settings than it trained on, so nothing was trained",
                f"put {identity.RECORD} back from a copy of the run's folder; or train from its weights as another "
                f"run: run_name=<a new name> load_path={chosen.path} +load_weights_only=true")
        if chosen and integrity.read_manifest(chosen.path) is None:
            # a kill between its last file and its manifest (composer's `latest` link already on it), or copied
            # without it: its content matched the CRCs torch wrote (above), so it is resumed from rather than lost,
            # and hashed now for every later start
            log.warning("%s has no manifest: its content matches the CRCs torch wrote into it; resuming from it "
                        "and writing its manifest now", chosen.path)
            integrity.write_manifest(chosen.path, run=before)
        data = shards.train_data(fcfg)
        if chosen:  # the data it goes on with is the data it trained on
            shards.same_train_data(before.get("train_data"), data, fcfg, chosen.path)
        scored = _samples_scored(fcfg, world)
        if chosen and scored is not None and before.get("eval_samples") not in (None, scored):
            log.warning("the evaluations from batch %d on score %s of the validation data, the run's earlier "
                        "ones %s (composer scores eval_subset_num_batches batches of device_eval_batch_size "
                        "samples on each rank): the eval curve and the final evaluation are not comparable "
                        "with the earlier evaluations (eval_subset_num_batches=-1 scores the whole split at any "
                        "world size)", chosen.batch, _said(scored), _said(before["eval_samples"]))
        path = resume.in_format(chosen, reads_sharded) if chosen else None
        ours_now = identity.identity(cfg)
        # where a run with continue_from= came from, kept by every later start (train/task/continuation.py)
        lineage, from_path, same_data = before.get("continued_from"), None, True
        if parent:
            from train.config.continuation import same_data as same
            from train.task import continuation

            lineage = parent[1]
            same_data = same(identity.spelt_once(parent[2].get("identity") or {}), ours_now)
            from_path = continuation.in_format(parent[0], reads_sharded, folder)
        elif chosen and lineage:
            from train.task import continuation

            continuation.tidy(folder)  # its own checkpoint now: the conversion of the other run's is not read again
        identity.write_record(folder, fcfg.run_name, _model_choice(), ours_now,
                              **({"train_data": data} if data else {}), eval_samples=scored,
                              **({"continued_from": lineage} if lineage else {}))
        return path, from_path, lineage, same_data

    path, from_path, lineage, same_data = decided_on_rank_0(record_and_load_path)
    if lineage and OmegaConf.select(fcfg, "callbacks.run_report") is not None:
        from train.config.continuation import said

        # the run's reports say where it came from (metrics.json, progress.json)
        OmegaConf.update(fcfg, "callbacks.run_report.continued_from", said(lineage), force_add=True)
    if from_path:
        from train.task import continuation

        continuation.load_from(fcfg, from_path, lineage, same_data)
    if only_job and rank == 0:
        log.warning("autoresume=false, but this start is a requeue of job %s (SLURM_RESTART_COUNT=%s): it %s", job,
                    requeues(), f"continues the checkpoints its own job trained, from "
                    f"{path}" if path else "starts from batch 0 (its job trained no checkpoint yet)")
    if path:
        # as composer's autoresume does: the whole state of the run's own checkpoint, whatever load_* said
        fcfg.load_path, fcfg.load_weights_only, fcfg.load_ignore_keys = path, False, None
        # what is logged is what happened: composer is told autoresume=false (it must not follow its link), and
        # the config it logs says where this start resumed from
        OmegaConf.update(fcfg, "variables.resumed_from", path, force_add=True)
        log.info("resuming from %s", path)
    if ours:
        fcfg.autoresume = False  # the choice is made; composer must not follow a stale link instead
    return path


def _verify_load_path(fcfg) -> None:
    """A checkpoint named by load_path= (another run's, a consolidated file) is checked as one resumed from is:
    against its manifest where it has one (each rank hashing its share), else by its structure and a single file's
    zip CRCs. One that does not verify stops the run naming the file before any weight is read: torch loads
    damaged weights without a word, and the run would train on from them, exit 0."""
    load = fcfg.get("load_path")
    if not load or is_remote(load) or not Path(str(load)).exists():
        return  # a remote one is composer's to read; a missing one composer's error names
    from train.checkpoint import integrity, resume

    path = Path(str(load))
    whys = resume.differs_everywhere(resume.Checkpoint(path, -1, -1, sharded=path.is_dir()))
    if whys:
        why = whys[0] if str(path) in whys[0] else f"{path}: {whys[0]}"
        raise integrity.RunStopped("load_path", f"{why}; nothing was trained from it",
                                   "an intact copy of that checkpoint, or an earlier one")
    _same_shape(fcfg, path)


def _same_shape(fcfg, path: Path) -> None:
    """The model load_path holds against this run's, from the config composer stores in the checkpoint itself: the
    checks compare them where the checkpoint's folder records its run (identity.json), and a file copied elsewhere
    (`train.consolidate --out FILE`) has none. composer loads what matches and leaves the rest: an untied
    model's checkpoint loaded into a tied run drops its output layer and trains on at a higher loss, exit 0.
    Skipped where the command asks for a partial load (load_strict_model_weights=false, load_ignore_keys)."""
    if fcfg.get("load_strict_model_weights") is False or fcfg.get("load_ignore_keys"):
        return
    from composer.utils import dist
    from omegaconf import OmegaConf

    from train.checkpoint.resume import model_keys, stored_model
    from train.checks.checkpoints import other_function, other_shape

    # torch's reader of a sharded checkpoint is collective where a process group is up: every rank reads
    held = stored_model(path) if path.is_dir() else decided_on_rank_0(stored_model, path)
    if held is None:
        return
    ours = model_keys(OmegaConf.to_container(fcfg.model, resolve=True))
    shape, function = other_shape(held, ours), other_function(held, ours)
    if function and not shape and dist.get_global_rank() == 0:
        log.warning(f"load_path: {path} holds weights trained under other model settings ({function}, as the "
                    "checkpoint records): they load (the same sizes) but compute something else in this model")
    if shape:
        raise UserError("load_path", f"{path} holds a model of another shape than this one ({shape}, as the "
                        "checkpoint records): loading it would leave weights out, or fail", "the model settings of "
                        "the run that wrote it; or +load_strict_model_weights=false +load_weights_only=true to load "
                        "the weights that match (a grown model)")


def _samples_scored(fcfg, world: int):
    """How much of the validation data an evaluation scores: "all" of it (eval_subset_num_batches -1, llm-foundry's
    default), else eval_subset_num_batches x device_eval_batch_size x ranks samples, the first of each rank's share,
    so other ones at another world size or eval batch size."""
    if not fcfg.get("eval_loader") and not fcfg.get("eval_loaders"):
        return None  # no evaluation of the validation data
    n = fcfg.get("eval_subset_num_batches", -1)
    if n is None or n < 0:
        return "all"
    # llm-foundry's default eval batch is the training microbatch it trains with (reduced to a rank's share)
    from train.plan.estimate import microbatch_trained

    size = fcfg.get("device_eval_batch_size") or microbatch_trained(fcfg, world)
    return n * size * world if isinstance(size, int) and not isinstance(size, bool) else None


def _said(scored) -> str:
    return "all" if scored == "all" else f"{scored} samples"


def _end_not_reached(ckpt, fcfg, newest: bool = True) -> str | None:
    """Why the run must not resume from `ckpt`, its final checkpoint, though the file is sound: the run stopped
    after it and before its end (no finished.json of this batch: one past it is of a training whose later
    checkpoints are gone). composer writes the final checkpoint
    before what comes at the end of fit: the evaluation at the last batch when max_duration is not a multiple of
    eval_interval, the Hugging Face export, metrics.json and the trackers' last numbers. Resuming from it would
    find nothing to train and report the evaluation before as the final one, exit 0. The batches since the
    checkpoint before are trained again instead (at most save_interval). newest: no later checkpoint was found by
    this start (set aside); where the duration's end cannot be told in batches (epochs, wall-clock time), the newest
    is taken for the final one. None: resume from it."""
    from train.checkpoint import integrity, resume
    from train.checks.core import batches_in, time_of
    from train.launch import finished

    # in the duration's own unit, from where the checkpoint stands as its manifest records it (a tok run killed
    # after its final checkpoint would otherwise report the evaluation before as its final one, exit 0, on every
    # rerun); a manifest without it (hashed on a later start, or written without that record) in batches at this
    # command's batch size, as then no batch size changed since
    duration = str(fcfg.get("max_duration")).strip()
    time = time_of(duration)
    at, end = integrity.stands_at(ckpt.path, time[1]) if time else None, batches_in(fcfg, duration)
    if at:
        if not at[0] < time[0] <= at[1]:  # this command's final one: the batch that ended at it reached it, not the one before
            return None
    elif end is not None:
        if end != ckpt.batch:
            return None  # not this command's final one (past it: the run was trained longer; nothing to do)
    elif not newest or (time and time[1] == "ep" and not time[0] - 1 <= ckpt.epoch <= time[0]):
        # in epochs or wall-clock time the end is not known in batches: the newest checkpoint may be the final one
        # (resumed from, a run killed in its final evaluation printed the evaluation before as its final one, exit 0,
        # on every rerun). composer names a checkpoint by the epochs done: the epoch's last batch saved at its batch
        # interval is named before the epoch ends (ep0-ba64 of a 1ep run), so the epoch before counts too
        return None
    if finished.ended_at_checkpoint(ckpt.path.parent, fcfg) == ckpt.batch:
        return None  # the run reached its end at this batch
    found = resume.find(ckpt.path.parent)
    # A finished.json past its final checkpoint is of a training whose later checkpoints are gone (deleted by
    # hand to go back, then this shorter one stopped after its final checkpoint): not this one's end (its numbers
    # would be printed as this run's, exit 0). Past a later checkpoint, this is no final one (returned above).
    what = (f"the final one (batch {ckpt.batch})" if at or end is not None else f"the newest (batch {ckpt.batch}) "
            f"and, as max_duration={duration} is not told in batches, taken for the final one")
    why = (f"it is {what} of a run that stopped before its end (no {finished.FILE} of "
           "it): what comes after it (the evaluation at the end, the export, the report) never ran, and resuming "
           "from it would skip them")
    if any(c.batch < ckpt.batch and resume.problem(c) is None for c in found):
        return why + "; the last batches are trained again from the checkpoint before"
    interval = str(fcfg.get("save_interval")).strip()
    every, epochs = batches_in(fcfg, interval), time_of(interval)
    if (ckpt.batch <= every if every is not None else bool(epochs) and epochs[1] == "ep" and ckpt.epoch <= epochs[0]):
        # the run's one checkpoint ever: the whole run is its last batches
        return why + f"; no checkpoint came before it, so the run trains its {ckpt.batch} batches again from batch 0"
    log.warning("the run stopped after its final checkpoint %s and before its end (no %s): its final "
                "evaluation, export and report may be missing, and no earlier checkpoint is left to train its "
                "last batches again from (save_num_checkpoints_to_keep); the numbers printed are those of the last "
                "evaluation it recorded", ckpt.path, finished.FILE)
    return None


def _model_choice() -> str | None:
    try:
        from hydra.core.hydra_config import HydraConfig

        from train.config.identity import label

        return label(HydraConfig.get().runtime.choices)
    except Exception:
        return None


def _checkpoint_size(fcfg) -> int | None:
    """Bytes of the newest complete checkpoint in the save folder, or None."""
    from train.checkpoint import integrity, resume

    folder = fcfg.get("save_folder")
    if not folder or is_remote(folder):
        return None
    done = next((c for c in resume.newest_first(folder) if resume.problem(c) is None), None)
    if done is None:
        return None
    path = done.path
    return sum((path / n if path.is_dir() else path).stat().st_size for n in integrity.files_of(path))


def _checkpoint_would_not_fit(fcfg) -> bool:
    """Whether the save folder's file system has less room than a checkpoint takes: torch's writer reports a full
    disk as `RuntimeError: [enforce fail at inline_container.cc] unexpected pos`, without the OSError."""
    from common.files import free_bytes

    size, folder = _checkpoint_size(fcfg), fcfg.get("save_folder")
    free = free_bytes(folder) if size else None
    return free is not None and free < size


def _checkpoint_disk_full(fcfg):
    """A checkpoint that did not fit: the folder, about what it needs (the newest complete one's size), what is
    free, and that resuming after making room is exact."""
    from common.files import DiskFull

    return DiskFull.at(Path(fcfg.save_folder), _checkpoint_size(fcfg),
                       what="a checkpoint (about as large as the newest one)",
                       fix="free space there (or raise the quota), or set save_num_checkpoints_to_keep lower; then "
                       "run the same command again: it resumes exactly from the newest complete checkpoint (the "
                       "cut-off one is set aside)")


def _as_the_shell_expands(value: str) -> str:
    """`$NAME` / `${NAME}` as the job script's `export` expanded them (train/launch/executor.py), an unset one to
    nothing: os.path.expandvars keeps it as written, so a task set `$UNSET` literally over the script's ""."""
    from train.launch.executor import VARIABLE

    return VARIABLE.sub(lambda m: os.environ.get(m.group(1) or m.group(2), ""), value)


def _node_local_cwd(fcfg, env: dict) -> None:
    """composer and llm-foundry sync the ranks of a node through signal files in the working directory,
    named alike on every node: in a directory shared by several nodes they collide. Give each node its own,
    after making the config's relative paths absolute."""
    for key in ("save_folder", "load_path", "variables.data_local", "variables.data_remote", "eval_gauntlet",
                "callbacks.hf_checkpointer.save_folder",  # else the Hugging Face folders go with the scratch folder
                "callbacks.tracking.save_folder",  # else its record of logged values
                *(f"{loader}.dataset.{where}" for loader in loader_keys(fcfg) for where in ("local", "remote")),
                "tokenizer.name"):
        value = OmegaConf.select(fcfg, key)
        if _relative(value) and (key != "tokenizer.name" or os.path.exists(value)):  # else a hub name
            OmegaConf.update(fcfg, key, os.path.abspath(value))
    # ICL tasks: a file of them is read here, so that each task's dataset_uri (relative to the working directory,
    # as llm-foundry opens it) can be made absolute too; llm-foundry reads the same list from the file.
    tasks = OmegaConf.select(fcfg, "icl_tasks")
    if isinstance(tasks, str) and not is_remote(tasks):
        tasks = OmegaConf.load(tasks).icl_tasks
    if isinstance(tasks, ListConfig):
        for task in tasks:
            if isinstance(task, DictConfig) and _relative(task.get("dataset_uri")):
                task.dataset_uri = os.path.abspath(task.dataset_uri)
        OmegaConf.update(fcfg, "icl_tasks", tasks, merge=False)
    job = job_id() or env["MASTER_PORT"]
    base, name = Path(tempfile.gettempdir()), f"pretrain-{os.getuid()}-{job}-node{env['NODE_RANK']}"
    scratch, held = held_scratch(base / name)
    os.chdir(scratch)
    if env["LOCAL_RANK"] == "0":  # the node's ranks share it; the last to need it removes it
        atexit.register(shutil.rmtree, scratch, ignore_errors=True)
        if held:
            remove_stale_scratch(base, own=name)


# The scratch folders' locks, open for as long as this process lives (see held_scratch).
_HELD: list[int] = []


def held_scratch(path: Path) -> tuple[Path, bool]:
    """`path` made private (private_dir) and held: a shared flock on the folder itself, which the kernel lets go
    when this process ends, SIGKILL included. (path, whether the file system took the lock.) Another job's
    remove_stale_scratch may remove the folder between our mkdir and our lock (its exclusive lock came first),
    even before we open it: then it is made again."""
    import fcntl

    while True:
        path = private_dir(path)
        try:
            fd = os.open(path, os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW)
        except FileNotFoundError:
            continue
        try:
            fcntl.flock(fd, fcntl.LOCK_SH)
        except OSError as err:  # a file system without flock on folders: used unheld, nothing removed
            os.close(fd)
            log.debug("scratch folder %s not locked (%s)", path, err)
            return path, False
        with contextlib.suppress(FileNotFoundError):
            now, locked = os.stat(path), os.fstat(fd)
            if (now.st_dev, now.st_ino) == (locked.st_dev, locked.st_ino):
                _HELD.append(fd)
                return path, True
        os.close(fd)


def remove_stale_scratch(base: Path, own: str) -> list[Path]:
    """Remove this user's scratch folders in `base` that no process holds: a job killed with SIGKILL (scancel
    after its grace, the OOM killer, a node's reboot of the job) never runs the atexit that removes its folder,
    and each would stay on the node's disk. Each is removed under an exclusive lock, so a job starting on that
    folder waits and makes it again (held_scratch)."""
    import fcntl

    removed = []
    for path in base.glob(f"pretrain-{os.getuid()}-*-node*"):
        if path.name == own:
            continue
        try:
            fd = os.open(path, os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW)
        except OSError:  # not a folder, a link, or gone
            continue
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)  # fails while any rank of a live job holds it
            if os.fstat(fd).st_uid == os.getuid():
                shutil.rmtree(path, ignore_errors=True)
                removed.append(path)
        except OSError:
            pass
        finally:
            os.close(fd)
    if removed:
        log.info("removed %d scratch folder(s) of this user's jobs that ended without removing them: %s",
                 len(removed), ", ".join(p.name for p in removed))
    return removed


def _relative(value) -> bool:
    """A relative path (not a URI): relative to the working directory the task leaves."""
    return isinstance(value, str) and not is_remote(value) and not os.path.isabs(value)


# A socket's path holds at most 107 bytes (sun_path). Loader workers hand each batch to their rank over a socket
# Python's multiprocessing makes as <temp folder>/pymp-XXXXXXXX/listener-XXXXXXXX (32 bytes more); when that path
# is too long the worker's feeder thread fails (`OSError: AF_UNIX path too long`) and the rank waits for its batch
# forever: a run that hangs without a word, past dist_timeout (nothing is in a collective).
_SOCKET_PATH_MAX, _MP_SOCKET_SUFFIX = 107, len("/pymp-XXXXXXXX/listener-XXXXXXXX")


def short_enough_for_sockets(tmp: str, workers: int) -> None:
    """Refuse, at the start, a temporary folder too long for the sockets loader workers need."""
    longest = len(os.fsencode(tmp)) + _MP_SOCKET_SUFFIX
    if workers > 0 and longest > _SOCKET_PATH_MAX:
        raise UserError("TMPDIR", f"{tmp} is too long for the sockets the data loader workers hand batches over "
                        f"({longest} bytes with multiprocessing's names, the limit is {_SOCKET_PATH_MAX}): each "
                        "rank would wait for its first batch forever",
                        "export TMPDIR=/tmp (or another short path) before the command, or "
                        "train_loader.num_workers=0 eval_loader.num_workers=0")


def private_dir(path: Path) -> Path:
    """`path`, created (or found) as a folder only this user can enter. Every local rank of a job derives the
    same name, so it cannot be random; a folder of that name made by someone else (or a link) is refused
    instead of used."""
    path.mkdir(mode=0o700, parents=True, exist_ok=True)
    st = os.lstat(path)
    if not stat.S_ISDIR(st.st_mode) or st.st_uid != os.getuid() or st.st_mode & 0o077:
        raise RuntimeError(f"scratch folder {path} exists but is not a private folder of this user "
                           f"(mode {stat.S_IMODE(st.st_mode):o}, owner uid {st.st_uid}): remove it, or set TMPDIR")
    return path
