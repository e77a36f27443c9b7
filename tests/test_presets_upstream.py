"""Model presets against the recipes they come from: llm-foundry's published pretrain YAMLs (mpt-*) and Megatron-LM's
GPT-3 175B script (gpt175b and its system-check sizes).

Every difference is listed, with its reason, in one table, conf/model/_upstream/differences.yaml. A difference
that is not listed fails here, and so does a listed one that is no longer a difference or whose values moved:
the table cannot fall behind the presets. What gpt175b reproduces of Megatron's recipe is checked on llm-foundry's
own objects (a small MPT built from the preset, its optimizer's parameter groups, composer's scheduler).
"""
import copy
from fnmatch import fnmatch

import pytest
import yaml
from helpers import ROOT, SHARED
from omegaconf import OmegaConf

from train.checks.values import PRODUCT_KEYS
from train.config.compose import compose

UPSTREAM = SHARED / "llm-foundry-yamls" / "pretrain"
TABLE = ROOT / "conf" / "model" / "_upstream" / "differences.yaml"
# A GPU run as the presets are meant for: the cluster preset decides precision, init device, attention and loss
# implementation, workers and logging; data=c4 is the tokenizer and vocabulary the upstream YAMLs name.
GPU_RUN = ("cluster=ndv5", "data=c4")
# Our own keys (groups and settings llm-foundry never sees: train/checks/values.py), llm-foundry's `variables`
# (whose values are ours to pick: data paths), and the run's name.
NOT_COMPARED = {*PRODUCT_KEYS, "hydra", "variables", "run_name"}
NOT_SET = "(not set)"
OUR_MPT = sorted(p.stem for p in (ROOT / "conf" / "model").glob("mpt-*.yaml") if p.stem != "mpt-tiny")
PRESETS = sorted(p.stem for p in UPSTREAM.glob("mpt-*.yaml")) if UPSTREAM.is_dir() else OUR_MPT

# Megatron-LM examples/gpt3/train_gpt3_175b_distributed.sh at e958b2ca
MEGATRON = {"warmup_fraction": 0.001, "lr_decay_iters": 430_000, "train_iters": 500_000, "lr": 6.0e-5,
            "min_lr": 6.0e-6, "weight_decay": 0.1, "dropout": 0.1, "global_batch": 1536}


def need_upstream():
    if not UPSTREAM.is_dir():
        pytest.skip(f"llm-foundry's pretrain YAMLs not found at {UPSTREAM} (a checkout beside ../shared is needed)")


def table() -> dict:
    return yaml.safe_load(TABLE.read_text())  # not OmegaConf: `${...}` there is text to compare, not to resolve


def entries(preset: str) -> dict:
    """The table's entries for one preset: those of every section whose name or pattern matches it."""
    found = {}
    for pattern, section in table().items():
        if fnmatch(preset, pattern):
            assert not set(found) & set(section), f"{preset}: keys listed twice in {TABLE.name}"
            found.update(section)
    return found


def flat(node, prefix="") -> dict:
    """Dotted keys to leaf values; lists and empty maps are leaves."""
    if isinstance(node, dict) and node:
        out = {}
        for k, v in node.items():
            out.update(flat(v, f"{prefix}{k}."))
        return out
    return {prefix[:-1]: node}


def shown(raw, resolved):
    """A value as the table writes it: as written where it interpolates, resolved otherwise."""
    if isinstance(raw, dict):
        return {k: shown(raw[k], resolved[k]) for k in raw}
    return raw if isinstance(raw, str) and "${" in raw else resolved


def sides(cfg) -> tuple:
    raw = OmegaConf.to_container(cfg, resolve=False)
    resolved = OmegaConf.to_container(cfg, resolve=True)
    return ({k: v for k, v in raw.items() if k not in NOT_COMPARED},
            {k: v for k, v in resolved.items() if k not in NOT_COMPARED})


def ours(preset: str) -> tuple:
    return sides(compose([f"model={preset}", *GPU_RUN]))


