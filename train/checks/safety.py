"""Credentials and shell safety: run before Hydra writes anything (the run folder's .hydra/ holds every override),
and again for every sweep point. Every value that lands in the sbatch script stays data."""
import functools
import re

from omegaconf import OmegaConf

from common.errors import TOKEN_FORMS, URL_PASSWORD
from common.paths import is_remote
from train.checks.core import ConfigError, Problem, override_key, override_values, plain, value

# Environment variable names that hold credentials: never written into a script, a config copy or a plan. By word
# (AWS_ACCESS_KEY_ID, AWS_SESSION_TOKEN, AZURE_CLIENT_SECRET, AZURE_OPENAI_API_KEY, HF_TOKEN, HF_AUTH,
# WANDB_API_KEY, MLFLOW_TRACKING_PASSWORD, DATABRICKS_TOKEN, GOOGLE_APPLICATION_CREDENTIALS, MY_CRED, ...), not by letters:
# TOKENIZERS_PARALLELISM and NCCL_IB_QPS_PER_CONNECTION are settings.
# Words that name a credential wherever they stand as a word of a name, in an environment variable's or a config
# key's: one list, read by both rules below.
_WORDS = r"SECRETS?|PASSWORDS?|PASSWD|PASSPHRASE|CREDENTIALS?|CREDS?|AUTH|APIKEY|ACCESSKEY|AUTHTOKEN|SAS|PAT"
_ANYWHERE = r"SECRET|PASSWORD|PASSPHRASE|CONNECTION_STRING"
CREDENTIAL = re.compile(rf"(^|_)(KEYS?|TOKENS?|{_WORDS})(_|$)|{_ANYWHERE}|^AZURE_STORAGE_", re.IGNORECASE)
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


# Config keys that hold a secret (a tokenizer's `token`, a `password`), outside loggers and cluster.env (named as
# environment variables are: CREDENTIAL). A key or token word counts only with what it unlocks: `eos_token`,
# `pad_token`, `concat_tokens`, `text_key` are settings.
SECRET_KEY = re.compile(rf"(^|_)({_WORDS})(_|$)|{_ANYWHERE}|"
                        r"^(token|hf_token|auth_token|use_auth_token|access_token|api_?key|account_key|sas_token|"
                        r"private_key|secret_key|access_key|aws_access_key_id|aws_session_token)$|_api_?key$|"
                        # a key named for what it unlocks (an Azure storage account's); text_key, label_key,
                        # prompt_key name a column
                        r"(^|_)(storage|account|access|secret|shared|master|primary|secondary|subscription|signing|"
                        r"encryption)_?key$|"
                        r"(^|_)(access|auth|api|bearer|refresh|session|id|private|personal|hf|hub|github|gh|gitlab|"
                        r"wandb|slack|bot|databricks|mlflow|my)_?token$",
                        re.IGNORECASE)
# An assignment in a shell line: `export NAME=value`, `NAME=value cmd`, `declare -x NAME=value`, `env NAME=value`.
ASSIGNMENT = re.compile(r"(?:^|[\s;&|(])(?:export\s+|declare\s+-x\s+|env\s+)?([A-Za-z_][A-Za-z0-9_]*)=(\S*)")

# ---- credentials by shape, whatever the key: a value of `+variables.anything`, a cluster.setup line, a URL ------
# Beside common.errors' forms (URL user:password@, hf_, AKIA, ghp_/github_pat_, xox?-, sk-, glpat-, pypi-, npm_,
# AIza, dapi, JSON web tokens, AccountKey=, sig=), masked in every message: those whose secret is a part of them.
FORMS = (
    # the URL of a chat webhook is its credential: anyone holding it posts to the channel
    ("a chat webhook URL", re.compile(r"(?<=hooks\.slack\.com/)(?:services|workflows|triggers)/[^\s'\"?#]+|"
                                      r"(?<=discord\.com/api/webhooks/)[^\s'\"?#]+|"
                                      r"(?<=discordapp\.com/api/webhooks/)[^\s'\"?#]+|"
                                      r"(?<=\.webhook\.office\.com/webhookb2/)[^\s'\"?#]+")),
    ("a bearer token", re.compile(r"\b[Bb]earer +([A-Za-z0-9._~+/=-]{8,})")),
    ("an Authorization header", re.compile(r"(?i:authorization): *(?:(?i:basic|token) +)?([A-Za-z0-9._~+/=-]{8,})")),
)
# A URL's query parameter that holds a secret: ?access_token=, &token=, ?api_key=, ?key=, X-Amz-Signature=, ?sig=.
QUERY_SECRET = re.compile(r"[?&]([A-Za-z0-9_.-]*)=([^&#\s'\"]+)")
QUERY_NAME = re.compile(r"(^|[_.-])(token|access_?token|auth|key|api_?key|secret|client_secret|sig|signature|"
                        r"password|passwd|pwd|credentials?)$|[a-z](Token|Key|Secret|Signature|Password|Credential)$",
                        re.IGNORECASE)
