"""llm-foundry's Hugging Face models (`model.name: hf_causal_lm`) pretrained from a configuration: a GPT-2-style and
a Llama-style YAML of the user's own (`yaml=PATH`) and the presets (model=llama3-8b, llama-tiny) are checked and
planned from the architecture's config without torch, train a few batches on CPU (the GPT-2 one at two ranks, FSDP2
over gloo, its embedding tied to its output layer, on C4 text in a byte-level tokenizer's samples; the Llama one at
one rank on C4 in gpt-neox-20b's), resume, export a Hugging Face folder that transformers loads offline, sample and
evaluate.

The architecture is read here as llm-foundry builds it, from mirrors of transformers' config classes
(train/config/hf_arch.py): the tests that import transformers compare the mirrors with the classes, and the plan's
parameter counts with the models transformers builds.
"""
import json
import shutil
import subprocess
from pathlib import Path

import pytest
from helpers import ROOT, TOKENIZER, run, training
from hydra.core.hydra_config import HydraConfig

from train.checks import Context, check, errors
from train.config import hf_arch
from train.config.compose import compose
from train.launch.spec import scheduler
from train.plan.estimate import param_count
from train.plan.forecast import build_plan

LLAMA_BASE = ROOT / "conf" / "model" / "_hf" / "llama"
OFFLINE = {"HF_HUB_OFFLINE": "1", "TRANSFORMERS_OFFLINE": "1"}

# A GPT-2-style pretraining YAML as llm-foundry's own (scripts/train/yamls/pretrain/gpt2-small.yaml) writes one, at a
# size two CPU cores train in seconds; its base config folder is written by transformers (docs/config.md).
GPT2_YAML = """\
variables:
  data_local: ./my-copy-c4
  data_remote:
  max_seq_len: 128
  global_seed: 17
  run_name: gpt2-style
max_seq_len: ${variables.max_seq_len}
run_name: ${variables.run_name}
model:
  name: hf_causal_lm
  pretrained_model_name_or_path: BASE
  pretrained: false
  config_overrides:
    n_positions: ${variables.max_seq_len}
    n_embd: 64
    n_layer: 2
    n_head: 4
    vocab_size: 50304
tokenizer:
  name: TOKENIZER
  kwargs:
    model_max_length: ${variables.max_seq_len}
train_loader:
  name: text
  dataset:
    local: ${variables.data_local}
    remote: ${variables.data_remote}
    split: train
    shuffle: true
    max_seq_len: ${variables.max_seq_len}
    shuffle_seed: ${variables.global_seed}
  drop_last: true
  num_workers: 0
eval_loader:
  name: text
  dataset:
    local: ${variables.data_local}
    remote: ${variables.data_remote}
    split: val
    shuffle: false
    max_seq_len: ${variables.max_seq_len}
    shuffle_seed: ${variables.global_seed}
  drop_last: false
  num_workers: 0
scheduler: {name: cosine_with_warmup, t_warmup: 1ba, alpha_f: 0.1}
optimizer: {name: decoupled_adamw, lr: 1.0e-3, betas: [0.9, 0.95], eps: 1.0e-08, weight_decay: 0.0}
algorithms:
  gradient_clipping: {clipping_type: norm, clipping_threshold: 1.0}
max_duration: 4ba
eval_interval: 2ba
eval_subset_num_batches: 2
global_train_batch_size: 8
device_train_microbatch_size: 4
device_eval_batch_size: 4
seed: ${variables.global_seed}
precision: fp32
save_interval: 2ba
fsdp_config: {sharding_strategy: FULL_SHARD, mixed_precision: PURE, state_dict_type: sharded}
"""

# A Llama-style one (as llm-foundry's hf-llama-3.1-8B.yaml, its sizes in config_overrides) on this checkout's
# base folder, without FSDP (one file per checkpoint, as llm-foundry writes one without fsdp_config).
LLAMA_YAML = GPT2_YAML.replace("run_name: gpt2-style", "run_name: llama-style").replace("""\
  config_overrides:
    n_positions: ${variables.max_seq_len}
    n_embd: 64
    n_layer: 2
    n_head: 4
    vocab_size: 50304""", """\
  config_overrides:
    hidden_size: 64
    intermediate_size: 176
    num_hidden_layers: 2
    num_attention_heads: 4
    num_key_value_heads: 2
    head_dim: 16
    max_position_embeddings: ${variables.max_seq_len}
    rope_theta: 500000.0
    vocab_size: 50304""").replace(
    "fsdp_config: {sharding_strategy: FULL_SHARD, mixed_precision: PURE, state_dict_type: sharded}\n", "")


