"""`yaml=PATH` (or `python -m train PATH`): the user's own llm-foundry YAML, read as llm-foundry reads it, with our
groups beneath it and the command line over it. Inputs are llm-foundry's own published pretraining YAMLs."""
import json
import os
import subprocess
from pathlib import Path

import pytest
from helpers import SHARED, TOKENIZER, need_shared, run
from hydra.core.hydra_config import HydraConfig
from omegaconf import OmegaConf

from train.checks import Context, check, errors
from train.config.compose import command_line, compose
from train.launch.spec import scheduler
from train.plan.forecast import build_plan

YAMLS = SHARED / "llm-foundry-yamls" / "pretrain"
UPSTREAM = sorted(p.name for p in YAMLS.glob("*.yaml")) or ["(../shared absent)"]
# What a CPU needs that llm-foundry's GPU recipes do not say (docs/config.md, "Your own llm-foundry YAML").
CPU = ["precision=fp32", "train_loader.num_workers=1", "eval_loader.num_workers=1"]


@pytest.fixture(autouse=True)
def _shared():
    need_shared()


def _composed(*overrides):
    cfg = compose(list(overrides))
    ctx = Context(mode="plan", overrides=tuple(overrides), choices=dict(HydraConfig.get().runtime.choices),
                  scheduler=scheduler(cfg))
    return cfg, ctx


@pytest.mark.parametrize("name", UPSTREAM)
def test_each_published_yaml_composes_checks_and_plans_on_a_gpu_cluster(name):
    cfg, ctx = _composed(f"yaml={YAMLS / name}", "cluster=ndv5", "storage=amlfs",
                         "variables.data_local=/tmp/nowhere-c4")
    problems = check(cfg, ctx)
    # testing.yaml trains 200 batches and sets no save_interval (1000ba): its final checkpoint alone, which a GPU
    # cluster refuses (every requeue would start again at batch 0; train/checks/checkpoints.py)
    refused = ["save_interval"] if name == "testing.yaml" else []
    assert [p.key for p in errors(problems)] == refused, [str(p) for p in errors(problems)]
    assert cfg.run_name.startswith(name.removesuffix(".yaml") + "-")
    plan = build_plan(compose([f"yaml={YAMLS / name}", "cluster=ndv5", "storage=amlfs",
                               "plan=json"]))
    assert plan["world_size"] == 8 and plan["params"] > 0
    if name.startswith("mpt-") and name != "mpt-tiny.yaml":
        # the same model as our preset of that name (tests/test_presets_upstream.py compares the rest)
        ours = build_plan(compose([f"model={name.removesuffix('.yaml')}", "cluster=ndv5", "cluster.nodes=16",
                                   "storage=amlfs", "plan=json"]))
        assert plan["params"] == ours["params"]


def test_the_yaml_is_over_our_groups_and_the_command_line_over_the_yaml():
    path = YAMLS / "mpt-30b.yaml"
    cfg, _ = _composed(f"yaml={path}")  # cluster=local says fp32 and torch attention; the YAML says otherwise
    assert cfg.precision == "amp_bf16" and cfg.model.attn_config.attn_impl == "flash"
    assert cfg.eval_interval == "10000ba" and cfg.max_duration == "143100ba"
    # keys it does not set: our groups (checkpoint format and folder), conf/train.yaml (the checkpoint policy)
    assert cfg.fsdp_config.state_dict_type == "sharded" and cfg.save_interval == "1000ba"
    full, _ = _composed(f"yaml={path}", "checkpoint=full")
    assert full.fsdp_config.state_dict_type == "full"
    # no model preset beneath it: mpt-tiny's (the default) keys do not leak in
    assert cfg.model.d_model == 7168 and cfg.model.vocab_size == 50368
    # the command line, in llm-foundry's vocabulary, is last
    cli_cfg, _ = _composed(f"yaml={path}", "precision=fp32", "eval_interval=2000ba")
    assert cli_cfg.precision == "fp32" and cli_cfg.eval_interval == "2000ba"
    # a blank run_name (llm-foundry would read $RUN_NAME) gets our name: the YAML's stem and what it trains
    assert cfg.run_name.startswith("mpt-30b-")
    # its `run_name: ${variables.run_name}` takes the variable given on the command line, as in llm-foundry (it was
    # dropped when the file was read: the run went on under our name)
    named, _ = _composed(f"yaml={path}", "variables.run_name=my-exp-1")
    assert named.run_name == "my-exp-1" and named.save_folder.endswith("/my-exp-1")