# A shell flag whose value is a secret (`huggingface-cli login --token X`, `--password X`), and those of a login
# command (`docker login -p X`; `wandb login KEY` takes it as its argument).
SECRET_FLAG = re.compile(r"^--(token|api[-_]?key|password|passwd|client[-_]secret|access[-_]token|"
                         r"auth[-_]token|hf[-_]token|wandb[-_]key|sas[-_]token|"
                         # az storage --account-key, a key named for what it unlocks (not --sort-key, --label-key)
                         r"(storage|account|access|secret|shared|master|primary|secondary|subscription)[-_]key|"
                         r"[a-z_-]*secret[a-z_-]*)$", re.IGNORECASE)
WANDB_FLAGS_WITH_VALUE = {"--host", "--anonymously"}
# Long random words: 24 characters or more, outside paths (a path is no secret), in which what is left without its
# hexadecimal parts (the hashes and ids this product and its tools print: run names mpt-tiny-1c6d94ab, xxh3_64 shard
# hashes, git commits, uuids) is 16 characters or more that mix lower and upper case letters and digits, with the
# entropy of random text, changing between the three as random text does (a model's name, Meta-Llama-3.1-70B-Instruct,
# mixes them but changes at a quarter of its letters; a random token, at more than half).
LONG_WORD = re.compile(r"[A-Za-z0-9+_~.-]{24,}={0,2}")
# A word that is a path (/data/c4, ./ckpt, EleutherAI/gpt-neox-20b; a URL is none): no long random word in it counts.
# Unless it is one run of base64 with `/` inside and none leading (an AWS secret access key, an Azure storage
# account key) that reads as random text as a whole: a path starts with /, ./ or ~, or its parts are words.
PATH = re.compile(r"[^\s'\"=,\[\]{}()]+")
BASE64 = re.compile(r"[A-Za-z0-9+][A-Za-z0-9+/]{23,}")
WORD_PART = re.compile(r"(?:[A-Z]?[a-z]{2,}|[0-9]+)+")  # MyProject, runs, step1000: a part of a path
HEX_PART = re.compile(r"^[0-9a-fA-F]*$")
ENTROPY_LENGTH, ENTROPY_LEFT, ENTROPY_BITS, ENTROPY_CHANGES = 24, 16, 3.5, 0.4


def _random_looking(word: str) -> bool:
    import math
    from collections import Counter

    if len(word) < ENTROPY_LENGTH or "${" in word:
        return False
    left = "".join(part for part in re.split(r"[-_.~]", word) if not HEX_PART.match(part))
    if len(left) < ENTROPY_LEFT or not (re.search(r"[a-z]", left) and re.search(r"[A-Z]", left)
                                        and re.search(r"[0-9]", left)):
        return False
    bits = -sum(n / len(left) * math.log2(n / len(left)) for n in Counter(left).values())
    kinds = ["l" if c.islower() else "u" if c.isupper() else "d" if c.isdigit() else None for c in left]
    pairs = [(a, b) for a, b in zip(kinds, kinds[1:]) if a and b]
    return bits >= ENTROPY_BITS and bool(pairs) and sum(a != b for a, b in pairs) / len(pairs) >= ENTROPY_CHANGES


