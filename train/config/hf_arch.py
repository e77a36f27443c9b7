"""llm-foundry's `hf_causal_lm` models pretrained from a configuration: the architecture's config as transformers
builds it, read here without transformers, which imports torch (the submit path never does).

llm-foundry builds such a model (ComposerHFCausalLM, `pretrained: false`) in three steps: transformers' AutoConfig
reads `config.json` from `pretrained_model_name_or_path` (a local folder, or a hub name: downloaded, or found in the
hub cache), passing its values to the config class of its `model_type`, which derives some values from others as it
is constructed (LlamaConfig: head_dim = hidden_size / num_attention_heads, num_key_value_heads = the heads); then it
sets each of `config_overrides` on that config object (llmfoundry.utils.config_utils.set_config_overrides: an
attribute the config lacks is a ValueError) without deriving anything again; then AutoModelForCausalLM.from_config
makes fresh weights. `attributes` does the same from a mirror of the config classes (MIRRORS; compared with
transformers' own classes by tests/test_hf_models.py), and `shape` turns the result into the sizes the plan counts.

Compute nodes are offline: the base folder must be on this machine, or its config.json in the hub cache. The model
presets use folders of this checkout (conf/model/_hf/<model_type>/config.json, which hold the model type alone:
the architecture is in config_overrides); a user's YAML may point at them, at a folder of its own (any config.json
with a `model_type`, e.g. `LlamaConfig().save_pretrained(folder)`), or at a hub name downloaded beforehand.

Our groups set MPT's knobs in `model:` (the cluster's attention implementation, loss and init device, the data's
vocabulary size); `foundry_model` says them in hf_causal_lm's terms, as llm-foundry is handed the model
(train/task/foundry.py).
"""
import functools
import json
from pathlib import Path

NAME = "hf_causal_lm"

# What our groups put in `model:` in MPT's keys (conf/cluster/_cpu.yaml, _slurm.yaml; conf/data/*.yaml), which
# ComposerHFCausalLM does not take (a TypeError as the model is built): said in its terms by foundry_model.
GROUP_KNOBS = ("attn_config", "loss_fn", "vocab_size")
# MPT's attention implementations (the cluster's model.attn_config.attn_impl) as transformers' attn_implementation:
# flash attention on GPUs (flash-attn, in the image), transformers' plain attention (llm-foundry's default) else.
ATTENTION = {"flash": "flash_attention_2", "torch": None}


def is_hf(model) -> bool:
    return value_of(model, "name") == NAME


def value_of(node, key, default=None):
    """node[key], or default where the node has none, holds null, or is not a mapping (a model config read as
    given: plain dicts and OmegaConf nodes alike)."""
    try:
        v = node.get(key, default)
    except AttributeError:
        return default
    return default if v is None else v


def _plain(node):
    from omegaconf import OmegaConf

    if OmegaConf.is_config(node):
        return OmegaConf.to_container(node, resolve=True)
    return node


def overrides(model) -> dict:
    """config_overrides as llm-foundry gets them: the architecture's own, with model.vocab_size (the vocabulary our
    data groups size for their tokenizer, or a preset's) where they do not set vocab_size."""
    found = dict(_plain(value_of(model, "config_overrides", {})) or {})
    vocab = value_of(model, "vocab_size")
    if vocab is not None and "vocab_size" not in found:
        found["vocab_size"] = vocab
    return found


def foundry_model(model: dict, special: dict | None = None) -> dict:
    """The `model:` section llm-foundry is handed: for an hf_causal_lm, our groups' MPT knobs in its terms (the
    attention implementation, the vocabulary in config_overrides; MPT's loss setting dropped: transformers'
    models compute their own loss). The checks refuse any other MPT key, and an attn_config beyond attn_impl.
    `special`: the tokenizer's {bos_token_id, eos_token_id} (train/config/vocab.py special_ids), set where the
    overrides do not: the base config's are its own family's (LlamaConfig's end of text is id 2, a byte or a word of
    another tokenizer), which the model's exports carry and generation stops at. (Not the pad token: transformers'
    embeddings keep a pad id's row out of training.)"""
    if not is_hf(model):
        return model
    out = {k: v for k, v in model.items() if k not in GROUP_KNOBS}
    out["config_overrides"] = {**(special or {}), **overrides(model)}
    impl = ATTENTION.get(value_of(value_of(model, "attn_config", {}), "attn_impl"))
    if impl and not out.get("use_flash_attention_2") and out.get("attn_implementation") is None:
        out["attn_implementation"] = impl
    return out


# ---- the config classes, mirrored -------------------------------------------------------------------------------