# A recipe that leaves to llm-foundry what llm-foundry has defaults for: no alpha_f, weight_decay, betas,
# algorithms, shuffle_seed, seed, eval_loader, eval_interval or fsdp_config.
MINIMAL = """
variables: {data_local: /tmp/nowhere-c4, max_seq_len: 128, global_seed: 42}
max_seq_len: ${variables.max_seq_len}
model: {name: mpt_causal_lm, d_model: 64, n_heads: 2, n_layers: 2, max_seq_len: "${variables.max_seq_len}"}
tokenizer: {name: EleutherAI/gpt-neox-20b}
train_loader:
  name: text
  dataset: {local: "${variables.data_local}", split: train, shuffle: true, max_seq_len: "${variables.max_seq_len}"}
  drop_last: true
scheduler: {name: constant_with_warmup, t_warmup: 2ba}
optimizer: {name: decoupled_lionw, lr: 1.0e-4}
max_duration: 6ba
global_train_batch_size: 8
device_train_microbatch_size: 8
device_eval_batch_size: 8
"""


def test_what_the_yaml_leaves_out_is_llm_foundrys_default_not_ours(tmp_path):
    """Our presets' shared recipe (conf/recipe/mpt.yaml) filled every key a YAML left out: measured, a YAML without
    alpha_f, weight_decay, algorithms, shuffle_seed or eval_loader trained with alpha_f 0.1 (composer's default
    0.0), gradient clipping, seed 42 from variables.global_seed (llm-foundry's 17: nothing reads the variable),
    another data order, and an evaluation of the whole val split; a Lion or constant_with_warmup recipe was
    refused over Adam's eps and cosine's alpha_f it never wrote. Now the YAML is the whole recipe."""
    (tmp_path / "mine.yaml").write_text(MINIMAL)
    cfg, ctx = _composed(f"yaml={tmp_path / 'mine.yaml'}")
    assert dict(cfg.scheduler) == {"name": "constant_with_warmup", "t_warmup": "2ba"}
    assert dict(cfg.optimizer) == {"name": "decoupled_lionw", "lr": 1.0e-4}
    for absent in ("algorithms", "seed", "eval_interval", "eval_first", "eval_subset_num_batches",
                   "train_loader.dataset.shuffle_seed", "model.vocab_size", "model.expansion_ratio"):
        assert OmegaConf.select(cfg, absent, default="absent") == "absent", absent
    assert cfg.eval_loader is None and cfg.fsdp_config is None  # no evaluation, no FSDP: as llm-foundry reads it
    assert ctx.choices["checkpoint"] == "full"  # without FSDP composer writes one file
    assert not errors(check(cfg, ctx)), [str(p) for p in errors(check(cfg, ctx))]
    # the cluster's knobs still go beneath it (a CPU's attention and loss), and the command line over it, keys
    # the YAML left out included, without Hydra's `+`, as llm-foundry's command line takes them
    assert cfg.model.attn_config.attn_impl == "torch" and cfg.model.loss_fn == "torch_crossentropy"
    args = command_line([f"yaml={tmp_path / 'mine.yaml'}", "eval_interval=2ba", "seed=5", "model.n_layers=3",
                         "scheduler.alpha_f=0.5", "cluster.nodes=1"])
    assert args[1:] == ["++eval_interval=2ba", "++seed=5", "++model.n_layers=3", "++scheduler.alpha_f=0.5",
                        "cluster.nodes=1"]
    over, ctx = _composed(*args)
    assert (over.eval_interval, over.seed, over.model.n_layers, over.scheduler.alpha_f) == ("2ba", 5, 3, 0.5)
    # a misspelt one is added too, and refused by what it configures, as before
    typo, ctx = _composed(*command_line([f"yaml={tmp_path / 'mine.yaml'}", "optimizer.lrr=1e-3"]))
    assert [p.key for p in errors(check(typo, ctx))] == ["optimizer.lrr"]


def test_composers_run_name_placeholder_in_save_folder_is_the_runs_own_folder(tmp_path):
    """`save_folder: ./{run_name}/checkpoints` (llm-foundry's YAMLs): composer fills it; this tool read it as a
    folder named `{run_name}`, so every run of the YAML shared one finished.json: measured, a sweep point with
    another learning rate found the first run's and reported its numbers as its own, nothing trained, exit 0."""
    (tmp_path / "mine.yaml").write_text(MINIMAL + f"save_folder: {tmp_path}/{{run_name}}/ckpt\n")
    cfg, ctx = _composed(f"yaml={tmp_path / 'mine.yaml'}")
    other, _ = _composed(f"yaml={tmp_path / 'mine.yaml'}", "optimizer.lr=2e-4")
    assert cfg.save_folder == f"{tmp_path}/{cfg.run_name}/ckpt" and other.save_folder != cfg.save_folder
    assert command_line(["save_folder=/c/{run_name}/x"]) == ["save_folder=/c/${run_name}/x"]
    # composer's per-rank placeholders would give each rank a folder of its own: refused
    (tmp_path / "rank.yaml").write_text(MINIMAL + f"save_folder: {tmp_path}/{{rank}}/ckpt\n")
    cfg, ctx = _composed(f"yaml={tmp_path / 'rank.yaml'}")
    assert [p.key for p in errors(check(cfg, ctx))] == ["save_folder"]