def _commands(text: str) -> list:
    """The words of each command in a shell line (a `|`, `;`, `&&` or `||` ends one), as the shell splits them."""
    import shlex

    try:
        lexer = shlex.shlex(text, posix=True, punctuation_chars=";&|")
        lexer.whitespace_split = True
        words = list(lexer)
    except ValueError:  # an unclosed quote: split on spaces
        words = text.split()
    found, current = [], []
    for w in words:
        if w and set(w) <= set(";&|"):
            found.append((current, w))
            current = []
        else:
            current.append(w)
    return found + [(current, "")]


def _in_commands(text: str) -> list:
    """(what, secret) for a login command's key or a secret flag's value in a shell line. A value taken from the
    environment (`$HF_TOKEN`) holds none."""
    found = []
    commands = _commands(text)
    for num, (words, ends) in enumerate(commands):
        login = "login" in words[1:4]  # docker login, gh auth login, sudo singularity remote login
        for i, w in enumerate(words):
            flag, eq, given = w.partition("=")
            given = given if eq else (words[i + 1] if i + 1 < len(words) else "")
            if given.startswith("-"):  # the next flag: this one took no value
                continue
            if SECRET_FLAG.match(flag) or login and flag in ("-p", "--password"):
                found.append(("a secret given to a command (" + flag + ")", given))
            elif words[:1] == ["curl"] and flag in ("-u", "--user") and ":" in given:  # (docker run -u uid:gid)
                found.append(("a password given to a command (" + flag + " user:password)", given.split(":", 1)[1]))
        # aws configure set aws_secret_access_key KEY
        at = next((i for i in range(len(words) - 3) if words[i].endswith("aws") and words[i + 1:i + 3] ==
                   ["configure", "set"]), None)
        if at is not None and CREDENTIAL.search(words[at + 3].rsplit(".", 1)[-1]) and at + 4 < len(words):
            found.append((f"a credential given to the AWS CLI ({words[at + 3]})", words[at + 4]))
        at = next((i for i in range(len(words) - 1) if words[i].endswith("wandb") and words[i + 1] == "login"), None)
        if at is not None:  # wandb login KEY, sudo -E wandb login KEY
            skip = False
            for w in words[at + 2:]:
                if skip:
                    skip = False
                elif w.startswith("-"):
                    skip = w in WANDB_FLAGS_WITH_VALUE
                else:
                    found.append(("a W&B key given to `wandb login`", w))
        # `echo KEY | docker login --password-stdin`, `| gh auth login --with-token`
        if ends == "|" and words[:1] in (["echo"], ["printf"]) and num + 1 < len(commands) and \
                "login" in commands[num + 1][0]:
            found += [("a secret piped to a login command", w) for w in words[1:] if not w.startswith("-")]
    return [(what, s) for what, s in found if s and not s.startswith("$")]


@functools.lru_cache(maxsize=4096)  # a sweep's points hold the same texts
def _spans(text: str) -> tuple:
    """(what, start, end) of each credential recognised by its shape in text."""
    found = [("a URL with a password in it", *m.span(2)) for m in URL_PASSWORD.finditer(text)]
    for what, pattern in (*TOKEN_FORMS, *FORMS):
        found += [(what, *m.span(pattern.groups and 1)) for m in pattern.finditer(text)]
    found += [(f"a secret in a URL's query parameter ({m.group(1)})", *m.span(2)) for m in QUERY_SECRET.finditer(text)
              if QUERY_NAME.search(m.group(1)) and not m.group(2).startswith("$")]
    for what, secret in _in_commands(text):  # words as the shell reads them: found again in the text
        found += [(what, *m.span()) for m in re.finditer(re.escape(secret), text)]
    paths = []
    for m in PATH.finditer(text):
        word = m.group(0)
        if "/" not in word or is_remote(word):
            continue
        if BASE64.fullmatch(word) and _random_looking(re.sub("[/+]", "", word)) and \
                not any(len(part) >= 4 and WORD_PART.fullmatch(part) for part in word.split("/")):
            found.append(("a long random string with / in it (a base64 key, by its form)", *m.span()))
        else:
            paths.append(m.span())
    found += [("a long random string (a key or a token, by its form)", *m.span()) for m in LONG_WORD.finditer(text)
              if _random_looking(m.group(0)) and not any(s <= m.start() < e for _, s, e in found)
              and not any(s <= m.start() < e for s, e in paths)]
    return tuple(found)


