"""Which data loaders llm-foundry builds from a config, by their dotted keys: `train_loader`, then `eval_loader`, or
each of `eval_loaders` (several evaluators, each with its `label`: llm-foundry moves a YAML's `eval_loader` list
there) as `eval_loaders.0`, `eval_loaders.1`, ... A null or absent loader is none. Every check and task step that
looks at the loaders' data, workers or lengths goes through this list, so several evaluators are looked at as one.

Light: no torch, no llm-foundry."""
from collections.abc import Mapping, Sequence

from omegaconf import OmegaConf


def loader_keys(cfg) -> list:
    cfg = cfg if OmegaConf.is_config(cfg) else OmegaConf.create(cfg)  # llm-foundry's config as a plain dict too

    def at(key):
        return OmegaConf.select(cfg, key, default=None, throw_on_missing=False)

    keys = [k for k in ("train_loader", "eval_loader") if isinstance(at(k), Mapping)]
    many = at("eval_loaders")
    if isinstance(many, Sequence) and not isinstance(many, str):
        keys += [f"eval_loaders.{i}" for i, one in enumerate(many) if isinstance(one, Mapping)]
    return keys


def eval_keys(cfg) -> list:
    return [k for k in loader_keys(cfg) if k != "train_loader"]
