"""Model arithmetic from the config alone (no torch): parameter count and FLOPs per token."""


def param_count(model) -> int:
    """Parameters of llm-foundry's MPT for this model config (weights tied, as MPT does by default)."""
    d, layers, vocab = model["d_model"], model["n_layers"], model["vocab_size"]
    hidden = int(model.get("expansion_ratio", 4) * d)
    bias = not model.get("no_bias", False)  # MPTConfig keeps biases unless told
    per_layer = (
        3 * d * d + d * d           # Wqkv, out_proj
        + 2 * d * hidden            # up, down
        + 2 * d                     # two LayerNorm weights
        + bias * (3 * d + d + hidden + d + 2 * d)
    )
    embeddings = vocab * d + (model["max_seq_len"] * d if model.get("learned_pos_emb", True) else 0)
    return layers * per_layer + embeddings + d * (1 + bias)  # + final norm


def flops_per_token(model) -> float:
    """Training FLOPs per token: 6N for the matmuls plus attention's QK^T and AV (forward 2*2*L*s*d, x3)."""
    return 6 * param_count(model) + 12 * model["n_layers"] * model["max_seq_len"] * model["d_model"]