def shapes(text: str) -> list:
    """(what, the secret) for each credential recognised by its shape in text: common.errors' forms (URL
    user:password@, the token prefixes, AccountKey=, sig=), the forms above, a secret URL query
    parameter, a bearer or Authorization header, a login command's key or a secret flag's value, a long random
    word."""
    return [(what, text[s:e]) for what, s, e in _spans(text) if e > s]


def mask_shapes(text: str) -> str:
    """text with every credential recognised by its shape replaced by ****, however short (`?token=abc`)."""
    spans = sorted((s, e) for _, s, e in _spans(text) if e > s)
    out, at = [], 0
    for s, e in spans:
        if e > at:
            out += [text[at:max(s, at)], "****"]
            at = e
    return "".join(out) + text[at:]


def masked(problem: Problem, secrets=()) -> Problem:
    """The problem with every credential in it masked: each of `secrets`, and anything of a credential's shape."""
    from dataclasses import replace

    p = problem.masked(secrets)
    return replace(p, key=mask_shapes(p.key), problem=mask_shapes(p.problem), fix=mask_shapes(p.fix))


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
    """A credential recognised by its shape, in any value (a URL with a password or a token in its query, a chat
    webhook, a bearer header, a login command's key, a known token's prefix, a long random string): it would be
    written into .hydra/, the sweep's files, submitit's pickles, the sbatch script and the plan, and the values a
    run logs to its tracker. Named once, where the command line gave it (interpolations repeat it).
    And a key whose name says it holds a secret (tokenizer.kwargs.token, ...password) with a value in it."""
    seen, named = {}, []
    for path, name, v in _walk(plain(cfg)):
        if not isinstance(v, str):
            continue
        for what, secret in shapes(v):
            seen.setdefault(secret, (what, []))[1].append(path)
        if not path.startswith(("loggers.", "cluster.env.")) and SECRET_KEY.search(name) and v.strip() and \
                v.lower() not in ("true", "false", "none", "null"):
            named.append(path)
    by_key = {}
    for what, paths in seen.values():
        given = [p for p in paths if ctx.given(p) is not None]
        key = (given or paths)[0]
        whats, also = by_key.setdefault(key, ([], []))
        whats += [what] if what not in whats else []
        also += [p for p in paths if p != key and p not in also]
    for key, (whats, also) in by_key.items():
        yield _by_shape(key, " and ".join(whats), also)
    for path in named:
        yield Problem(path, f"holds a credential: it would be written in plain text into {_WHERE}, and into the "
                      "config the run logs to its tracker (as MLflow parameters)", "remove it here and export it in "
                      f"the shell you submit from (for the Hugging Face hub: HF_TOKEN): {_EXPORT}")


def _by_shape(key: str, what: str, also=()) -> Problem:
    return Problem(key, f"holds {what}: it would be written in plain text into {_WHERE}, and into the config the "
                   "run logs" + (f" (it also reaches {', '.join(also[:3])})" if also else ""),
                   "give the value without the credential (a URL without user:password or its token) and export the "
                   "credential in the shell you submit from (AWS_*, AZURE_*, HF_TOKEN, WANDB_API_KEY, "
                   "MLFLOW_TRACKING_USERNAME/MLFLOW_TRACKING_PASSWORD, a webhook's URL in a variable of your own, "
                   f"...): {_EXPORT}; a setup line reads it as $NAME (`wandb login` and `huggingface-cli` need no "
                   "key argument: they read WANDB_API_KEY and HF_TOKEN)")


def secret_by_name(key: str) -> bool:
    """A key whose value the config checks take for a credential by its name alone (credentials,
    secrets_in_values, tracking_credentials): refused on the command line too, before a message can echo it."""
    last = key.rsplit(".", 1)[-1].split("[")[0]
    if key.startswith("cluster.env."):
        return bool(CREDENTIAL.search(last))
    # a logger's arguments (W&B's `api_key`, a `key`, a `token`) hold nothing but its settings and its secrets
    return bool(SECRET_KEY.search(last) or key.startswith("loggers.") and LOGGER_WORD.search(last))


