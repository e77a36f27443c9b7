"""Model arithmetic from the config alone (no torch): parameters, FLOPs, memory per GPU, checkpoint size.

Units: sizes in bytes; GiB = 2**30 bytes. Storage bandwidths (`storage.write_GBps`, `storage.file_GBps`) are read
in the units of the vendor tables they come from: the AMLFS table (2.3 TiB written in 2.04 min at 19.2 "GB/s")
works out only with 2**30 bytes per "GB", so that is what a "GB/s" is here.
"""

from train.config.hf_arch import value_of
from train.config.vocab import MPT_VOCAB

GiB = 2**30
TiB = 2**40


def size_words(n) -> str:
    """A size in bytes as the plan and the checks print it."""
    if n is None:
        return "?"
    if n >= TiB:
        return f"{n / TiB:.2f} TiB"
    return f"{n / GiB:.1f} GiB" if n >= GiB / 10 else f"{n / 2**20:.1f} MiB"


# Bytes per parameter that FSDP keeps sharded under llm-foundry's MPT presets (mixed_precision PURE, AdamW):
# fp32 weights, fp32 gradients (FSDP hands the optimizer full-precision sharded grads), two fp32 Adam moments.
WEIGHT_BYTES, GRAD_BYTES, ADAM_BYTES = 4, 4, 8
# A composer checkpoint holds the fp32 weights and the two Adam moments: 12 bytes per parameter.
CHECKPOINT_BYTES_PER_PARAM = WEIGHT_BYTES + ADAM_BYTES
# Megatron-LM's (distributed optimizer) checkpoint adds fp16 weights beside the fp32 master weights: 14.
MEGATRON_BYTES_PER_PARAM = 2 + CHECKPOINT_BYTES_PER_PARAM

# Activations kept per layer, in units of (microbatch x seq x d_model) elements (Korthikanti et al. 2022,
# "Reducing Activation Recomputation in Large Transformer Models"): 34 per layer without recomputation when
# attention scores are never materialised (flash attention); with activation checkpointing only the block's
# input (1 element) is kept, and one block's full set is rebuilt at a time during backward.
ACT_ELEMENTS_PER_LAYER = 34
ACT_ELEMENTS_CHECKPOINTED = 1
# CUDA context, NCCL buffers, cuBLAS workspaces: outside PyTorch's allocator, roughly constant.
RUNTIME_BYTES = 2 * GiB
# Of the GPU's memory, this fraction is left free for allocator fragmentation and peaks the model misses.
HEADROOM = 0.10

# Bytes per weight of a Hugging Face export, by its precision (llm-foundry's hf_checkpointer's names).
EXPORT_BYTES_PER_PARAM = {"float32": 4, "bfloat16": 2, "float16": 2}
HF_FOLDER_NAME = "ba{batch}"  # hf_checkpointer's default huggingface_folder_name (conf/export/hf.yaml keeps it)

SHARDING_STRATEGIES = ("FULL_SHARD", "SHARD_GRAD_OP", "HYBRID_SHARD", "_HYBRID_SHARD_ZERO2", "NO_SHARD")


def vocab_size(model) -> int:
    hf = hf_shape(model)
    return hf["vocab_size"] if hf else value_of(model, "vocab_size", MPT_VOCAB)


def hf_shape(model) -> dict | None:
    """The sizes of a Hugging Face architecture (llm-foundry's hf_causal_lm, or a built model's config of another
    model_type than MPT's), from its config (train/config/hf_arch.py); None for an MPT."""
    from train.config import hf_arch

    if hf_arch.is_hf(model) or value_of(model, "model_type") not in (None, "mpt"):
        return hf_arch.model_shape(model)
    return None


def summary(model) -> dict:
    """What the plan says of the model: its width, layers, heads, vocabulary and sequence length (MPT's
    max_seq_len; a Hugging Face architecture's positions, with its model_type and key/value heads)."""
    hf = hf_shape(model)
    if hf:
        from train.config import hf_arch

        return {"model_type": hf_arch.attributes(model)["model_type"] if "model_type" not in model
                else model["model_type"], "d_model": hf["d_model"], "n_heads": hf["n_heads"],
                "kv_heads": hf["kv_heads"], "n_layers": hf["n_layers"], "max_seq_len": hf["positions"],
                "vocab_size": hf["vocab_size"]}
    return {**{k: model.get(k) for k in ("d_model", "n_heads", "n_layers", "max_seq_len")},
            "vocab_size": vocab_size(model)}


