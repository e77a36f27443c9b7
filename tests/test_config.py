"""Composition: every preset combination is a valid llm-foundry config, and llm-foundry's own override lines
land where llm-foundry reads them."""
import itertools

import pytest
from omegaconf import OmegaConf

from train.checks.values import FOUNDRY_KEYS
from train.config.compose import CONF, compose
from train.plan.estimate import param_count
from train.task.foundry import foundry_config

MODELS = sorted(p.stem for p in (CONF / "model").glob("*.yaml"))
STORAGES = sorted(p.stem for p in (CONF / "storage").glob("*.yaml"))
CHECKPOINTS = sorted(p.stem for p in (CONF / "checkpoint").glob("*.yaml"))


def test_the_documented_presets_are_the_groups_hydra_offers():
    """What Hydra lists for each group (as `--help` shows it) holds the presets the docs name; the parametrized
    tests below go over what the folders hold, so a preset missing there would go unnoticed."""
    from hydra._internal.config_repository import ConfigRepository
    from hydra._internal.utils import create_config_search_path
    from hydra.core.object_type import ObjectType
    from hydra.core.plugins import Plugins

    Plugins.instance()
    repo = ConfigRepository(create_config_search_path(str(CONF)))
    offered = {g: set(repo.get_group_options(g, ObjectType.CONFIG)) for g in ("model", "storage", "checkpoint")}
    assert {"mpt-125m", "mpt-350m", "mpt-760m", "mpt-1b", "mpt-3b", "mpt-7b", "mpt-13b", "mpt-30b", "mpt-70b",
            "gpt175b", "gpt-375m", "gpt-857m", "mpt-tiny", "llama3-8b", "llama-tiny"} <= offered["model"]
    assert {"local", "amlfs", "blob", "fsx"} <= offered["storage"]
    assert {"sharded", "full", "none"} <= offered["checkpoint"]


@pytest.mark.torch  # imports llm-foundry (~8 s)
def test_product_keys_match_llm_foundry_train_config():
    from llmfoundry.utils.config_utils import TRAIN_CONFIG_KEYS

    assert FOUNDRY_KEYS == TRAIN_CONFIG_KEYS


@pytest.mark.torch  # imports llm-foundry
@pytest.mark.parametrize("model", MODELS)
def test_every_combination_passes_llm_foundry_validation(model):
    from llmfoundry.command_utils.train import validate_config
    from llmfoundry.utils.config_utils import TRAIN_CONFIG_KEYS, TrainConfig, make_dataclass_and_log_config

    for storage, checkpoint in itertools.product(STORAGES, CHECKPOINTS):
        cfg = foundry_config(compose([f"model={model}", f"storage={storage}", f"checkpoint={checkpoint}"]))
        _, train_cfg = make_dataclass_and_log_config(cfg, TrainConfig, TRAIN_CONFIG_KEYS, transforms="all")
        validate_config(train_cfg)
        if train_cfg.model["name"] == "mpt_causal_lm":
            assert train_cfg.model["n_layers"] > 0
        else:  # a Hugging Face architecture (conf/recipe/hf.yaml): its sizes in config_overrides
            assert train_cfg.model["config_overrides"]["num_hidden_layers"] > 0
        if checkpoint == "none":
            assert train_cfg.save_folder is None and not train_cfg.autoresume
        else:
            assert train_cfg.save_folder.endswith(train_cfg.run_name) and train_cfg.autoresume
            assert train_cfg.fsdp_config["state_dict_type"] == checkpoint


@pytest.mark.parametrize("model,billions", [("mpt-30b", 29.9), ("mpt-70b", 64.8), ("gpt175b", 175.0),
                                            ("mpt-125m", 0.125), ("mpt-7b", 6.7)])
def test_param_counts_match_published_sizes(model, billions):
    assert param_count(compose([f"model={model}"]).model) / 1e9 == pytest.approx(billions, rel=0.01)


@pytest.mark.torch  # builds the model with llm-foundry
@pytest.mark.parametrize("model,extra", [
    ("mpt-tiny", []), ("gpt-375m", []),
    # the shapes the formula once left out (plans were off by up to half: untied 6.86 M planned, 13.31 M built)
    ("mpt-tiny", ["+model.tie_word_embeddings=false"]),
    ("mpt-tiny", ["+model.ffn_config.ffn_type=mptglu"]),
    ("mpt-tiny", ["+model.ffn_config.ffn_hidden_size=1000"]),
    ("mpt-tiny", ["+model.attn_config.attn_type=grouped_query_attention", "+model.attn_config.kv_n_heads=1"]),
    ("mpt-tiny", ["+model.attn_config.attn_type=multiquery_attention", "++model.no_bias=false"]),
    ("gpt-375m", ["++model.ffn_config.ffn_type=mptglu", "+model.tie_word_embeddings=false", "++model.no_bias=false"]),
    # position embeddings dropped by MPT itself with alibi or rope; RMS norms without a bias
    ("mpt-tiny", ["+model.attn_config.alibi=true"]),
    ("mpt-tiny", ["+model.attn_config.rope=true", "+model.attn_config.rope_impl=hf"]),
    ("mpt-tiny", ["+model.norm_type=rmsnorm", "++model.no_bias=false"]),
    ("mpt-tiny", ["+model.norm_type=layernorm", "++model.no_bias=false"]),
])
def test_param_count_formula_matches_the_built_model(model, extra):
    """The light formula (used by plans) against llm-foundry's own MPT, built on the meta device."""
    import torch
    from llmfoundry.models.mpt import MPTConfig, MPTForCausalLM

    model_cfg = OmegaConf.to_container(foundry_config(compose([f"model={model}", *extra])).model)
    kwargs = {k: v for k, v in model_cfg.items() if k not in ("name", "loss_fn")}
    kwargs["init_device"] = "meta"
    with torch.device("meta"):
        built = MPTForCausalLM(MPTConfig(**kwargs))
    assert sum(p.numel() for p in built.parameters()) == param_count(model_cfg)


