"""The image contract (common/image.py): each task's check before submitit's bootstrap, run for real against a
Python without the project's packages, against this venv, without a checkout, through the loopback Slurm's srun;
the marker the Dockerfile writes; what a plan or a submission says of an image from its marker (inside the .sqsh
with unsquashfs, or beside it); the NCCL topology file mounted into containers."""
import hashlib
import json
import os
import re
import shlex
import shutil
import subprocess
import sys
import tomllib

import pytest
from helpers import PYTHON, ROOT

from common import image
from train.checks import Context, check, errors
from train.config.compose import compose
from train.launch.executor import container_mounts, srun_args
from train.launch.spec import sbatch_script

BUILD_LINE = "docker build -t pretrain:latest . && enroot import -o /data/images/pretrain.sqsh dockerd://pretrain:latest"


def run_check(python: str, *command: str, cwd=ROOT, env=None) -> subprocess.CompletedProcess:
    """srun's command in a container job, as the sbatch script has it, here without the container."""
    return subprocess.run([*image.srun_prefix(), python, *command], cwd=cwd, capture_output=True, text=True,
                          timeout=120, env=env)


@pytest.fixture(scope="module")
def bare_python(tmp_path_factory):
    """A Python with nothing installed: an image that has python3 and none of the project's packages."""
    venv = tmp_path_factory.mktemp("bare") / "venv"
    subprocess.run([sys.executable, "-m", "venv", "--without-pip", str(venv)], check=True, timeout=120)
    return str(venv / "bin" / "python")


# ------------------------------------------------------------------------------------------ the job's check


@pytest.mark.e2e  # starts a Python process of its own
def test_a_python_without_the_packages_stops_with_what_is_missing_and_how_to_build(bare_python):
    done = run_check(bare_python, "-c", "print('ran')")
    assert done.returncode == image.EXIT == 78 and done.stdout == ""
    lines = done.stderr.strip().splitlines()
    assert lines[0].startswith("image check: missing llm-foundry, torch, mosaicml, mosaicml-streaming, transformers")
    assert "(this project's dependencies, pyproject.toml)" in lines[0]
    # the last line is what the sweep's summary shows of a failed rank: it says it all
    assert lines[-1].startswith(f"image check: {bare_python} cannot run this project's jobs (this image has no "
                                f"{image.MARKER}: it was not built from this project's Dockerfile)")
    assert lines[-1].endswith(f"{BUILD_LINE} (docs/cluster-run.md: The image)")


@pytest.mark.e2e  # starts a Python process of its own
def test_this_venv_passes_and_the_command_is_the_task(tmp_path):
    done = run_check(str(PYTHON), "-c", "import os, sys; print('ran', os.getpid()); sys.exit(5)")
    assert done.returncode == 5, done.stderr  # exec: the command's own exit status
    assert done.stdout.startswith("ran ")
    assert "image check: warning: flash-attn is not installed" in done.stderr  # this CPU venv has no flash-attn
    assert "cannot run" not in done.stderr
    quiet = run_check(str(PYTHON), "-c", "pass", env={**os.environ, "SLURM_PROCID": "3"})
    assert quiet.returncode == 0 and quiet.stderr == ""  # warnings: the first task only


def test_no_python_in_the_image(tmp_path):
    done = run_check("python3-not-here", "-c", "pass")
    assert done.returncode == 78
    assert done.stderr.strip() == (f"image check: no python3-not-here in this container image, which cannot run "
                                   f"the jobs of this project; {image.BUILD}")


@pytest.mark.e2e  # starts a Python process of its own
def test_no_checkout_at_the_working_folder(tmp_path):
    done = run_check(str(PYTHON), "-c", "print('ran')", cwd=tmp_path)
    assert done.returncode == 78 and done.stdout == ""
    assert f"the checkout of this project is not at {tmp_path} in the container" in done.stderr


@pytest.mark.e2e  # starts a Python process of its own
def test_a_python_that_cannot_run_the_check_is_named(tmp_path):
    fake = tmp_path / "python3"
    fake.write_text("#!/bin/sh\necho 'SyntaxError: invalid syntax' >&2\nexit 1\n")
    fake.chmod(0o755)
    done = run_check(str(fake), "-c", "pass")
    assert done.returncode == 1
    assert done.stderr.strip().splitlines()[-1].startswith(f"image check: {fake} could not run the check (exit "
                                                          "status 1, above)")


