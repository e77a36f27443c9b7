"""Rules about llm-foundry's Hugging Face models (`model.name: hf_causal_lm`): the keys ComposerHFCausalLM takes,
the architecture's config (its base folder on this machine, config_overrides against its config class, what that
class derived before them) and what its positions and attention allow. The architecture is read as llm-foundry
builds it, without transformers (train/config/hf_arch.py)."""
import importlib.util

from train.checks import foundry_names as names
from train.checks.core import ERROR, WARNING, Problem, close_match, nearest, value
from train.config import hf_arch

# Our groups' MPT knobs that an hf model takes in its own terms (hf_arch.foundry_model): attn_config.attn_impl alone.
_ATTENTION_KNOB = ("attn_impl",)


def _model(cfg):
    from omegaconf import OmegaConf

    node = value(cfg, "model")
    return OmegaConf.to_container(node, resolve=True) if OmegaConf.is_config(node) else node


def _by_user(ctx, key) -> bool:
    """Set on the command line or in the user's YAML (not by one of our groups)."""
    from train.checks.values import _recipe_value

    return ctx.given(key) is not None or _recipe_value(ctx, key) is not None


def model_keys(cfg, ctx):
    """ComposerHFCausalLM takes its own arguments and no other: an MPT key (d_model, attn_config's alibi) is a
    TypeError as the model is built, after the queue. Our groups' knobs (the cluster's attention implementation and
    loss, the data's vocab_size) are said in its terms; MPT's loss setting is not the model's to choose."""
    if value(cfg, "model.name") != hf_arch.NAME:
        return
    model = _model(cfg)
    known = (*names.HF_CAUSAL_LM_KEYS, "name", "master_weights_dtype", *hf_arch.GROUP_KNOBS)
    for key in model:
        if key not in known:
            yield Problem(f"model.{key}", "is not a setting of llm-foundry's hf_causal_lm (ComposerHFCausalLM's "
                          "arguments): a TypeError as the model is built, after the queue"
                          + ("; the architecture's sizes go in model.config_overrides" if key in
                             names.MPT_MODEL_KEYS else ""),
                          close_match(str(key), names.HF_CAUSAL_LM_KEYS) if key not in names.MPT_MODEL_KEYS else
                          "set the architecture's own attribute in model.config_overrides (llama: hidden_size, "
                          "num_hidden_layers, num_attention_heads; gpt2: n_embd, n_layer, n_head)")
    attn = model.get("attn_config")
    for key in (attn if isinstance(attn, dict) else {}):
        if key not in _ATTENTION_KNOB:
            yield Problem(f"model.attn_config.{key}", "is MPT's attention setting; an hf_causal_lm's attention is its "
                          "architecture's (model.config_overrides) and its implementation model.attn_implementation",
                          f"remove it (~model.attn_config.{key})")
    if model.get("loss_fn") is not None and _by_user(ctx, "model.loss_fn"):
        yield Problem("model.loss_fn", "is MPT's loss setting: a Hugging Face model computes its own loss, so it is "
                      "not passed on", "remove it", WARNING)
    overrides = model.get("config_overrides") or {}
    if not isinstance(overrides, dict):
        yield Problem("model.config_overrides", f"must be a mapping of the config's attributes, got "
                      f"{model.get('config_overrides')!r}", "e.g. model.config_overrides.hidden_size=1024")
    elif overrides.get("vocab_size") not in (None, model.get("vocab_size")) and _by_user(ctx, "model.vocab_size"):
        # the architecture's own vocabulary wins (hf_arch.overrides): the one given would be dropped without a word
        yield Problem("model.vocab_size", f"{model.get('vocab_size')!r} is not the vocabulary this model is built "
                      f"with: model.config_overrides.vocab_size={overrides['vocab_size']!r} (the architecture's) wins",
                      f"model.config_overrides.vocab_size={model.get('vocab_size')} (an hf_causal_lm's sizes are its "
                      "architecture's attributes)")