def test_a_data_preset_beneath_a_yaml_with_its_own_data_folder_is_warned(tmp_path):
    """`data=c4` with a YAML that sets variables.data_local: the YAML's folder trains (groups go beneath it), the
    preset typed on the command line did nothing, without a word. Warned now; not when the folder is given."""
    (tmp_path / "mine.yaml").write_text(MINIMAL)
    cfg, ctx = _composed(f"yaml={tmp_path / 'mine.yaml'}", "data=c4")
    [warned] = [p for p in check(cfg, ctx) if p.key == "data"]
    assert warned.level == "warning" and "variables.data_local (/tmp/nowhere-c4) is what trains" in warned.problem
    cfg, ctx = _composed(f"yaml={tmp_path / 'mine.yaml'}", "data=c4", "variables.data_local=/tmp/other")
    assert not [p for p in check(cfg, ctx) if p.key == "data"]


def test_a_model_other_than_mpt_and_hf_causal_lm_is_refused_by_its_name_once(tmp_path):
    """An hf_t5 recipe got four errors about MPT keys it has no reason to set (`model.d_model: has no value`, the
    MPT defaults of our presets leaking into it); now one, naming model.name and why. (hf_causal_lm trains:
    tests/test_hf_models.py.)"""
    hf = "model: {name: hf_t5, pretrained_model_name_or_path: t5-small, pretrained: false}"
    (tmp_path / "hf.yaml").write_text("\n".join(hf if line.startswith("model:") else line
                                                for line in MINIMAL.splitlines()))
    cfg, ctx = _composed(f"yaml={tmp_path / 'hf.yaml'}")
    assert [(p.key, p.problem.split(":")[0]) for p in errors(check(cfg, ctx))] == [("model.name", "'hf_t5'")]


def test_variables_change_everything_that_reads_them_as_in_llm_foundry():
    path = YAMLS / "mpt-30b.yaml"
    base, _ = _composed(f"yaml={path}")
    longer, _ = _composed(f"yaml={path}", "variables.max_seq_len=4096", "variables.global_seed=42")
    for cfg, seq, seed in ((base, 2048, 17), (longer, 4096, 42)):
        assert (cfg.max_seq_len, cfg.model.max_seq_len, cfg.tokenizer.kwargs.model_max_length,
                cfg.train_loader.dataset.max_seq_len, cfg.eval_loader.dataset.max_seq_len) == (seq,) * 5
        assert (cfg.seed, cfg.train_loader.dataset.shuffle_seed) == (seed, seed)
    assert longer.run_name != base.run_name  # another training: another run
    # our presets keep the same two variables, so the same words work without a YAML
    for spelled in (["variables.max_seq_len=256"], ["max_seq_len=256"]):
        cfg, _ = _composed(*spelled)
        assert (cfg.model.max_seq_len, cfg.train_loader.dataset.max_seq_len) == (256, 256)
    assert _composed("variables.max_seq_len=256")[0].run_name == _composed("max_seq_len=256")[0].run_name
    assert _composed("variables.global_seed=42")[0].seed == 42


def test_a_variable_the_yaml_reads_and_does_not_set_is_asked_for_not_taken_from_ours(tmp_path):
    """conf/train.yaml's variables lie beneath a YAML: one that misspelt `global_seed: 42` as `global_sed` trained
    with our seed 17, and one without `variables.max_seq_len` at our 2048, exit 0. llm-foundry refuses such a YAML
    (an InterpolationKeyError): so is it here, naming the variable, unless the command line sets it."""
    text = (YAMLS / "testing.yaml").read_text().replace("global_seed: 17", "global_sed: 42")
    assert "global_sed: 42" in text and "${variables.global_seed}" in text
    (tmp_path / "typo.yaml").write_text(text)
    found = _problems("plan", f"yaml={tmp_path / 'typo.yaml'}", *CPU)
    assert found[("variables.global_seed", "error")] == (
        "your YAML reads it and its `variables:` does not set it: llm-foundry refuses such a YAML "
        "(InterpolationKeyError), and here it would take this tool's default, 17 set it under `variables:` in your "
        "YAML, or variables.global_seed=<value>")
    found = _problems("plan", f"yaml={tmp_path / 'typo.yaml'}", *CPU, "variables.global_seed=42")
    assert ("variables.global_seed", "error") not in found
    cfg, _ = _composed(f"yaml={tmp_path / 'typo.yaml'}", "variables.global_seed=42")
    assert (cfg.seed, cfg.train_loader.dataset.shuffle_seed) == (42, 42)
    # a preset chosen for it gives it as asked: data=c4 names the data folder a YAML without one reads
    (tmp_path / "nodata.yaml").write_text("".join(line for line in (YAMLS / "mpt-125m.yaml").read_text().splitlines(
        keepends=True) if "data_local:" not in line))
    found = _problems("plan", f"yaml={tmp_path / 'nodata.yaml'}", "cluster=ndv5", "data=c4")
    assert ("variables.data_local", "error") not in found, found


