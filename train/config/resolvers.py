"""OmegaConf resolvers used by conf/. Set before Hydra composes anything."""
import os

from omegaconf import OmegaConf


def subdir(root, name):
    """`root/name`, or null when there is no root (no remote to stream from)."""
    return None if root in (None, "", "null") else f"{root}/{name}"


def given_or(value, otherwise):
    """`value` unless it is blank (null or ""): a YAML's `run_name: ${variables.run_name}` with the variable given
    on the command line, else our name (train/config/recipe_yaml.py)."""
    return otherwise if value in (None, "") else value


def vocab_size(tokenizer_name) -> int:
    from train.config.vocab import vocab_size as size

    return size(tokenizer_name)


def hf_config(model_type) -> str:
    """The base folder of a Hugging Face architecture preset in this checkout (conf/model/_hf/<model_type>, its
    config.json the model type alone): a compute node reads it without the hub, at the path its job runs from."""
    from common.paths import CONF

    return str(CONF / "model" / "_hf" / str(model_type))


def register_resolvers() -> None:
    from common.help import register

    register()
    from train.config.identity import run_id  # the run's name: what it trains (train/config/identity.py)

    for name, fn in {"run_id": run_id, "subdir": subdir, "abspath": os.path.abspath, "vocab_size": vocab_size,
                     "given_or": given_or, "hf_config": hf_config}.items():
        if not OmegaConf.has_resolver(name):
            OmegaConf.register_new_resolver(name, fn)

