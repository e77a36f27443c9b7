"""The names and types the login node checks without llm-foundry (train/checks/foundry_names.py) are the pinned
llm-foundry's own: its registries, its classes' keyword arguments, its TrainConfig's fields and types."""
import dataclasses
import importlib
import inspect
import typing

import pytest

from train.checks import foundry_names as ours

pytestmark = pytest.mark.torch  # imports llm-foundry (and torch)


def _kwargs(obj):
    init = inspect.unwrap(obj.__init__) if inspect.isclass(obj) else obj
    params = inspect.signature(init).parameters.values()
    if any(p.kind == p.VAR_KEYWORD for p in params):
        return None
    kept = [p for p in params if p.name not in ("self", "params") and p.kind != p.VAR_POSITIONAL]
    return tuple(p.name for p in kept), tuple(p.name for p in kept if p.default is p.empty)


def _type(t):
    if typing.get_origin(t) is typing.Union:
        return "|".join(_type(a) for a in typing.get_args(t))
    if t is type(None):
        return "None"
    if typing.get_origin(t) in (dict, list):
        return typing.get_origin(t).__name__
    return t.__name__


def _upstream(reg) -> dict:
    """A registry's entries as llm-foundry registers them: a training run in this process (a test that trains
    in-process) adds ours (run_report) and registers a subclass of its own over one (kill_loss_spike:
    common/compat.py); those are left out, and the subclass read as the class it stands for."""
    out = {}
    for n in reg.get_all():
        obj = reg.get(n)
        if getattr(obj, "__module__", "").split(".")[0] in ("train", "common"):
            obj = next((c for c in obj.__mro__ if c.__module__.startswith("llmfoundry.")), None) \
                if inspect.isclass(obj) else None
        if obj is not None:
            out[n] = obj
    return out


def test_registries_equal_the_pinned_llm_foundry():
    from llmfoundry import layers_registry, registry

    for name, kept in (("optimizers", ours.OPTIMIZERS), ("schedulers", ours.SCHEDULERS)):
        reg = _upstream(getattr(registry, name))
        assert {n: _kwargs(o) for n, o in reg.items()} == kept, name
    for name, kept in ours.OPTIMIZER_DEFAULTS.items():
        upstream = inspect.signature(registry.optimizers.get(name)).parameters.values()
        assert {a.name: list(a.default) if isinstance(a.default, tuple) else a.default for a in upstream
                if a.default is not inspect.Parameter.empty} == kept, name
    for name, kept in (("callbacks", ours.CALLBACK_KWARGS), ("loggers", ours.LOGGER_KWARGS),
                       ("algorithms", ours.ALGORITHM_KWARGS)):
        reg = _upstream(getattr(registry, name))
        assert {n: _kwargs(o) for n, o in reg.items()} == {n: kept[n] for n in reg}, name
    with_config = {n: _kwargs(o) for n, o in _upstream(registry.callbacks_with_config).items()}
    # llm-foundry passes these their train_config itself (and refuses one in their keys)
    assert {n: k and tuple(tuple(a for a in part if a != "train_config") for part in k) for n, k in
            with_config.items()} == {n: ours.CALLBACK_KWARGS[n] for n in with_config}
    assert set(ours.CALLBACK_KWARGS) == set(_upstream(registry.callbacks)) | set(with_config)
    for name, kept in (("dataloaders", ours.DATALOADERS), ("callbacks", ours.CALLBACKS),
                       ("callbacks_with_config", ours.CALLBACKS_WITH_CONFIG), ("algorithms", ours.ALGORITHMS),
                       ("loggers", ours.LOGGERS), ("models", ours.MODELS)):
        assert tuple(sorted(_upstream(getattr(registry, name)))) == kept, name
    for name, kept in (("attention_implementations", ours.ATTENTION_IMPLEMENTATIONS),
                       ("attention_classes", ours.ATTENTION_CLASSES), ("norms", ours.NORMS), ("ffns", ours.FFNS),
                       ("fcs", ours.FCS)):
        assert tuple(sorted(getattr(layers_registry, name).get_all())) == kept, name