def command_line_secrets(args: list) -> tuple[list, list]:
    """(problems, secrets) for the overrides of a command line that hold a credential by its shape, before Hydra
    reads them: Hydra's own errors (an unquoted URL it cannot parse, a key it cannot override) print the override
    in full. Named as the config check names them (cluster.setup[0]); a value Hydra cannot parse, by its key."""
    from hydra.core.override_parser.overrides_parser import OverridesParser

    parser = OverridesParser.create()
    problems, secrets = [], []
    for arg in args:
        if arg.startswith("-") or "=" not in arg:
            continue
        key, raw = override_key(arg), arg.split("=", 1)[1]
        if raw and not raw.startswith("$") and secret_by_name(key):  # by its name: echoed as Hydra's fix
            env = key.startswith("cluster.env.")
            problems.append(next(credentials(OmegaConf.create({"cluster": {"env": {key[12:]: raw}}}), None)) if env
                            else _by_shape(key, "a credential (by its key's name)"))
            secrets.append(raw)
            continue
        try:
            values = override_values(parser.parse_overrides([arg])[0])
        except Exception:  # read by the gate as Hydra's grammar error
            values = []
        # a credential assigned in its text (`cluster.setup=[export WANDB_API_KEY=...]`, which Hydra cannot read
        # unquoted): masked wherever the override is shown
        secrets += assigned_credentials(raw)
        # none read (that, or glob(), range()): its text is looked at, and its items
        values = values or [raw, re.sub(r"[\[\]{}'\",]", " ", raw)]
        found = {}
        for v in values:
            for path, _, leaf in _walk(v, key) if isinstance(v, (dict, list)) else [(key, None, v)]:
                for what, secret in shapes(leaf) if isinstance(leaf, str) else ():
                    found.setdefault(path, {}).setdefault(secret, what)  # one name for each secret
                    secrets.append(secret)
        problems += [_by_shape(path, " and ".join(dict.fromkeys(whats.values()))) for path, whats in found.items()]
    return problems, secrets


def setup_exports(cfg, ctx):
    """cluster.setup lines are written into the sbatch script as they are: a credential assigned there is written
    with them (and into .hydra/ and the plan)."""
    yield from _assigned_credentials(value(cfg, "cluster.setup"), "cluster.setup")


def assigned_credentials(text: str) -> list:
    """The values assigned in plain text to credential names in a shell line (`export HF_TOKEN=...`); one read from
    the environment (`$MY_TOKEN`) is none."""
    values = [assigned.rstrip("]})'\",") for name, assigned in ASSIGNMENT.findall(text) if CREDENTIAL.search(name)]
    return [v for v in values if v and not v.startswith(("$", '"$', "'$"))]


def _assigned_credentials(lines, key: str):
    """A credential assigned in plain text in the setup lines at `key`."""
    for num, line in enumerate(lines or []):
        for name, assigned in ASSIGNMENT.findall(str(line)):
            if assigned_credentials(f"{name}={assigned}"):
                yield Problem(f"{key}[{num}]", f"sets {name}, a credential, in plain text: the setup lines are "
                              f"written into {_WHERE}", f"drop the assignment and `export {name}=...` in the shell you "
                              f"submit from: {_EXPORT} (a setup line may still use ${name})")


def secret_values(cfg) -> list:
    """The values this config holds that are credentials (by key name or by form): masked in every message."""
    found = []
    for path, _, v in _walk(plain(cfg)):
        if not isinstance(v, str) or not v:
            continue
        found += [secret if len(secret) >= 8 else v for _, secret in shapes(v)]  # a short one: its whole value
        if secret_by_name(path):
            found.append(v)
        if path.startswith("cluster.setup"):
            found += assigned_credentials(v)
    return [f for f in found if f and f.lower() not in ("true", "false")]


LOGGER_WORD = re.compile(r"(^|_)(key|token)$", re.IGNORECASE)