def test_llm_foundry_override_lines_land_where_llm_foundry_reads_them():
    cfg = foundry_config(compose([
        "variables.data_local=/data/my-copy-c4", "save_folder=/data/checkpoints", "save_interval=1000ba",
        "save_num_checkpoints_to_keep=10", "fsdp_config.state_dict_type=sharded", "data=c4",
    ]))
    assert cfg.train_loader.dataset.local == cfg.eval_loader.dataset.local == "/data/my-copy-c4"
    assert cfg.save_folder == "/data/checkpoints"
    assert cfg.save_interval == "1000ba"
    assert cfg.save_num_checkpoints_to_keep == 10
    assert cfg.fsdp_config.state_dict_type == "sharded"

    cfg = foundry_config(compose(["data=c4", "variables.data_remote=/blob/my-copy-c4",
                                  "variables.data_local=/tmp/local-storage"]))
    assert cfg.train_loader.dataset.remote == "/blob/my-copy-c4"
    assert cfg.train_loader.dataset.local == "/tmp/local-storage"


def test_product_keys_are_dropped_and_hydra_context_resolved():
    cfg = foundry_config(compose(["model=mpt-125m"]))
    assert not {"cluster", "storage", "data", "checkpoint", "plan", "hydra"} & set(cfg)
    assert "${" not in OmegaConf.to_yaml(cfg)


def test_run_name_is_stable_per_command_and_differs_between_commands():
    a = compose(["model=mpt-125m", "optimizer.lr=1e-4"]).run_name
    assert a == compose(["optimizer.lr=1e-4", "model=mpt-125m"]).run_name  # order does not matter
    assert a == compose(["model=mpt-125m", "optimizer.lr=1e-4", "plan=true"]).run_name
    # tracking and export are not what is trained: adding them to a command resumes the same run
    assert a == compose(["model=mpt-125m", "optimizer.lr=1e-4", "logger=mlflow", "export=hf"]).run_name
    assert a != compose(["model=mpt-125m", "optimizer.lr=2e-4"]).run_name
    assert a.startswith("mpt-125m-")
    assert compose(["run_name=mine"]).run_name == "mine"


def test_storage_presets_route_data_and_checkpoints():
    blob = foundry_config(compose(["storage=blob", "data=c4"]))
    assert blob.variables.data_remote == "/blob/datasets/c4"
    assert blob.variables.data_local.startswith("/tmp/local-storage/")  # node-local cache, one per run
    amlfs = foundry_config(compose(["storage=amlfs", "data=c4"]))
    assert amlfs.variables.data_local == "/data/datasets/c4" and amlfs.variables.data_remote is None
    assert amlfs.save_folder.startswith("/data/checkpoints/")
    assert foundry_config(compose(["storage=fsx"])).save_folder.startswith("/fsx/checkpoints/")


@pytest.mark.parametrize("override, message", [
    ("cluster.nodes=two", "Value 'two' of type 'str' could not be converted to Integer"),
    ("cluster.node=2", "Key 'node' not in 'Cluster'"),
    ("storage.write_GBps=fast", "could not be converted to Float"),
    ("checkpoint.autoresume=maybe", "Value 'maybe' is not a valid bool"),
    ("data.kinds=mds", "Key 'kinds' not in 'Data'"),
])
def test_our_groups_are_typed(override, message):
    """A wrong type or an unknown key in our groups is refused at composition, naming the key (train/config/schema.py)."""
    from hydra.errors import ConfigCompositionException

    with pytest.raises(ConfigCompositionException) as err:
        compose([override])
    text = str(err.value.__cause__)
    assert message in text and f"full_key: {override.split('=')[0]}" in text


def test_every_preset_fits_its_schema():
    """Every preset composes against the schema, and its environment values are strings, as a shell holds them."""
    pairs = [(c, "local") for c in ("local", "ndv4", "ndv5", "p4d", "p5", "slurm-local")]
    for cluster, storage in pairs + [("ndv5", s) for s in ("amlfs", "blob", "fsx")]:
        cfg = compose([f"cluster={cluster}", f"storage={storage}", "data=mock"])
        assert OmegaConf.get_type(cfg.cluster).__name__ == "Cluster"
        assert all(isinstance(v, str) for v in cfg.cluster.env.values()), cluster
        assert isinstance(cfg.storage.write_GBps, float) and isinstance(cfg.cluster.nodes, int)


def test_cluster_environments_are_complete_as_their_sources_set_them():
    """p5/p4d: the EFA set of AWS's MPT sbatch; ndv5/ndv4: srun without CPU binding, as Azure's recipes run it
    (their NCCL_IGNORE_CPU_AFFINITY / topology files expect ranks free to use any core)."""
    efa = {"FI_PROVIDER": "efa", "FI_EFA_USE_DEVICE_RDMA": "1", "FI_EFA_FORK_SAFE": "1", "FI_EFA_USE_HUGE_PAGE": "0",
           "FI_EFA_ENABLE_SHM_TRANSFER": "1", "FI_LOG_LEVEL": "1", "NCCL_ASYNC_ERROR_HANDLING": "1"}
    for name in ("p5", "p4d"):
        env = compose([f"cluster={name}"]).cluster.env
        assert {k: env.get(k) for k in efa} == efa, name
        assert "--cpu-bind=none" not in compose([f"cluster={name}"]).cluster.srun_extra
    for name in ("ndv5", "ndv4"):
        assert "--cpu-bind=none" in compose([f"cluster={name}"]).cluster.srun_extra