def yaml_file(folder, text, base, tokenizer=TOKENIZER) -> str:
    path = folder / "recipe.yaml"
    path.write_text(text.replace("BASE", str(base)).replace("TOKENIZER", str(tokenizer)))
    return str(path)


def composed(*overrides):
    cfg = compose(list(overrides))
    return cfg, Context(mode="plan", overrides=tuple(overrides), choices=dict(HydraConfig.get().runtime.choices),
                        scheduler=scheduler(cfg))


def problems(*overrides) -> list:
    cfg, ctx = composed(*overrides)
    return [(p.key, p.level) for p in check(cfg, ctx)]


# ---- checked and planned on the login node (no torch) -----------------------------------------------------------


# meta-llama/Meta-Llama-3-8B's config.json: the values that make its architecture
LLAMA3_8B = {"hidden_size": 4096, "num_hidden_layers": 32, "num_attention_heads": 32, "num_key_value_heads": 8,
             "intermediate_size": 14336, "vocab_size": 128256, "rope_theta": 500000.0, "max_position_embeddings": 8192,
             "rms_norm_eps": 1e-05, "tie_word_embeddings": False, "attention_bias": False, "mlp_bias": False,
             "hidden_act": "silu", "rope_scaling": None, "head_dim": 128}


def test_llama3_8b_preset_plans_llama_3_8bs_published_parameter_count():
    """Meta's Llama 3 8B: 8,030,261,248 parameters (4096 wide, 32 layers, 8 key/value heads, a 14336 SwiGLU, an
    untied 128256-token output layer); the plan counts them from the preset's config_overrides, offline."""
    cfg, ctx = composed("model=llama3-8b", "cluster=ndv5", "data=c4")
    assert not errors(check(cfg, ctx))
    built = hf_arch.attributes(hf_arch.foundry_model(dict(cfg.model)))
    assert {k: built[k] for k in LLAMA3_8B} == LLAMA3_8B
    plan = build_plan(cfg)
    assert plan["params"] == 8_030_261_248
    assert plan["model"] == {"model_type": "llama", "d_model": 4096, "n_heads": 32, "kv_heads": 8, "n_layers": 32,
                             "max_seq_len": 8192, "vocab_size": 128256}
    assert plan["checkpoint_bytes"] == 12 * 8_030_261_248 and plan["fits"] is not None


def test_llama_tiny_is_the_architectures_smallest_and_its_vocabulary_follows_the_data():
    cfg, ctx = composed("model=llama-tiny")
    assert not errors(check(cfg, ctx))
    assert hf_arch.foundry_model(dict(cfg.model))["config_overrides"]["vocab_size"] == 320  # mock: 257 ids
    cfg, _ = composed("model=llama-tiny", "data=c4")  # the data group's vocabulary, as for mpt-tiny
    assert hf_arch.foundry_model(dict(cfg.model))["config_overrides"]["vocab_size"] == 50368