def upstream(preset: str) -> tuple:
    return sides(OmegaConf.load(UPSTREAM / f"{preset}.yaml"))


def select(tree: dict, key: str):
    node = tree
    for part in key.split("."):
        if not isinstance(node, dict) or part not in node:
            return NOT_SET
        node = node[part]
    return node


def value_at(both: tuple, key: str):
    raw, resolved = both
    v = select(raw, key)
    return NOT_SET if v == NOT_SET else shown(v, select(resolved, key))


def differences(preset: str) -> dict:
    """Dotted key -> (ours, upstream) for every key whose values differ. Both sides reading the same
    `${variables.*}` count as equal: those values are the user's (where the data is), not the recipe's."""
    (o_raw, o_res), (u_raw, u_res) = ours(preset), upstream(preset)
    o_raw, o_res, u_raw, u_res = flat(o_raw), flat(o_res), flat(u_raw), flat(u_res)
    out = {}
    for key in sorted(set(o_res) | set(u_res)):
        if o_res.get(key, NOT_SET) == u_res.get(key, NOT_SET):
            continue
        a, b = o_raw.get(key), u_raw.get(key)
        if isinstance(a, str) and a == b and a.startswith("${variables."):
            continue
        out[key] = (shown(a, o_res[key]) if key in o_res else NOT_SET,
                    shown(b, u_res[key]) if key in u_res else NOT_SET)
    return out


def under(key: str, listed: str) -> bool:
    return key == listed or key.startswith(listed + ".")


# --------------------------------------------------------------------------------------- llm-foundry's YAMLs


def test_every_upstream_yaml_has_its_preset():
    need_upstream()
    assert PRESETS == OUR_MPT


@pytest.mark.parametrize("preset", PRESETS)
def test_preset_differs_from_its_upstream_yaml_only_where_listed(preset):
    need_upstream()
    listed = entries(preset)
    unlisted = {k: v for k, v in differences(preset).items() if not any(under(k, e) for e in listed)}
    assert not unlisted, (
        f"{preset} differs from llm-foundry's {preset}.yaml where {TABLE.relative_to(ROOT)} gives no reason "
        "(key: (ours, upstream)); align the preset, or list the difference with why:\n"
        + "\n".join(f"  {k}: {v}" for k, v in unlisted.items()))


@pytest.mark.parametrize("preset", PRESETS)
def test_every_listed_difference_is_still_one(preset):
    need_upstream()
    found = differences(preset)
    o, u = ours(preset), upstream(preset)
    for key, entry in entries(preset).items():
        assert any(under(k, key) for k in found), f"{preset}: {key} no longer differs: remove it from the table"
        assert entry["ours"] == value_at(o, key), f"{preset}: {key} is {value_at(o, key)!r} here, not as listed"
        assert entry["upstream"] == value_at(u, key), \
            f"{preset}: {key} is {value_at(u, key)!r} upstream, not as listed"


def test_table_sections_and_entries_are_well_formed():
    names = set(OUR_MPT) | {"gpt175b"}
    for pattern, section in table().items():
        assert any(fnmatch(n, pattern) for n in names), f"section {pattern!r} matches no preset"
        for key, entry in section.items():
            assert set(entry) == {"ours", "upstream", "why"}, f"{pattern} {key}: {sorted(entry)}"
            assert isinstance(entry["why"], str) and len(entry["why"]) > 20, f"{pattern} {key}: no reason given"


def test_mpt_30b_evaluates_as_upstream():
    assert compose(["model=mpt-30b"]).eval_interval == "10000ba"


# ------------------------------------------------------------------------------------- Megatron's GPT-3 175B


def gpt(preset="gpt175b", *more):
    return OmegaConf.to_container(compose([f"model={preset}", *GPU_RUN, *more]), resolve=True)


def test_gpt175b_listed_values_are_the_presets():
    """Megatron's side is a shell script (described in words in the table); ours must hold what is listed."""
    o = ours("gpt175b")
    for key, entry in table()["gpt175b"].items():
        assert entry["ours"] == value_at(o, key), f"gpt175b: {key} is {value_at(o, key)!r}, not as listed"
        assert isinstance(entry["upstream"], str) and entry["upstream"] != NOT_SET


