"""Pretrain LLMs on Slurm: Hydra config groups in conf/ -> llm-foundry's train().

Importing this package stays light (no torch): it only registers the OmegaConf resolvers the configs use.
"""
from train.resolvers import register_resolvers

register_resolvers()
