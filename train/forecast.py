"""`plan=true` / `plan=json`: what a run would need and take, from the config alone. Starts and submits nothing.

Light (no torch, no llm-foundry): model arithmetic from train.estimate, the sbatch script from train.executor.
The plan describes the job `-m` would submit: cluster.nodes x cluster.tasks_per_node ranks.
"""
import json
import math

from omegaconf import DictConfig, OmegaConf

from train import estimate
from train.checks.core import batches as _batches
from train.checks.core import value
from train.estimate import GiB, TiB

# Published GPT-3 175B checkpoint from the Megatron-LM recipe, to set our figure beside.
MEGATRON_GPT3_CHECKPOINT_BYTES = int(2.3 * TiB)


def _steps_and_tokens(duration, tokens_per_step: int, global_batch: int):
    if isinstance(duration, str):
        n = int("".join(ch for ch in duration if ch.isdigit()) or 0)
        if duration.endswith("ba"):
            return n, n * tokens_per_step
        if duration.endswith("tok"):
            steps = math.ceil(n / tokens_per_step)
            return steps, n
        if duration.endswith("sp"):
            steps = math.ceil(n / global_batch)
            return steps, steps * tokens_per_step
    return None, None  # epochs: depends on the data set's size


def _submitit_folder() -> str:
    """Where a `-m` run started now would keep its job files (the launcher's submitit_folder)."""
    try:
        from hydra.core.hydra_config import HydraConfig

        return f"{HydraConfig.get().sweep.dir}/.submitit/%j"
    except Exception:
        return "<sweep dir>/.submitit/%j"


