"""The plan as people read it (`plan=true`: text, with a table for a sweep) or as programs do (`plan=json`).

The figures come from train/plan/forecast.py; this module only words and prints them (stdout: the command's answer).
"""
import json

from omegaconf import DictConfig, OmegaConf

from train.checks.core import value
from train.plan.estimate import size_words as _size
from train.plan.forecast import MEGATRON_GPT3_CHECKPOINT_BYTES, build_plan


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


def _render_export(p: dict) -> str:
    size = _size(p["export_bytes"]) if p["export_bytes"] else "?"
    if p["export"] == "hf":
        return (f"export      hf: {size} of {p['export_precision']} weights (+ tokenizer, MPT code) in "
                f"{p['export_folder']} at the end of training")
    return (f"export      none (export=hf writes a Hugging Face folder at the end); `python -m train.export` of a "
            f"checkpoint: {size} ({p['export_precision']}), half that with --precision=bfloat16")


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


def _render_saves(p: dict) -> str:
    """How many checkpoints a run writes and at which batches, whatever save_interval's unit."""
    from train.checks.checkpoints import when_saved

    every, n = p["save_interval"], p["checkpoints_to_max_duration"]
    epoch = f" (an epoch: about {p['epoch_batches']:,} batches)" if p["epoch_batches"] else ""
    if n is None:
        return (f"every {every}{epoch}: how many checkpoints to max_duration, and when, is not known here "
                f"({p['checkpoint_batches_unknown']})")
    schedule = {"at": p["checkpoint_batches"], "end": p["checkpoint_batches"][-1] if p["checkpoint_batches"] else None,
                "before_end": p["checkpoints_before_end"], "count": n, "estimated": p["checkpoint_batches_estimated"],
                "unknown": p["checkpoint_batches_unknown"]}
    overhead = (f", {p['checkpoint_overhead'] * 100:.2f}% of training time"
                if p["checkpoint_overhead"] is not None else "")
    none = (": none before it, so every restart begins again at batch 0" if not p["checkpoints_before_end"] else "")
    return (f"every {every}{epoch}: {n:,} checkpoint{'s' * (n != 1)} to max_duration, {when_saved(schedule, every)}"
            f"{none}{overhead}")