# Every transformers PretrainedConfig's own attributes (set by its __init__) and properties: config_overrides may
# set these on any architecture.
PRETRAINED_CONFIG_ATTRIBUTES = (
    "_attn_implementation_autoset", "_attn_implementation_internal", "_commit_hash", "_name_or_path",
    "add_cross_attention", "architectures", "bad_words_ids", "begin_suppress_tokens", "bos_token_id",
    "chunk_size_feed_forward", "cross_attention_hidden_size", "decoder_start_token_id", "diversity_penalty",
    "do_sample", "early_stopping", "encoder_no_repeat_ngram_size", "eos_token_id",
    "exponential_decay_length_penalty", "finetuning_task", "forced_bos_token_id", "forced_eos_token_id", "id2label",
    "is_decoder", "is_encoder_decoder", "label2id", "length_penalty", "max_length", "min_length",
    "no_repeat_ngram_size", "num_beam_groups", "num_beams", "num_return_sequences", "output_attentions",
    "output_hidden_states", "output_scores", "pad_token_id", "prefix", "problem_type", "pruned_heads",
    "remove_invalid_values", "repetition_penalty", "return_dict", "return_dict_in_generate", "sep_token_id",
    "suppress_tokens", "task_specific_params", "temperature", "tf_legacy_loss", "tie_encoder_decoder",
    "tie_word_embeddings", "tokenizer_class", "top_k", "top_p", "torch_dtype", "torchscript", "transformers_version",
    "typical_p", "use_bfloat16",
)
PRETRAINED_CONFIG_PROPERTIES = ("_attn_implementation", "name_or_path", "num_labels", "use_return_dict")
PRETRAINED_CONFIG_DEFAULTS = {"tie_word_embeddings": True}


def _llama_derived(attrs: dict) -> None:
    """LlamaConfig.__init__: the key/value heads and the head size where they are not given."""
    if attrs.get("num_key_value_heads") is None:
        attrs["num_key_value_heads"] = attrs["num_attention_heads"]
    if attrs.get("head_dim") is None:
        attrs["head_dim"] = attrs["hidden_size"] // attrs["num_attention_heads"]


# model_type -> the config class's arguments and their defaults, its attribute_map (aliases), what its __init__
# derives. transformers 4.51's LlamaConfig and GPT2Config (tests/test_hf_models.py compares them).
MIRRORS = {
    "llama": {
        "class": "LlamaConfig",
        "defaults": {"vocab_size": 32000, "hidden_size": 4096, "intermediate_size": 11008, "num_hidden_layers": 32,
                     "num_attention_heads": 32, "num_key_value_heads": None, "hidden_act": "silu",
                     "max_position_embeddings": 2048, "initializer_range": 0.02, "rms_norm_eps": 1e-6,
                     "use_cache": True, "pad_token_id": None, "bos_token_id": 1, "eos_token_id": 2,
                     "pretraining_tp": 1, "tie_word_embeddings": False, "rope_theta": 10000.0, "rope_scaling": None,
                     "attention_bias": False, "attention_dropout": 0.0, "mlp_bias": False, "head_dim": None},
        "attribute_map": {},
        "derive": _llama_derived,
    },
    "gpt2": {
        "class": "GPT2Config",
        "defaults": {"vocab_size": 50257, "n_positions": 1024, "n_embd": 768, "n_layer": 12, "n_head": 12,
                     "n_inner": None, "activation_function": "gelu_new", "resid_pdrop": 0.1, "embd_pdrop": 0.1,
                     "attn_pdrop": 0.1, "layer_norm_epsilon": 1e-5, "initializer_range": 0.02,
                     "summary_type": "cls_index", "summary_use_proj": True, "summary_activation": None,
                     "summary_proj_to_labels": True, "summary_first_dropout": 0.1, "scale_attn_weights": True,
                     "use_cache": True, "bos_token_id": 50256, "eos_token_id": 50256,
                     "scale_attn_by_inverse_layer_idx": False, "reorder_and_upcast_attn": False},
        "attribute_map": {"hidden_size": "n_embd", "max_position_embeddings": "n_positions",
                          "num_attention_heads": "n_head", "num_hidden_layers": "n_layer"},
        "derive": None,
    },
}


class ArchError(ValueError):
    """What keeps the architecture from being known here: (key, problem, fix), as a Problem says it. A ValueError:
    a rule that counts the model's figures after the architecture's own rule said it is passed over
    (train/checks/__init__.py)."""

    def __init__(self, key: str, problem: str, fix: str, options=()):
        super().__init__(f"{key}: {problem}")
        self.key, self.problem, self.fix = key, problem, fix
        self.options = tuple(options)  # the names a misspelt one may have meant (the checks suggest the nearest)