def test_our_callbacks_are_registered_under_the_names_kept():
    from llmfoundry.registry import callbacks

    from train.task import run_report, tracking

    run_report.register()
    tracking.register()
    assert set(ours.OUR_CALLBACKS) <= set(callbacks.get_all())


def test_train_config_types_equal_the_pinned_llm_foundry():
    from llmfoundry.utils.config_utils import TrainConfig

    hints = typing.get_type_hints(TrainConfig)
    assert {f.name: _type(hints[f.name]) for f in dataclasses.fields(TrainConfig)} == ours.TRAIN_CONFIG


def test_build_optimizer_still_reads_the_extra_keys():
    from llmfoundry.utils import builders

    source = inspect.getsource(builders._extract_param_groups)
    for key in ours.OPTIMIZER_EXTRA:
        assert f"'{key}'" in source


def test_the_text_loaders_arguments_equal_the_pinned_llm_foundry():
    from llmfoundry.data.text_data import build_text_dataloader

    accepted, required = _kwargs(build_text_dataloader)
    passed = ("tokenizer", "device_batch_size")  # by llm-foundry's build_dataloader
    assert ours.TEXT_LOADER_KWARGS == (tuple(a for a in accepted if a not in passed),
                                       tuple(r for r in required if r not in passed))


def test_the_text_loaders_dataset_keys_equal_the_pinned_libraries():
    from llmfoundry.data import utils
    from llmfoundry.data.text_data import StreamingTextDataset
    from streaming import StreamingDataset

    params = set(inspect.signature(StreamingTextDataset).parameters) | set(inspect.signature(StreamingDataset).parameters)
    assert sorted(params) == list(ours.TEXT_DATASET_PARAMS)
    source = inspect.getsource(utils)
    for key in ours.TEXT_DATASET_EXTRA:
        assert f"dataset_cfg.get('{key}'" in source, key


def test_an_mpt_models_keys_equal_the_pinned_libraries():
    from llmfoundry.models.mpt import ComposerMPTCausalLM, MPTConfig
    from transformers import PretrainedConfig

    args = {*inspect.signature(MPTConfig.__init__).parameters, *inspect.signature(ComposerMPTCausalLM.__init__).parameters}
    assert sorted(args - {"self", "kwargs"} | {"name"}) == list(ours.MPT_MODEL_KEYS)
    assert sorted(PretrainedConfig().to_dict()) == list(ours.HF_CONFIG_KEYS)
    source = inspect.getsource(importlib.import_module("llmfoundry.command_utils.train"))  # the module, not train()
    for key in ours.MPT_MODEL_EXTRA:
        assert f"'{key}'" in source, key


def test_an_mpt_blocks_keyword_arguments_equal_the_pinned_llm_foundry():
    """What attn_config/ffn_config may hold (the attention class's and FFN builder's arguments, less the required
    ones the block passes itself), what the block keeps for itself, and what each initialization reads."""
    from llmfoundry.layers_registry import attention_classes, ffns, param_init_fns
    from llmfoundry.models.layers.blocks import MPTBlock

    def kept(obj, passed):
        spec = _kwargs(obj)
        return None if spec is None else (tuple(sorted(spec[0])), tuple(r for r in spec[1] if r not in passed))

    assert {n: kept(attention_classes.get(n), ("d_model", "n_heads")) for n in attention_classes.get_all()} == \
        {n: (tuple(sorted(a)), r) for n, (a, r) in ours.ATTENTION_KWARGS.items()}
    assert {*MPTBlock.args_to_exclude_in_attn_class.fget(None), "attn_type"} == set(ours.ATTENTION_CONFIG_EXTRA)
    assert {n: kept(ffns.get(n), ("d_model", "expansion_ratio")) for n in ffns.get_all()} == ours.FFN_KWARGS
    reads = {n: set(inspect.signature(param_init_fns.get(n)).parameters) - {"module", "kwargs"}
             for n in param_init_fns.get_all()}
    assert reads == {n: set(keys) for n, keys in ours.PARAM_INIT_FNS.items()}


