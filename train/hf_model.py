"""An exported Hugging Face model folder, found by path or run name and loaded offline (sample and evaluate)."""
import json
import logging
from pathlib import Path

from common.errors import UserError
from train.config.storage_args import HF_SUBFOLDER, export_batch, named, run_folders

log = logging.getLogger(__name__)


def find_folder(arg: str, at: tuple[Path, Path] | None = None) -> Path:
    """The model folder `arg` names: a folder holding config.json, a run's `huggingface/` folder or output folder
    (its newest `ba{B}`), or a run name on the storage whose roots are `at` (train/config/storage_args.py: roots;
    the local storage's, `$PRETRAIN_ROOT` or `./runs`, by default). Found by run name, a run that trained on past
    its newest export (a checkpoint of a later batch in its save folder) is warned: the export is older weights
    than the run's; an export of a training since rolled back over a loss spike is passed over."""
    path, by_name = Path(arg), named(arg)
    if by_name:
        path = run_folders(arg, at)[1]
    if (path / "config.json").is_file():
        return path.resolve()
    for base in (path / HF_SUBFOLDER, path):
        found = [p for p in base.glob("*") if export_batch(p) is not None and (p / "config.json").is_file()]
        partial = [p for p in found if not _weights_complete(p)]
        if partial:  # llm-foundry's hf_checkpointer writes in place, config first: one killed midway has no weights
            log.warning("%s: an export without all its weights (written in place and stopped midway?): passed over",
                        ", ".join(map(str, partial)))
            found = [p for p in found if p not in partial]
        if found:
            # the run's checkpoint folder, found by name or from its outputs folder's (<run>/huggingface/ba{B})
            run = arg if by_name else (path.name if base != path else path.parent.name)
            save_folder = run_folders(run, at)[0]
            if not (by_name or (base.name == HF_SUBFOLDER and save_folder.is_dir())):
                return max(found, key=export_batch).resolve()
            found = _not_rolled_back(found, save_folder)
            if not found:
                break
            newest = _of_the_runs_end(max(found, key=export_batch), found, save_folder)
            _warn_if_trained_past(newest, export_batch(newest), save_folder)
            return newest.resolve()
    raise UserError("model", f"{arg!r}: no exported model there (a folder with config.json, or a run whose outputs "
                    f"hold {HF_SUBFOLDER}/ba{{B}}/)", "export one first: train with export=hf, or run "
                    "`python -m train.export <checkpoint>`; or pass the exported folder's path")


def _weights_complete(folder: Path) -> bool:
    """The folder holds its weights whole and its tokenizer: one safetensors file as long as its header says, or an
    index (written after its shards) whose every shard is there. hf_checkpointer writes the weights in place, then
    the tokenizer: a folder stopped in between has config.json and part of them."""
    if not ((folder / "tokenizer_config.json").is_file() or (folder / "tokenizer.json").is_file()):
        return False
    if (folder / "model.safetensors").is_file():
        return _safetensors_whole(folder / "model.safetensors")
    for index in ("model.safetensors.index.json", "pytorch_model.bin.index.json"):
        try:
            shards = set(json.loads((folder / index).read_text())["weight_map"].values())
        except (OSError, ValueError, KeyError, TypeError, AttributeError):
            continue
        return bool(shards) and all((folder / name).is_file() for name in shards)
    return (folder / "pytorch_model.bin").is_file()


def _safetensors_whole(path: Path) -> bool:
    """The file is as long as its header says (8 bytes of header length, the JSON header, then the tensors' bytes
    up to the largest end offset the header gives)."""
    try:
        with open(path, "rb") as f:
            n = int.from_bytes(f.read(8), "little")
            header = json.loads(f.read(n))
        end = max((t["data_offsets"][1] for k, t in header.items() if k != "__metadata__"), default=0)
        return path.stat().st_size == 8 + n + end
    except (OSError, ValueError, KeyError, TypeError, IndexError):
        return False