def tracking_credentials(cfg, ctx):
    """A logger's credential in the config would be written into `.hydra/`, the plan and the config the run
    prints and logs to the tracking server itself. The values are never echoed."""
    def walk(node, path):
        if isinstance(node, dict):
            for k, v in node.items():
                yield from walk(v, f"{path}.{k}")
                if secret_by_name(f"{path}.{k}") and v not in (None, ""):
                    yield Problem(f"{path}.{k}", "looks like a credential: it would be written in plain text into "
                                  "the run's .hydra/ config, the plan and the config logged to the tracker",
                                  "remove it here and export it in the shell you submit from (WANDB_API_KEY, "
                                  "MLFLOW_TRACKING_TOKEN, MLFLOW_TRACKING_USERNAME/MLFLOW_TRACKING_PASSWORD, "
                                  "DATABRICKS_TOKEN): jobs inherit that environment")
        elif isinstance(node, list):
            for i, v in enumerate(node):
                yield from walk(v, f"{path}[{i}]")

    loggers = plain(cfg).get("loggers")  # (unresolved where the config does not resolve: still checked by name)
    if isinstance(loggers, dict):
        yield from walk(loggers, "loggers")


# Every single value the sbatch script is written from (train/launch/executor.py, common/sweep/contract.py): an
# `#SBATCH` directive's (--account, --partition, the summary job's --partition, --output/--error under the submitit
# folder) or a shell line's (the image, the folders). Paths follow the roots they are made of: a root is named, not
# every path made from it. Keys a config does not have are passed over (a point's config has no hydra.*, data_prep's
# no cluster.*).
SCRIPT_VALUES = ("cluster.account", "cluster.partition", "cluster.summary_partition", "cluster.qos",
                 "cluster.constraint", "cluster.container.image", "storage.root", "storage.data_root",
                 "storage.data_local_root", "storage.checkpoint_root", "storage.output_root", "out_root",
                 "hydra.sweep.dir", "hydra.launcher.submitit_folder", "hydra.launcher.account",
                 "hydra.launcher.partition", "hydra.launcher.summary_partition", "hydra.launcher.qos")


def _control_characters(read, keys):
    """A control character in a value that reaches the sbatch script. read(key): its value, None where missing."""
    bad = []
    for key in keys:
        v = read(key)
        if isinstance(v, str) and CONTROL.search(v):
            if not any(b in v for b in bad):  # a path made of a root named already
                yield Problem(key, f"{v!r} holds a control character (a newline would end its #SBATCH line and run "
                              "the rest as a shell command)", "remove it")
            bad.append(v)


def launcher_safety(config):
    """A sweep's own settings (its Hydra config: the sweep folder, submitit's folder, the launcher's resources and
    setup lines, which data_prep's parts take), checked as a point's are before anything is written: what reaches
    the script stays data, and no credential is written into the script, multirun.yaml or submitit's pickles."""
    def read(key):
        try:
            return OmegaConf.select(config, key, default=None)
        except Exception:  # noqa: BLE001 -- a value that does not resolve is another check's problem
            return None

    yield from _control_characters(read, SCRIPT_VALUES)
    launcher = read("hydra.launcher")
    if launcher is None:
        return
    settings = plain(launcher)
    yield from _assigned_credentials(settings.get("setup"), "hydra.launcher.setup")
    for path, name, v in _walk(settings, "hydra.launcher"):
        whats = dict.fromkeys(what for what, _ in shapes(v)) if isinstance(v, str) else {}
        if whats:
            yield _by_shape(path, " and ".join(whats))
        elif SECRET_KEY.search(name) and isinstance(v, str) and v.strip() and not v.startswith("$"):
            yield _by_shape(path, "a credential (by its key's name)")


def shell_safety(cfg, ctx):
    """sbatch reads `#SBATCH` lines up to a newline (the rest would run as a command, and sbatch would silently
    ignore every directive after it); the run name is a path component of the checkpoint and output folders."""
    name = value(cfg, "run_name")
    if not isinstance(name, str) or not name or "/" in name or "\\" in name or name in (".", "..") \
            or ".." in name.split(".") or CONTROL.search(name) or re.search("[\"'`]", name):
        yield Problem("run_name", f"{name!r} is not a plain folder name (it names the checkpoint and output folders: "
                      "no path separators, `..`, quotes, which break the shell lines that name those folders, or "
                      "control characters)", "e.g. run_name=mpt-30b-c4-v2")
    def read(key):
        try:
            return value(cfg, key, None)
        except ConfigError:  # a value missing or not resolving: its own rule names it
            return None

    yield from _control_characters(read, SCRIPT_VALUES)
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