@pytest.mark.parametrize("preset", ["gpt175b", "gpt-375m", "gpt-857m"])
def test_gpt_presets_compose_megatrons_regularisation(preset):
    cfg = gpt(preset)
    m = MEGATRON
    assert cfg["model"]["attn_config"]["attn_pdrop"] == m["dropout"]  # --attention-dropout
    assert cfg["model"]["resid_pdrop"] == cfg["model"]["emb_pdrop"] == m["dropout"]  # --hidden-dropout
    assert cfg["optimizer"]["lr"] == m["lr"]
    # torch's AdamW as Megatron runs it decays by lr x 0.1 per step; decoupled_adamw by (lr / initial lr) x wd
    assert cfg["optimizer"]["weight_decay"] == pytest.approx(m["weight_decay"] * m["lr"])
    assert cfg["optimizer"]["param_groups"] == [{"param_str_match": "bias|norm", "weight_decay": 0.0}]
    assert cfg["scheduler"]["alpha_f"] * m["lr"] == pytest.approx(m["min_lr"])


def test_gpt175b_schedule_counts_megatrons_samples():
    cfg = gpt()
    batch = cfg["global_train_batch_size"]
    assert batch == MEGATRON["global_batch"] and cfg["max_duration"] == f"{MEGATRON['train_iters']}ba"
    decay = MEGATRON["lr_decay_iters"] * batch  # Megatron: lr_decay_steps = lr_decay_iters x global_batch_size
    assert cfg["scheduler"]["t_max"] == f"{decay}sp"
    assert cfg["scheduler"]["t_warmup"] == f"{round(MEGATRON['warmup_fraction'] * decay)}sp"


@pytest.mark.parametrize("preset", ["gpt-375m", "gpt-857m"])
def test_system_checks_keep_megatrons_iterations(preset):
    """The recipe's system check runs the 175B script with only the shape changed: the same 430 + 430,000
    iterations, in batches here (composer takes a t_max past a max_duration in the same unit)."""
    cfg = gpt(preset)
    assert cfg["scheduler"]["t_warmup"] == "430ba" and cfg["scheduler"]["t_max"] == "430000ba"
    assert int(cfg["max_duration"][:-2]) <= MEGATRON["lr_decay_iters"]


def tiny_from(preset: str):
    """llm-foundry's MPT built from the preset's model config at a size this machine builds in a second."""
    from llmfoundry.models.mpt import MPTConfig, MPTForCausalLM

    model = gpt(preset, "cluster=local")["model"]
    kwargs = {k: v for k, v in model.items() if k not in ("name", "loss_fn")}
    kwargs.update(d_model=64, n_heads=4, n_layers=2, max_seq_len=32, vocab_size=128, init_device="cpu")
    return MPTForCausalLM(MPTConfig(**kwargs))


@pytest.mark.torch  # imports llm-foundry (~8 s)
def test_gpt175b_dropout_lands_in_the_built_model():
    model = tiny_from("gpt175b")
    assert model.transformer.emb_drop.p == MEGATRON["dropout"]
    for block in model.transformer.blocks:
        assert block.resid_attn_dropout.p == block.resid_ffn_dropout.p == MEGATRON["dropout"]
        assert block.attn.attn_dropout_p == MEGATRON["dropout"]


