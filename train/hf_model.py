"""An exported Hugging Face model folder, found by path or run name and loaded offline (sample and evaluate)."""
import os
import re
from pathlib import Path

from common.errors import UserError
from train.export import HF_SUBFOLDER

_BATCH = re.compile(r"^ba(\d+)$")


def find_folder(arg: str, output_root: Path | None = None, checkpoint_root: Path | None = None) -> Path:
    """The model folder `arg` names: a folder holding config.json, a run's `huggingface/` folder or output folder
    (its newest `ba{B}`), or a run name under `output_root` (train/config/storage_args.py: the local storage's,
    `$PRETRAIN_ROOT/outputs` or `./runs/outputs`, by default). Found by run name, a run that trained on past
    its newest export (a checkpoint in `checkpoint_root/<run>` of a later batch) is warned: the export is older
    weights than the run's."""
    from train.config.storage_args import roots

    path, by_name = Path(arg), False
    if not path.exists() and os.sep not in arg:
        path, by_name = (output_root or roots([])[1]) / arg, True
    if (path / "config.json").is_file():
        return path.resolve()
    for base in (path / HF_SUBFOLDER, path):
        found = [p for p in base.glob("ba*") if _BATCH.match(p.name) and (p / "config.json").is_file()]
        if found:
            newest = max(found, key=lambda p: int(_BATCH.match(p.name)[1]))
            if by_name:
                _warn_if_trained_past(newest, int(_BATCH.match(newest.name)[1]), (checkpoint_root or
                                                                                  roots([])[0]) / arg)
            return newest.resolve()
    raise UserError("model", f"{arg!r}: no exported model there (a folder with config.json, or a run whose outputs "
                    f"hold {HF_SUBFOLDER}/ba{{B}}/)", "export one first: train with export=hf, or run "
                    "`python -m train.export <checkpoint>`; or pass the exported folder's path")


def _warn_if_trained_past(folder: Path, batch: int, save_folder: Path) -> None:
    import logging

    from train.checkpoint.resume import find

    later = [c for c in find(save_folder) if c.batch > batch]
    if later:
        logging.getLogger(__name__).warning(
            "%s is the run's newest export, of batch %d; the run trained on to batch %d (%s): these are its older "
            "weights. To use the newest: python -m train.export %s", folder, batch, later[-1].batch,
            later[-1].path, save_folder.name)


def load(folder: Path, dtype: str | None = None):
    """(model, tokenizer) from the folder alone: no hub access, MPT's code from the folder (trust_remote_code)."""
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer

    kwargs = {"torch_dtype": getattr(torch, dtype)} if dtype else {"torch_dtype": "auto"}
    model = AutoModelForCausalLM.from_pretrained(folder, trust_remote_code=True, local_files_only=True, **kwargs)
    tokenizer = AutoTokenizer.from_pretrained(folder, local_files_only=True)
    return model.eval(), tokenizer