def _of_the_runs_end(newest: Path, found: list, save_folder: Path) -> Path:
    """The export of the batch the run now ends at, where an export past it is left from a training since gone
    back (its later checkpoints deleted by hand and the run trained again to an earlier end: the older training's
    export would be scored as the run's, exit 0). An export past the run's end without one at it: refused, named."""
    from train.checkpoint.resume import find
    from train.launch import finished

    ended, batch = finished.ended_at(save_folder), export_batch(newest)
    if ended is None or batch <= ended or any(c.batch >= batch for c in find(save_folder)):
        return newest
    at_end = [p for p in found if export_batch(p) == ended]
    if at_end:
        log.warning("%s is of a training past where the run now ends (batch %d, %s): using %s", newest, ended,
                    save_folder / finished.FILE, at_end[0])
        return at_end[0]
    raise UserError("model", f"{newest} is the run's newest export, of batch {batch}, but the run now ends at batch "
                    f"{ended} ({save_folder / finished.FILE}) with no checkpoint past it: the export is of a training "
                    "since gone back", f"export the run as it is: python -m train.export {save_folder.name}; or pass "
                    "the exported folder's path to use it anyway")


def _not_rolled_back(found: list, save_folder: Path) -> list:
    """The exports but those of a training since rolled back over a loss spike (the run's spike.json,
    train/task/spike.py): past a rollback's point and written before it. The rollback sets them aside; a kill
    between its record and its moves leaves them, and a start finishes it."""
    from train.task.interventions import FILE, read, rollbacks

    gone = [p for p in found for r in rollbacks(read(save_folder))
            if export_batch(p) > r.get("resumed_from", export_batch(p)) and _written(p) < r.get("time", 0)]
    if gone:
        log.warning("%s: of a training since rolled back over a loss spike (%s): passed over",
                    ", ".join(map(str, sorted(set(gone), key=export_batch))), save_folder / FILE)
    return [p for p in found if p not in gone]


def _written(folder: Path) -> float:
    """When the oldest of the folder's files was written (hf_checkpointer writes them all, in place, at each
    export: one older than a rollback holds the training before it)."""
    return min((p.stat().st_mtime for p in folder.rglob("*") if p.is_file()), default=0.0)


def _warn_if_trained_past(folder: Path, batch: int, save_folder: Path) -> None:
    from train.checkpoint.resume import find

    later = [c for c in find(save_folder) if c.batch > batch]
    if later:
        log.warning(
            "%s is the run's newest export, of batch %d; the run trained on to batch %d (%s): these are its older "
            "weights. To use the newest: python -m train.export %s", folder, batch, later[-1].batch,
            later[-1].path, save_folder.name)


def load(folder: Path):
    """(model, tokenizer) from the folder alone, in the dtype it was exported in: no hub access, MPT's code from the
    folder (trust_remote_code)."""
    from common.collector import imported_without_collections

    imported_without_collections("torch", "transformers")
    from transformers import AutoModelForCausalLM, AutoTokenizer

    model = AutoModelForCausalLM.from_pretrained(folder, trust_remote_code=True, local_files_only=True,
                                                 torch_dtype="auto")
    tokenizer = AutoTokenizer.from_pretrained(folder, local_files_only=True)
    return model.eval(), tokenizer


def max_seq_len(config: dict) -> int | None:
    """The longest sequence an exported model takes (its config.json's values): MPT's max_seq_len; a Hugging Face
    architecture's positions (max_position_embeddings; GPT-2's n_positions). None where the config says none."""
    for key in ("max_seq_len", "max_position_embeddings", "n_positions"):
        if isinstance(config.get(key), int):
            return config[key]
    return None


def refuses_past(config: dict) -> int | None:
    """The length past which the model fails, not degrades: MPT's max_seq_len (it refuses longer), GPT-2's n_positions
    (a position past its learned embeddings is an IndexError). Rotary positions (Llama) go on: None."""
    if config.get("model_type") == "gpt2":
        return config.get("n_positions")
    return config.get("max_seq_len") if isinstance(config.get("max_seq_len"), int) else None