def test_srun_runs_the_check_then_the_command(slurm, bare_python):
    """On the loopback cluster (no pyxis: the container options aside) srun takes the check as its command and
    the interpreter and submitit's arguments as the check's: options end at the command."""
    base = ["srun", "-N1", "-n1", f"--chdir={ROOT}", "--kill-on-bad-exit=1", *image.srun_prefix()]
    ok = subprocess.run([*base, str(PYTHON), "-u", "-c", "print('ran')"], capture_output=True, text=True,
                        timeout=300)
    assert ok.returncode == 0 and ok.stdout.strip() == "ran", ok.stderr
    bad = subprocess.run([*base, bare_python, "-u", "-c", "print('ran')"], capture_output=True, text=True,
                         timeout=300)
    assert bad.returncode == 78 and "ran" not in bad.stdout
    assert "image check: missing llm-foundry" in bad.stderr and BUILD_LINE in bad.stderr


# --------------------------------------------------------------------------------------- the sbatch script


def test_the_plans_sbatch_script_runs_the_check_inside_the_container():
    cfg = compose(["cluster=ndv5", "cluster.container.image=/data/images/pretrain.sqsh"])
    text = sbatch_script(cfg)
    srun = next(line for line in text.splitlines() if line.startswith("srun "))
    words = shlex.split(srun)
    at = words.index("sh")
    assert words[at - 1] == f"--container-workdir={ROOT}"  # after every srun option: srun's command
    assert words[at:at + 4] == ["sh", "-c", image.SCRIPT, "image-check"]
    assert words[at + 4:at + 8] == ["python3", "-u", "-m", "submitit.core._submit"]
    assert "\n" not in image.SCRIPT and "'" not in image.SCRIPT  # one line, quoted once
    bare = sbatch_script(compose(["cluster=ndv5"]))
    assert "image-check" not in bare  # bare mode runs the submitting venv's own Python


def test_a_container_job_its_summary_and_its_array_run_the_images_python3_and_a_bare_job_this_venvs():
    """The job's interpreter, decided once (train/launch/executor.py: resources) and read by the summary job and by
    every script the plan shows, one job or an array (common/sweep/contract.py: interpreter)."""
    from common.sweep import contract
    from train.launch import spec

    image_run = ["cluster=ndv5", "cluster.container.image=/data/images/pretrain.sqsh"]
    boxed = [compose([*image_run, f"optimizer.lr={lr}"]) for lr in (1e-3, 2e-3)]
    run = spec.of(boxed[0])
    assert run.resources.python == run.summary.python == contract.interpreter(run.summary) == "python3"
    scripts = spec.array_scripts(boxed, spec.PLAN_FOLDER)
    assert [(k, idx) for _, k, idx in scripts] == [(0, [0, 1]), (1, [0, 1])]  # one array of both points
    assert "image-check python3 -u -m submitit.core._submit " in scripts[0][0]
    bare = spec.of(compose(["cluster=ndv5"]))
    assert bare.resources.python is bare.summary.python is None
    assert contract.interpreter(bare.resources) == contract.interpreter(bare.summary) == shlex.quote(sys.executable)
    assert f" {shlex.quote(sys.executable)} -u -m submitit.core._submit " in sbatch_script(compose(["cluster=ndv5"]))


def test_the_check_takes_no_value_from_the_config(tmp_path):
    """The check is constant text; the image, mounts and folders reach srun as separate, quoted words."""
    pwned = tmp_path / "pwned"
    cfg = compose(["cluster=ndv5", f"cluster.container.image='/x/$(touch {pwned}).sqsh'"])
    args = srun_args(cfg)
    assert args[-4:] == image.srun_prefix()
    assert all(image.SCRIPT not in a for a in args[:-4])


def test_the_nccl_topology_file_is_mounted_at_its_own_path():
    cfg = compose(["cluster=ndv5", "cluster.container.image=/data/images/pretrain.sqsh"])
    assert cfg.cluster.env.NCCL_TOPO_FILE == "/opt/microsoft/ndv5-topo.xml"  # where Azure's HPC images put it
    assert "/opt/microsoft/ndv5-topo.xml:/opt/microsoft/ndv5-topo.xml" in container_mounts(cfg)
    v4 = compose(["cluster=ndv4", "cluster.container.image=/data/images/pretrain.sqsh"])
    assert "/opt/microsoft/ndv4-topo.xml:/opt/microsoft/ndv4-topo.xml" in container_mounts(v4)
    odd = compose(["cluster=ndv5", "cluster.container.image=/data/images/pretrain.sqsh",
                   "cluster.env.NCCL_TOPO_FILE=$HOME/topo.xml"])
    assert not any("topo" in m for m in container_mounts(odd))
    found = [p for p in check(odd, Context(mode="plan", choices={"cluster": "ndv5"}, scheduler="slurm"))
             if p.key == "cluster.env.NCCL_TOPO_FILE"]
    assert found and "is not mounted into the container" in found[0].problem
    assert not [m for m in container_mounts(compose(["cluster=p5", "cluster.container.image=/i.sqsh"]))
                if "topo" in m]


