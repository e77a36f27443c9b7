"""`python -m train [overrides] [-m]`: compose conf/, validate, then plan, train here, or launch."""
import sys

import hydra
from omegaconf import DictConfig

import train  # noqa: F401  (registers resolvers before composing)
from train.validate import ConfigError, validate


@hydra.main(config_path="../conf", config_name="train", version_base=None)
def main(cfg: DictConfig):
    try:
        validate(cfg)
    except ConfigError as err:
        print(err, file=sys.stderr)
        sys.exit(2)
    if cfg.plan:
        from train.plan import print_plan

        return print_plan(cfg)
    from train.task import run  # the heavy imports (torch, llm-foundry) start here

    return run(cfg)


if __name__ == "__main__":
    main()