@pytest.mark.torch  # imports llm-foundry (~8 s)
def test_gpt175b_decays_what_megatron_decays():
    """llm-foundry's build_optimizer with the preset's optimizer config, on a small MPT of the same kind: every
    bias and 1-D parameter (Megatron's rule) in a group without weight decay, every matrix decayed; one step
    with zero gradients moves only what is decayed, by exactly lr/initial_lr x weight_decay."""
    import torch
    from llmfoundry.utils.builders import build_optimizer

    model = tiny_from("gpt175b")
    config = copy.deepcopy(gpt()["optimizer"])
    optimizer = build_optimizer(model, config.pop("name"), config)
    decay_of = {id(p): g["weight_decay"] for g in optimizer.param_groups for p in g["params"]}
    names = dict(model.named_parameters())
    assert len(decay_of) == len(names)
    for name, p in names.items():
        megatron_skips = name.endswith(".bias") or p.dim() == 1
        assert decay_of[id(p)] == (0.0 if megatron_skips else pytest.approx(6.0e-6)), name
    assert {n for n, p in names.items() if p.dim() == 2} >= {"transformer.wte.weight", "transformer.wpe.weight"}

    before = {n: p.detach().clone() for n, p in names.items()}
    for p in names.values():
        p.grad = torch.zeros_like(p)
    optimizer.step()
    for name, p in names.items():
        if decay_of[id(p)] == 0.0:
            assert torch.equal(p, before[name]), name
        else:
            assert torch.allclose(p, before[name] * (1 - 6.0e-6), rtol=0, atol=1e-9), name


@pytest.mark.torch  # imports llm-foundry (~8 s)
def test_gpt175b_lr_holds_at_its_minimum_after_iteration_430000():
    """composer's cosine_with_warmup from the preset, as llm-foundry builds it, over Megatron's iterations: warmup to
    430, cosine to 430,000, then the minimum held to 500,000. With t_max in batches composer refuses it."""
    import torch
    from composer.core import State, Timestamp
    from composer.devices import DeviceCPU
    from llmfoundry.utils.builders import build_scheduler

    cfg = gpt()
    batch = cfg["global_train_batch_size"]
    settings = dict(cfg["scheduler"])
    scheduler = build_scheduler(settings.pop("name"), settings)
    state = State(model=torch.nn.Linear(1, 1), rank_zero_seed=0, run_name="schedule", device=DeviceCPU(),
                  max_duration=cfg["max_duration"])

    def lr_at(step):
        state.timestamp = Timestamp(batch=step, sample=step * batch)
        return cfg["optimizer"]["lr"] * scheduler(state)

    assert lr_at(0) == 0.0 and lr_at(215) == pytest.approx(3.0e-5) and lr_at(430) == pytest.approx(6.0e-5)
    assert lr_at(215_215) == pytest.approx((6.0e-5 + 6.0e-6) / 2)  # half way through the cosine
    for step in (430_000, 450_000, 500_000):
        assert lr_at(step) == pytest.approx(6.0e-6), step

    in_batches = build_scheduler("cosine_with_warmup", {"t_warmup": "430ba", "t_max": "430000ba", "alpha_f": 0.1})
    with pytest.raises(ValueError, match="must be greater than or equal to max_duration"):
        in_batches(state)


@pytest.mark.torch  # imports llm-foundry (~8 s)
def test_system_check_schedule_is_the_175b_one_in_batches():
    import torch
    from composer.core import State, Timestamp
    from composer.devices import DeviceCPU
    from llmfoundry.utils.builders import build_scheduler

    cfg = gpt("gpt-375m")
    settings = dict(cfg["scheduler"])
    scheduler = build_scheduler(settings.pop("name"), settings)
    state = State(model=torch.nn.Linear(1, 1), rank_zero_seed=0, run_name="check", device=DeviceCPU(),
                  max_duration=cfg["max_duration"])
    state.timestamp = Timestamp(batch=430)
    assert scheduler(state) == pytest.approx(1.0)
    state.timestamp = Timestamp(batch=2000)
    assert scheduler(state) == pytest.approx(1.0, abs=1e-4)  # 2,000 of 430,000 iterations: barely decayed


@pytest.mark.parametrize("preset,millions", [("gpt-375m", 64.1), ("gpt-857m", 356.0)])
def test_system_check_names_are_the_recipes_labels_not_counts(preset, millions):
    """The header comments say what these shapes hold; the names are the recipe's labels (see the presets)."""
    from train.plan.estimate import param_count

    model = OmegaConf.to_container(compose([f"model={preset}"]).model, resolve=True)
    assert param_count(model) / 1e6 == pytest.approx(millions, abs=0.05)
