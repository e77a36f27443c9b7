"""Pretrain LLMs on Slurm: Hydra config groups in conf/ -> llm-foundry's train().

Importing this package stays light (no torch): it only registers the OmegaConf resolvers the configs use and the
typed schemas of our groups (train/config/schema.py).
"""
from train.config.resolvers import register_resolvers
from train.config.schema import register as register_schemas

register_resolvers()
register_schemas()
