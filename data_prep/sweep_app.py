"""data_prep's side of the sweep launcher (common/sweep/): `python -m data_prep -m
'part=range(0,N)' num_parts=N` sends one job per part, all parts in one Slurm job array (hydra/launcher=htc) or
as processes here (the default, data_prep_local). Resources come from `hydra.launcher.*` (data_prep has no
cluster group). The output does not depend on how the parts ran: the last part to finish merges.
"""
import logging
import sys
from pathlib import Path

from omegaconf import DictConfig, OmegaConf

from common.sweep.contract import JobSpec, SweepApp, params_spec

log = logging.getLogger(__name__)


class DataPrepApp(SweepApp):
    status_command = "python -m data_prep.status"
    failed_exit = 2  # as a plain data_prep run that fails
    log_tail = False  # its errors name the file, the line and the fix: no traceback to read

    def configs(self, launcher, job_overrides: list, first: int) -> list:
        """Every part's config, checked before anything is written or submitted: what the parts share (the input,
        the tokenizer, out_root: once), then each part's own settings (the part in range). Every problem of every
        point at once, raised as data_prep's error: the launcher prints it and exits 2."""
        from common.compose import sweep_points
        from data_prep.errors import DataPrepError
        from data_prep.settings import settings_from
        from train.checks.safety import launcher_safety

        # the launcher's settings are written into the script, multirun.yaml and the pickles: checked first
        common = list(launcher_safety(launcher.config)) + _shared_problems(launcher.config)
        out, problems, parts = [], list(common), {}
        said = {(p.key, p.problem) for p in common}
        for overrides, cfg in sweep_points(launcher.hydra_context.config_loader, launcher.config,
                                           launcher.config.hydra.sweep.dir, job_overrides, first):
            OmegaConf.resolve(cfg)
            try:
                s = settings_from(cfg)
                parts.setdefault((str(s.split_dir), s.num_parts), set()).add(s.part)
            except DataPrepError as err:  # those of the shared settings are said once, above
                problems += [p.at_point(first + len(out)) for p in err.problems if (p.key, p.problem) not in said]
            out.append((overrides, cfg))
        if problems:
            raise DataPrepError(problems=problems)
        for (split_dir, num_parts), ran in parts.items():
            left = sorted(set(range(num_parts)) - ran) if None not in ran else []
            if left:  # legal (another sweep may run them), but this one cannot merge the dataset
                log.warning(f"data_prep: warning: part: this sweep runs part {', '.join(map(str, sorted(ran)))} of "
                            f"num_parts={num_parts} for {split_dir}; part {', '.join(map(str, left))} not: the "
                            f"dataset is merged only once every part has run (part=range(0,{num_parts}), or the same "
                            "command without -m afterwards, which writes what is missing and merges)")
        return out

    def spec(self, cfg: DictConfig, params) -> JobSpec:
        """One task per part, with the resources given to the launcher (`hydra.launcher.cpus_per_task=64`)."""
        return params_spec(params, name="data_prep")

    def record(self, point) -> dict:
        from data_prep.settings import settings_from

        return {"split_dir": str(settings_from(point.cfg).split_dir)}

    def heading(self, manifest: dict) -> str:
        """Each dataset of the sweep (`-m split=train,val` makes two): merged (its size), or how many blocks are
        still missing."""
        from data_prep.app import merged_summary, missing_blocks

        lines = []
        for split_dir in dict.fromkeys(Path(p["split_dir"]) for p in manifest["points"]):
            s = merged_summary(split_dir)
            missing = missing_blocks(split_dir) if s is None else []
            if s is not None:
                lines.append(f"dataset {split_dir}: merged, {s['samples']:,} samples, {s['tokens']:,} tokens from "
                             f"{s['docs']:,} documents")
            elif not missing:  # a merge not run yet, killed, or withdrawn while a damaged block is written again
                lines.append(f"dataset {split_dir}: every block complete, not merged yet (the last part to finish "
                             "merges)")
            else:
                lines.append(f"dataset {split_dir}: {len(missing)} blocks not complete yet ({', '.join(missing[:5])}"
                             f"{', ...' if len(missing) > 5 else ''})")
        return "\n".join(lines)

    def finish(self, results: list, rows: list) -> bool:
        """After a waited-for sweep: each merged dataset's summary, as a plain run prints it, or what is missing;
        True (not exit 0) where the parts all ran and a dataset is still not merged."""
        from data_prep.app import merged_summary, missing_blocks
        from data_prep.progress import print_summary

        datasets = list(dict.fromkeys(Path(r["dataset"]) for r in results if isinstance(r, dict)))
        summaries = {d: merged_summary(d) for d in datasets}
        for summary in summaries.values():
            if summary is not None:
                print_summary(summary)
        unmerged = [d for d, s in summaries.items() if s is None]
        if datasets and not unmerged:
            return False
        if all(row["state"] == "COMPLETED" for row in rows):
            # the parts ran, yet no dataset: parts of num_parts were not in this sweep (warned at submission), or
            # the last part's merge did not end
            for d in unmerged or [None]:
                why = ("some of its blocks were not written (parts of num_parts that were not in this sweep)"
                       if d is None or missing_blocks(d) else
                       "every block is written, but the merge did not end (its part's log says why)")
                print(f"data_prep: the sweep's parts finished, but the dataset{f' {d}' if d else ''} is not merged: "
                      f"{why}; see `python -m data_prep.status`. Run the same command without -m: it writes what is "
                      "missing, then merges", file=sys.stderr)
            return True  # no dataset: not exit 0
        return False


def _shared_problems(config: DictConfig) -> list:
    """What every part shares, checked once on the sweep's config (its swept values, part=0,1,2,3, not applied): the
    input's files, the tokenizer, out_root (data_prep.app.prepare, which writes nothing)."""
    from hydra.core.override_parser.overrides_parser import OverridesParser

    from data_prep.app import prepare
    from data_prep.errors import DataPrepError

    swept = {o.key_or_group for o in OverridesParser.create().parse_overrides(list(config.hydra.overrides.task))
             if o.is_sweep_override()}
    if "input" in swept:  # each point a dataset of its own files, all in one out_root: never one dataset
        return DataPrepError("input", "is swept (-m input=A,B): each point would prepare its own files into the same "
                             "out_root, as separate runs that refuse each other's folder",
                             "give the files as one list, quoted for the shell: 'input=[A,B]' (and -m "
                             "'part=range(0,N)' num_parts=N to spread them over jobs)").problems
    try:
        prepare(config)
    except DataPrepError as err:
        return err.problems
    return []
