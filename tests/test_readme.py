"""Every `python -m train` / `python -m data_prep` line of README.md and of the pages under docs/ runs, as a look:
`plan=json` (or `--cfg job`, `--help` as written) for training, `--cfg job` for data_prep, with temporary roots. A
line shown with an refusal after it (an `error:` line, or Hydra's own `full_key:` message) must fail, without a
traceback, and print every line shown. Every docs/ page is linked from README.md, and every relative link of these
pages points to a file that exists (and, with an anchor, to a heading of that page). So the docs cannot rot."""
import json
import re
import shlex
from pathlib import Path

import pytest
from helpers import ROOT, need_shared, run

PAGES = [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md"))]
TEXTS = {page.relative_to(ROOT).as_posix(): page.read_text() for page in PAGES}


def _command_lines() -> list:
    """(page, command words, the refusal shown after it: its lines, or None), from code blocks and inline code;
    a line shown on several pages is run once, under the first page (README.md first)."""
    found = []
    for page, text in TEXTS.items():
        for block in re.findall(r"```[a-z]*\n(.*?)```", text, flags=re.S):
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
                    found.append((page, line, tuple(x for x in shown if x) if refused else None))
        for code in re.findall(r"`(python -m (?:train|data_prep) [^`]*)`", text):
            found.append((page, code, None))
    seen, unique = set(), []
    for page, line, err in found:
        if "[overrides]" in line or line in seen:
            continue
        seen.add(line)
        unique.append((page, line, err))
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
    text = " ".join(line for _, line, _ in LINES)
    assert len(LINES) >= 15, LINES
    for words in ("-m model=mpt-30b", "data_prep dataset=c4", "cluster.env.NCCL_IB_PCI_RELAXED_ORDERING=1",
                  "cluster.sbatch_extra='{reservation: big}'", "plan=true", "eval_loader=null"):
        assert words in text, words


@pytest.mark.e2e  # one process per line
@pytest.mark.parametrize("page,line,error", LINES, ids=[f"{page}: {line[:90]}" for page, line, _ in LINES])
def test_every_readme_command_line_runs_as_a_look(tmp_path, page, line, error):
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
    proc = run("-m", module, *args, *look, root=root, env={"HF_HUB_OFFLINE": "1"}, timeout=120)
    assert "Traceback" not in proc.stderr, (page, proc.stderr[-3000:])
    if error:  # our checks exit 2; Hydra's own refusals (a wrong type, an unknown key) exit 1
        assert proc.returncode in (1, 2), (page, proc.stderr[-3000:])
        for shown in error:
            assert shown in proc.stderr, (page, shown, proc.stderr[-3000:])
    else:
        assert proc.returncode == 0, f"{page}: {line}\n{proc.stderr[-3000:]}"
    assert list(root.iterdir()) == [], "a look wrote something"


# docs/config.md's walkthrough, from raw files to a trained run: the first ```bash block under this heading
WALKTHROUGH = "From raw files to a trained run, offline"


def _walkthrough() -> list:
    """The walkthrough's lines, as a shell reads them: continuations joined, blank lines and comments left out."""
    text = TEXTS["docs/config.md"]
    heading = re.search(rf"^#+ {re.escape(WALKTHROUGH)}$", text, flags=re.M)
    assert heading, f"docs/config.md has no heading {WALKTHROUGH!r}"
    after = text[heading.end():]
    block = re.search(r"```bash\n(.*?)```", after, flags=re.S)
    assert block and not re.search(r"^#+ ", _prose(after[:block.start()]), flags=re.M), \
        f"no ```bash block under {WALKTHROUGH!r} before the next heading"
    lines = [line.strip() for line in block.group(1).replace("\\\n", " ").splitlines()]
    return [line for line in lines if line and not line.startswith("#")]


@pytest.mark.e2e
@pytest.mark.train
def test_the_offline_walkthrough_runs_as_printed(tmp_path, monkeypatch):
    """docs/config.md's walkthrough, every line for real and in order, in a fresh checkout root beside ../shared
    (its lines name the data as ../shared/...), with an empty Hugging Face cache so that nothing can come from the
    hub: data_prep makes runs/datasets/c4's train and val splits, which the other pages read, and llm-foundry's YAML
    trains on them to its answer."""
    need_shared()
    work = tmp_path / "checkout"
    work.mkdir()
    (tmp_path / "shared").symlink_to(ROOT.parent / "shared")
    env = {"HF_HOME": str(tmp_path / "hf-empty")}
    done = []
    for line in _walkthrough():
        words = shlex.split(line)
        if words[0] == "export":
            env.update(word.split("=", 1) for word in words[1:])
            continue
        assert words[:2] == ["python", "-m"], f"{line!r}: the walkthrough holds a line this test does not run"
        # PRETRAIN_ROOT is runs/ of the working folder: the storage root a user's shell, without it, gets
        proc = run(*words[1:], root=work / "runs", env=env, cwd=work, timeout=900)
        assert proc.returncode == 0, f"{line}\n{proc.stdout[-2000:]}\n{proc.stderr[-4000:]}"
        done.append((words[2], proc))
    assert env.get("HF_HUB_OFFLINE") == "1", "the walkthrough no longer switches the hub off"
    assert [module for module, _ in done] == ["data_prep", "data_prep", "train"], done

    from data_prep.facts import check_index, dataset_facts

    data = work / "runs" / "datasets" / "c4"
    assert sorted(p.name for p in data.iterdir() if p.is_dir()) == ["train", "val"]
    for split in ("train", "val"):
        assert check_index(data / split) == [], split
        facts = dataset_facts(data / split)
        assert facts["sample_tokens"] == 128 and facts["samples"] > 1000, (split, facts)
    # the folder the walkthrough makes is the one data=c4 reads on the default storage (no PRETRAIN_ROOT)
    from train.config.compose import compose

    monkeypatch.delenv("PRETRAIN_ROOT", raising=False)
    monkeypatch.chdir(work)
    assert Path(compose(["data=c4"]).variables.data_local) == data

    trained = done[-1][1]
    assert re.search(r"^final train loss \d", trained.stdout, flags=re.M), trained.stdout
    # one screen, though the YAML sets log_to_console: composer's config dump and metric tables go to the log file
    shown = trained.stdout.splitlines() + trained.stderr.splitlines()
    assert len(shown) <= 30 and not any(line.startswith(("Config:", "[batch=")) for line in shown), shown
    [output] = (work / "runs" / "outputs").iterdir()
    assert "[batch=2/2]" in (output / "__main__.log").read_text()
    assert output.name.startswith("testing-")
    metrics = json.loads((output / "metrics.json").read_text())
    assert metrics["batches"] == 2 and metrics["final_eval"]["eval/LanguageCrossEntropy"] > 0, metrics


def _prose(text: str) -> str:
    """The text without its code blocks and inline code (``...`` first, then `...`): `# comment` lines and
    `[...](...)` in code are not headings or links."""
    text = re.sub(r"```.*?```", "", text, flags=re.S)
    return re.sub(r"`[^`]*`", "", re.sub(r"``.*?``", "", text, flags=re.S))


def _anchors(text: str) -> set:
    """The anchors a page's headings get, as GitHub makes them: lower case, punctuation dropped, spaces to
    hyphens, a repeated heading numbered (-1, -2, ...)."""
    seen, anchors = {}, set()
    for heading in re.findall(r"^#{1,6} +(.+?) *#* *$", re.sub(r"```.*?```", "", text, flags=re.S), flags=re.M):
        slug = re.sub(r"[^\w\- ]", "", heading.lower()).replace(" ", "-")
        anchors.add(slug if slug not in seen else f"{slug}-{seen[slug]}")
        seen[slug] = seen.get(slug, 0) + 1
    return anchors


def _links(text: str) -> list:
    return [target for target in re.findall(r"\]\(([^)\s]+)\)", _prose(text))
            if not re.match(r"[a-z][a-z0-9+.-]*:", target)]  # relative: no https:, mailto:, ...


def test_every_docs_page_is_linked_from_the_readme_and_every_relative_link_resolves():
    readme = {Path(target.partition("#")[0]).as_posix() for target in _links(TEXTS["README.md"])}
    pages = [page for page in TEXTS if page != "README.md"]
    assert pages, "no docs/*.md page"
    unlinked = [page for page in pages if page not in readme]
    assert not unlinked, f"docs pages README.md does not link to: {unlinked}"
    broken = []
    for page, text in TEXTS.items():
        for target in _links(text):
            path, _, anchor = target.partition("#")
            where = ((ROOT / page).parent / path).resolve() if path else ROOT / page
            if not where.exists():
                broken.append(f"{page}: ({target}): {where} does not exist")
            elif anchor and where.suffix == ".md" and anchor not in _anchors(
                    TEXTS.get(where.relative_to(ROOT).as_posix()) or where.read_text()):
                broken.append(f"{page}: ({target}): no heading of {where.name} has the anchor #{anchor}")
    assert not broken, "\n".join(broken)