def test_a_key_an_mpt_block_does_not_take_fails_the_build_and_one_its_initialization_ignores_does_not():
    """Why the first is refused on the login node and the second only warned."""
    from llmfoundry.models.mpt import MPTConfig, MPTForCausalLM

    tiny = dict(d_model=16, n_heads=2, n_layers=1, max_seq_len=8, vocab_size=64, init_device="cpu")
    for bad in ({"attn_config": {"attn_impl": "torch", "qk_lnorm": True}},
                {"ffn_config": {"ffn_type": "mptmlp", "expansion": 2}}):
        with pytest.raises(TypeError, match="unexpected keyword argument"):
            MPTForCausalLM(MPTConfig(**tiny, **bad))
    MPTForCausalLM(MPTConfig(**tiny, attn_config={"attn_impl": "torch"}, init_config={"init_std": 0.5}))


@pytest.mark.parametrize("text", ["100ba", "3e4tok", "0.5dur", "1ep", "2iter", "1sp", "10sec", "1e3BA", "1h", "45m",
                                  "1h30m", "10s", "01h", "1h1s", "25h", "90m", "1.5h", "1H", "1.5ba", "ba", "1m30",
                                  "5ms", "-3ba", "1 ba"])
def test_the_gates_time_parser_reads_what_composer_reads(text):
    """core.time_of against composer's Time.from_timestring: wall-clock times ("1h30m": seconds) included, which
    composer reads first (save_interval=1h was refused as 'not a time')."""
    from composer.core.time import Time

    from train.checks.core import time_of

    try:
        time = Time.from_timestring(text)
        theirs = (time.value, time.unit.value)
    except (ValueError, TypeError):
        theirs = None
    assert time_of(text) == theirs


def test_composers_fsdp_settings_equal_the_pinned_composer():
    """FSDPConfig keeps any other key and reads none (device_mesh it refuses); FSDP2Config (FSDP_VERSION=2) drops
    another key with a warning."""
    from composer.utils.parallelism import FSDP2Config, FSDPConfig

    assert tuple(sorted(f.name for f in dataclasses.fields(FSDPConfig) if f.init)) == ours.FSDP_CONFIG_KEYS
    assert tuple(sorted(FSDP2Config.settable_attrs())) == ours.FSDP2_CONFIG_KEYS
    assert FSDPConfig(sharding_strateg="SHARD_GRAD_OP").sharding_strategy == "FULL_SHARD"  # the typo, ignored
    with pytest.raises(ValueError, match="device mesh"):
        FSDPConfig(device_mesh=None)
    with pytest.warns(UserWarning, match="sharding_strateg.*will be ignored"):
        FSDP2Config.from_compatible_attrs({"sharding_strateg": "FULL_SHARD"})



def test_tensor_parallel_settings_equal_the_pinned_libraries():
    """llm-foundry pops `strategy` (its tp_strategies registry) and passes the rest with its layer plan to
    composer's TPConfig, which refuses another key; it needs strategy and tensor_parallel_degree."""
    from composer.utils.parallelism import TPConfig
    from llmfoundry.registry import tp_strategies
    from llmfoundry.utils.config_utils import process_init_device

    assert tuple(sorted(tp_strategies.get_all())) == ours.TP_STRATEGIES
    fields = {f.name for f in dataclasses.fields(TPConfig) if f.init}
    assert tuple(sorted(fields - {"layer_plan"} | {"strategy"})) == ours.TP_CONFIG_KEYS
    with pytest.raises(TypeError, match="tensor_parallel_degre"):
        TPConfig(tensor_parallel_degre=2, layer_plan={})
    with pytest.raises(TypeError, match="layer_plan"):
        TPConfig(**{"tensor_parallel_degree": 2, "layer_plan": {}}, layer_plan={})
    with pytest.raises(ValueError, match="requires 'strategy' and 'tensor_parallel_degree'"):
        process_init_device({}, None, {"strategy": "ffn"})


