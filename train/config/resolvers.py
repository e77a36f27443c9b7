"""OmegaConf resolvers used by conf/, and its interpolations parsed once each. Set before Hydra composes anything."""
import functools
import os

from omegaconf import OmegaConf


def subdir(root, name):
    """`root/name`, or null when there is no root (no remote to stream from)."""
    return None if root in (None, "", "null") else f"{root}/{name}"


def given_or(value, otherwise):
    """`value` unless it is blank (null or ""): a YAML's `run_name: ${variables.run_name}` with the variable given
    on the command line, else our name (hydra_plugins/recipe_source/)."""
    return otherwise if value in (None, "") else value


def vocab_size(tokenizer_name) -> int:
    from train.config.vocab import vocab_size as size

    return size(tokenizer_name)


def register_resolvers() -> None:
    from common.help import register

    register()
    from train.config.identity import run_id  # the run's name: what it trains (train/config/identity.py)

    for name, fn in {"run_id": run_id, "subdir": subdir, "abspath": os.path.abspath, "vocab_size": vocab_size,
                     "given_or": given_or}.items():
        if not OmegaConf.has_resolver(name):
            OmegaConf.register_new_resolver(name, fn)


def parse_each_interpolation_once() -> None:
    """OmegaConf parses a value's `${...}` with its ANTLR grammar (pure Python) each time the value is read, and
    a composed config is read whole many times (checks, the run's name, the plan): half the time of composing
    and resolving one (15 configs composed and resolved: 2.7-2.8 s, 1.4-1.6 s parsed once). A parse tree depends
    on the text alone and nothing changes it once made (its tokens keep their own input), so each text is parsed
    once per process. OmegaConf 2.3 reads `parse` by name in base.py and _utils.py."""
    import omegaconf._utils
    import omegaconf.base
    from omegaconf import grammar_parser

    if not hasattr(omegaconf.base.parse, "cache_info"):
        once = functools.lru_cache(maxsize=4096)(grammar_parser.parse)
        omegaconf.base.parse = omegaconf._utils.parse = once