def test_a_yaml_without_a_microbatch_gets_llm_foundrys_auto(tmp_path):
    """llm-foundry's TrainConfig defaults device_train_microbatch_size to 'auto': a YAML without it was refused
    ("has no value", ours beneath is `???`), which llm-foundry trains."""
    text = "".join(line for line in (YAMLS / "mpt-125m.yaml").read_text().splitlines(keepends=True)
                   if not line.startswith("device_train_microbatch_size"))
    (tmp_path / "nomb.yaml").write_text(text)
    found = _problems("plan", f"yaml={tmp_path / 'nomb.yaml'}", "cluster=ndv5")
    assert not [k for k, level in found if k == "device_train_microbatch_size"]
    assert _composed(f"yaml={tmp_path / 'nomb.yaml'}")[0].device_train_microbatch_size == "auto"


def test_the_command_line_forms_llm_foundry_users_type():
    path = "../shared/data/llm-foundry-yamls/pretrain/mpt-7b.yaml"
    # `composer train.py <yaml> k=v`: the YAML as the first word; a relative path made absolute (a job composes
    # again in its own folder); -m first
    args = command_line([path, "cluster=ndv5", "-m"])
    assert args == ["-m", f"yaml={os.path.abspath(path)}", "cluster=ndv5"]
    assert command_line(["yaml=a b.yaml"]) == [f"yaml='{os.path.abspath('a b.yaml')}'"]
    assert command_line(["--config-name", "x.yaml"]) == ["--config-name", "x.yaml"]  # a flag's value stays



def _problems(mode, *overrides):
    cfg, ctx = _composed(*command_line(list(overrides)))
    return {(p.key, p.level): p.problem + " " + p.fix for p in check(cfg, Context(mode=mode, overrides=ctx.overrides,
                                                                                    choices=ctx.choices))}


def test_a_group_the_yaml_overrides_is_said_and_mock_data_never_lands_in_the_yamls_folder(tmp_path):
    """Measured, exit 0 and no word: `model=mpt-350m` on mpt-125m.yaml trained the 125M model; `checkpoint=none` on a
    YAML with its own save_folder kept saving; `data=mock` wrote synthetic shards into the YAML's data_local, and the
    same YAML without data=mock then trained on them (the same loss)."""
    recipe = tmp_path / "mine.yaml"
    recipe.write_text(MINIMAL.replace("/tmp/nowhere-c4", str(tmp_path / "my-data"))
                      + "save_folder: ./{run_name}/checkpoints\nfsdp_config: {state_dict_type: full}\n")
    found = _problems("plan", f"yaml={recipe}", "model=mpt-350m", "checkpoint=none", f"tokenizer.name={TOKENIZER}")
    # the YAML's model trains, and the preset's values where the YAML leaves a key out (it said "not used")
    assert found[("model", "warning")].startswith("model=mpt-350m goes beneath your YAML: what the YAML sets trains, "
                                                  "and the preset's values where it leaves a key out: "
                                                  "eval_interval=1000ba; fsdp_config.activation_checkpointing=False ")
    assert "save_folder, fsdp_config.state_dict_type are what trains" in found[("checkpoint", "warning")]
    # export= (or one of its keys) beneath a YAML with its own exporter: the YAML's exported (every 4ba in float32
    # where export.interval=2ba export.precision=bfloat16 asked, and the plan said bfloat16), no word
    exporting = tmp_path / "exporting.yaml"
    exporting.write_text(recipe.read_text() + "callbacks: {hf_checkpointer: {save_interval: 4ba, precision: float32, "
                         "save_folder: ./hf}}\n")
    for given in (["export=hf", "export.interval=2ba"], ["export.precision=bfloat16"]):
        said = _problems("plan", f"yaml={exporting}", *given, f"tokenizer.name={TOKENIZER}")[("export", "warning")]
        assert said.startswith(f"{given[0]} goes beneath your YAML, whose callbacks.hf_checkpointer.save_folder, "
                               "callbacks.hf_checkpointer.save_interval, callbacks.hf_checkpointer.precision are "
                               "what exports"), said
    assert ("export", "warning") not in _problems("plan", f"yaml={recipe}", "export=hf", f"tokenizer.name={TOKENIZER}")
    # data=c4 beneath a model that leaves its vocabulary out: the preset's 50368 trained (an MPT's default, or a
    # Hugging Face model's config, where llm-foundry reads the YAML alone), no word
    said = _problems("plan", f"yaml={recipe}", "data=c4", f"tokenizer.name={TOKENIZER}")[("model.vocab_size", "warning")]
    assert said.startswith("data=c4 goes beneath your YAML, whose model leaves vocab_size out: the preset's 50368 "
                           "trains"), said
    assert ("model.vocab_size", "warning") not in _problems("plan", f"yaml={recipe}", "data=c4", "model.vocab_size=512",
                                                           f"tokenizer.name={TOKENIZER}")
    assert ("model.vocab_size", "warning") not in _problems("plan", "data=c4", f"tokenizer.name={TOKENIZER}")  # no YAML
    # set on the command line, the YAML's key is not what trains: not said
    found = _problems("plan", f"yaml={recipe}", "checkpoint=none", "save_folder=null", f"tokenizer.name={TOKENIZER}")
    assert "save_folder," not in found.get(("checkpoint", "warning"), "")
    assert ("model", "warning") not in found
    run = _problems("run", f"yaml={recipe}", "data=mock", f"tokenizer.name={TOKENIZER}")
    assert str(tmp_path / "my-data") in run[("data", "error")]
    # with a folder of its own for the synthetic tokens, a smoke test of the YAML's model is fine
    own = _problems("run", f"yaml={recipe}", "data=mock", f"variables.data_local={tmp_path / 'mock'}",
                    f"tokenizer.name={TOKENIZER}")
    assert ("data", "error") not in own