# ------------------------------------------------------------------------------------ pins and the marker


def test_the_pins_are_read_as_tomllib_and_packaging_read_them():
    from packaging.requirements import Requirement
    from packaging.specifiers import SpecifierSet

    text = (ROOT / "pyproject.toml").read_text()
    project = tomllib.loads(text)["project"]
    want = {image.norm(Requirement(r).name): SpecifierSet(str(Requirement(r).specifier))
            for r in project["dependencies"]}
    got = image.direct_requirements(text)
    assert {k: SpecifierSet(v) for k, v in got.items()} == want
    assert image.requires_python(text) == project["requires-python"]
    lock = image.lock_pins((ROOT / "requirements.lock").read_text())
    assert lock["torch"] == "2.7.0" and lock["mosaicml-streaming"] == "0.12.0" and len(lock) > 200


@pytest.mark.parametrize("version", ["2.7.0", "2.7", "2.7.0+cu126", "2.7.0a0+git12", "2.6.9", "2.7.1",
                                     "3.11.7", "3.10.0", "3.12.0", "3.12.0rc1", "3.9.18", "1.2.3.post1",
                                     "1.2.3rc1", "1.2.3", "1.3", "1.2.3.dev0"])
def test_versions_compare_as_packaging_compares_them(version):
    from packaging.specifiers import SpecifierSet

    for spec in ["==2.7.0", ">=3.10,<3.12", "!=2.7.0", "~=1.2.3", "~=1.2", "==1.2.*", "!=1.2.*", ">2.6",
                 ">=3.8,<4", "<=2.7", ">1.2.3", "<1.2.3"]:
        assert image.satisfies(version, spec) == SpecifierSet(spec).contains(version, prereleases=True), spec


def test_what_surely_fails_and_what_may_not():
    have = image.installed()
    assert image.verdict("3.11.7", have, ROOT, flash=False) == ([], [])  # this venv is the lock
    errs, warns = image.verdict("3.9.18", have, ROOT, flash=False)
    assert errs == ["Python 3.9.18, where this project needs >=3.10,<3.12 (pyproject.toml requires-python)"]
    other = {**have, "torch": "2.5.1", "attrs": "25.1.0"}
    del other["docker"]
    errs, warns = image.verdict("3.11.7", other, ROOT, flash=False)
    assert errs == ["not the pinned versions: torch 2.5.1 (pyproject.toml: ==2.7.0)"]
    assert warns == ["2 of requirements.lock's %d pins differ (the versions this project is tested with): "
                     "attrs 25.1.0 (lock: 26.1.0), docker missing" % len(image.lock_pins(
                         (ROOT / "requirements.lock").read_text()))]
    local = {**have, "torch": "2.7.0+cu126", "matplotlib": "3.9.0"}
    errs, warns = image.verdict("3.11.7", local, ROOT, flash=False)
    assert errs == [] and "matplotlib 3.9.0" in warns[0] and "torch" not in warns[0]


@pytest.mark.e2e  # starts a Python process of its own
def test_the_dockerfile_writes_the_marker_the_plan_reads(tmp_path):
    """The Dockerfile's own command line for the marker (run here by this venv's Python, from elsewhere, as a
    script) records this checkout's lock and every installed package."""
    dockerfile = (ROOT / "Dockerfile").read_text()
    assert "pip install -r requirements.lock" in dockerfile
    assert "COPY common/image.py ./image.py" in dockerfile
    line = re.search(r"RUN (python3 image\.py marker /opt/pretrain > (\S+))", dockerfile)
    assert line and line.group(2) == image.MARKER
    shutil.copy(ROOT / "common" / "image.py", tmp_path / "image.py")
    for name in ("requirements.lock", "pyproject.toml"):
        shutil.copy(ROOT / name, tmp_path / name)
    out = subprocess.run([str(PYTHON), "image.py", "marker", str(tmp_path)], cwd=tmp_path, capture_output=True,
                         text=True, timeout=60, check=True).stdout
    found = json.loads(out)
    assert found["project"] == "slurm-pretrain" and found["version"] == "0.1.0" and found["format"] == 1
    assert found["lock_sha256"] == hashlib.sha256((ROOT / "requirements.lock").read_bytes()).hexdigest()
    assert found["packages"]["torch"] == "2.7.0" and found["python"].startswith("3.11.")
    # flash attention as pyproject's gpu extra pins it
    gpu = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]["optional-dependencies"]["gpu"]
    assert f"pip install --no-build-isolation '{gpu[0]}'" in dockerfile