def test_config_overrides_are_checked_against_the_architectures_config_class():
    """What llm-foundry refuses (or builds otherwise than asked) after the queue, said before: an attribute the
    config class lacks, a head size the base config derived before the overrides changed the width (LlamaConfig's
    head_dim stays 4096 / 32 = 128: silently four times the heads' width), an MPT key, a GPT-2 shorter than its
    samples."""
    cfg, ctx = composed("model=llama-tiny", "+model.config_overrides.hidden_sizes=64")
    [p] = errors(check(cfg, ctx))
    assert p.key == "model.config_overrides.hidden_sizes" and "LlamaConfig" in p.problem
    assert p.fix == "did you mean `hidden_size`?"
    cfg, ctx = composed("model=llama-tiny", "~model.config_overrides.head_dim")
    [p] = errors(check(cfg, ctx))
    assert p.key == "model.config_overrides.head_dim" and "head_dim=128" in p.problem
    assert p.fix == "model.config_overrides.head_dim=32"
    assert problems("model=llama-tiny", "+model.d_model=128") == [("model.d_model", "error")]
    assert problems("model=llama-tiny", "+model.attn_config.alibi=true") == [("model.attn_config.alibi", "error")]
    assert problems("model=llama-tiny", "model.config_overrides.num_key_value_heads=3") == [
        ("model.config_overrides.num_key_value_heads", "error")]
    assert problems("model=llama-tiny", "variables.max_seq_len=256", "model.config_overrides.max_position_embeddings=128") \
        == [("model.config_overrides.max_position_embeddings", "warning")]  # rotary positions go on
    assert problems("model=llama-tiny", "model.pretrained=true") == [("model.pretrained", "error")]  # no weights
    assert problems("model=llama-tiny", "+model.config_overrides.vocab_size=200") == [
        ("model.config_overrides.vocab_size", "error")]  # the mock tokenizer's 257 ids


def test_a_gpt2_shorter_than_its_samples_is_refused(tmp_path):
    base = tmp_path / "gpt2"
    base.mkdir()
    (base / "config.json").write_text(json.dumps({"model_type": "gpt2"}))
    path = yaml_file(tmp_path, GPT2_YAML, base)
    cfg, ctx = composed(f"yaml={path}", "variables.data_local=/tmp/nowhere", "model.config_overrides.n_positions=64")
    found = [p for p in errors(check(cfg, ctx)) if p.key.startswith("model")]
    assert [p.key for p in found] == ["model.config_overrides.n_positions"] and "IndexError" in found[0].problem


@pytest.mark.e2e
def test_a_hub_name_not_on_this_machine_is_refused_naming_the_key_and_the_fix(tmp_path, cli):
    """Compute nodes are offline: a base config named by its hub name and not in the hub cache would fail as the
    run starts (and the plan cannot count it): refused, with the local folder and the download as fixes."""
    proc = cli("train", "model=llama-tiny", "model.pretrained_model_name_or_path=meta-llama/Meta-Llama-3-8B",
               "plan=true", check=2, env={"HF_HUB_CACHE": str(tmp_path / "empty-cache")})
    assert "error: model.pretrained_model_name_or_path: 'meta-llama/Meta-Llama-3-8B' is a Hugging Face hub name" \
        in proc.stderr
    assert f"model.pretrained_model_name_or_path={LLAMA_BASE}" in proc.stderr
    assert "huggingface-cli download meta-llama/Meta-Llama-3-8B config.json" in proc.stderr
    assert not proc.stdout and not (tmp_path / "outputs").exists()


# ---- against transformers and llm-foundry themselves -----------------------------------------------------------


@pytest.mark.torch  # imports transformers (torch)
@pytest.mark.parametrize("model_type", sorted(hf_arch.MIRRORS))
def test_the_mirrored_config_classes_are_transformers_own(model_type):
    import transformers
    from transformers import AutoConfig, PretrainedConfig

    mirror = hf_arch.MIRRORS[model_type]
    cls = getattr(transformers, mirror["class"])
    assert AutoConfig.for_model(model_type).__class__ is cls
    import inspect

    signature = {k: p.default for k, p in inspect.signature(cls.__init__).parameters.items()
                 if k not in ("self", "kwargs")}
    assert signature == mirror["defaults"]
    assert cls.attribute_map == mirror["attribute_map"]
    assert set(vars(PretrainedConfig())) == set(hf_arch.PRETRAINED_CONFIG_ATTRIBUTES)
    assert all(hasattr(PretrainedConfig(), k) for k in hf_arch.PRETRAINED_CONFIG_PROPERTIES)
    # constructed as transformers constructs it, derived values included
    base = {"model_type": model_type, "num_attention_heads": 8, "hidden_size": 256} if model_type == "llama" else \
        {"model_type": model_type, "n_head": 8, "hidden_size": 256}
    ours = hf_arch.construct(model_type, base)
    theirs = AutoConfig.for_model(**base).to_dict()
    assert {k: v for k, v in ours.items() if k in theirs} == {k: theirs[k] for k in ours if k in theirs}