KEY = "model.pretrained_model_name_or_path"


def config_file(name) -> Path | None:
    """The config.json a pretrained_model_name_or_path stands for on this machine: a folder's, or a hub name's in
    the hub cache; None where there is none."""
    from data_prep.facts import hub_file

    path = Path(str(name)).expanduser()
    if path.is_dir():
        return path / "config.json" if (path / "config.json").is_file() else None
    if str(name).startswith(("/", "./", "../", "~")) or str(name).count("/") > 1:
        return None  # a path that does not exist, not a hub name
    return hub_file(str(name), "config.json")


def weights_in(name) -> bool:
    """Whether the folder (or the hub name's cached snapshot) holds weights for `pretrained: true`."""
    file = config_file(name)
    if file is None:
        return False
    return any(next(file.parent.glob(pattern), None) for pattern in ("*.safetensors", "pytorch_model*.bin",
                                                                      "model.safetensors.index.json"))


def base_config(name) -> tuple[dict, Path]:
    """(the base config.json's values, where it is); ArchError where it is not on this machine or not readable."""
    if not name:
        raise ArchError(KEY, "is not set: llm-foundry builds an hf_causal_lm from the config.json there",
                        f"{KEY}=<a folder holding config.json>, e.g. {_example('llama')}")
    file = config_file(name)
    if file is None:
        from data_prep.facts import hub_cache

        local = Path(str(name)).expanduser()
        if local.is_dir():
            raise ArchError(KEY, f"{local} holds no config.json (transformers' AutoConfig reads the architecture "
                            "from it)", f"a folder holding the architecture's config.json, e.g. {_example('llama')}"
                            " (its model_type alone; the sizes go in model.config_overrides)")
        if str(name).startswith(("/", "./", "../", "~")) or str(name).count("/") > 1:
            raise ArchError(KEY, f"{local.absolute()} does not exist", "the folder holding the architecture's "
                            f"config.json, e.g. {_example('llama')}")
        raise ArchError(KEY, f"{name!r} is a Hugging Face hub name whose config.json is not in the hub cache here "
                        f"({hub_cache()}): compute nodes are offline, so llm-foundry's AutoConfig would fail as the "
                        "run starts, and the checks and the plan cannot read the architecture",
                        f"a local folder: {KEY}={_example(_guess_type(name))} (the model type alone; the sizes go in "
                        "model.config_overrides), or one written where the hub is reachable (python -c \"from "
                        f"transformers import AutoConfig; AutoConfig.from_pretrained('{name}').save_pretrained('DIR')\""
                        f"), or download it into the cache: huggingface-cli download {name} config.json")
    try:
        found = json.loads(file.read_text())
    except (OSError, ValueError) as err:
        raise ArchError(KEY, f"{file} is not a readable JSON file ({err})", "write it again with "
                        "save_pretrained") from None
    if not isinstance(found, dict):
        raise ArchError(KEY, f"{file} holds no JSON object", "write it again with save_pretrained")
    return found, file


def _example(model_type: str) -> str:
    """A base folder of this checkout (conf/model/_hf/<model_type>, what the presets' ${hf_config:...} names)."""
    from common.paths import CONF

    return str(CONF / "model" / "_hf" / (model_type if model_type in MIRRORS else "llama"))


def _guess_type(name) -> str:
    lowered = str(name).lower()
    return "gpt2" if "gpt2" in lowered else "llama"


def known_attributes(model_type: str, base: dict) -> set:
    """The names a config of this type has an attribute for (what set_config_overrides' hasattr finds): its
    arguments, aliases, every PretrainedConfig's, and any key its config.json holds (kept as an attribute)."""
    mirror = MIRRORS[model_type]
    return {*mirror["defaults"], *mirror["attribute_map"], *PRETRAINED_CONFIG_ATTRIBUTES,
            *PRETRAINED_CONFIG_PROPERTIES, *base}


def construct(model_type: str, base: dict) -> dict:
    """The attributes of the config class of `model_type` constructed from a config.json's values (what AutoConfig
    does): its defaults, the values given, what its __init__ derives from them, then the rest of the values (set
    by PretrainedConfig's own __init__, through the aliases)."""
    mirror = MIRRORS[model_type]
    attrs = {**PRETRAINED_CONFIG_DEFAULTS, **mirror["defaults"]}
    given = {k: v for k, v in base.items() if k in mirror["defaults"]}
    attrs.update(given)
    if mirror["derive"]:
        mirror["derive"](attrs)
    for k, v in base.items():
        if k not in given:
            attrs[mirror["attribute_map"].get(k, k)] = v
    return attrs