# ----------------------------------------------------------------------------- the plan, from a login node


def _marker(tmp_path, **change) -> dict:
    found = image.marker(ROOT)
    found["packages"] = {**found["packages"], image.FLASH: "2.7.4.post1"}
    for k, v in change.items():
        if v is None:
            del found["packages"][k]
        else:
            found["packages"][k] = v
    return found


def _problems(img, mode="plan", *extra):
    cfg = compose(["cluster=ndv5", f"cluster.container.image={img}", *extra])
    return [p for p in check(cfg, Context(mode=mode, choices={"cluster": "ndv5"}, scheduler="slurm"))
            if p.key == "cluster.container.image"]


def test_a_marker_beside_the_image_confirms_it(tmp_path):
    img = tmp_path / "pretrain.sqsh"
    img.write_bytes(b"not read here")
    (tmp_path / "pretrain.sqsh.json").write_text(json.dumps(_marker(tmp_path)))
    assert _problems(img) == [] and _problems(img, "sweep") == []


def test_an_image_whose_marker_lacks_a_pin_is_refused_and_the_plan_warns(tmp_path):
    img = tmp_path / "pretrain.sqsh"
    img.write_bytes(b"")
    (tmp_path / "pretrain.sqsh.json").write_text(json.dumps(_marker(tmp_path, torch=None, **{"flash-attn": None})))
    refused = errors(_problems(img, "sweep"))
    assert [p.problem for p in refused] == [
        f"{img} (the marker beside it, {img}.json): missing torch (this project's dependencies, pyproject.toml); "
        "every task would stop in its first seconds",
        f"{img} (the marker beside it, {img}.json) has no flash-attn, which model.attn_config.attn_impl=flash needs: the model would "
        "fail to build in every task"]
    assert BUILD_LINE in refused[0].fix and image.SIDECAR in refused[0].fix
    assert all(p.level == "warning" for p in _problems(img, "plan")) and len(_problems(img, "plan")) == 2
    # attention without flash-attn: only the missing pin
    assert len(errors(_problems(img, "sweep", "model.attn_config.attn_impl=torch"))) == 1


def test_an_image_that_cannot_be_confirmed_is_a_warning_that_says_how_to_build(tmp_path):
    img = tmp_path / "pretrain.sqsh"
    img.write_bytes(b"")
    [p] = _problems(img, "sweep")
    assert p.level == "warning" and p.problem.startswith(f"cannot confirm {img} is built from this project's "
                                                         "Dockerfile (")
    assert f"no {img}.json beside it" in p.problem and BUILD_LINE in p.fix
    sidecar = tmp_path / "pretrain.sqsh.json"
    sidecar.write_text(json.dumps(_marker(tmp_path)))
    os.utime(sidecar, (1, 1))  # older than the image: a copy of another build's marker
    [p] = _problems(img, "sweep")
    assert p.level == "warning" and f"{sidecar} is older than the image" in p.problem
    sidecar.write_text(json.dumps({"project": "someone-else"}))
    [p] = _problems(img, "sweep")
    assert p.level == "warning" and "is not this project's image" in p.problem
    [p] = _problems("'nvcr.io#nvidia/pytorch:24.05-py3'", "sweep")
    assert p.level == "warning" and "is a registry image" in p.problem
    assert _problems(img, "run") == []  # a plain run trains here: the image is for jobs


@pytest.mark.skipif(not (shutil.which("mksquashfs") and shutil.which("unsquashfs")),
                    reason="squashfs-tools is not installed (apt-get install squashfs-tools)")
