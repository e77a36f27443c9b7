"""Every `python -m train` / `python -m data_prep` line of README.md runs, as a look: `plan=json` (or `--cfg
job`, `--help` as written) for training, `--cfg job` for data_prep, with temporary roots. A line shown with an
refusal after it (an `error:` line, or Hydra's own `full_key:` message) must fail, without a traceback, and print
every line shown. So the docs cannot rot."""
import os
import re
import shlex
import subprocess

import pytest
from paths import PYTHON, ROOT

README = (ROOT / "README.md").read_text()


def _command_lines() -> list:
    """(command words, the refusal shown after it: its lines, or None), from code blocks and inline code."""
    found = []
    for block in re.findall(r"```[a-z]*\n(.*?)```", README, flags=re.S):
        lines = block.replace("\\\n", " ").splitlines()
        for i, line in enumerate(lines):
            line = line.strip().removeprefix("$ ")
            if re.match(r"python -m (train|data_prep)(\s|$)", line) and "[" not in line.split("#")[0].split("=")[0]:
                shown = []
                for x in lines[i + 1:]:
                    if x.startswith("$ ") or re.match(r"python -m ", x):
                        break
                    shown.append(x.strip())
                refused = any(x.startswith("error: ") or x.startswith("full_key: ") for x in shown)
                found.append((line, tuple(x for x in shown if x) if refused else None))
    for code in re.findall(r"`(python -m (?:train|data_prep) [^`]*)`", README):
        found.append((code, None))
    seen, unique = set(), []
    for line, err in found:
        if "[overrides]" in line or line in seen:
            continue
        seen.add(line)
        unique.append((line, err))
    return unique


LINES = _command_lines()


def _first_point(arg: str) -> str:
    key, _, value = arg.partition("=")
    if value.startswith("range("):
        return f"{key}={value[6:].split(',')[0]}"
    if "," in value and not value.startswith(("[", "{", "'", '"')):
        return f"{key}={value.split(',')[0]}"
    return arg


def test_the_readme_has_the_lines_people_copy():
    text = " ".join(line for line, _ in LINES)
    assert len(LINES) >= 15, LINES
    for words in ("-m model=mpt-30b", "data_prep dataset=c4", "cluster.env.NCCL_IB_PCI_RELAXED_ORDERING=1",
                  "cluster.sbatch_extra='{reservation: big}'", "plan=true", "eval_interval=0"):
        assert words in text, words


@pytest.mark.e2e  # one process per line
@pytest.mark.parametrize("line,error", LINES, ids=[line[:90] for line, _ in LINES])
def test_every_readme_command_line_runs_as_a_look(tmp_path, line, error):
    words = shlex.split(line, comments=True)
    module, args = words[2], words[3:]
    root = tmp_path / "root"
    root.mkdir()
    if module == "train":
        look = [] if any(a.startswith(("--cfg", "--help", "plan=")) for a in args) else ["plan=json"]
    else:  # data_prep has no plan: compose its config; a sweep (-m) as its first point
        if "-m" in args:
            args = [_first_point(a) for a in args if a != "-m"]
        look = [] if "--cfg" in args else ["--cfg", "job"]
    env = {**os.environ, "PRETRAIN_ROOT": str(root), "HF_HUB_OFFLINE": "1"}
    proc = subprocess.run([str(PYTHON), "-m", module, *args, *look], cwd=ROOT, env=env, capture_output=True,
                          text=True, timeout=120)
    assert "Traceback" not in proc.stderr, proc.stderr[-3000:]
    if error:  # our checks exit 2; Hydra's own refusals (a wrong type, an unknown key) exit 1
        assert proc.returncode in (1, 2), proc.stderr[-3000:]
        for shown in error:
            assert shown in proc.stderr, (shown, proc.stderr[-3000:])
    else:
        assert proc.returncode == 0, f"{line}\n{proc.stderr[-3000:]}"
    assert list(root.iterdir()) == [], "a look wrote something"
