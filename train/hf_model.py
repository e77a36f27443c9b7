"""An exported Hugging Face model folder, found by path or run name and loaded offline (sample and evaluate)."""
import os
import re
from pathlib import Path

from common.errors import UserError
from train.export import HF_SUBFOLDER

_BATCH = re.compile(r"^ba(\d+)$")


def find_folder(arg: str, output_root: Path | None = None) -> Path:
    """The model folder `arg` names: a folder holding config.json, a run's `huggingface/` folder or output folder
    (its newest `ba{B}`), or a run name under `output_root` (train/config/storage_args.py: the local storage's,
    `$PRETRAIN_ROOT/outputs` or `./runs/outputs`, by default)."""
    from train.config.storage_args import roots

    path = Path(arg)
    if not path.exists() and os.sep not in arg:
        path = (output_root or roots([])[1]) / arg
    if (path / "config.json").is_file():
        return path.resolve()
    for base in (path / HF_SUBFOLDER, path):
        found = [p for p in base.glob("ba*") if _BATCH.match(p.name) and (p / "config.json").is_file()]
        if found:
            return max(found, key=lambda p: int(_BATCH.match(p.name)[1])).resolve()
    raise UserError("model", f"{arg!r}: no exported model there (a folder with config.json, or a run whose outputs "
                    f"hold {HF_SUBFOLDER}/ba{{B}}/)", "export one first: train with export=hf, or run "
                    "`python -m train.export <checkpoint>`; or pass the exported folder's path")


def load(folder: Path, dtype: str | None = None):
    """(model, tokenizer) from the folder alone: no hub access, MPT's code from the folder (trust_remote_code)."""
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer

    kwargs = {"torch_dtype": getattr(torch, dtype)} if dtype else {"torch_dtype": "auto"}
    model = AutoModelForCausalLM.from_pretrained(folder, trust_remote_code=True, local_files_only=True, **kwargs)
    tokenizer = AutoTokenizer.from_pretrained(folder, local_files_only=True)
    return model.eval(), tokenizer