def test_an_experiment_with_a_yaml_says_what_it_puts_over_and_beneath_it(tmp_path):
    """An experiment goes over the YAML, and its model and data presets beneath it: measured, exit 0 and no word,
    gpt-375m's dropout, GELU, init, param groups and a schedule to 430000ba trained mpt-125m.yaml's shape on the
    experiment's slimpajama folder; with mpt-30b-ndv5-amlfs the YAML's ./my-copy-c4 beat the experiment's data=c4."""
    path = YAMLS / "mpt-125m.yaml"
    found = _problems("plan", f"yaml={path}", "experiment=gpt-375m-ndv5-check")
    assert found[("model", "warning")].startswith(
        "model=gpt-375m (of experiment=gpt-375m-ndv5-check) goes beneath your YAML: what the YAML sets trains, and "
        "the preset's values where it leaves a key out: model.learned_pos_emb=True; ")
    assert "model.attn_config.attn_pdrop=0.1" in found[("model", "warning")]
    assert "scheduler.t_max=430000ba" in found[("model", "warning")]
    assert found[("experiment", "warning")].startswith(
        "experiment=gpt-375m-ndv5-check goes over your YAML, and its values replace the YAML's: variables.data_local: "
        "./my-copy-c4 in the YAML, /data/datasets/slimpajama here")
    assert ("data", "warning") not in found  # the experiment's own folder trains: said above
    # an hparams_search preset goes over the YAML too (its 16-batch grid replaced the YAML's 4800ba, no word)
    said = _problems("plan", f"yaml={path}", "hparams_search=mpt_tiny_grid")[("hparams_search", "warning")]
    assert said.startswith("hparams_search=mpt_tiny_grid goes over your YAML, and its values replace the YAML's: "
                           "max_duration: 4800ba in the YAML, 16ba here; "), said
    assert said.endswith("or leave hparams_search= out"), said
    found = _problems("plan", f"yaml={path}", "experiment=mpt-30b-ndv5-amlfs")
    assert found[("data", "warning")].startswith("data=c4 (of experiment=mpt-30b-ndv5-amlfs) goes beneath your YAML, "
                                                 "whose variables.data_local (./my-copy-c4) is what trains")
    assert ("model", "warning") not in found  # mpt-30b's keys are all the YAML's
    # a value the YAML already holds is replaced by nothing: not said (it said "1000ba in the YAML, 1000ba here")
    (tmp_path / "saves.yaml").write_text((YAMLS / "mpt-7b.yaml").read_text() + "\nsave_interval: 1000ba\n")
    assert ("experiment", "warning") not in _problems("plan", f"yaml={tmp_path / 'saves.yaml'}",
                                                      "experiment=mpt-7b-p5-fsx")
    (tmp_path / "other.yaml").write_text((YAMLS / "mpt-7b.yaml").read_text() + "\nsave_interval: 500ba\n")
    assert "save_interval: 500ba in the YAML, 1000ba here" in _problems(
        "plan", f"yaml={tmp_path / 'other.yaml'}", "experiment=mpt-7b-p5-fsx")[("experiment", "warning")]
    # nor a key the YAML's loader gives (llm-foundry's default microbatch, auto), taken for the preset's
    (tmp_path / "nomb.yaml").write_text("".join(line for line in (YAMLS / "mpt-125m.yaml").read_text().splitlines(
        keepends=True) if not line.startswith("device_train_microbatch_size")))
    said = _problems("plan", f"yaml={tmp_path / 'nomb.yaml'}", "cluster=ndv5", "model=mpt-125m")[("model", "warning")]
    assert said.startswith("model=mpt-125m goes beneath your YAML, which sets every key of it"), said