def attributes(model) -> dict:
    """The architecture's config as llm-foundry builds it for this `model:` section (its base config.json, then
    config_overrides set one by one); ArchError where it cannot be known here or llm-foundry would refuse it."""
    name = value_of(model, "pretrained_model_name_or_path")
    return _attributes(str(name) if name else "", json.dumps(overrides(model), sort_keys=True, default=str),
                       _stamp(name))


def _stamp(name):
    """The config.json's time and size, so that a file written again is read again (the cache below)."""
    file = config_file(name) if name else None
    try:
        st = file.stat() if file else None
    except OSError:
        return None
    return (str(file), st.st_mtime_ns, st.st_size) if st else None


@functools.lru_cache(maxsize=64)  # the plan asks for the same model at many world sizes
def _attributes(name: str, given: str, stamp) -> dict:
    base, file = base_config(name)
    model_type = base.get("model_type")
    if model_type not in MIRRORS:
        raise ArchError(KEY, f"{file} is of model_type {model_type!r}: this tool checks, plans, exports and "
                        f"resumes the hf_causal_lm architectures {', '.join(sorted(MIRRORS))} (their config "
                        "classes mirrored here, without torch)", f"a config.json of model_type llama (Llama, "
                        f"Mistral-like: {_example('llama')}) or gpt2 ({_example('gpt2')}), or train that model "
                        "with llm-foundry's own scripts")
    attrs = construct(model_type, base)
    known = known_attributes(model_type, base)
    amap = MIRRORS[model_type]["attribute_map"]
    for key, v in json.loads(given).items():
        if key not in known:
            raise ArchError(f"model.config_overrides.{key}", f"is not an attribute of transformers' "
                            f"{MIRRORS[model_type]['class']} (model_type {model_type}, from {file}): llm-foundry "
                            f"refuses it as the model is built (\"config does not have attribute {key!r} to "
                            "override\"), after the queue", "remove it (the architecture's settings: "
                            f"{', '.join(sorted(MIRRORS[model_type]['defaults']))})",
                            options=sorted(k for k in known if not k.startswith("_")))
        current = attrs.get(amap.get(key, key))
        if isinstance(current, dict) and isinstance(v, dict):
            extra = sorted(set(v) - set(current))
            if extra:
                raise ArchError(f"model.config_overrides.{key}.{extra[0]}", f"is not a key of {key} ({', '.join(current)})"
                                ": llm-foundry refuses it as the model is built", f"one of {', '.join(current)}")
            attrs[amap.get(key, key)] = {**current, **v}
        else:
            attrs[amap.get(key, key)] = v
    attrs["model_type"] = model_type
    attrs["_base"], attrs["_given"] = str(file), sorted(json.loads(given))
    return attrs


def _int(attrs, key, source) -> int:
    v = attrs.get(key)
    if not isinstance(v, int) or isinstance(v, bool) or v <= 0:
        raise ArchError(f"model.config_overrides.{key}", f"must be a positive whole number, got {v!r} ({source})",
                        f"e.g. model.config_overrides.{key}=<a positive number>")
    return v