def test_the_marker_inside_a_squashfs_image_is_read(tmp_path):
    """What enroot import makes is a squashfs file: its /etc/slurm-pretrain-image.json is read with unsquashfs,
    before any copy beside it."""
    root = tmp_path / "root"
    (root / "etc").mkdir(parents=True)
    (root / "etc" / "slurm-pretrain-image.json").write_text(json.dumps(_marker(tmp_path)))
    img = tmp_path / "ours.sqsh"
    subprocess.run(["mksquashfs", str(root), str(img), "-quiet", "-no-progress", "-noappend"], check=True,
                   capture_output=True, timeout=120)
    (tmp_path / "ours.sqsh.json").write_text(json.dumps({"project": "someone-else"}))  # stale, not read
    assert image.read_marker(str(img))[1] == f"its {image.MARKER}"
    assert _problems(img, "sweep") == []
    (root / "etc" / "slurm-pretrain-image.json").unlink()
    other = tmp_path / "theirs.sqsh"
    subprocess.run(["mksquashfs", str(root), str(other), "-quiet", "-no-progress", "-noappend"], check=True,
                   capture_output=True, timeout=120)
    [p] = _problems(other, "sweep")
    assert p.level == "warning" and f"unsquashfs -cat could not read {image.MARKER} from it" in p.problem


def test_the_failed_checks_last_line_says_why_this_image_lacks_them(tmp_path, monkeypatch):
    """An image with a marker: run by another interpreter than the one its packages are for, or built from
    another requirements.lock than the checkout's."""
    import io

    monkeypatch.setattr(image, "installed", lambda: {})
    ours = tmp_path / "marker.json"
    monkeypatch.setattr(image, "MARKER", str(ours))

    def last_line():
        out = io.StringIO()
        assert image.check(out) == 78
        return out.getvalue().strip().splitlines()[-1]

    ours.write_text(json.dumps({**image.marker(ROOT), "interpreter": "/opt/venv/bin/python3"}))
    assert f"{sys.executable} ran here, but the image's packages are installed for /opt/venv/bin/python3" in last_line()
    ours.write_text(json.dumps({**image.marker(ROOT), "interpreter": sys.executable, "lock_sha256": "0" * 64}))
    assert "built from another requirements.lock than this checkout's: rebuild it" in last_line()
    ours.write_text("[]")
    assert f"this image has no {ours}" in last_line()


def test_a_sweeps_summary_job_is_one_cpu_in_its_points_environment_without_their_preflight():
    """The summary job after a sweep's points, decided once (common/sweep/contract.py: summary_job) for training's
    points and for any other app's: named after the points, ten minutes, on summary_partition else the points'
    partition, with their account, qos, srun arguments and setup, but not their preflight check."""
    from common.sweep import contract
    from train.launch import spec

    run = spec.of(compose(["cluster=ndv5", "cluster.account=acct", "cluster.qos=high", "cluster.preflight.enabled=true"]))
    points, summary = run.resources, run.summary
    assert (summary.name, summary.timeout_min, summary.nodes, summary.tasks_per_node) == (
        f"{run.run_name}-summary", 10, 1, 1)
    assert (summary.partition, summary.account, summary.qos, summary.srun_args) == (
        points.partition, "acct", "high", points.srun_args)
    assert set(summary.setup) < set(points.setup) and any("preflight" in line for line in points.setup)
    assert not any("preflight" in line for line in summary.setup)
    assert spec.of(compose(["cluster=ndv5", "cluster.summary_partition=cpu"])).summary.partition == "cpu"
    generic = contract.params_spec({"submitit_folder": "/s/%j", "scheduler": "slurm", "partition": "gpu",
                                    "summary_partition": "cpu", "setup": ["module load x"]}, "job")
    assert (generic.summary.name, generic.summary.partition, generic.summary.setup) == (
        "job-summary", "cpu", ("module load x",))
    assert contract.params_spec({"submitit_folder": "/s/%j"}, "job").summary is None  # a local sweep has none


def test_a_local_sweep_always_waits_and_a_slurm_one_as_asked_for_any_app():
    """Whether `-m` waits, decided once (common/sweep/contract.py: sweep_waits) for training and any other app."""
    from common.sweep import contract
    from train.launch import spec

    assert not spec.of(compose(["cluster=ndv5"])).waits and spec.of(compose(["cluster=ndv5", "cluster.wait=true"])).waits
    assert spec.of(compose(["cluster=local", "cluster.wait=false"])).waits
    params = {"submitit_folder": "/s/%j", "scheduler": "slurm"}
    assert not contract.params_spec(params, "job").waits and contract.params_spec({**params, "wait": True}, "job").waits
    assert contract.params_spec({"submitit_folder": "/s/%j", "wait": False}, "job").waits