def test_the_shape_an_mpt_takes_for_a_key_left_out_equals_the_pinned_llm_foundry():
    """A continued run's record holds the model keys its config had; one it left out is MPT's default."""
    from llmfoundry.models.mpt import MPTConfig

    from train.checks.checkpoints import MPT_SHAPE_DEFAULTS, SHAPE_KEYS

    mpt = MPTConfig()
    parts = {"model": vars(mpt), "model.attn_config": mpt.attn_config, "model.ffn_config": mpt.ffn_config}
    # (n_heads: what kv_n_heads is, with multihead attention; kv_n_heads itself is compared as MPT derives it)
    assert MPT_SHAPE_DEFAULTS == {k: parts[k.rsplit(".", 1)[0]][k.rsplit(".", 1)[1]] for k in (*SHAPE_KEYS, "model.n_heads")
                                  if k not in ("model.name", "model.ffn_config.ffn_hidden_size",
                                               "model.attn_config.kv_n_heads")}
    assert "ffn_hidden_size" not in mpt.ffn_config  # derived from expansion_ratio: no default of its own


def test_the_icl_task_settings_equal_the_pinned_llm_foundry():
    """build_icl_evaluators passes a task's keys but its own to the task type's icl_datasets class: another key is
    a TypeError (raised at the call, before any file is read)."""
    from llmfoundry.registry import icl_datasets

    assert {n: set(_kwargs(icl_datasets.get(n))[0]) for n in icl_datasets.get_all()} == \
        {n: set(kept) for n, kept in ours.ICL_TASK_KWARGS.items()}
    with pytest.raises(TypeError, match="continuation_delimiterr"):
        icl_datasets.get("language_modeling")(dataset_uri="x.jsonl", tokenizer=None, max_seq_len=8, pad_tok_id=0,
                                              num_fewshot=0, destination_path="x", continuation_delimiterr=" ")

_BASE = dict(d_model=16, n_heads=2, n_layers=1, max_seq_len=8, vocab_size=64, expansion_ratio=4, no_bias=False,
             learned_pos_emb=True, tie_word_embeddings=True, init_device="cpu",
             ffn_config={"ffn_type": "mptmlp"}, attn_config={"attn_impl": "torch"})


def _shapes(**kw) -> dict:
    """The name and size of each weight of a small MPT with these settings over _BASE's."""
    from llmfoundry.models.mpt import MPTConfig, MPTForCausalLM

    return {k: tuple(v.shape) for k, v in MPTForCausalLM(MPTConfig(**{**_BASE, **kw})).state_dict().items()}


def test_each_setting_the_gate_calls_a_change_of_shape_changes_an_mpts_weights():
    """train/checks/checkpoints.py refuses continuing a run whose checkpoint holds a model of another shape: each
    of its SHAPE_KEYS changes the names or sizes of the weights (so torch's load of the other refuses it)."""
    from train.checks.checkpoints import SHAPE_KEYS

    changed = {"model.d_model": {"d_model": 32}, "model.n_layers": {"n_layers": 2}, "model.vocab_size": {"vocab_size": 72},
               "model.expansion_ratio": {"expansion_ratio": 2}, "model.no_bias": {"no_bias": True},
               "model.learned_pos_emb": {"learned_pos_emb": False},
               "model.tie_word_embeddings": {"tie_word_embeddings": False},
               "model.ffn_config.ffn_type": {"ffn_config": {"ffn_type": "mptglu"}},
               "model.ffn_config.ffn_hidden_size": {"ffn_config": {"ffn_type": "mptmlp", "ffn_hidden_size": 24}},
               "model.attn_config.attn_type": {"attn_config": {"attn_impl": "torch", "kv_n_heads": 1,
                                                               "attn_type": "grouped_query_attention"}},
               "model.attn_config.qk_ln": {"attn_config": {"attn_impl": "torch", "qk_ln": True}},
               "model.attn_config.qk_gn": {"attn_config": {"attn_impl": "torch", "qk_gn": True}},
               "model.attn_config.fused_qkv": {"attn_config": {"attn_impl": "torch", "fused_qkv": False}},
               "model.norm_type": {"norm_type": "rmsnorm"},  # no biases in its norms
               "model.attn_config.kv_n_heads": {"attn_config": {"attn_impl": "torch", "kv_n_heads": 1,
                                                                "attn_type": "grouped_query_attention"}}}
    assert set(changed) == set(SHAPE_KEYS) - {"model.name"}

    before = _shapes()
    for key, kw in changed.items():
        assert _shapes(**kw) != before, key
    assert _shapes(attn_config={"attn_impl": "torch", "attn_pdrop": 0.0}, emb_pdrop=0.1) == before  # not a shape