@pytest.mark.torch  # builds the models with transformers, on the meta device
@pytest.mark.parametrize("overrides", [
    {},  # the base config alone
    {"hidden_size": 96, "num_attention_heads": 6, "head_dim": 24, "num_key_value_heads": 2, "intermediate_size": 200,
     "num_hidden_layers": 3, "vocab_size": 1000, "attention_bias": True, "mlp_bias": True},
    {"hidden_size": 64, "num_attention_heads": 4, "head_dim": 32, "num_key_value_heads": 4, "num_hidden_layers": 2,
     "tie_word_embeddings": True, "vocab_size": 500},
    {"model_type": "gpt2", "n_embd": 48, "n_layer": 2, "n_head": 4, "vocab_size": 700, "n_positions": 64},
    {"model_type": "gpt2", "hidden_size": 32, "num_hidden_layers": 1, "n_head": 2, "n_inner": 50,
     "tie_word_embeddings": False, "vocab_size": 300, "max_position_embeddings": 16},
])
def test_the_plans_parameter_count_is_the_built_models(tmp_path, overrides):
    """As llm-foundry builds it: AutoConfig from the base folder, config_overrides set by llm-foundry's own
    set_config_overrides, AutoModelForCausalLM.from_config."""
    import torch
    from llmfoundry.utils.config_utils import set_config_overrides
    from transformers import AutoConfig, AutoModelForCausalLM

    overrides = dict(overrides)
    model_type = overrides.pop("model_type", "llama")
    (tmp_path / "config.json").write_text(json.dumps({"model_type": model_type}))
    model = {"name": "hf_causal_lm", "pretrained_model_name_or_path": str(tmp_path), "config_overrides": overrides}
    config = AutoConfig.from_pretrained(tmp_path)
    set_config_overrides(config, overrides)
    with torch.device("meta"):
        built = AutoModelForCausalLM.from_config(config)
    assert param_count(model) == sum(p.numel() for p in built.parameters())
    assert hf_arch.model_shape(config.to_dict()) == hf_arch.model_shape(model)  # what the run's report reads


@pytest.mark.torch  # imports llm-foundry
def test_the_keys_hf_causal_lm_takes_are_llm_foundrys():
    import inspect

    from llmfoundry.models.hf import ComposerHFCausalLM

    from train.checks.foundry_names import HF_CAUSAL_LM_KEYS

    taken = set(inspect.signature(ComposerHFCausalLM.__init__).parameters) - {"self", "tokenizer"}
    assert set(HF_CAUSAL_LM_KEYS) == taken


@pytest.mark.torch  # composer's FSDP2 over a one-process gloo group
def test_llm_foundrys_wrapping_makes_each_decoder_layer_an_fsdp2_unit_and_keeps_the_tied_embedding(tmp_path,
                                                                                                    monkeypatch):
    """What composer's FSDP2 (the CPU clusters' FSDP_VERSION=2) makes of llm-foundry's hf models: each decoder layer
    is sharded as its own unit (llm-foundry marks them for wrapping; the plan's memory counts one unit gathered at a
    time), the embedding stays in the root unit with the output layer it is tied to (GPT-2)."""
    import torch.distributed as dist
    from composer.core import Precision
    from composer.distributed import parallelize_composer_model
    from composer.utils.parallelism import FSDP2Config
    from llmfoundry.models.hf import ComposerHFCausalLM
    from torch.distributed.fsdp import FSDPModule
    from transformers import AutoTokenizer

    (tmp_path / "config.json").write_text(json.dumps({"model_type": "gpt2"}))
    for key in ("RANK", "LOCAL_RANK", "NODE_RANK"):  # what composer reads of a rank's place
        monkeypatch.setenv(key, "0")
    for key in ("WORLD_SIZE", "LOCAL_WORLD_SIZE"):
        monkeypatch.setenv(key, "1")
    dist.init_process_group("gloo", init_method=f"file://{tmp_path / 'rendezvous'}", rank=0, world_size=1)
    try:
        model = ComposerHFCausalLM(AutoTokenizer.from_pretrained(TOKENIZER), str(tmp_path), pretrained=False,
                                   config_overrides={"n_embd": 32, "n_layer": 2, "n_head": 2, "vocab_size": 50304})
        parallelize_composer_model(model, None, FSDP2Config(), Precision.FP32)  # as composer's Trainer does
        inner = model.model.transformer
        assert all(isinstance(block, FSDPModule) for block in inner.h)
        assert not isinstance(inner.wte, FSDPModule) and isinstance(model.model, FSDPModule)
        assert model.model.lm_head.weight is inner.wte.weight
    finally:
        dist.destroy_process_group()