def build_plan(cfg: DictConfig, problems=()) -> dict:
    """Every figure of the plan, as plain JSON-able values. problems: the checks' warnings, reported with it."""
    from train.executor import sbatch_script

    model = OmegaConf.to_container(value(cfg, "model"), resolve=True)
    params = estimate.param_count(model)
    fpt = estimate.flops_per_token(model)
    nodes, tasks = value(cfg, "cluster.nodes"), value(cfg, "cluster.tasks_per_node")
    world = nodes * tasks
    gbs, mb = value(cfg, "global_train_batch_size"), value(cfg, "device_train_microbatch_size")
    seq = value(cfg, "max_seq_len")
    per_device = gbs / world
    per_device = int(per_device) if per_device == int(per_device) else per_device
    grad_accum = None
    if isinstance(mb, int) and isinstance(per_device, int) and per_device % mb == 0:
        grad_accum = per_device // mb
    tokens_per_step = gbs * seq
    duration = value(cfg, "max_duration")
    steps, tokens = _steps_and_tokens(duration, tokens_per_step, gbs)

    # memory
    fig = estimate.fit(cfg, world)
    precision = value(cfg, "precision")
    act_bytes = 2 if precision != "fp32" else 4
    mb_int = mb if isinstance(mb, int) else 0
    fsdp = value(cfg, "fsdp_config")
    ac = bool(fsdp and fsdp.get("activation_checkpointing")) and world > 1

    # checkpoint
    # llm-foundry's own key decides (the checkpoint group only sets its default)
    kind = (value(cfg, "fsdp_config.state_dict_type") if fsdp else None) or value(cfg, "checkpoint.state_dict_type")
    sharded = kind == "sharded" and bool(fsdp) and world > 1
    ckpt = estimate.checkpoint_bytes(params)
    write_gbps, file_gbps = value(cfg, "storage.write_GBps"), value(cfg, "storage.file_GBps")
    write_s = estimate.write_seconds(ckpt, sharded=sharded, ranks=world, write_GBps=write_gbps,
                                     file_GBps=file_gbps)
    save_folder = value(cfg, "save_folder")
    every = _batches(value(cfg, "save_interval"))
    saves = (steps // every) if (save_folder and every and steps) else (0 if not save_folder else None)

    # time
    peak, mfu = value(cfg, "cluster.peak_flops"), value(cfg, "cluster.mfu")
    step_s = train_s = tps_gpu = None
    if peak and mfu:
        tps_gpu = peak * mfu / fpt
        step_s = tokens_per_step / (tps_gpu * world)
        train_s = step_s * steps if steps else None

    plan = {
        "run_name": value(cfg, "run_name"),
        "model": {k: model.get(k) for k in ("d_model", "n_heads", "n_layers", "vocab_size", "max_seq_len")},
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
        "activation_bytes_with_checkpointing": estimate.activation_bytes(model, mb_int, act_bytes, True),
        "activation_bytes_without_checkpointing": estimate.activation_bytes(model, mb_int, act_bytes, False),
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
        "peak_flops": peak,
        "mfu": mfu,
        "tokens_per_second_per_gpu": tps_gpu,
        "tokens_per_second": tps_gpu * world if tps_gpu else None,
        "step_seconds": step_s,
        "train_seconds": train_s,
        "train_days": train_s / 86400 if train_s else None,
        "checkpoint_overhead": (saves * write_s / train_s) if (saves and write_s and train_s) else None,
        "preflight": _preflight(cfg, nodes, tasks),
        "sbatch_script": sbatch_script(cfg, _submitit_folder()),
        "warnings": [str(p) for p in problems],
    }
    return plan


def _preflight(cfg, nodes: int, tasks: int) -> dict:
    """The in-job check's settings (cluster.preflight) and the all-reduces' time at the expected figures."""
    from train.preflight_report import estimate_seconds, pair_rounds

    s = OmegaConf.to_container(value(cfg, "cluster.preflight"), resolve=True)
    return {**s, "pair_rounds": len(pair_rounds(nodes)),
            "estimated_allreduce_seconds": estimate_seconds(s, nodes, tasks) if s["enabled"] or s["only"] else None}


def _render_preflight(p: dict) -> list:
    s = p["preflight"]
    if not (s["enabled"] or s["only"]):
        return ["preflight   off (cluster.preflight.enabled=false)"]
    exp = s["expected_busbw_GBps"]
    judged = (f"expected busbw intra {exp['intra']} / inter {exp['inter']} GB/s, below {s['tolerance']:g} x "
              f"expected fails" if exp["intra"] or exp["inter"] else "figures reported, not judged (no expected "
              "busbw for this cluster)")
    cost = (f"~{s['estimated_allreduce_seconds']:.2f} s of all-reduces at the expected figures"
            if s["estimated_allreduce_seconds"] is not None else "all-reduce time unknown (no expected figures)")
    on_fail = (f"requeue without the bad nodes (at most {s['max_exclusions']} in all)" if s["on_fail"] == "requeue"
               else "fail with the report")
    return [f"preflight   {'ONLY (trains nothing)' if s['only'] else 'on'}: devices, node check "
            f"{s['node_check'] or '(none)'}, all-reduce of {_size(s['bytes'])} x {s['iters']} within each node, "
            f"{s['pair_rounds']} round(s) of node pairs and the whole job",
            f"            {judged}; on failure: {on_fail}",
            f"            cost: {cost}, plus the node check and communicator set-up"]


# Bytes per weight of a Hugging Face export, by its precision (llm-foundry's hf_checkpointer's names).
EXPORT_BYTES_PER_PARAM = {"float32": 4, "bfloat16": 2, "float16": 2}


def _export(cfg, params: int) -> dict:
    """The Hugging Face folder's weights on disk: export=hf at its precision; otherwise what `python -m
    train.export` writes by default (float32). Tied embeddings are stored once, as counted in params."""
    hf = value(cfg, "export.format") == "hf"
    precision = value(cfg, "export.precision") if hf else "float32"
    per_param = EXPORT_BYTES_PER_PARAM.get(precision)
    return {"export": "hf" if hf else "none", "export_precision": precision,
            "export_folder": f"{value(cfg, 'export.folder')}/huggingface/ba{{B}}" if hf else None,
            "export_bytes": per_param * params if per_param else None}


def _render_export(p: dict) -> str:
    size = _size(p["export_bytes"]) if p["export_bytes"] else "?"
    if p["export"] == "hf":
        return (f"export      hf: {size} of {p['export_precision']} weights (+ tokenizer, MPT code) in "
                f"{p['export_folder']} at the end of training")
    return (f"export      none (export=hf writes a Hugging Face folder at the end); `python -m train.export` of a "
            f"checkpoint: {size} ({p['export_precision']}), half that with --precision=bfloat16")


# ------------------------------------------------------------------------------------------------ report


def _size(n) -> str:
    if n is None:
        return "?"
    if n >= TiB:
        return f"{n / TiB:.2f} TiB"
    return f"{n / GiB:.1f} GiB" if n >= GiB / 10 else f"{n / 2**20:.1f} MiB"


def _duration_words(s) -> str:
    if s is None:
        return "?"
    if s < 120:
        return f"{s:.1f} s"
    if s < 7200:
        return f"{s / 60:.2f} min"
    if s < 3 * 86400:
        return f"{s / 3600:.1f} h"
    return f"{s / 86400:.1f} days"


def _big(n) -> str:
    for unit, scale in (("T", 1e12), ("B", 1e9), ("M", 1e6), ("k", 1e3)):
        if n >= scale:
            return f"{n / scale:.2f} {unit}"
    return f"{n:.0f}"


def _flop(n) -> str:
    for unit, scale in (("T", 1e12), ("G", 1e9), ("M", 1e6), ("k", 1e3)):
        if n >= scale:
            return f"{n / scale:.1f} {unit}FLOP"
    return f"{n:.0f} FLOP"


def render(p: dict) -> str:
    out = [f"plan for {p['run_name']} (nothing started or submitted)", ""]
    add = out.append
    m = p["model"]
    add(f"model       {_big(p['params'])} parameters (d_model {m['d_model']}, {m['n_layers']} layers, "
        f"{m['n_heads']} heads, vocab {m['vocab_size']}, seq {m['max_seq_len']})")
    add(f"            {_flop(p['flops_per_token'])} per token = 6N {_flop(p['flops_per_token_6n'])} "
        f"+ attention {_flop(p['flops_per_token_attention'])}")
    gpu = f" on {p['gpu']}" if p["gpu"] else " (CPU)"
    add(f"cluster     {p['cluster']}: {p['nodes']} node(s) x {p['tasks_per_node']} tasks = world size "
        f"{p['world_size']}{gpu}")
    accum = (f" = microbatch {p['device_train_microbatch_size']} x {p['grad_accum']} gradient accumulation"
             if p["grad_accum"] else f" (microbatch {p['device_train_microbatch_size']})")
    add(f"batch       global {p['global_train_batch_size']} = {p['world_size']} ranks x {p['per_device_batch']} "
        f"per device{accum}; {_big(p['tokens_per_step'])} tokens per step")
    if p["steps"]:
        add(f"duration    max_duration {p['max_duration']} = {p['steps']:,} steps = {_big(p['tokens'])} tokens")
    else:
        add(f"duration    max_duration {p['max_duration']}: steps depend on the data set's size")

    ac = "on" if p["activation_checkpointing"] else "off"
    if p["memory_per_gpu_bytes"] is not None:
        fits = "fits" if p["fits"] else "DOES NOT FIT"
        smallest = (f"smallest node count that fits: {p['min_nodes']}" if p["min_nodes"]
                    else "no node count fits at this microbatch")
        if p["min_nodes"] and p["min_nodes_batch"] not in (None, p["min_nodes"]):
            smallest += f" ({p['min_nodes_batch']} to also divide the global batch)"
        b = p["memory_breakdown_bytes"]
        add(f"memory/GPU  ~{_size(p['memory_per_gpu_bytes'])} of {_size(p['gpu_memory_bytes'])} "
            f"({_size(p['usable_memory_bytes'])} usable, {int(p['memory_headroom'] * 100)}% kept free): {fits}; "
            f"{smallest}")
        add(f"            {p['sharding_strategy'] or 'no FSDP'} over {p['world_size']} ranks: weights "
            f"{_size(b['params'])} (fp32) + grads {_size(b['grads'])} (fp32) + Adam {_size(b['optimizer'])} "
            f"(2 x fp32)")
        add(f"            + gathered blocks {_size(b['gathered'])} + activations {_size(b['activations'])} "
            f"(checkpointing {ac}) + CUDA/NCCL {_size(b['runtime'])}")
    else:
        add("memory/GPU  no GPU memory to fit (CPU cluster)")
    add(f"            activations per microbatch: {_size(p['activation_bytes_with_checkpointing'])} with "
        f"activation checkpointing, {_size(p['activation_bytes_without_checkpointing'])} without (this run: {ac})")

    per_rank = (f", {_size(p['checkpoint_bytes_per_rank'])} per rank in {p['checkpoint_files']} files"
                if p["checkpoint_bytes_per_rank"] else ", one file written by rank 0")
    tier = f" ({p['storage_tier']})" if p["storage_tier"] else ""
    ceiling = f", one file at most {p['file_GBps']} GB/s" if p["file_GBps"] else ""
    what = p["checkpoint"] or "none (checkpoint=none: nothing is written; a checkpoint would be)"
    add(f"checkpoint  {what}: {_size(p['checkpoint_bytes'])} (12 B/param: fp32 weights + 2 Adam moments){per_rank}")
    add(f"            write {_duration_words(p['checkpoint_write_seconds'])} at {p['write_GBps']} GB/s{tier}"
        f"{ceiling}")
    if p["checkpoint_layout"]:
        add(f"            layout: {p['checkpoint_layout']}")
    if p["checkpoints_to_max_duration"]:
        overhead = (f", {p['checkpoint_overhead'] * 100:.2f}% of training time"
                    if p["checkpoint_overhead"] is not None else "")
        add(f"            every {p['save_interval']}: {p['checkpoints_to_max_duration']:,} checkpoints to "
            f"max_duration{overhead}")
    meg = p["megatron_checkpoint_bytes"]
    ratio = meg / MEGATRON_GPT3_CHECKPOINT_BYTES
    add(f"            Megatron-LM layout (fp16 weights beside fp32 master weights + 2 moments, 14 B/param): "
        f"{_size(meg)}" + (f", {ratio * 100:.0f}% of the ~2.3 TiB its GPT-3 175B recipe writes"
                           if 0.5 < ratio < 2 else ""))
    add(_render_export(p))

    if p["step_seconds"]:
        add(f"speed       at {p['mfu'] * 100:.2f}% MFU (cluster.mfu) of {p['peak_flops'] / 1e12:.0f} TFLOP/s: "
            f"{p['tokens_per_second_per_gpu']:,.0f} tokens/s/GPU, {_big(p['tokens_per_second'])} tokens/s")
        add(f"            {p['step_seconds']:.2f} s per step; {_duration_words(p['train_seconds'])} to max_duration")
    else:
        add("speed       unknown here (no cluster.peak_flops / cluster.mfu for this cluster)")
    out.extend(_render_preflight(p))
    if p["sbatch_script"]:
        add("sbatch      the script `-m` would submit:")
        out.extend("    " + line for line in p["sbatch_script"].rstrip().splitlines())
    else:
        add("sbatch      none: cluster=local runs on this machine")
    if p["warnings"]:
        add("warnings    (legal but likely mistakes, and what would stop a run or submission from this node):")
        for w in p["warnings"]:
            out.extend("    " + line for line in w.splitlines())
    return "\n".join(out)


def _json_default(o):
    try:
        return OmegaConf.to_container(o, resolve=True)
    except Exception:
        return str(o)


def to_json(obj) -> str:
    return json.dumps(obj, indent=2, default=_json_default)


def _emit(text: str) -> None:
    try:
        print(text, flush=True)
    except BrokenPipeError:  # `plan=true | head`: the reader has seen enough
        import os
        import sys

        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())