def architecture(cfg, ctx):
    """The architecture llm-foundry would build: its base config.json on this machine (compute nodes are offline),
    each of config_overrides an attribute of its config class (else llm-foundry's ValueError after the queue), no
    value the class derived from sizes the overrides change (set without deriving again: silently other widths),
    heads that split, and a sequence its positions hold."""
    if value(cfg, "model.name") != hf_arch.NAME or not isinstance(_model(cfg).get("config_overrides") or {}, dict):
        return
    try:
        attrs = hf_arch.attributes(_model(cfg))
        for key, problem, fix in hf_arch.stale(attrs):
            yield Problem(key, problem, fix)
        shape = hf_arch.shape(attrs)
    except hf_arch.ArchError as err:
        meant = nearest(err.key.rsplit(".", 1)[-1], err.options) if err.options else None
        yield Problem(err.key, err.problem, f"did you mean `{meant}`?" if meant else err.fix)
        return
    from train.plan.estimate import trained_seq_len

    seq, positions = trained_seq_len(cfg), shape["positions"]
    if isinstance(seq, int) and isinstance(positions, int) and seq > positions:
        key = "n_positions" if attrs["model_type"] == "gpt2" else "max_position_embeddings"
        if shape["learned_positions"]:
            yield Problem(f"model.config_overrides.{key}", f"{positions} positions, and the run trains samples of "
                          f"{seq} tokens: GPT-2 has a learned embedding per position, and a later position indexes "
                          "past it (an IndexError at the first step)", f"model.config_overrides.{key}={seq}, or "
                          f"max_seq_len={positions}")
        else:
            yield Problem(f"model.config_overrides.{key}", f"{positions}, and the run trains samples of {seq} tokens: "
                          "the rotary positions go on past it (nothing fails), but the config then says less than "
                          "the model was trained for", f"model.config_overrides.{key}={seq}", WARNING)


def building(cfg, ctx):
    """What llm-foundry refuses as it builds an hf_causal_lm, on every rank after the queue: pretrained weights
    with meta initialisation, weights that are not there, flash attention without a GPU, PEFT without peft."""
    if value(cfg, "model.name") != hf_arch.NAME:
        return
    model = _model(cfg)
    name = model.get("pretrained_model_name_or_path")
    pretrained = model.get("pretrained", True)  # ComposerHFCausalLM's default
    if pretrained and name and hf_arch.config_file(name) is not None and not hf_arch.weights_in(name):
        yield Problem("model.pretrained", f"{pretrained!r} (ComposerHFCausalLM's default where it is left out) loads "
                      f"weights from {name}, which holds a config and no weights (*.safetensors, pytorch_model.bin)",
                      "model.pretrained=false to pretrain the architecture from fresh weights")
    if pretrained and model.get("init_device") == "meta":
        yield Problem("model.init_device", "meta, with pretrained weights: llm-foundry refuses the pair ('Setting "
                      "cfg.pretrained=True is not supported when init_device=\"meta\"') as the model is built",
                      "model.init_device=mixed (rank 0 loads the weights, FSDP hands them out), or model.pretrained=false")
    flash = model.get("use_flash_attention_2") or model.get("attn_implementation") == "flash_attention_2"
    if flash and not (value(cfg, "cluster.gpus_per_node") or 0):
        yield Problem("model.use_flash_attention_2" if model.get("use_flash_attention_2") else
                      "model.attn_implementation", "flash attention runs on GPUs, and this cluster trains on CPUs",
                      "leave it out (transformers' eager attention), or model.attn_implementation=sdpa")
    if (model.get("peft_config") or model.get("pretrained_lora_id_or_path")) and not importlib.util.find_spec("peft"):
        key = "model.peft_config" if model.get("peft_config") else "model.pretrained_lora_id_or_path"
        yield Problem(key, "needs the peft package, which is not installed (llm-foundry refuses it as the model is "
                      "built)", "remove it: this tool pretrains whole models", ERROR)


RULES = [model_keys, architecture, building]