# ---- trained, resumed, exported, sampled, evaluated -------------------------------------------------------------
# One run of each YAML, made once for its tests by the module's fixtures, one step each (so that each test's setup
# holds one command): trained 2 batches, then the same run to 4 (it resumes from its checkpoint at batch 2), then
# its newest checkpoint exported by `python -m train.export`. A run's tests share one pytest-xdist group, so that
# they run on one worker, which makes the run once.

GPT2_RANKS = ("-m", "cluster.tasks_per_node=2")  # two ranks: a process each (our launcher's)


def _metrics(root, run_name):
    found = sorted((root / "outputs").rglob("metrics.json"), key=lambda p: p.stat().st_mtime)
    return json.loads([p for p in found if json.loads(p.read_text()).get("run_name") == run_name][-1].read_text())


def _train(root, path, data, *args) -> subprocess.CompletedProcess:
    """`python -m train yaml=PATH ...` (helpers.training: in this process at one rank, a process per rank with
    `-m`)."""
    return training("-m", "train", f"yaml={path}", f"variables.data_local={data}", *args, root=root, check=True,
                    env=OFFLINE)


def _planned_and_trained(root, text, base, data, *launch, tokenizer=TOKENIZER) -> dict:
    """The YAML written, planned (`plan=json`, as many ranks as the training), and trained 2 batches."""
    path = yaml_file(root, text, base, tokenizer)
    ranks = [a for a in launch if a.startswith("cluster.tasks_per_node=")]
    plan = json.loads(run("-m", "train", f"yaml={path}", f"variables.data_local={data}", "plan=json", *ranks,
                          root=root, check=True).stdout)
    _train(root, path, data, *launch, "max_duration=2ba")
    return {"root": root, "path": path, "plan": plan}


def _resumed(first: dict, data, run_name, *launch, then=()) -> dict:
    """The same run to 4 batches (`then`: what that command adds): its metrics and what it logged."""
    root = first["root"]
    second = _train(root, first["path"], data, *launch, "max_duration=4ba", *then)
    logs = second.stderr + "".join(p.read_text() for p in (root / "outputs").rglob("*.err"))
    return {**first, "metrics": _metrics(root, run_name), "logs": logs}


def _assert_resumed(made: dict, run_name) -> None:
    assert [b for b, _ in made["metrics"]["train_loss"]] == [1, 2, 3, 4]  # batches 1-2 came through the checkpoint
    assert f"resuming from {made['root'] / 'checkpoints' / run_name / 'ep0-ba2'}" in made["logs"]


def _exported(made: dict, run_name) -> Path:
    """`python -m train.export RUN`: its newest checkpoint as a Hugging Face folder, where export=hf writes one."""
    root = made["root"]
    folder = root / "outputs" / run_name / "huggingface" / "ba4"
    out = run("-m", "train.export", run_name, root=root, check=True, env=OFFLINE)
    assert out.stdout.strip().splitlines()[-1] == str(folder) and (folder / "model.safetensors").is_file()
    return folder


def _sampled_and_scored(root, run_name, folder) -> None:
    assert "auto_map" not in json.loads((folder / "config.json").read_text())  # transformers' own class, no code
    sampled = run("-m", "train.sample", run_name, "The weather today is", "--max-new-tokens", "8",
                  "--temperature", "0", root=root, check=True, env=OFFLINE)
    assert sampled.stdout.startswith("The weather today is") and sampled.stdout.rstrip().endswith("---")
    scored = json.loads(run("-m", "train.evaluate", run_name, "--json", root=root, check=True,
                            env=OFFLINE).stdout.strip().splitlines()[-1])
    [(_, got)] = scored["evaluators"].items()
    assert got["trainer"]["batch"] == 4
    assert got["cross_entropy"] == pytest.approx(got["trainer"]["cross_entropy"], rel=1e-4)