def print_plan(cfg: DictConfig, problems=()) -> dict:
    p = build_plan(cfg, problems)
    _emit(to_json(p) if value(cfg, "plan") == "json" else render(p))
    return p


def _summary(plans: list) -> str:
    cols = ("point", "nodes", "world", "grad_accum", "mem/GPU", "fits", "min_nodes", "ckpt write", "s/step", "days")
    rows = [" | ".join(cols), " | ".join("---" for _ in cols)]
    for i, p in enumerate(plans):
        mem = _size(p["memory_per_gpu_bytes"]) if p["memory_per_gpu_bytes"] is not None else "-"
        rows.append(" | ".join(str(x) for x in (
            i, p["nodes"], p["world_size"], p["grad_accum"], mem, p["fits"], p["min_nodes"],
            _duration_words(p["checkpoint_write_seconds"]),
            f"{p['step_seconds']:.2f}" if p["step_seconds"] else "-",
            f"{p['train_days']:.1f}" if p["train_days"] else "-")))
    return "\n".join("| " + r + " |" for r in rows)


def print_plans(cfgs: list, problems=()) -> list:
    """A sweep's plans, one per point. plan=json: one JSON list, one object per point, in point order.
    problems: the sweep's warnings, each point's named by its key (Problem.at_point)."""
    prefix = [f"[sweep point #{i}] " for i in range(len(cfgs))]
    plans = [build_plan(cfg, [p for p in problems if p.key.startswith(prefix[i])]) for i, cfg in enumerate(cfgs)]
    if value(cfgs[0], "plan") == "json":
        _emit(to_json(plans))
    else:
        _emit("\n".join(f"=== sweep point #{i} ===\n{render(p)}\n" for i, p in enumerate(plans))
              + f"\nsweep of {len(plans)} points:\n{_summary(plans)}")
    return plans
