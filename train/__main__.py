"""`python -m train [overrides] [-m]`: compose conf/, check (train/checks/gate.py, before Hydra writes), then plan, train
here, or launch."""
import os
import sys

import hydra
from omegaconf import DictConfig

import train  # noqa: F401  (registers resolvers before composing)
from train.config.compose import command_line


@hydra.main(config_path="../conf", config_name="train", version_base=None)
def main(cfg: DictConfig):
    # Checked (and planned) already, before Hydra wrote anything: train/checks/gate.py.
    from common.errors import UserError
    from train.checkpoint.resume import FolderInUse
    from train.task.main import run  # the heavy imports (torch, llm-foundry) start here
    from train.task.shards import DamagedShard, NotMounted, OtherData

    try:
        return run(cfg)
    except UserError as err:  # key / problem / fix, no traceback: refused at the start, or stopped in training
        from hydra.core.hydra_config import HydraConfig
        from hydra.types import RunMode

        if HydraConfig.get().mode == RunMode.MULTIRUN:
            raise  # a sweep job: its summary shows the error
        print(err, file=sys.stderr)
        # 2: refused before training (as the checks refuse); 1: a run that stopped (a non-finite loss, a full disk)
        sys.exit(2 if isinstance(err, (FolderInUse, DamagedShard, NotMounted, OtherData)) else 1)


def _dotted_keys(node, prefix="") -> set:
    keys = set()
    if isinstance(node, dict):
        for k, v in node.items():
            full = f"{prefix}{k}"
            keys.add(full)
            keys |= _dotted_keys(v, full + ".")
    return keys


def suggest_keys(args: list) -> list:
    """For overrides of keys the config does not have (Hydra's "Key 'x' is not in struct"): the closest keys."""
    import difflib

    from hydra.core.global_hydra import GlobalHydra
    from omegaconf import OmegaConf

    from common.paths import CONF
    from train.checks import ConfigError
    from train.config.compose import compose

    groups = {p.name for p in CONF.iterdir() if p.is_dir()}
    pairs = [a.split("=", 1) for a in args if "=" in a and not a.startswith("-")]
    choices = [f"{k}={v}" for k, v in pairs if k in groups]
    unknown = [(k.lstrip("~"), v) for k, v in pairs
               if not k.startswith("+") and "/" not in k and k not in groups | {"yaml"} and not k.startswith("hydra")]
    if not unknown:
        return []
    GlobalHydra.instance().clear()
    try:
        cfg = compose(choices)
    except Exception:
        return []
    finally:
        GlobalHydra.instance().clear()
    keys = _dotted_keys(OmegaConf.to_container(cfg, resolve=False))
    found = []
    for key, val in unknown:
        if key in keys:
            continue
        # a misspelt key is close to one beside it (not to its parent: model.attn_config.alibi is no typo of
        # model.attn_config, it is an llm-foundry key the preset does not set)
        parent, _, name = key.rpartition(".")
        beside = {k.rpartition(".")[2]: k for k in keys if k.rpartition(".")[0] == parent}
        match = [beside[m] for m in difflib.get_close_matches(name, sorted(beside), n=1, cutoff=0.6)]
        if match:
            fix = f"did you mean {match[0]}? ({match[0]}={val})"
        elif parent and isinstance(OmegaConf.select(cfg, parent), DictConfig):
            fix = f"+{key}={val} (a key {parent} does not set yet: Hydra adds one with +)"
        else:
            fix = "see the keys with `python -m train --cfg job`; `+variables.<name>=...` adds a value of your own"
        found.append(ConfigError(key, "is not a key of this config", fix))
    return found


def composition_problems(args: list, err) -> list:
    """Hydra's refusal of an override as it composes (its ConfigCompositionException), as key / problem / fix: a
    misspelt key under a group, said as "did you mean" where Hydra advised adding it with +; a key added with + that
    the config has; a value that cannot take a mapping's place. [] where there is nothing more to say than Hydra."""
    import re

    from train.checks import Problem

    text = str(err)
    if found := re.match(r"Could not override '([^']+)'", text):
        return [p for p in suggest_keys(args) if p.key == found.group(1)]
    if found := re.match(r"Could not append to config\. An item is already at '([^']+)'", text):
        key = found.group(1)
        given = [a.split("=", 1)[1] for a in args if "=" in a and a.split("=", 1)[0].lstrip("+") == key]
        return [Problem(key, "is set already, and + adds a key the config does not have",
                        f"{key}={given[-1] if given else '<value>'} (without +)")]
    if found := re.match(r"Error merging override ([^=\s]+)=(.*)", text):
        key, why = found.group(1).lstrip("+~"), " ".join(str(err.__cause__ or "").splitlines()[:1])
        return [Problem(key, f"`{found.group(2)}` cannot take its place" + (f" ({why})" if why else ""),
                        f"a value of the kind it holds (`python -m train --cfg job` shows it); a mapping's keys are "
                        f"set one by one: {key}.<name>=<value>")]
    return []


def report_composition_problems(args: list) -> None:
    """Hydra prints its own error for an override it cannot apply as it composes (exit 1), advising `+` for a
    misspelt key: where composition_problems can say more, that instead, exit 2, before anything is written."""
    from common.compat import patch_hydra_composition_errors_answered_first

    def answer(err) -> None:
        problems = composition_problems(args, err)
        if problems:
            for problem in problems:
                print(problem, file=sys.stderr)
            sys.exit(2)

    patch_hydra_composition_errors_answered_first(answer)


if __name__ == "__main__":
    # Submission scripts, submitit's pickles, `.hydra/` and multirun.yaml hold job commands and the whole config:
    # nothing this command (or a job it starts: Slurm and submitit pass the umask on) writes is world-readable.
    os.umask(os.umask(0o027) | 0o027)
    sys.argv[1:] = command_line(sys.argv[1:])
    from common.plugins import scan_or_say

    scan_or_say()  # a broken Hydra plugin installed here is named, not Hydra's scan traceback
    from common.compat import patch_hydra_compose_once_per_command
    from train.checks.gate import before_hydra

    patch_hydra_compose_once_per_command(sys.argv[1:])

    before_hydra(sys.argv[1:])  # what Hydra itself would refuse, as key / problem / fix (exit 2)
    report_composition_problems(sys.argv[1:])  # and what it refuses as it composes
    main()
