"""Pretrain LLMs on Slurm: Hydra config groups in conf/ -> llm-foundry's train().

Importing this package stays light (no torch): it only registers the OmegaConf resolvers the configs use and the
typed schemas of our groups (train/config/schema.py), and has OmegaConf parse each interpolation once.
"""
from train.config.resolvers import parse_each_interpolation_once, register_resolvers
from train.config.schema import register as register_schemas

parse_each_interpolation_once()
register_resolvers()
register_schemas()