def render(p: dict) -> str:
    out = [f"plan for {p['run_name']} (nothing started or submitted)", ""]
    add = out.append
    if p["finished"]:
        add(f"finished    this run reached max_duration {p['max_duration']} earlier ({p['finished']}): the same "
            "command trains nothing, and `-m` submits nothing for it (to train it longer: "
            f"run_name={p['run_name']} and a larger max_duration)")
    m = p["model"]
    if m.get("model_type"):  # a Hugging Face architecture (hf_causal_lm)
        add(f"model       {_big(p['params'])} parameters ({m['model_type']}: hidden {m['d_model']}, {m['n_layers']} "
            f"layers, {m['n_heads']} heads ({m['kv_heads']} key/value), vocab {m['vocab_size']}, positions "
            f"{m['max_seq_len']})")
    else:
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
        f"per device{accum}; {_big(p['tokens_per_step'])} tokens per step"
        + (f" (samples of {p['max_seq_len']} tokens, train_loader.dataset.max_seq_len)"
           if p["max_seq_len"] != m["max_seq_len"] else ""))
    if p["steps"]:
        add(f"duration    max_duration {p['max_duration']} = {p['steps']:,} steps = {_big(p['tokens'])} tokens")
    else:
        add(f"duration    max_duration {p['max_duration']}: steps depend on the data set's size")
    r = p["resumes"]
    if r and not p["finished"]:
        trained = f", {_big(r['tokens'])} tokens trained" if r["tokens"] is not None else ""
        left = (f": {r['steps_left']:,} steps left = {_big(r['tokens_left'])} tokens"
                + (f", {_duration_words(r['seconds_left'])}" if r["seconds_left"] else "")
                if r["steps_left"] is not None else "")
        add(f"resumes     from {r['checkpoint']} (batch {r['batch']:,}{trained}){left}")
    for num, line in enumerate(p.get("continues") or ()):
        add(("continues   from " if num == 0 else "            ") + line)

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
    auto = p["device_train_microbatch_size"] == "auto"  # composer halves it on each out-of-memory, down to 1
    add(f"            activations per {'sample (microbatch auto: it needs 1 to fit)' if auto else 'microbatch'}: "
        f"{_size(p['activation_bytes_with_checkpointing'])} with activation checkpointing, "
        f"{_size(p['activation_bytes_without_checkpointing'])} without (this run: {ac})")

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
    if p["checkpoint"]:
        add("            " + _render_saves(p))
    if p["checkpoints_kept"]:
        keep = p["save_num_checkpoints_to_keep"]
        free = (f"{_size(p['storage_free_bytes'])} free on {p['storage_root']} now" if p["storage_free_bytes"]
                is not None else f"{p['storage_root']} is not on this node: free space not known here")
        add(f"            kept: {p['checkpoints_kept']:,} (save_num_checkpoints_to_keep={keep}) = "
            f"{_size(p['checkpoints_kept_bytes'])} at max_duration; {free}")
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
    array = p.get("sbatch_array")
    if p["sbatch_script"] and array:
        add(f"sbatch      the job array `-m` would submit for points #{', #'.join(map(str, array['points']))} "
            f"(this point: its task {array['task']}):")
        out.extend("    " + line for line in p["sbatch_script"].rstrip().splitlines())
    elif p["sbatch_script"]:
        add("sbatch      the script `-m` would submit:")
        out.extend("    " + line for line in p["sbatch_script"].rstrip().splitlines())
    else:
        add("sbatch      none: cluster=local runs on this machine")
    if p["sweep_waits"]:
        add("-m          waits for every job, then prints and writes the summary")
    else:
        add("-m          submits and returns; follow with `python -m train.status <sweep> --watch`; a summary job "
            f"on partition {p['summary_partition']} writes the summary when the last point ends "
            "(cluster.wait=true: wait instead)")
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
    cols = ("point", "nodes", "world", "grad_accum", "mem/GPU", "fits", "min_nodes", "ckpt write", "s/step", "days",
            "submits")
    rows = [" | ".join(cols), " | ".join("---" for _ in cols)]
    for i, p in enumerate(plans):
        mem = _size(p["memory_per_gpu_bytes"]) if p["memory_per_gpu_bytes"] is not None else "-"
        rows.append(" | ".join(str(x) for x in (
            i, p["nodes"], p["world_size"], p["grad_accum"], mem, p["fits"], p["min_nodes"],
            _duration_words(p["checkpoint_write_seconds"]),
            f"{p['step_seconds']:.2f}" if p["step_seconds"] else "-",
            f"{p['train_days']:.1f}" if p["train_days"] else "-",
            "no: finished earlier" if p["finished"] else "yes")))
    return "\n".join("| " + r + " |" for r in rows)


def print_plans(cfgs: list, problems=(), batch_of: str | None = None) -> list:
    """A sweep's plans, one per point. plan=json: one JSON list, one object per point, in point order.
    problems: the sweep's warnings, each point's named by its key (Problem.at_point). batch_of: the sweeper whose
    first batch these points are, when it launches more later."""
    prefix = [f"[sweep point #{i}] " for i in range(len(cfgs))]
    plans = [build_plan(cfg, [p for p in problems if p.key.startswith(prefix[i])]) for i, cfg in enumerate(cfgs)]
    # Points with equal resources go as one job array (common/sweep/contract.py): its script
    # is what they are submitted with, not each one's own
    submitted = [i for i, p in enumerate(plans) if p["sbatch_script"] and not p.get("finished")]
    if len(submitted) > 1:
        from train.launch.spec import array_scripts
        from train.plan.forecast import _submitit_folder

        for i, (script, k, idx) in zip(submitted, array_scripts([cfgs[i] for i in submitted], _submitit_folder())):
            if len(idx) > 1:
                plans[i]["sbatch_script"] = script
                plans[i]["sbatch_array"] = {"task": k, "points": [submitted[j] for j in idx]}
    if value(cfgs[0], "plan") == "json":
        _emit(to_json(plans))
    else:
        _emit("\n".join(f"=== sweep point #{i} ===\n{render(p)}\n" for i, p in enumerate(plans))
              + f"\nsweep of {len(plans)} point{'s' * (len(plans) != 1)}"
              + (f" (the first batch the {batch_of} launched; more come later)" if batch_of else "")
              + f":\n{_summary(plans)}")
    return plans