def test_what_llm_foundry_refuses_of_a_yamls_evaluators_is_refused_before_the_queue(tmp_path):
    """docs/config.md's CPU line has `eval_loader.num_workers=1`: on a YAML whose evaluators are a list it made an
    eval_loader beside eval_loaders, and on one with none an eval_loader without a name; both passed the checks and
    failed in llm-foundry when the run started. An empty `callbacks:` crashed the run's own start."""
    listed = tmp_path / "listed.yaml"
    listed.write_text(MINIMAL + """eval_loader:
  - {label: a, name: text, dataset: {local: /tmp/nowhere-c4, split: val, max_seq_len: 128}, drop_last: false}
  - {label: b, name: text, dataset: {local: /tmp/nowhere-c4, split: val, max_seq_len: 128}, drop_last: false}
callbacks:
""")
    found = _problems("plan", f"yaml={listed}", "eval_loader.num_workers=1")
    assert "eval_loaders.0.num_workers=1 eval_loaders.1.num_workers=1" in found[("eval_loader", "error")]
    assert ("eval_loader", "error") not in _problems("plan", f"yaml={listed}", "eval_loaders.0.num_workers=1")
    none = tmp_path / "none.yaml"
    none.write_text(MINIMAL)
    assert "has no name" in _problems("plan", f"yaml={none}", "eval_loader.num_workers=1")[("eval_loader", "error")]
    cfg, _ = _composed(f"yaml={listed}")
    assert "run_report" in cfg.callbacks  # the run's report: the task reads its folder first thing
    # a mixture's streams are each a folder streaming opens: a missing one is named by its stream
    mixed = tmp_path / "mixed.yaml"
    mixed.write_text(MINIMAL.replace('dataset: {local: "${variables.data_local}", split: train,',
                                     f'dataset: {{streams: {{a: {{local: {tmp_path / "nope"}}}}}, split: train,'))
    found = _problems("run", f"yaml={mixed}", f"tokenizer.name={TOKENIZER}")
    assert "does not exist" in found[("train_loader.dataset.streams.a.local", "error")]


def test_seed_on_a_yaml_that_shuffles_by_its_variable_says_the_data_order_does_not_follow():
    """seed=42 on testing.yaml seeded the model and left the data order at the YAML's global_seed (17): a sweep over
    seed varied the initialisation alone, no word. Our presets shuffle by seed: nothing to say."""
    said = _problems("plan", f"yaml={YAMLS / 'testing.yaml'}", "seed=42")[("seed", "warning")]
    assert said.startswith("seeds the model's initialisation; the data order follows "
                           "train_loader.dataset.shuffle_seed=17"), said
    assert ("seed", "warning") not in _problems("plan", f"yaml={YAMLS / 'testing.yaml'}", "variables.global_seed=42")
    assert ("seed", "warning") not in _problems("plan", "seed=42")