@pytest.fixture(scope="session")
def c4_bytes(tmp_path_factory):
    """The real C4 excerpts of `c4_mds` in 128-token samples of a byte-level tokenizer (data=mock's: 256 bytes and
    an end of text), written by data_prep's command, made once: its folder, the tokenizer in `tokenizer`. composer
    keeps the tokenizer's files in every checkpoint, and a sharded one stores each entry of a vocabulary as an item
    of its own, saved and loaded one by one: gpt-neox-20b's 50,000 would make them the most of a two-rank run here."""
    from helpers import C4_FIRST, C4_SECOND, made_once, need_shared

    from train.task.mock_data import write_tokenizer

    need_shared()

    def make(out):
        write_tokenizer(out / "tokenizer")
        for split, source in (("train", C4_FIRST), ("val", C4_SECOND)):
            run("-m", "data_prep", "dataset=c4", f"input={source}", f"out_root={out}", f"split={split}",
                f"tokenizer={out / 'tokenizer'}", "concat_tokens=128", "num_parts=1", "progress=false", check=True,
                timeout=300)
    return made_once(tmp_path_factory, "c4-bytes", make)


@pytest.fixture(scope="module")
def gpt2_style(tmp_path_factory, c4_bytes):
    """The GPT-2-style YAML on a base config folder written by transformers (the documented offline step), planned
    and trained 2 batches at two ranks (FSDP2 over gloo, sharded checkpoints)."""
    from transformers import GPT2Config

    root = tmp_path_factory.mktemp("gpt2-style")
    GPT2Config().save_pretrained(root / "gpt2-config")
    return _planned_and_trained(root, GPT2_YAML, root / "gpt2-config", c4_bytes, *GPT2_RANKS,
                                tokenizer=c4_bytes / "tokenizer")


@pytest.fixture(scope="module")
def gpt2_resumed(gpt2_style, c4_bytes):
    return _resumed(gpt2_style, c4_bytes, "gpt2-style", *GPT2_RANKS)


@pytest.fixture(scope="module")
def gpt2_exported(gpt2_resumed):
    return _exported(gpt2_resumed, "gpt2-style")


@pytest.mark.train
@pytest.mark.xdist_group("gpt2-style")
def test_a_gpt2_style_yaml_plans_and_trains_at_two_ranks_with_a_shard_each(gpt2_style):
    plan = gpt2_style["plan"]
    # 50304 x 64 tied + 128 x 64 positions + 2 layers of 12 x 64^2 + 13 x 64 + the final norm
    assert plan["params"] == 50304 * 64 + 128 * 64 + 2 * (12 * 64 * 64 + 13 * 64) + 2 * 64
    assert plan["model"]["model_type"] == "gpt2" and plan["checkpoint_files"] == 2
    assert len(list((gpt2_style["root"] / "checkpoints" / "gpt2-style" / "ep0-ba2").glob("*.distcp"))) == 2


@pytest.mark.train
@pytest.mark.xdist_group("gpt2-style")
def test_a_gpt2_style_run_resumes_at_two_ranks_from_its_sharded_checkpoint(gpt2_resumed):
    _assert_resumed(gpt2_resumed, "gpt2-style")
    ckpt = gpt2_resumed["root"] / "checkpoints" / "gpt2-style"
    assert (ckpt / "ep0-ba4").is_dir() and len(list((ckpt / "ep0-ba4").glob("*.distcp"))) == 2


@pytest.mark.train
@pytest.mark.xdist_group("gpt2-style")
def test_a_gpt2_style_runs_export_samples_and_scores_the_trainers_eval(gpt2_resumed, gpt2_exported):
    _sampled_and_scored(gpt2_resumed["root"], "gpt2-style", gpt2_exported)


@pytest.mark.train
@pytest.mark.xdist_group("gpt2-style")
def test_a_gpt2_style_export_loads_in_transformers_with_its_embedding_tied(gpt2_style, gpt2_exported):
    import torch
    from transformers import AutoModelForCausalLM

    model = AutoModelForCausalLM.from_pretrained(gpt2_exported, local_files_only=True)
    assert model.lm_head.weight is model.transformer.wte.weight
    assert sum(p.numel() for p in model.parameters()) == gpt2_style["plan"]["params"]
    assert torch.isfinite(model.transformer.wte.weight).all()


