"""The reference's app in bench/bench_sweep.py: a Hydra app that does nothing with one value, `lr`, to sweep, so that
hydra-submitit-launcher's `submitit_slurm` launcher is timed submitting a sweep of it, and nothing else.

    .venv/bin/python bench/trivial_app.py -m hydra/launcher=submitit_slurm lr=1e-4,2e-4
"""
import hydra
from hydra.core.config_store import ConfigStore

ConfigStore.instance().store(name="trivial", node={"lr": 0.0})


@hydra.main(version_base=None, config_name="trivial")
def main(cfg) -> float:
    return cfg.lr


if __name__ == "__main__":
    main()
