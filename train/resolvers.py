"""OmegaConf resolvers used by conf/. Registered before Hydra composes anything."""
import hashlib
import os

from omegaconf import OmegaConf

# Overrides that change where or how a run is reported or launched, not what it trains: they must not
# change the run's name, or a resumed run would miss its own checkpoints.
_NAME_NEUTRAL = ("hydra", "plan", "cluster.timeout_min", "cluster.partition", "cluster.account", "cluster.qos",
                 "cluster.dist_timeout", "dist_timeout",
                 # where a run is tracked or exported is not what it trains: adding them resumes the same run
                 "logger", "loggers", "export")


def run_id(model: str) -> str:
    """`<model>-<hash of the command-line overrides>`: the same command gives the same name every time."""
    from hydra.core.hydra_config import HydraConfig

    overrides = list(HydraConfig.get().overrides.task) if HydraConfig.initialized() else []
    kept = sorted(o for o in overrides if not o.lstrip("+~").startswith(_NAME_NEUTRAL))
    return f"{model}-{hashlib.sha1(chr(10).join(kept).encode()).hexdigest()[:8]}"


def subdir(root, name):
    """`root/name`, or null when there is no root (no remote to stream from)."""
    return None if root in (None, "", "null") else f"{root}/{name}"


def vocab_size(tokenizer_name) -> int:
    from train.vocab import vocab_size as size

    return size(tokenizer_name)


def register_resolvers() -> None:
    from common.help import register

    register()
    for name, fn in {"run_id": run_id, "subdir": subdir, "abspath": os.path.abspath, "vocab_size": vocab_size}.items():
        if not OmegaConf.has_resolver(name):
            OmegaConf.register_new_resolver(name, fn)