def test_the_plan_counts_what_composer_and_the_train_loader_read(tmp_path):
    """max_duration=2e3ba was planned as 23 steps (the digits joined: composer reads 2000 batches), and the tokens of
    a step came from the top-level max_seq_len where the train loader cuts samples to its own."""
    plan = build_plan(compose(["max_duration=2e3ba"]))
    assert plan["steps"] == 2000
    tok = build_plan(compose(["max_duration=1e9tok"]))
    assert tok["steps"] == -(-10**9 // tok["tokens_per_step"]) and tok["tokens"] == tok["steps"] * tok["tokens_per_step"]
    recipe = tmp_path / "mine.yaml"
    recipe.write_text(MINIMAL.replace('shuffle: true, max_seq_len: "${variables.max_seq_len}"}', 'shuffle: true, max_seq_len: 64}'))
    cfg, ctx = _composed(f"yaml={recipe}")
    assert (cfg.max_seq_len, cfg.train_loader.dataset.max_seq_len) == (128, 64)
    assert build_plan(cfg)["tokens_per_step"] == 8 * 64
    found = _problems("plan", f"yaml={recipe}")
    assert "train_loader.dataset.max_seq_len=64" in found[("max_seq_len", "warning")]
    # a YAML without the top-level key llm-foundry requires: refused as llm-foundry refuses it, not filled with ours
    bare = tmp_path / "bare.yaml"
    bare.write_text(MINIMAL.replace("max_seq_len: ${variables.max_seq_len}\n", "", 1))
    assert "requires" in _problems("plan", f"yaml={bare}")[("max_seq_len", "error")]
    assert ("max_seq_len", "error") not in _problems("plan", f"yaml={bare}", "max_seq_len=128")

def test_plan_of_a_yaml_writes_nothing_and_names_the_run(tmp_path, cli):
    out = cli("train", str(YAMLS / "mpt-7b.yaml"), "cluster=ndv5", "cluster.nodes=8", "plan=json", root=tmp_path / "root", cwd=tmp_path)
    assert out.returncode == 0, out.stderr[-2000:]
    plan = json.loads(out.stdout)
    assert plan["run_name"].startswith("mpt-7b-") and plan["world_size"] == 64
    assert plan["params"] == pytest.approx(6.7e9, rel=0.05)
    assert sorted(p.name for p in tmp_path.iterdir()) == []  # no outputs/, no root/


def test_a_sweep_over_a_yaml_plans_each_point(tmp_path, cli):
    out = cli("train", "-m", f"yaml={YAMLS / 'testing.yaml'}", *CPU, "optimizer.lr=1e-4,2e-4", "plan=true", root=tmp_path / "root", cwd=tmp_path)
    assert out.returncode == 0, out.stderr[-2000:]
    names = {w for w in out.stdout.split() if w.startswith("testing-")}
    assert len(names) == 2, out.stdout[-3000:]
    assert sorted(p.name for p in tmp_path.iterdir()) == []


def test_bad_yamls_are_refused_in_one_pass_naming_each_key(tmp_path, cli):
    text = (YAMLS / "testing.yaml").read_text()
    bad = (text.replace("max_duration: 200ba", "max_durations: 200ba")
           .replace("name: decoupled_adamw", "name: decoupled_adamw_nope")
           .replace("shuffle_seed: ${variables.global_seed}", "shuffle_seed: ${variables.global_sed}"))
    (tmp_path / "bad.yaml").write_text(bad)
    out = cli("train", "bad.yaml", *CPU, root=tmp_path / "root", cwd=tmp_path)
    assert out.returncode == 2
    err = out.stderr
    assert "error: max_durations: is not a key llm-foundry or this tool knows" in err and "max_duration`?" in err
    assert "error: train_loader.dataset.shuffle_seed: `${variables.global_sed}` cannot be resolved" in err
    assert "error: optimizer.name: 'decoupled_adamw_nope' is not an optimizer llm-foundry knows" in err
    assert "Traceback" not in err
    assert sorted(p.name for p in tmp_path.iterdir()) == ["bad.yaml"]  # nothing written

    (tmp_path / "list.yaml").write_text("- a\n- b\n")
    (tmp_path / "broken.yaml").write_text("model: {d_model: 128\n")
    # keys of this command, which llm-foundry refuses: `plan: json` made every run of the YAML a plan
    (tmp_path / "planned.yaml").write_text("plan: json\n" + text)
    (tmp_path / "hydra.yaml").write_text("hydra: {run: {dir: elsewhere}}\n" + text)
    # llm-foundry refuses eval_loaders beside an eval_loader (a list of them trained, eval_loaders dropped, no word)
    (tmp_path / "both.yaml").write_text(text + "\neval_loaders: [{label: more, name: text, dataset: {}}]\n")
    out = cli("train", "yaml=missing.yaml", "-m", root=tmp_path / "root", cwd=tmp_path)
    assert out.returncode == 2 and f"error: yaml: {tmp_path / 'missing.yaml'}: no such file" in out.stderr
    for name, says in (("list.yaml", "is not a mapping of llm-foundry keys"), ("broken.yaml", "is not readable YAML"),
                       ("planned.yaml", "has a `plan:` key, which is not llm-foundry's"),
                       ("hydra.yaml", "has a `hydra:` key, which is not llm-foundry's"),
                       ("both.yaml", "has both `eval_loader` and `eval_loaders`, which llm-foundry refuses")):
        out = cli("train", f"yaml={name}", root=tmp_path / "root", cwd=tmp_path)
        assert out.returncode == 2 and says in out.stderr and "Traceback" not in out.stderr, out.stderr[-2000:]
    assert sorted(p.name for p in tmp_path.iterdir()) == ["bad.yaml", "both.yaml", "broken.yaml", "hydra.yaml",
                                                          "list.yaml", "planned.yaml"]


@pytest.mark.e2e  # reads MDS data made by data_prep's command (the c4_mds fixture)
def test_an_eval_loader_list_is_several_evaluators_each_checked_as_the_one_is(tmp_path, c4_mds):
    """llm-foundry takes `eval_loader` as a list of labelled loaders (it moves the list to `eval_loaders`): such a
    YAML composes (a list cannot be merged onto conf/train.yaml's mapping: it was refused as `yaml: is not a key`),
    and each evaluator is checked as the one eval_loader is (its folder, workers, label), keyed by its place."""
    import yaml

    recipe = yaml.safe_load((YAMLS / "testing.yaml").read_text())
    one = {**recipe["eval_loader"], "num_workers": 1}
    recipe["eval_loader"] = [{**one, "label": "c4"},
                             {**one, "label": "elsewhere", "dataset": {**one["dataset"], "local": str(tmp_path / "no")}},
                             {**one, "label": "c4", "num_workers": 0}, one]
    (tmp_path / "multi.yaml").write_text(yaml.safe_dump(recipe))
    given = [f"yaml={tmp_path / 'multi.yaml'}", "precision=fp32", "train_loader.num_workers=1",
             f"variables.data_local={c4_mds}", f"tokenizer.name={TOKENIZER}"]
    cfg = compose(given)
    assert cfg.eval_loader is None and [e.get("label") for e in cfg.eval_loaders] == ["c4", "elsewhere", "c4", None]
    found = {(p.key, p.level): p for p in check(cfg, Context())}
    # (and testing.yaml's own save_interval, 1000ba against its 200 batches: the final checkpoint alone, said)
    assert sorted(found) == [("eval_loaders.1.dataset.local", "error"), ("eval_loaders.2.label", "warning"),
                             ("eval_loaders.2.num_workers", "error"), ("eval_loaders.3.label", "error"),
                             ("save_interval", "warning")], found
    assert "does not exist" in found["eval_loaders.1.dataset.local", "error"].problem
    assert "'c4' is also eval_loaders.0's label" in found["eval_loaders.2.label", "warning"].problem
    assert "llm-foundry refuses an evaluator of several without one" in found["eval_loaders.3.label", "error"].problem
    # the fixes, in the same keys on the command line
    fixed = compose([*given, f"eval_loaders.1.dataset.local={c4_mds}", "eval_loaders.2.num_workers=1",
                     "eval_loaders.2.label=c4_2", "+eval_loaders.3.label=c4_3", "save_interval=100ba"])
    assert check(fixed, Context()) == []


@pytest.mark.train
def test_llm_foundrys_testing_yaml_trains_on_c4_on_cpu(tmp_path, c4_mds, cli):
    """docs/config.md's CPU line for a YAML written for GPUs: its own model, data and schedule, a few batches."""
    args = [str(YAMLS / "testing.yaml"), *CPU, f"variables.data_local={c4_mds}", f"tokenizer.name={TOKENIZER}",
            "max_duration=2ba", "global_train_batch_size=16", "device_train_microbatch_size=8", "eval_interval=2ba",
            "eval_subset_num_batches=2", "log_to_console=false"]
    out = cli("train", *args, timeout=600, root=tmp_path / "root", cwd=tmp_path)
    assert out.returncode == 0, out.stderr[-3000:]
    [run] = (tmp_path / "root" / "outputs").iterdir()
    assert run.name.startswith("testing-")
    metrics = json.loads((run / "metrics.json").read_text())
    assert metrics["batches"] == 2 and metrics["final_eval"]["eval/LanguageCrossEntropy"] > 0
    config = (run / ".hydra" / "config.yaml").read_text()
    assert "d_model: 128\n  n_heads: 2" in config  # testing.yaml's model, not our mpt-tiny preset
    # the same command again is the same run: it finds its own checkpoint and has nothing left to train
    again = cli("train", *args, timeout=600, root=tmp_path / "root", cwd=tmp_path)
    assert again.returncode == 0, again.stderr[-3000:]
    assert [p.name for p in (tmp_path / "root" / "outputs").iterdir()] == [run.name]


def test_a_yaml_edited_while_its_job_waits_in_the_queue_trains_as_checked_and_submitted(slurm, tmp_path, c4_mds):
    """A Slurm job composes its config when it starts, hours after the submission: from `yaml=PATH` it read the file
    as edited since (measured: n_layers 2 -> 3 and lr 6e-4 -> 6e-3 trained, exit 0, and its checkpoints in a folder
    the summary did not name, since a run's name hashes what it trains; a requeue after the edit would have
    started that other run from batch 0). The job now composes from the sweep's copy of the bytes checked."""
    recipe = tmp_path / "mine.yaml"
    recipe.write_text(MINIMAL.replace("/tmp/nowhere-c4", str(c4_mds)).replace("max_duration: 6ba", "max_duration: 2ba"))
    proc = run("-m", "train", "-m", recipe, "cluster=slurm-local", "cluster.tasks_per_node=1", f"tokenizer.name={TOKENIZER}",
               "train_loader.num_workers=1", "progress_bar=false", "cluster.sbatch_extra={begin: now+3600}",
               root=tmp_path / "root", timeout=300)
    assert proc.returncode == 0, proc.stderr[-3000:]
    [sweep_dir] = (tmp_path / "root" / "outputs" / "sweeps").iterdir()
    manifest = json.loads((sweep_dir / "sweep.json").read_text())
    [point] = manifest["points"]
    recipe.write_text(recipe.read_text().replace("n_layers: 2", "n_layers: 3").replace("lr: 1.0e-4", "lr: 5.0e-3"))
    subprocess.run(["scontrol", "update", f"JobId={point['job_id']}", "StartTime=now"], check=True, timeout=30)
    watched = run("-m", "train.status", sweep_dir, "--watch", "2", timeout=600)
    assert watched.returncode == 0, watched.stdout[-3000:] + watched.stderr[-3000:]
    trained = OmegaConf.load(sweep_dir / "0" / ".hydra" / "config.yaml")
    assert (trained.model.n_layers, trained.optimizer.lr) == (2, 1.0e-4)  # the recipe as checked
    # the run the summary names, with its checkpoints there, and no other
    assert [p.name for p in (tmp_path / "root" / "checkpoints").iterdir()] == [Path(point["checkpoint"]).name]
    assert any(Path(point["checkpoint"]).glob("*.pt")), point["checkpoint"]
    # the same command now is the edited recipe: another run (its name hashes what it trains), planned as such
    again = run("-m", "train", recipe, "cluster=slurm-local", "cluster.tasks_per_node=1", f"tokenizer.name={TOKENIZER}",
                "plan=json", root=tmp_path / "root", timeout=300, check=True)
    assert json.loads(again.stdout)["run_name"] != Path(point["checkpoint"]).name
