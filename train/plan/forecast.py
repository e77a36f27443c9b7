"""The plan's figures (`plan=true` / `plan=json`): what a run would need and take, from the config alone. Starts
and submits nothing; train/plan/forecast_report.py words and prints them.

Light (no torch, no llm-foundry): model arithmetic from train.plan.estimate, the sbatch script from train.launch.executor.
The plan describes the job `-m` would submit: cluster.nodes x cluster.tasks_per_node ranks.
"""
import math

from omegaconf import DictConfig, OmegaConf

from common.paths import is_remote
from train.checks.core import batches_in, per_batch, time_of, value
from train.plan import estimate
from train.plan.estimate import TiB

# Published GPT-3 175B checkpoint from the Megatron-LM recipe, to set our figure beside.
MEGATRON_GPT3_CHECKPOINT_BYTES = int(2.3 * TiB)


def _submitit_folder() -> str:
    """Where a `-m` run started now would keep its job files (the launcher's submitit_folder)."""
    try:
        from hydra.core.hydra_config import HydraConfig

        hydra = HydraConfig.get()
        sweep = f"{hydra.sweep.dir}"
        # the launcher's own setting, `${hydra.sweep.dir}/.submitit/%j` by default (Hydra's config node alone
        # cannot resolve an interpolation of the whole config's `hydra.`: read it as written)
        raw = OmegaConf.select(hydra, "launcher", default=None)
        raw = OmegaConf.to_container(raw, resolve=False).get("submitit_folder") if raw is not None else None
        folder = str(raw or "${hydra.sweep.dir}/.submitit/%j").replace("${hydra.sweep.dir}", sweep)
        return folder if "${" not in folder else f"{sweep}/.submitit/%j"
    except Exception:
        return "<sweep dir>/.submitit/%j"


