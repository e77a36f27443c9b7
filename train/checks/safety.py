"""Credentials and shell safety: run before Hydra writes anything (the run folder's .hydra/ holds every override),
and again for every sweep point. Every value that lands in the sbatch script stays data."""
import re

from omegaconf import OmegaConf
from omegaconf.errors import InterpolationResolutionError

from train.checks.core import Problem, value

# Environment variable names that hold credentials: never written into a script, a config copy or a plan.
CREDENTIAL = re.compile(r"(_KEY|_TOKEN|_SECRET|PASSWORD|PASSWD|_CREDENTIALS?)$|^AZURE_STORAGE_|SECRET|PASSWORD",
                        re.IGNORECASE)
ENV_NAME = re.compile(r"^[A-Za-z_][A-Za-z0-9_]*$")
CONTROL = re.compile(r"[\x00-\x1f\x7f]")


def credentials(cfg, ctx):
    """A credential in cluster.env would be written into the sbatch script, `.hydra/` and the plan."""
    for name in value(cfg, "cluster.env") or {}:
        if CREDENTIAL.search(str(name)):
            yield Problem(f"cluster.env.{name}", "looks like a credential: it would be written in plain text into "
                          "the sbatch script, the run's .hydra/ config and the plan",
                          f"remove it here and `export {name}=...` in the shell you submit from: Slurm passes that "
                          f"environment to every task (--export=ALL), and local runs inherit it")


# Argument names of a logger that hold a secret (W&B's `api_key`, a `token`, a `password`), at any depth.
LOGGER_CREDENTIAL = re.compile(r"(^|_)(key|token|secret|password|passwd|credentials?)$|api_?key|secret|password",
                               re.IGNORECASE)
# A URL with a password in it: scheme://user:password@host
URL_PASSWORD = re.compile(r"^[A-Za-z][A-Za-z0-9+.-]*://[^/@\s]*:[^/@\s]*@")


def tracking_credentials(cfg, ctx):
    """A logger's credential in the config would be written into `.hydra/`, the plan and the config the run
    prints and logs to the tracking server itself. The values are never echoed."""
    def walk(node, path):
        if isinstance(node, dict):
            for k, v in node.items():
                yield from walk(v, f"{path}.{k}")
                if LOGGER_CREDENTIAL.search(str(k)) and v not in (None, ""):
                    yield Problem(f"{path}.{k}", "looks like a credential: it would be written in plain text into "
                                  "the run's .hydra/ config, the plan and the config logged to the tracker",
                                  "remove it here and export it in the shell you submit from (WANDB_API_KEY, "
                                  "MLFLOW_TRACKING_TOKEN, MLFLOW_TRACKING_USERNAME/MLFLOW_TRACKING_PASSWORD, "
                                  "DATABRICKS_TOKEN): jobs inherit that environment")
        elif isinstance(node, list):
            for i, v in enumerate(node):
                yield from walk(v, f"{path}[{i}]")
        elif isinstance(node, str) and URL_PASSWORD.match(node):
            yield Problem(path, "holds a URL with a password in it (scheme://user:password@...): it would be "
                          "written in plain text into the run's .hydra/ config, the plan and the run's log",
                          "give the URL without the user and password, and export them instead (for MLflow: "
                          "MLFLOW_TRACKING_USERNAME and MLFLOW_TRACKING_PASSWORD)")

    loggers = value(cfg, "loggers")
    if not OmegaConf.is_config(loggers):
        return
    try:
        plain = OmegaConf.to_container(loggers, resolve=True)
    except InterpolationResolutionError:  # its keys are still checked by name
        plain = OmegaConf.to_container(loggers, resolve=False)
    yield from walk(plain, "loggers")


def shell_safety(cfg, ctx):
    """sbatch reads `#SBATCH` lines up to a newline (the rest would run as a command, and sbatch would silently
    ignore every directive after it); the run name is a path component of the checkpoint and output folders."""
    name = value(cfg, "run_name")
    if not isinstance(name, str) or not name or "/" in name or "\\" in name or name in (".", "..") \
            or ".." in name.split(".") or CONTROL.search(name):
        yield Problem("run_name", f"{name!r} is not a plain folder name (it names the checkpoint and output folders: "
                      "no path separators, `..` or control characters)", "e.g. run_name=mpt-30b-c4-v2")
    for key in ("cluster.account", "cluster.partition", "cluster.qos", "cluster.constraint",
                "cluster.container.image"):
        v = value(cfg, key)
        if isinstance(v, str) and CONTROL.search(v):
            yield Problem(key, f"{v!r} holds a control character (a newline would end its #SBATCH line and run the "
                          "rest as a shell command)", "remove it")
    for k, v in (value(cfg, "cluster.sbatch_extra") or {}).items():
        if CONTROL.search(f"{k}{v}") or not re.match(r"^[A-Za-z0-9_-]+$", str(k)):
            yield Problem(f"cluster.sbatch_extra.{k}", f"{k}={v!r} is not a plain sbatch flag and value (a newline "
                          "would end the #SBATCH line and run the rest as a command)",
                          "a flag name of letters, digits and dashes, and a value on one line")
    for key in ("cluster.srun_extra", "cluster.container.mounts", "storage.mounts"):
        for v in value(cfg, key) or []:
            if CONTROL.search(str(v)):
                yield Problem(key, f"{v!r} holds a control character", "remove it")
    for k, v in (value(cfg, "cluster.env") or {}).items():
        if not ENV_NAME.match(str(k)):
            yield Problem(f"cluster.env.{k}", "is not an environment variable name",
                          "letters, digits and underscores, not starting with a digit")
        elif CONTROL.search(str(v)):
            yield Problem(f"cluster.env.{k}", f"{v!r} holds a control character", "put the value on one line")


RULES = [credentials, tracking_credentials, shell_safety]
