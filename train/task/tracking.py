"""One tracking run (MLflow, W&B) per training run, however often it starts: a Composer callback that makes every
start log the same parameters.

A run resumed by the same command (a requeue, a restart after a crash) continues its tracking run (conf/logger/),
and llm-foundry logs the config again at every start. Two parts of that config differ from start to start: the
checkpoint a start resumes from (train/task/main.py writes it into `load_path`, with `load_weights_only` and
`load_ignore_keys`) and, for `-m` runs submitted again, the sweep folder the run report writes to. MLflow refuses a
parameter whose value changes within a run (and drops the metrics batched with it); a resumed W&B run refuses a
changed config value and fails. So the config is logged with the values the user configured for the former (given
by conf/logger/*.yaml, resolved before the resume point is chosen), and without the latter (nor W&B's local folder,
which follows it).

Registered with llm-foundry's callback registry as `tracking`. Parameters logged by anything else pass unchanged.
"""
from composer.core import Callback, State
from composer.loggers import Logger

# Folders of the submission a start belongs to (`<outputs>/sweeps/<time>/<point>` for `-m`): where it writes its
# report, and W&B's local files unless WANDB_DIR is set.
PER_SUBMISSION = (("callbacks", "run_report", "folder"), ("loggers", "wandb", "init_kwargs", "dir"))


class Tracking(Callback):
    def __init__(self, configured: dict):
        self.configured = dict(configured)  # {key: the value the user configured (None: not set)}

    def init(self, state: State, logger: Logger) -> None:
        # INIT runs before composer and llm-foundry log any parameter
        log_hyperparameters = logger.log_hyperparameters

        def same_every_start(parameters: dict) -> None:
            log_hyperparameters(self.stable(parameters))

        logger.log_hyperparameters = same_every_start

    def stable(self, parameters: dict) -> dict:
        out = dict(parameters)
        for key, configured in self.configured.items():
            if key in out:
                if configured is None:
                    del out[key]  # not configured: logged by no start
                else:
                    out[key] = configured
        for path in PER_SUBMISSION:
            out = _without(out, path)
        return out


def _without(node: dict, path: tuple) -> dict:
    """`node` less the key at `path`, copied down to it (the dicts given are llm-foundry's logged config)."""
    key, rest = path[0], path[1:]
    if key not in node or (rest and not isinstance(node[key], dict)):
        return node
    out = dict(node)
    if rest:
        out[key] = _without(node[key], rest)
    else:
        del out[key]
    return out


def register() -> None:
    from llmfoundry.registry import callbacks

    if "tracking" not in callbacks:
        callbacks.register("tracking", func=Tracking)