def width(model) -> int:
    """The model's hidden size (MPT's d_model)."""
    hf = hf_shape(model)
    return hf["d_model"] if hf else model["d_model"]


def layers(model) -> int:
    hf = hf_shape(model)
    return hf["n_layers"] if hf else model["n_layers"]


def _attention_width(model) -> int:
    """The width attention's scores are computed over: heads x head size (MPT: d_model)."""
    hf = hf_shape(model)
    return hf["n_heads"] * hf["head_dim"] if hf else model["d_model"]


def kv_heads(model) -> int:
    """Key/value heads of MPT's attention: every head's (multihead_attention, the default), one
    (multiquery_attention), or attn_config.kv_n_heads (grouped_query_attention)."""
    attn = value_of(model, "attn_config", {})
    kind = value_of(attn, "attn_type", "multihead_attention")
    if kind == "multiquery_attention":
        return 1
    if kind == "grouped_query_attention":
        return value_of(attn, "kv_n_heads", 1)
    return model["n_heads"]


def ffn_hidden(model) -> int:
    """The feed-forward width: ffn_config.ffn_hidden_size where set, else expansion_ratio x d_model (as llm-foundry's
    resolve_ffn_hidden_size)."""
    return int(value_of(value_of(model, "ffn_config", {}), "ffn_hidden_size") or value_of(model, "expansion_ratio", 4) * model["d_model"])


