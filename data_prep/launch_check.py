"""Hydra callback for -m sweeps: validate once before any job is launched (bad input launches and writes
nothing), and afterwards print the merged dataset's summary, or what is still missing."""
import json
import sys
from typing import Any

from hydra.experimental.callback import Callback
from omegaconf import DictConfig


class ValidateBeforeLaunch(Callback):
    def on_multirun_start(self, config: DictConfig, **kwargs: Any) -> None:
        # Sweep values (part=0,1,2,3) are not applied to this config; everything common to the jobs is.
        from data_prep.app import prepare
        from data_prep.errors import DataPrepError

        try:
            prepare(config)
        except DataPrepError as err:
            print(err, file=sys.stderr)
            sys.exit(2)

    def on_multirun_end(self, config: DictConfig, **kwargs: Any) -> None:
        from pathlib import Path

        from data_prep.__main__ import ERROR_FILE
        from data_prep.app import missing_blocks
        from data_prep.facts import SUMMARY_FILE
        from data_prep.progress import print_summary
        from data_prep.settings import settings_from

        failed = sorted(Path(config.hydra.sweep.dir).glob(f"*/{ERROR_FILE}"))
        for path in failed:
            print(f"{path.parent.name}: {path.read_text().strip()}", file=sys.stderr)
        if failed:
            print(f"data_prep: {len(failed)} jobs failed; finished blocks are kept, so fix the cause and run the same "
                  f"command again", file=sys.stderr)
            sys.exit(2)
        settings = settings_from(config)
        missing = missing_blocks(settings.split_dir)
        if missing:
            print(f"data_prep: {len(missing)} blocks are not complete yet ({', '.join(missing[:5])}"
                  f"{', ...' if len(missing) > 5 else ''}); run the missing parts again, or the same command "
                  f"without -m, to finish and merge", file=sys.stderr)
            return
        print_summary(json.loads((settings.split_dir / SUMMARY_FILE).read_text()))