def shape(attrs: dict) -> dict:
    """The sizes of a Hugging Face model's config (attributes(), or a built model's config.to_dict()) as the plan
    counts them: width, layers, heads, the parameters of one decoder layer (an FSDP unit), of the embeddings and
    output layer, and of the final norm; ArchError where a size is missing or the attention cannot split."""
    model_type = attrs.get("model_type")
    src = f"model_type {model_type}"
    if model_type == "llama":
        d, layers = _int(attrs, "hidden_size", src), _int(attrs, "num_hidden_layers", src)
        heads, kv = _int(attrs, "num_attention_heads", src), _int(attrs, "num_key_value_heads", src)
        head, ffn, vocab = _int(attrs, "head_dim", src), _int(attrs, "intermediate_size", src), _int(attrs, "vocab_size", src)
        if heads % kv:
            raise ArchError("model.config_overrides.num_key_value_heads", f"{kv} does not divide num_attention_heads="
                            f"{heads}: each key/value head serves a whole number of query heads", "a divisor of "
                            "num_attention_heads (8 of 32 in Llama 3 8B)")
        q, k = heads * head, kv * head
        block = d * q + 2 * d * k + q * d + 3 * d * ffn + 2 * d
        block += bool(attrs.get("attention_bias")) * (q + 2 * k + d) + bool(attrs.get("mlp_bias")) * (2 * ffn + d)
        embedding = vocab * d * (1 if attrs.get("tie_word_embeddings") else 2)
        return {"d_model": d, "n_layers": layers, "n_heads": heads, "kv_heads": kv, "head_dim": head,
                "ffn_hidden": ffn, "vocab_size": vocab, "positions": attrs.get("max_position_embeddings"),
                "learned_positions": False, "block_params": block, "embedding_params": embedding, "final_params": d}
    if model_type == "gpt2":
        d, layers = _int(attrs, "n_embd", src), _int(attrs, "n_layer", src)
        heads, vocab, positions = _int(attrs, "n_head", src), _int(attrs, "vocab_size", src), _int(attrs, "n_positions", src)
        if d % heads:
            raise ArchError("model.config_overrides.n_head", f"{heads} does not divide n_embd={d} (GPT-2's attention "
                            "refuses it as the model is built)", "a head count that divides n_embd")
        ffn = attrs.get("n_inner") or 4 * d
        # c_attn (q, k, v with biases), c_proj, the MLP's c_fc and c_proj with biases, two layer norms
        block = (d * 3 * d + 3 * d) + (d * d + d) + (d * ffn + ffn) + (ffn * d + d) + 2 * 2 * d
        embedding = vocab * d + positions * d + (0 if attrs.get("tie_word_embeddings", True) else vocab * d)
        return {"d_model": d, "n_layers": layers, "n_heads": heads, "kv_heads": heads, "head_dim": d // heads,
                "ffn_hidden": ffn, "vocab_size": vocab, "positions": positions, "learned_positions": True,
                "block_params": block, "embedding_params": embedding, "final_params": 2 * d}
    raise ArchError(KEY, f"model_type {model_type!r} is not one this tool counts", "llama or gpt2")


def model_shape(model) -> dict:
    """shape() of a `model:` section (hf_causal_lm) or of a built model's config.to_dict()."""
    return shape(model if "model_type" in model else attributes(model))


def stale(attrs: dict) -> list:
    """(key, problem, fix) for each value the base config's class derived from sizes config_overrides change, which
    set_config_overrides does not derive again: the model is built at the old value without a word (LlamaConfig's
    head_dim: hidden_size 128 and 4 heads on the base's 4096 / 32 build heads 128 wide, four times the width)."""
    if attrs.get("model_type") != "llama":
        return []
    given, found = set(attrs["_given"]), []
    heads, d = attrs.get("num_attention_heads"), attrs.get("hidden_size")
    if {"hidden_size", "num_attention_heads"} & given and "head_dim" not in given and isinstance(heads, int) \
            and isinstance(d, int) and heads > 0 and attrs.get("head_dim") != d // heads:
        found.append(("model.config_overrides.head_dim", f"is not set, and LlamaConfig derived head_dim="
                      f"{attrs.get('head_dim')} from the base config ({attrs['_base']}) before config_overrides "
                      f"changed hidden_size/num_attention_heads ({d} / {heads}), which llm-foundry sets without "
                      f"deriving it again: every attention head would be {attrs.get('head_dim')} wide, not {d // heads}",
                      f"model.config_overrides.head_dim={d // heads}"))
    if "num_attention_heads" in given and "num_key_value_heads" not in given \
            and attrs.get("num_key_value_heads") != heads:
        found.append(("model.config_overrides.num_key_value_heads", f"is not set, and LlamaConfig derived "
                      f"num_key_value_heads={attrs.get('num_key_value_heads')} from the base config's heads before "
                      f"config_overrides set num_attention_heads={heads}; llm-foundry does not derive it again",
                      f"model.config_overrides.num_key_value_heads={heads} (multihead attention), or a divisor of "
                      "it (grouped-query)"))
    return found


# Attributes that size a Hugging Face architecture's weights (whatever their model_type: the names are the classes'
# own), so a checkpoint of one value does not load into another.
SHAPE_ATTRIBUTES = ("vocab_size", "hidden_size", "n_embd", "intermediate_size", "n_inner", "num_hidden_layers",
                    "n_layer", "num_key_value_heads", "head_dim", "tie_word_embeddings", "attention_bias", "mlp_bias",
                    "n_positions")


def shape_keys(*identities) -> tuple:
    """The identity keys (train/config/identity.py) that size the weights of runs of hf_causal_lm models, where all
    the identities are of one: compared where both runs name them (a checkpoint continued under another width is
    refused before the queue, not by torch's size mismatch after it)."""
    if not all(i.get("model.name") == NAME for i in identities):
        return ()
    return ("model.vocab_size", *(f"model.config_overrides.{a}" for a in SHAPE_ATTRIBUTES))
