"""Credentials and shell safety: run before Hydra writes anything (the run folder's .hydra/ holds every override),
and again for every sweep point. Every value that lands in the sbatch script stays data."""
import re

from omegaconf import OmegaConf
from omegaconf.errors import InterpolationResolutionError

from common.errors import secrets_in
from train.checks.core import Problem, value

# Environment variable names that hold credentials: never written into a script, a config copy or a plan. By word
# (AWS_ACCESS_KEY_ID, AWS_SESSION_TOKEN, AZURE_CLIENT_SECRET, AZURE_OPENAI_API_KEY, HF_TOKEN, HF_AUTH,
# WANDB_API_KEY, MLFLOW_TRACKING_PASSWORD, DATABRICKS_TOKEN, GOOGLE_APPLICATION_CREDENTIALS, ...), not by letters:
# TOKENIZERS_PARALLELISM and NCCL_IB_QPS_PER_CONNECTION are settings.
CREDENTIAL = re.compile(r"(^|_)(KEYS?|TOKENS?|SECRETS?|PASSWORD|PASSWD|PASSPHRASE|CREDENTIALS?|AUTH|APIKEY|"
                        r"ACCESSKEY|AUTHTOKEN|SAS|PAT)(_|$)|SECRET|PASSWORD|CONNECTION_STRING|^AZURE_STORAGE_",
                        re.IGNORECASE)
ENV_NAME = re.compile(r"^[A-Za-z_][A-Za-z0-9_]*$")
CONTROL = re.compile(r"[\x00-\x1f\x7f]")
_WHERE = "the sbatch script, the run's .hydra/ config, the sweep's files and the plan"
_EXPORT = ("Slurm passes that environment to every task (--export=ALL), and local runs inherit it")


def credentials(cfg, ctx):
    """A credential in cluster.env would be written into the sbatch script, `.hydra/` and the plan."""
    for name in value(cfg, "cluster.env") or {}:
        if CREDENTIAL.search(str(name)):
            yield Problem(f"cluster.env.{name}", f"looks like a credential: it would be written in plain text into "
                          f"{_WHERE}", f"remove it here and `export {name}=...` in the shell you submit from: {_EXPORT}")


# Config keys that hold a secret (a tokenizer's `token`, a `password`), outside loggers (tracking_credentials) and
# cluster.env (credentials). `eos_token`, `pad_token` and `concat_tokens` are not secrets.
SECRET_KEY = re.compile(r"^(token|hf_token|auth_token|use_auth_token|access_token|api_?key|secret|client_secret|"
                        r"password|passwd|account_key|sas_token|private_key|secret_key|access_key|"
                        r"aws_secret_access_key|aws_access_key_id|aws_session_token)$|(_password|_secret|_api_?key)$",
                        re.IGNORECASE)
# An assignment in a shell line: `export NAME=value`, `NAME=value cmd`, `declare -x NAME=value`, `env NAME=value`.
ASSIGNMENT = re.compile(r"(?:^|[\s;&|(])(?:export\s+|declare\s+-x\s+|env\s+)?([A-Za-z_][A-Za-z0-9_]*)=(\S*)")


def _plain(cfg):
    from omegaconf import OmegaConf

    try:
        return OmegaConf.to_container(cfg, resolve=True)
    except Exception:  # a value that does not resolve is another rule's problem; its text is still looked at
        return OmegaConf.to_container(cfg, resolve=False)


def _walk(node, path=""):
    """(dotted key, key name, value) of every leaf, dicts and lists."""
    if isinstance(node, dict):
        for k, v in node.items():
            yield from _walk(v, f"{path}.{k}" if path else str(k))
    elif isinstance(node, list):
        for i, v in enumerate(node):
            yield from _walk(v, f"{path}[{i}]")
    else:
        yield path, path.rsplit(".", 1)[-1].split("[")[0], node


def secrets_in_values(cfg, ctx):
    """A credential recognised by its form, in any value (a URL with a password, a Hugging Face or AWS key): it
    would be written into .hydra/, the sweep's files, submitit's pickles, the sbatch script and the plan, and the
    values a run logs to its tracker. Named once, where the command line gave it (interpolations repeat it).
    And a key whose name says it holds a secret (tokenizer.kwargs.token, ...password) with a value in it."""
    seen, named = {}, []
    for path, name, v in _walk(_plain(cfg)):
        if not isinstance(v, str):
            continue
        for what, secret in secrets_in(v):
            seen.setdefault(secret, (what, []))[1].append(path)
        if not path.startswith(("loggers.", "cluster.env.")) and SECRET_KEY.search(name) and v.strip() and \
                v.lower() not in ("true", "false", "none", "null"):
            named.append(path)
    for what, paths in seen.values():
        given = [p for p in paths if ctx.given(p) is not None]
        key = (given or paths)[0]
        also = [p for p in paths if p != key]
        yield Problem(key, f"holds {what}: it would be written in plain text into {_WHERE}, and into the config the "
                      "run logs" + (f" (it also reaches {', '.join(also[:3])})" if also else ""),
                      "give the value without the credential (a URL without user:password) and export the "
                      "credential in the shell you submit from (AWS_*, AZURE_*, HF_TOKEN, MLFLOW_TRACKING_USERNAME/"
                      f"MLFLOW_TRACKING_PASSWORD, ...): {_EXPORT}")
    for path in named:
        yield Problem(path, f"holds a credential: it would be written in plain text into {_WHERE}, and into the "
                      "config the run logs to its tracker (as MLflow parameters)", "remove it here and export it in "
                      f"the shell you submit from (for the Hugging Face hub: HF_TOKEN): {_EXPORT}")


def setup_exports(cfg, ctx):
    """cluster.setup lines are written into the sbatch script as they are: a credential assigned there is written
    with them (and into .hydra/ and the plan)."""
    for num, line in enumerate(value(cfg, "cluster.setup") or []):
        for name, assigned in ASSIGNMENT.findall(str(line)):
            if CREDENTIAL.search(name) and assigned and not assigned.startswith(("$", '"$', "'$")):
                yield Problem(f"cluster.setup[{num}]", f"sets {name}, a credential, in plain text: the setup lines are "
                              f"written into {_WHERE}", f"drop the assignment and `export {name}=...` in the shell you "
                              f"submit from: {_EXPORT} (a setup line may still use ${name})")


def secret_values(cfg) -> list:
    """The values this config holds that are credentials (by key name or by form): masked in every message."""
    found = []
    for path, name, v in _walk(_plain(cfg)):
        if not isinstance(v, str) or not v:
            continue
        found += [secret for _, secret in secrets_in(v)]
        if path.startswith("cluster.env.") and CREDENTIAL.search(name) or SECRET_KEY.search(name) \
                or path.startswith("loggers.") and LOGGER_CREDENTIAL.search(name):
            found.append(v)
        if path.startswith("cluster.setup"):
            found += [assigned for n, assigned in ASSIGNMENT.findall(v) if CREDENTIAL.search(n)]
    return [f for f in found if f and f.lower() not in ("true", "false")]


# Argument names of a logger that hold a secret (W&B's `api_key`, a `token`, a `password`), at any depth.
LOGGER_CREDENTIAL = re.compile(r"(^|_)(key|token|secret|password|passwd|credentials?)$|api_?key|secret|password",
                               re.IGNORECASE)


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


RULES = [credentials, secrets_in_values, setup_exports, tracking_credentials, shell_safety]