def test_the_heads_are_a_change_of_shape_exactly_where_mpts_weights_change_size():
    """Another n_heads of multihead attention splits the same weights into other heads: they load without a word,
    so it is warned as a change of what they compute (checks.checkpoints.FUNCTION_KEYS), not refused as a shape
    (it was, naming kv_n_heads and a load that would fail). With grouped query attention the keys and values are
    kv_n_heads heads of d_model/n_heads each: other_shape says a change exactly where MPT's weights change size."""
    from train.checks.checkpoints import other_function, other_shape

    def gqa(kv, heads):
        return {"n_heads": heads, "attn_config": {"attn_impl": "torch", "attn_type": "grouped_query_attention",
                                                  "kv_n_heads": kv}}

    def gn(heads):  # qk_gn: the query and key norms are head_dim wide
        return {"n_heads": heads, "attn_config": {"attn_impl": "torch", "qk_gn": True}}

    def identity(kw):
        attn = kw.get("attn_config", {})
        return {"model.name": "mpt_causal_lm", "model.d_model": 16, "model.n_heads": kw["n_heads"],
                **({"model.head_dim": kw["head_dim"]} if "head_dim" in kw else {}),
                **{f"model.attn_config.{k}": v for k, v in attn.items() if k != "attn_impl"}}

    pairs = [({"n_heads": 2}, {"n_heads": 4}), (gqa(1, 2), gqa(2, 4)), (gqa(1, 2), gqa(1, 4)), (gqa(2, 2), gqa(1, 2)),
             (gn(2), gn(4)), ({"n_heads": 2}, {"n_heads": 2, "head_dim": 4}), ({"n_heads": 2}, {"n_heads": 4, "head_dim": 4})]
    for a, b in pairs:
        same = _shapes(**a) == _shapes(**b)
        assert (other_shape(identity(a), identity(b)) == "") == same, (a, b)
        assert other_function(identity(a), identity(b)) == f"model.n_heads={a['n_heads']} there, {b['n_heads']} here" \
            if a["n_heads"] != b["n_heads"] else not other_function(identity(a), identity(b))
    assert _shapes(n_heads=4) == _shapes() and _shapes(**gqa(1, 2)) != _shapes(**gqa(1, 4))  # both kinds seen
    assert _shapes(**gn(2)) != _shapes(**gn(4)) and _shapes(n_heads=2, head_dim=4) != _shapes()
    # the FFN's activation, a dict: MPT's default gelu when left out
    mpt = {"model.name": "mpt_causal_lm"}
    assert other_function(mpt, {**mpt, "model.ffn_config.ffn_act_fn.name": "silu"}) == \
        "model.ffn_config.ffn_act_fn.name='gelu' there, 'silu' here"


def test_the_metrics_an_mpts_evaluator_reports_are_the_ones_an_objective_is_checked_against():
    """An Optuna objective naming a metric the evaluator does not report (`eval/LanguageCrossEntropyy`) is refused
    (checks.values.objective_reported): the metrics are the MPT's eval metrics that llm-foundry gives an eval_loader
    evaluator (all but the in-context learning ones, command_utils/train.py)."""
    from llmfoundry.eval.metrics import InContextLearningMetric
    from llmfoundry.models.mpt import ComposerMPTCausalLM

    from train.checks.foundry_names import LM_EVAL_METRICS

    model = ComposerMPTCausalLM(**_BASE, loss_fn="torch_crossentropy")
    reported = [name for name, metric in model.get_metrics(is_train=False).items()
                if not isinstance(metric, InContextLearningMetric)]
    assert sorted(reported) == sorted(LM_EVAL_METRICS)
