"""The sbatch script `-m` submits for mpt-30b on 16 ndv5 nodes, compared line by line with a reviewed reference
(tests/reference/ndv5-mpt-30b-16-nodes.sbatch). A change to the presets or the launcher that changes what lands
on the cluster shows here as a diff; when the change is meant, regenerate the reference and review its diff:

    .venv/bin/python tests/test_sbatch_reference.py --write
"""
import sys
from pathlib import Path

HERE = Path(__file__).resolve().parent
REFERENCE = HERE / "reference" / "ndv5-mpt-30b-16-nodes.sbatch"
OVERRIDES = ["model=mpt-30b", "cluster=ndv5", "cluster.nodes=16", "storage=amlfs", "data=c4",
             "cluster.container.image='nvcr.io#nvidia/pytorch:24.05-py3'"]
FOLDER = "/data/outputs/sweeps/2026-11-22_09-00-00/0/.submitit/%j"
REGENERATE = ".venv/bin/python tests/test_sbatch_reference.py --write"
CHECKOUT = "/path/to/checkout"  # the checkout is mounted into the container at its own path: not ours to pin


def script() -> str:
    sys.path.insert(0, str(HERE.parent))
    from common.paths import PROJECT
    from train.config.compose import compose
    from train.launch.spec import sbatch_script

    return sbatch_script(compose(OVERRIDES), folder=FOLDER).replace(str(PROJECT), CHECKOUT)


def test_ndv5_script_matches_the_reference():
    expected = REFERENCE.read_text()
    assert script() == expected, f"the ndv5 sbatch script changed; if that is meant, run {REGENERATE}"


if __name__ == "__main__":
    if sys.argv[1:] != ["--write"]:
        sys.exit(f"usage: {sys.argv[0]} --write   (rewrites {REFERENCE.relative_to(HERE.parent)})")
    REFERENCE.write_text(script())
    print(REFERENCE)