@pytest.fixture(scope="module")
def llama_style(tmp_path_factory, c4_mds):
    """The Llama-style YAML on this checkout's base folder (its model type alone), planned and trained 2 batches at
    one rank (in this process), one checkpoint file each."""
    return _planned_and_trained(tmp_path_factory.mktemp("llama-style"), LLAMA_YAML, LLAMA_BASE, c4_mds)


@pytest.fixture(scope="module")
def llama_resumed(llama_style, c4_mds):
    """Resumed to 4 batches with export=hf: llm-foundry's hf_checkpointer writes the Hugging Face folder at the end
    (its config as written, before the export command writes the folder again)."""
    resumed = _resumed(llama_style, c4_mds, "llama-style", "export=hf")
    written = llama_style["root"] / "outputs" / "llama-style" / "huggingface" / "ba4" / "config.json"
    return {**resumed, "written": json.loads(written.read_text())}


@pytest.fixture(scope="module")
def llama_exported(llama_resumed):
    return _exported(llama_resumed, "llama-style")


@pytest.mark.train
@pytest.mark.xdist_group("llama-style")
def test_a_llama_style_yaml_plans_and_trains_at_one_rank_with_one_checkpoint_file(llama_style):
    assert llama_style["plan"]["model"] == {"model_type": "llama", "d_model": 64, "n_heads": 4, "kv_heads": 2,
                                            "n_layers": 2, "max_seq_len": 128, "vocab_size": 50304}
    assert (llama_style["root"] / "checkpoints" / "llama-style" / "ep0-ba2-rank0.pt").is_file()


@pytest.mark.train
@pytest.mark.xdist_group("llama-style")
def test_a_llama_style_run_resumes_and_its_export_hf_writes_the_tokenizers_end_of_text(llama_resumed):
    _assert_resumed(llama_resumed, "llama-style")
    assert (llama_resumed["root"] / "checkpoints" / "llama-style" / "ep0-ba4-rank0.pt").is_file()
    assert llama_resumed["written"]["eos_token_id"] == 0  # gpt-neox-20b's


@pytest.mark.train
@pytest.mark.xdist_group("llama-style")
def test_a_llama_style_runs_export_samples_and_scores_the_trainers_eval(llama_resumed, llama_exported):
    config = json.loads((llama_exported / "config.json").read_text())
    assert (config["head_dim"], config["num_key_value_heads"], config["eos_token_id"]) == (16, 2, 0)  # gpt-neox's
    _sampled_and_scored(llama_resumed["root"], "llama-style", llama_exported)


@pytest.mark.train
@pytest.mark.xdist_group("llama-style")
def test_a_llama_style_export_alone_loads_in_transformers_with_the_plans_parameter_count(llama_style, llama_exported,
                                                                                       tmp_path):
    from transformers import AutoModelForCausalLM

    alone = shutil.copytree(llama_exported, tmp_path / "model")  # no checkpoints, no run beside it
    model = AutoModelForCausalLM.from_pretrained(alone, local_files_only=True)
    assert model.num_parameters() == llama_style["plan"]["params"]


def test_a_run_continued_with_another_width_is_told_by_its_config_overrides():
    """A named run's checkpoints (its record's identity) or a load_path's (the config composer stores) against a
    command of another architecture: the overrides that size the weights are named, before the queue (else torch's
    size mismatch after it)."""
    from train.checks.checkpoints import other_shape
    from train.config.identity import identity

    ran = identity(compose(["model=llama-tiny"]))
    wider = identity(compose(["model=llama-tiny", "model.config_overrides.hidden_size=256",
                              "model.config_overrides.head_dim=64"]))
    assert other_shape(ran, wider) == ("model.config_overrides.hidden_size=128 there, 256 here; "
                                       "model.config_overrides.head_dim=32 there, 64 here")
    assert other_shape(ran, identity(compose(["model=llama-tiny", "optimizer.lr=1e-3"]))) == ""