def block_params(model) -> int:
    """Parameters of one transformer block (an FSDP unit under llm-foundry's MPT wrapping): the fused Wqkv (keys and
    values for kv_heads heads), out_proj, the feed-forward's up and down projections (and gate_proj for mptglu),
    two norms; biases unless no_bias. A Hugging Face architecture's decoder layer, as its config builds it."""
    hf = hf_shape(model)
    if hf:
        return hf["block_params"]
    d, hidden = model["d_model"], ffn_hidden(model)
    qkv = d + 2 * kv_heads(model) * (d // model["n_heads"])
    glu = value_of(value_of(model, "ffn_config", {}), "ffn_type", "mptmlp") == "mptglu"
    weights = d * qkv + d * d + (2 + glu) * d * hidden + 2 * d
    biases = qkv + d + (1 + glu) * hidden + d + 2 * d * norm_bias(model)
    return weights + (not value_of(model, "no_bias", False)) * biases


def norm_bias(model) -> bool:
    """Whether MPT's norms have a bias (where no_bias allows): the layer norms do, the RMS norms never."""
    return "rmsnorm" not in str(value_of(model, "norm_type", "low_precision_layernorm"))


def learned_positions(model) -> bool:
    """Whether an MPT learns position embeddings: MPTConfig turns learned_pos_emb off where alibi or rope gives the
    positions."""
    attn = value_of(model, "attn_config", {})
    return bool(value_of(model, "learned_pos_emb", True)) and not (value_of(attn, "alibi") or value_of(attn, "rope"))


def embedding_params(model) -> int:
    """The token (and learned position) embeddings, and the output projection where tie_word_embeddings=false."""
    hf = hf_shape(model)
    if hf:
        return hf["embedding_params"]
    d = model["d_model"]
    pos = model["max_seq_len"] * d if learned_positions(model) else 0
    head = 0 if value_of(model, "tie_word_embeddings", True) else d * vocab_size(model)
    return vocab_size(model) * d + pos + head


def param_count(model) -> int:
    """Parameters of llm-foundry's MPT (or a Hugging Face architecture's) for this model config."""
    hf = hf_shape(model)
    if hf:
        return hf["n_layers"] * hf["block_params"] + hf["embedding_params"] + hf["final_params"]
    d = model["d_model"]
    bias = not value_of(model, "no_bias", False) and norm_bias(model)
    return model["n_layers"] * block_params(model) + embedding_params(model) + d * (1 + bias)  # + final norm


def flops_per_token(model, seq: int | None = None) -> float:
    """Training FLOPs per token: 6N for the matmuls plus attention's QK^T and AV (forward 2*2*L*s*d, x3), s the
    length trained at (default: the model's max_seq_len)."""
    return 6 * param_count(model) + 12 * layers(model) * (seq or _max_seq_len(model)) * _attention_width(model)


def _max_seq_len(model) -> int:
    hf = hf_shape(model)
    return hf["positions"] if hf else model["max_seq_len"]


def shard_count(sharding_strategy: str | None, world_size: int, tasks_per_node: int) -> int:
    """Over how many ranks the weights, gradients and optimizer state are split."""
    if sharding_strategy in (None, "NO_SHARD"):
        return 1
    if sharding_strategy in ("HYBRID_SHARD", "_HYBRID_SHARD_ZERO2"):
        return max(1, min(world_size, tasks_per_node))
    return max(1, world_size)


def activation_bytes(model, microbatch: int, act_bytes: int, checkpointing: bool, seq: int | None = None) -> int:
    """Activations of one microbatch of `seq` tokens each (default: the model's max_seq_len): the layers' saved
    tensors, plus logits and the loss's fp32 copy."""
    if not microbatch:
        return 0
    d, n, seq = width(model), layers(model), seq or _max_seq_len(model)
    tokens = microbatch * seq
    if checkpointing:
        # every block's input, plus one block rebuilt in full during its backward
        layer_part = tokens * d * act_bytes * (n * ACT_ELEMENTS_CHECKPOINTED + ACT_ELEMENTS_PER_LAYER)
    else:
        layer_part = tokens * d * act_bytes * n * ACT_ELEMENTS_PER_LAYER
    logits = tokens * vocab_size(model) * (act_bytes + 4)
    return layer_part + logits


def counted_microbatch(microbatch) -> int:
    """The microbatch whose activations a plan counts. 'auto': composer halves the rank's share on each
    out-of-memory until one fits, down to 1, so the run needs 1 to fit (counting none would call any model's
    activations free)."""
    return microbatch if isinstance(microbatch, int) and not isinstance(microbatch, bool) and microbatch > 0 else 1


def activation_element_bytes(precision) -> int:
    """Bytes of an activation: 2 under mixed precision (composer's amp_*), 4 in fp32."""
    return 2 if precision in ("amp_bf16", "amp_fp16", "amp_fp8", "bf16", "fp16") else 4


def checkpoints_activations(fsdp: dict | None) -> bool:
    """Whether activations are recomputed in backward: fsdp_config.activation_checkpointing, under FSDP only."""
    return bool(value_of(fsdp, "activation_checkpointing", False)) if fsdp is not None else False


def memory_per_gpu(model, *, world_size: int, tasks_per_node: int, microbatch, precision: str,
                   fsdp: dict | None, checkpointing: bool | None = None, seq: int | None = None) -> dict:
    """Bytes per GPU, by part. fsdp: the fsdp_config (None: no FSDP, every rank holds everything).

    FULL_SHARD: weights, gradients and Adam state are split over the world (16 bytes x params in total, the
    rule of thumb), while each block's bf16 weights are gathered for its forward and backward (two units in
    flight with limit_all_gathers) and its gradients reduced from a bf16 buffer.
    """
    n = param_count(model)
    strategy = value_of(fsdp, "sharding_strategy", "FULL_SHARD") if fsdp is not None else None
    shards = shard_count(strategy, world_size, tasks_per_node)
    act_bytes = activation_element_bytes(precision)
    pure = fsdp is not None and value_of(fsdp, "mixed_precision", "DEFAULT") == "PURE" and act_bytes == 2
    unit_bytes = 2 if pure else 4
    if checkpointing is None:
        checkpointing = checkpoints_activations(fsdp)
    mb = counted_microbatch(microbatch)
    parts = {
        "params": WEIGHT_BYTES * n // shards,
        "grads": GRAD_BYTES * n // shards,
        "optimizer": ADAM_BYTES * n // shards,
        # gathered weights (two blocks in flight, plus the root unit's embedding) and one block's grads
        "gathered": (3 * block_params(model) + embedding_params(model)) * unit_bytes if shards > 1 else 0,
        "activations": activation_bytes(model, mb, act_bytes, checkpointing, seq),
        "runtime": RUNTIME_BYTES,
    }
    if strategy in ("SHARD_GRAD_OP", "_HYBRID_SHARD_ZERO2"):
        parts["gathered"] += unit_bytes * n  # weights stay gathered between forward and backward
    return {**parts, "total": sum(parts.values()), "shards": shards, "activation_checkpointing": checkpointing}


def usable_bytes(gpu_memory_bytes: int) -> int:
    return int(gpu_memory_bytes * (1 - HEADROOM))


def min_nodes(model, *, tasks_per_node: int, gpu_memory_bytes: int, microbatch, precision: str,
              fsdp: dict | None, max_nodes: int = 100_000, seq: int | None = None):
    """The smallest node count at which the estimate fits, or None if none does (the part that does not shrink
    with more ranks, activations mostly, is too large already). microbatch: a number, or the microbatch a rank
    trains with at a world size (llm-foundry cuts it to the rank's share of the global batch, larger on fewer
    nodes: the microbatch of many nodes' share would call one node fitting where it trains a larger one and does
    not)."""
    if not gpu_memory_bytes or not tasks_per_node:
        return None
    usable = usable_bytes(gpu_memory_bytes)

    def total(nodes):
        world = nodes * tasks_per_node
        return memory_per_gpu(model, world_size=world, tasks_per_node=tasks_per_node,
                              microbatch=microbatch(world) if callable(microbatch) else microbatch,
                              precision=precision, fsdp=fsdp, seq=seq)

    # More nodes never need more memory per GPU (the shards and the rank's microbatch shrink, the rest stays):
    # the smallest count that fits, by bisection
    if total(1)["total"] <= usable:
        return 1
    if total(max_nodes)["total"] > usable:
        return None  # what does not shrink with the node count (activations mostly) is too large already
    lo, hi = 1, max_nodes  # lo does not fit, hi does
    while hi - lo > 1:
        mid = (lo + hi) // 2
        lo, hi = (lo, mid) if total(mid)["total"] <= usable else (mid, hi)
    return hi


def checkpoint_bytes(params: int) -> int:
    return CHECKPOINT_BYTES_PER_PARAM * params


def write_seconds(total_bytes: int, *, sharded: bool, ranks: int, write_GBps: float, file_GBps: float | None):
    """Seconds to write a checkpoint: sharded, every rank writes its own file in parallel (bounded by the file
    system's aggregate bandwidth and by one file's ceiling); full, rank 0 writes one file."""
    if not write_GBps or write_GBps <= 0:
        return None
    file_GBps = file_GBps or write_GBps
    if sharded and ranks > 1:
        per_rank = total_bytes / ranks
        return max(total_bytes / (write_GBps * GiB), per_rank / (file_GBps * GiB))
    return total_bytes / (min(write_GBps, file_GBps) * GiB)


def _select(cfg, key):
    from omegaconf import OmegaConf

    return OmegaConf.select(cfg, key)


def _plain(node):
    from omegaconf import OmegaConf

    return OmegaConf.to_container(node, resolve=True) if node is not None and not isinstance(node, dict) else node


def fit(cfg, world: int, device_bytes: int | None = None) -> dict | None:
    """The memory estimate of a composed config at this world size, against one device of `device_bytes`
    (default: the cluster's cluster.gpu_memory_gb); None when that memory is unknown.

    On a CPU run, the device is this machine's RAM, shared by its ranks: pass device_bytes // ranks."""
    gpu_gb = _select(cfg, "cluster.gpu_memory_gb")
    if device_bytes is None:
        if not (_select(cfg, "cluster.gpus_per_node") or 0) or not gpu_gb:
            return None
        device_bytes = int(gpu_gb * GiB)
    model = _plain(_select(cfg, "model"))
    fsdp = _plain(_select(cfg, "fsdp_config")) or None
    common = dict(precision=_select(cfg, "precision"), seq=trained_seq_len(cfg))
    tasks = _select(cfg, "cluster.tasks_per_node")
    mem = memory_per_gpu(model, world_size=world, tasks_per_node=tasks, fsdp=fsdp_used(cfg, world),
                         microbatch=microbatch_trained(cfg, world), **common)
    smallest = min_nodes(model, tasks_per_node=tasks, gpu_memory_bytes=device_bytes, fsdp=fsdp,
                         microbatch=lambda w: _share(cfg, w), **common)
    return {
        "memory": mem,
        "gpu_memory_bytes": device_bytes,
        "usable_bytes": usable_bytes(device_bytes),
        "fits": mem["total"] <= usable_bytes(device_bytes),
        "min_nodes": smallest,
        "min_nodes_batch": _divides_from(cfg, smallest),
    }


def fsdp_used(cfg, world: int) -> dict | None:
    """The fsdp_config a run trains with at this world size, as plain values: none at one rank, where llm-foundry
    drops FSDP."""
    return (_plain(_select(cfg, "fsdp_config")) or None) if world > 1 else None


def sharded_checkpoints(cfg, world: int) -> bool:
    """Whether a run at this world size writes (and loads) sharded checkpoints: under FSDP, with
    fsdp_config.state_dict_type sharded (composer's FSDPConfig and llm-foundry read a missing one as full)."""
    return value_of(fsdp_used(cfg, world), "state_dict_type", "full") == "sharded"


def step_seconds(cfg, world: int) -> float | None:
    """Seconds per step at the plan's throughput (cluster.peak_flops x cluster.mfu): the global batch's tokens at
    the FLOPs per token of the length trained. None where the cluster gives no throughput, or the config no
    figures to count (the rules name what is missing)."""
    peak, mfu = _select(cfg, "cluster.peak_flops"), _select(cfg, "cluster.mfu")
    if not peak or not mfu:
        return None
    seq = trained_seq_len(cfg)
    try:
        flops = flops_per_token(_plain(_select(cfg, "model")), seq)
        return _select(cfg, "global_train_batch_size") * seq * flops / (peak * mfu * world)
    except (TypeError, ValueError, KeyError, ZeroDivisionError):
        return None


def trained_seq_len(cfg) -> int | None:
    """The length llm-foundry's train loader cuts samples to: train_loader.dataset.max_seq_len (a YAML interpolates
    its variables.max_seq_len there, so a top-level max_seq_len= does not reach it), else the top-level max_seq_len."""
    return _select(cfg, "train_loader.dataset.max_seq_len") or _select(cfg, "max_seq_len")


def microbatch_trained(cfg, world: int):
    """The microbatch a rank trains with: device_train_microbatch_size, reduced by llm-foundry to the rank's share
    of the global batch when larger ('auto' and fractions as given)."""
    gbs, mb = _select(cfg, "global_train_batch_size"), _select(cfg, "device_train_microbatch_size")
    if isinstance(mb, int) and isinstance(gbs, int) and world and gbs % world == 0:
        return min(mb, gbs // world)
    return mb


def _share(cfg, world: int):
    """The microbatch at a world size, for the smallest node count: the rank's share of the global batch where
    that is smaller (also where it does not divide: _divides_from says which counts do), so it only shrinks."""
    gbs, mb = _select(cfg, "global_train_batch_size"), _select(cfg, "device_train_microbatch_size")
    return min(mb, max(1, gbs // world)) if isinstance(mb, int) and isinstance(gbs, int) and world else mb


def _divides_from(cfg, nodes):
    """The smallest node count >= nodes at which llm-foundry can split the global batch evenly across the ranks."""
    if nodes is None:
        return None
    gbs, tasks = _select(cfg, "global_train_batch_size"), _select(cfg, "cluster.tasks_per_node")
    for n in range(nodes, nodes * 64 + 1):
        if gbs % (n * tasks) == 0:
            return n
    return None
