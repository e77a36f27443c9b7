"""Pretrain LLMs on Slurm: Hydra config groups in conf/ -> llm-foundry's train().

Importing this package stays light (no torch): it only registers the OmegaConf resolvers the configs use and the
typed schemas of our groups (train/config/schema.py), has OmegaConf parse each interpolation once (common/compat.py),
and ends the process without the GC's walk at teardown (common/collector.py).
"""
from common.collector import without_teardown_collections
from common.compat import patch_omegaconf_parse_each_interpolation_once
from train.config.resolvers import register_resolvers
from train.config.schema import register as register_schemas

without_teardown_collections()
patch_omegaconf_parse_each_interpolation_once()
register_resolvers()
register_schemas()