def build_plan(cfg: DictConfig, problems=()) -> dict:
    """Every figure of the plan, as plain JSON-able values. problems: the checks' warnings, reported with it."""
    from train.checks import continuation
    from train.launch import spec
    from train.launch.finished import read as read_finished

    folder = _submitit_folder()
    run = spec.of(cfg, folder)  # how and where it runs: the job's resources, whether `-m` waits
    model = OmegaConf.to_container(value(cfg, "model"), resolve=True)
    seq = estimate.trained_seq_len(cfg)  # what the train loader cuts samples to, so what a step holds
    params = estimate.param_count(model)
    fpt = estimate.flops_per_token(model, seq)
    nodes, tasks = run.resources.nodes, run.resources.tasks_per_node
    world = run.world_size
    gbs = value(cfg, "global_train_batch_size")
    per_device = gbs / world
    per_device = int(per_device) if per_device == int(per_device) else per_device
    mb = estimate.microbatch_trained(cfg, world)  # llm-foundry reduces one larger than a rank's share
    grad_accum = None
    if isinstance(mb, int) and isinstance(per_device, int) and mb > 0:
        grad_accum = -(-per_device // mb)  # a share that is no multiple of it ends each step with a smaller one
    tokens_per_step = gbs * seq
    duration = value(cfg, "max_duration")
    # as composer counts max_duration ("2e3ba" is 2000 batches, tokens in whole batches); none for epochs (the data
    # set's size decides) and wall-clock times
    steps = batches_in(cfg, duration)
    tokens = steps * tokens_per_step if steps is not None else None

    # memory
    fig = estimate.fit(cfg, world)
    precision = value(cfg, "precision")
    act_bytes = estimate.activation_element_bytes(precision)
    mb_int = estimate.counted_microbatch(mb)
    fsdp = value(cfg, "fsdp_config")
    ac = estimate.checkpoints_activations(estimate.fsdp_used(cfg, world))

    # checkpoint
    # llm-foundry's own key decides (the checkpoint group only sets its default; composer's is full)
    kind = (value(cfg, "fsdp_config.state_dict_type") or "full") if fsdp else value(cfg, "checkpoint.state_dict_type")
    sharded = estimate.sharded_checkpoints(cfg, world)
    ckpt = estimate.checkpoint_bytes(params)
    write_gbps, file_gbps = value(cfg, "storage.write_GBps"), value(cfg, "storage.file_GBps")
    write_s = estimate.write_seconds(ckpt, sharded=sharded, ranks=world, write_GBps=write_gbps,
                                     file_GBps=file_gbps)
    save_folder = value(cfg, "save_folder")

    resumes = _resumes(cfg, duration, tokens_per_step)

    # time
    peak, mfu = value(cfg, "cluster.peak_flops"), value(cfg, "cluster.mfu")
    tps_gpu = peak * mfu / fpt if peak and mfu else None
    step_s = estimate.step_seconds(cfg, world)
    train_s = step_s * steps if step_s and steps else None
    if step_s and resumes and resumes["steps_left"] is not None:
        resumes["seconds_left"] = step_s * resumes["steps_left"]

    from train.checks.checkpoints import checkpoints_kept, free_bytes, save_schedule

    # when composer writes them, in batches, whatever save_interval's unit (its last one at the end of training:
    # 25 batches every 10 are 3 checkpoints)
    schedule = save_schedule(cfg, step_s)
    saves = schedule["count"] if schedule else 0
    kept, kept_bytes = checkpoints_kept(cfg, step_s=step_s)
    storage_root, free = free_bytes(cfg)

    plan = {
        "run_name": value(cfg, "run_name"),
        "model": estimate.summary(model),
        "params": params,
        "flops_per_token": fpt,
        "flops_per_token_6n": 6 * params,
        "flops_per_token_attention": fpt - 6 * params,
        "cluster": value(cfg, "cluster.name"),
        "gpu": value(cfg, "cluster.gpu"),
        "nodes": nodes,
        "tasks_per_node": tasks,
        "world_size": world,
        "global_train_batch_size": gbs,
        "per_device_batch": per_device,
        "device_train_microbatch_size": mb,
        "grad_accum": grad_accum,
        "max_seq_len": seq,
        "tokens_per_step": tokens_per_step,
        "max_duration": duration,
        "steps": steps,
        "tokens": tokens,
        "precision": precision,
        "sharding_strategy": fsdp.get("sharding_strategy") if fsdp else None,
        "activation_checkpointing": ac,
        "memory_per_gpu_bytes": fig["memory"]["total"] if fig else None,
        "memory_breakdown_bytes": ({k: fig["memory"][k] for k in ("params", "grads", "optimizer", "gathered",
                                                                   "activations", "runtime")} if fig else None),
        "activation_bytes_with_checkpointing": estimate.activation_bytes(model, mb_int, act_bytes, True, seq),
        "activation_bytes_without_checkpointing": estimate.activation_bytes(model, mb_int, act_bytes, False, seq),
        "gpu_memory_bytes": fig["gpu_memory_bytes"] if fig else None,
        "usable_memory_bytes": fig["usable_bytes"] if fig else None,
        "memory_headroom": estimate.HEADROOM,
        "fits": fig["fits"] if fig else None,
        "min_nodes": fig["min_nodes"] if fig else None,
        "min_nodes_batch": fig["min_nodes_batch"] if fig else None,
        "checkpoint": kind if save_folder else None,
        "save_folder": save_folder,
        "checkpoint_bytes": ckpt,
        "checkpoint_bytes_per_rank": ckpt // world if sharded else None,
        "checkpoint_files": world if sharded else 1,
        # what is on disk at this world size, and what a resume at another world size does with it
        "checkpoint_layout": (None if not save_folder else
                              "sharded: ep{E}-ba{B}/ with one .distcp per rank; resumes at any rank count "
                              "(at one rank it is consolidated into one file first)" if sharded else
                              "one file ep{E}-ba{B}-rank0.pt (world size 1: llm-foundry trains without FSDP, so "
                              "checkpoint=sharded writes one file here); resumed at more ranks with "
                              "checkpoint=sharded it is converted into shards first" if kind == "sharded" else
                              "one file ep{E}-ba{B}-rank0.pt written by rank 0; resumes at any rank count"),
        "megatron_checkpoint_bytes": estimate.MEGATRON_BYTES_PER_PARAM * params,
        **_export(cfg, params),
        "storage_tier": value(cfg, "storage.tier"),
        "write_GBps": write_gbps,
        "file_GBps": file_gbps,
        "checkpoint_write_seconds": write_s,
        "save_interval": value(cfg, "save_interval"),
        "checkpoints_to_max_duration": saves,
        # ...of which before the end (0: every restart begins again at batch 0), the first ones' batches and the
        # end's, the interval in batches; epoch_batches where an epoch counts; why they are unknown, where they are
        "checkpoints_before_end": schedule["before_end"] if schedule else 0,
        "checkpoint_batches": schedule["at"] if schedule else [],
        "checkpoint_every_batches": schedule["every_batches"] if schedule else None,
        "epoch_batches": schedule["epoch_batches"] if schedule else None,
        "checkpoint_batches_estimated": schedule["estimated"] if schedule else False,
        "checkpoint_batches_unknown": schedule["unknown"] if schedule else None,
        # what stays on disk (train/checks/checkpoints.py refuses a run whose kept checkpoints cannot fit)
        "save_num_checkpoints_to_keep": value(cfg, "save_num_checkpoints_to_keep"),
        "checkpoints_kept": kept,
        "checkpoints_kept_bytes": kept_bytes,
        "storage_root": storage_root,
        "storage_free_bytes": free,
        "peak_flops": peak,
        "mfu": mfu,
        "tokens_per_second_per_gpu": tps_gpu,
        "tokens_per_second": tps_gpu * world if tps_gpu else None,
        "step_seconds": step_s,
        "train_seconds": train_s,
        "train_days": train_s / 86400 if train_s else None,
        "checkpoint_overhead": (saves * write_s / train_s) if (saves and write_s and train_s) else None,
        "preflight": _preflight(cfg, nodes, tasks),
        "sbatch_script": spec.sbatch_script(cfg, folder, run),
        "sbatch_array": None,  # a sweep's points with equal resources: one job array (forecast_report.print_plans)
        # what `-m` does after submitting (common/sweep/launch.py): return at once, or wait
        "sweep_waits": run.waits,
        "summary_partition": run.summary.partition if run.summary else None,
        # the run of this config finished earlier (its finished.json at this max_duration): the command would
        # train nothing, and `-m` would submit nothing for it (train/launch/finished.py)
        "finished": (read_finished(cfg) or {}).get("where"),
        "resumes": resumes,
        # continue_from=: the run and batch it starts from, what changes there, its data and its schedule (words)
        "continues": continuation.words(cfg) if not resumes else [],
        "warnings": [str(p) for p in problems],
    }
    return plan


def _resumes(cfg, duration, tokens_per_step: int) -> dict | None:
    """The checkpoint a start of this run goes on from (the newest complete one in its save folder, before its
    files are verified against its manifest), where it stands, and the steps and tokens left to max_duration at
    this command's batch size: from the tokens or samples it trained, as its manifest records them, where the
    duration is in those (a run continued at another batch size trained other amounts per batch before), else
    in batches. None for a new run, one that starts at batch 0 over its checkpoints (resume.goes_on), or a save
    folder not on a file system here."""
    from train.checkpoint import integrity, resume

    folder = value(cfg, "save_folder")
    if not folder or is_remote(folder) or not resume.goes_on(cfg):
        return None
    found = resume.newest_complete(folder)
    if found is None:
        return None
    n, unit = time_of(duration) or (None, None)
    tokens = (integrity.stands_at(found.path, "tok") or (None, None))[1]
    done = {"ba": found.batch, "tok": tokens}.get(unit) if unit != "sp" else \
        (integrity.stands_at(found.path, "sp") or (None, None))[1]
    per = per_batch(cfg, unit)
    if done is None and per:  # a manifest that says nothing of it: in batches at this batch size
        done, per, n = found.batch, 1, batches_in(cfg, duration)
    left = max(0, math.ceil((n - done) / per)) if per and n is not None else None
    return {"checkpoint": str(found.path), "batch": found.batch,
            "tokens": tokens, "steps_left": left,
            "tokens_left": left * tokens_per_step if left is not None else None, "seconds_left": None}


def _preflight(cfg, nodes: int, tasks: int) -> dict:
    """The in-job check's settings (cluster.preflight) and the all-reduces' time at the expected figures."""
    from train.task.preflight_report import estimate_seconds, pair_rounds

    s = OmegaConf.to_container(value(cfg, "cluster.preflight"), resolve=True)
    return {**s, "pair_rounds": len(pair_rounds(nodes)),
            "estimated_allreduce_seconds": estimate_seconds(s, nodes, tasks) if s["enabled"] or s["only"] else None}


def _hf_folder(cfg) -> str:
    """Where hf_checkpointer writes, from its own keys (a command line may set them directly, past export.*):
    <save_folder>/huggingface/<huggingface_folder_name>, its {batch} shown as {B}."""
    from train.config.storage_args import export_folder

    folder = value(cfg, "callbacks.hf_checkpointer.save_folder") or value(cfg, "export.folder")
    return export_folder(str(folder), None, value(cfg, "callbacks.hf_checkpointer.huggingface_folder_name"),
                         value(cfg, "run_name"))


def _export(cfg, params: int) -> dict:
    """The Hugging Face folder's weights on disk: export=hf at its precision; otherwise what `python -m
    train.export` writes by default (float32). Tied embeddings are stored once, as counted in params."""
    hf = value(cfg, "export.format") == "hf"
    precision = value(cfg, "export.precision") if hf else "float32"
    per_param = estimate.EXPORT_BYTES_PER_PARAM.get(precision)
    return {"export": "hf" if hf else "none", "export_precision": precision,
            "export_folder": _hf_folder(cfg) if hf else None,
            "export_bytes": per_param * params if per_param else None}
