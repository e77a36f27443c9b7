"""`python -m train.export CHECKPOINT [--out DIR] [--precision float32|bfloat16|float16]`: a checkpoint this tool
wrote -> a Hugging Face model folder.

CHECKPOINT is a sharded checkpoint folder (`ep{E}-ba{B}/`, from any number of ranks), a full checkpoint file
(`ep{E}-ba{B}-rank0.pt`), a run's save folder (its newest complete checkpoint), or a run name (its save folder under
`$PRETRAIN_ROOT/checkpoints`, or `./runs/checkpoints`). Runs on one machine, on CPU, without the cluster that
trained it. The folder it writes is the one llm-foundry's `hf_checkpointer` callback writes (`export=hf`):
safetensors weights, the tokenizer, and MPT's modelling code (an MPT), so that
`AutoModelForCausalLM.from_pretrained(folder, trust_remote_code=True)` loads it offline; a Hugging Face architecture
(hf_causal_lm: Llama, GPT-2) is transformers' own and needs no code. Prints the folder's path.
"""
import argparse
import logging
import os
import shutil
import sys
from pathlib import Path

from common.errors import UserError
from train.plan.estimate import EXPORT_BYTES_PER_PARAM

log = logging.getLogger(__name__)

PRECISIONS = tuple(EXPORT_BYTES_PER_PARAM)  # what export=hf writes, as the plan sizes it


def locate(arg: str, at: tuple[Path, Path] | None = None):
    """The complete checkpoint `arg` names (a checkpoint, a save folder, or a run name on the storage whose roots
    are `at`: train/config/storage_args.py, the local storage's by default)."""
    from train.checkpoint import resume
    from train.checkpoint.head import head_problem
    from train.config.storage_args import named, run_folders

    path = Path(arg)
    if named(arg):
        path = run_folders(arg, at)[0]
        if not path.exists():
            raise UserError("checkpoint", f"{arg!r} is neither a path nor a run with checkpoints under {path.parent}",
                            "give the checkpoint or save folder's path, or the training command's storage "
                            "overrides after the run name (storage=amlfs storage.root=...)")
    path = path.resolve()
    if path.is_file() and (why := head_problem(path)):  # what the login node and the task call it too
        raise UserError("checkpoint", f"{path}: {why}", "give a complete checkpoint of a run: an ep{E}-ba{B}-rank0.pt "
                        "file, an ep{E}-ba{B}/ folder, the run's save folder, or its run name (an older checkpoint "
                        "where this one's write was cut off)")
    ckpt, why = resume.at_path(path, any_file=True)
    if ckpt is None:
        raise UserError("checkpoint", f"{path}: no complete checkpoint there",
                        "give an ep{E}-ba{B}/ folder with .metadata, an ep{E}-ba{B}-rank0.pt file, or a save "
                        "folder holding one")
    if why:
        raise UserError("checkpoint", f"{ckpt.path}: {why}", "export an older, complete checkpoint of the run")
    return ckpt


def default_out(ckpt, at: tuple[Path, Path] | None = None) -> Path:
    """Where `export=hf` would have written this batch's folder: `<output_root>/<run_name>/huggingface/ba{B}` of the
    storage whose roots are `at` (train/config/storage_args.py: run_folders, export_folder)."""
    from train.config.storage_args import export_folder, run_folders

    if ckpt.batch < 0:
        raise UserError("--out", f"{ckpt.path} is not named as composer names a checkpoint (ep{{E}}-ba{{B}}-rank0.pt): "
                        "the batch of the default folder huggingface/ba{B} is not known", "--out=<folder to write>")
    return export_folder(run_folders(ckpt.path.parent, at)[1], ckpt.batch)


def read_model(ckpt) -> tuple[dict, dict]:
    """(the model's weights as the Hugging Face model names them, the run's Hugging Face metadata).

    composer stores the model's Hugging Face config and the tokenizer's files inside every checkpoint
    (`state.integrations.huggingface`), so a checkpoint alone is enough: no run config, no tokenizer download.
    Only the model and that metadata are read: the optimizer's moments (twice the weights) stay on disk.
    """
    from common.compat import UnsupportedVersion
    from train.checkpoint.resume import read_state

    fix = "export a checkpoint written by `python -m train`"
    try:  # into this one process, without a process group, whatever the number of ranks that wrote it
        state = read_state(ckpt.path, {"state.model", "state.integrations"})
    except UnsupportedVersion:
        raise
    except Exception as err:  # noqa: BLE001 -- a zip or a folder of something else: torch's own words, no traceback
        raise UserError("checkpoint", f"{ckpt.path} is not a checkpoint torch can read ({type(err).__name__}: "
                        f"{' '.join(str(err).split())[:300]})", fix) from None
    state = state.get("state") if isinstance(state, dict) else None
    if not isinstance(state, dict) or not isinstance(state.get("model"), dict):
        raise UserError("checkpoint", f"{ckpt.path} holds no composer training state (no `state.model`): not a "
                        "checkpoint of a training run", fix)
    hf = (state.get("integrations") or {}).get("huggingface")
    if not hf:
        raise UserError("checkpoint", f"{ckpt.path} holds no Hugging Face model metadata (not an llm-foundry model "
                        "checkpoint)", fix)
    if ckpt.sharded:
        _restore_empty_containers(hf)
    # composer's HuggingFaceModel keeps the transformers model under `model.`
    weights = {k.removeprefix("model."): v for k, v in state["model"].items()}
    return weights, hf


def _restore_empty_containers(hf: dict) -> None:
    """Put back the empty containers a sharded checkpoint lost. torch's distributed checkpoint flattens nested
    state into one entry per leaf, so an empty dict or list has no entry and is gone when read back: the stored
    tokenizer.json then lacks fields its parser requires (a TemplateProcessing post-processor's `special_tokens`),
    and the tokenizer does not load. These are the empty fields a tokenizer's files hold; others are optional."""
    tokenizer = hf.get("tokenizer") or {}
    content = (tokenizer.get("tokenizer.json") or {}).get("content")
    if isinstance(content, dict):
        content.setdefault("added_tokens", [])
        post = content.get("post_processor") or {}
        for proc in [post, *(post.get("processors") or [])]:
            if proc.get("type") == "TemplateProcessing":
                proc.setdefault("special_tokens", {})
    config = (tokenizer.get("tokenizer_config.json") or {}).get("content")
    if isinstance(config, dict):
        config.setdefault("added_tokens_decoder", {})
        config.setdefault("extra_special_tokens", {})


# What an export folder holds (save_pretrained's model and code, the tokenizer's files): a folder of these alone is
# an earlier export, which --out may replace.
EXPORT_FILES = ("config.json", "model.safetensors", "model.safetensors.index.json", "generation_config.json",
                "tokenizer.json", "tokenizer_config.json", "special_tokens_map.json", "added_tokens.json",
                "vocab.json", "merges.txt", "tokenizer.model")


def replaceable(out: Path) -> None:
    """Refuse an --out that holds anything but an earlier export: it is replaced whole, and a folder of the
    user's (their models, a run's checkpoints, the working directory) must not go with it. Nor may it land inside a
    checkpoint: a file added there fails that checkpoint's manifest, and every later resume and export sets it aside
    (the next export by run name would take the checkpoint before, exit 0). Beside the checkpoints is fine."""
    from common.paths import unwritable
    from train.checkpoint.resume import holding_checkpoint

    folder = holding_checkpoint(out)
    if folder is not None:
        raise UserError("--out", f"{out} is inside the checkpoint {folder}: what the export writes there would "
                        "no longer match the checkpoint's manifest, and resumes and exports would set it aside",
                        "an --out outside the checkpoint (the default: the run's outputs folder)")
    why = None if out.is_file() or out.is_symlink() else unwritable(out)  # (a file: refused below, as replaced)
    if why:
        raise UserError("--out", f"{out} cannot be written: {why}", "an --out in a folder you can write (the default: "
                        "the run's outputs folder)")
    if not out.exists() and not out.is_symlink():
        return
    if out.is_dir() and not out.is_symlink():
        held = list(out.iterdir())
        if not held:
            return
        names = {p.name for p in held}
        weights = {"model.safetensors", "model.safetensors.index.json"} & names
        if "config.json" in names and weights and all(
                p.is_file() and (p.name in EXPORT_FILES or p.suffix in (".py", ".safetensors")) for p in held):
            return
    what = "a folder that is not an earlier export" if out.is_dir() else "not a folder"
    raise UserError("--out", f"{out} is {what}; the export replaces --out whole, which would delete what it holds",
                    "another --out (a new folder, or an earlier export to replace)")


def export(ckpt, out: Path, precision: str = "float32") -> Path:
    """Write the Hugging Face folder of `ckpt` to `out` (built under a hidden name, then renamed into place): an MPT
    with its modelling code, or a transformers architecture (llm-foundry's hf_causal_lm) as transformers saves it."""
    from common.collector import imported_without_collections

    imported_without_collections("composer.models", "llmfoundry.models.mpt")
    from composer.models import HuggingFaceModel

    weights, hf = read_model(ckpt)
    config = dict(hf["model"]["config"]["content"])
    config.pop("_attn_implementation_autoset", None)
    out.parent.mkdir(parents=True, exist_ok=True)
    tmp = out.parent / f".partial-{out.name}"
    shutil.rmtree(tmp, ignore_errors=True)
    tmp.mkdir()
    # composer's own reader of the tokenizer files it stored in the checkpoint
    tokenizer = HuggingFaceModel.load_huggingface_tokenizer_from_saved_state(hf, tokenizer_save_dir=str(tmp / ".tok"))
    shutil.rmtree(tmp / ".tok", ignore_errors=True)
    if config.get("model_type") == "mpt":
        _save_mpt(config, weights, precision, tmp)
    else:
        _save_transformers(config, weights, precision, tmp, tokenizer, ckpt)
    if tokenizer is None:
        log.warning("%s holds no tokenizer: the folder has the model only", ckpt.path)
    else:
        tokenizer.save_pretrained(tmp)
    if out.exists():
        shutil.rmtree(out)
    os.replace(tmp, out)
    return out


def _save_mpt(config: dict, weights: dict, precision: str, tmp: Path) -> None:
    import torch
    from llmfoundry.models.mpt import MPTConfig, MPTForCausalLM
    from llmfoundry.utils.huggingface_hub_utils import edit_files_for_hf_compatibility
    from transformers import AutoConfig

    # A folder that loads anywhere: torch attention (flash needs a GPU and flash-attn; pass
    # attn_config={'attn_impl': 'flash'} to from_pretrained on a GPU), weights materialised on the CPU.
    config["attn_config"] = {**config.get("attn_config", {}), "attn_impl": "torch"}
    config["init_device"] = "cpu"
    dtype = getattr(torch, precision)

    # As llm-foundry's hf_checkpointer: register MPT with the auto classes so save_pretrained writes its code
    # and an auto_map, then flatten the llmfoundry imports of that code so that it runs without llm-foundry.
    AutoConfig.register("mpt", MPTConfig, exist_ok=True)  # in place of transformers' own MPT
    MPTConfig.register_for_auto_class()
    MPTForCausalLM.register_for_auto_class("AutoModelForCausalLM")
    with torch.device("meta"):
        model = MPTForCausalLM(MPTConfig(**config))
    model.load_state_dict({k: v.to(dtype) for k, v in weights.items()}, assign=True)
    model.to(dtype)
    model.save_pretrained(tmp)
    edit_files_for_hf_compatibility(str(tmp), ("llmfoundry",))


def _save_transformers(config: dict, weights: dict, precision: str, tmp: Path, tokenizer, ckpt) -> None:
    """A transformers architecture (llm-foundry's hf_causal_lm) from the config composer stored with the weights:
    transformers' own classes, so the folder loads without trust_remote_code. Its tokenizer's special tokens are
    the generation's (a checkpoint's config may hold its base config's family's: LlamaConfig's end of text is id 2,
    a byte or a word of another tokenizer, and generate would stop there)."""
    import torch
    from transformers import AutoConfig, AutoModelForCausalLM, GenerationConfig

    model_type = config.pop("model_type", None)
    try:
        hf_config = AutoConfig.for_model(model_type, **config)
    except ValueError as err:
        raise UserError("checkpoint", f"{ckpt.path} holds a {model_type!r} model, which this transformers does not "
                        f"know ({err})", "export it where its transformers version is installed") from None
    hf_config.use_cache = True  # training turns the cache off; generating wants it
    if tokenizer is not None:  # (not the pad token: a pad id's embedding row is kept out of any later training)
        for key in ("bos_token_id", "eos_token_id"):
            if getattr(tokenizer, key, None) is not None:
                setattr(hf_config, key, getattr(tokenizer, key))
    dtype = getattr(torch, precision)
    with torch.device("meta"):
        model = AutoModelForCausalLM.from_config(hf_config, attn_implementation="eager", torch_dtype=dtype)
    _, unexpected = model.load_state_dict({k: v.to(dtype) for k, v in weights.items()}, assign=True, strict=False)
    model.tie_weights()  # a tied output layer is the embedding's weight, loaded once
    missing = [name for name, param in model.named_parameters() if param.is_meta]
    if unexpected or missing:
        raise UserError("checkpoint", f"{ckpt.path}: its weights are not those of the {model_type} its config "
                        f"describes (missing {missing[:4]}, unexpected {sorted(unexpected)[:4]})",
                        "export a checkpoint written by `python -m train`")
    model.to(dtype)
    model.generation_config = GenerationConfig.from_model_config(hf_config)
    if tokenizer is not None:
        model.generation_config.pad_token_id = tokenizer.pad_token_id if tokenizer.pad_token_id is not None else \
            tokenizer.eos_token_id
    model.save_pretrained(tmp)


def parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="python -m train.export", description=__doc__.split("\n\n")[0])
    parser.add_argument("checkpoint", help="a checkpoint (ep{E}-ba{B}/ or ep{E}-ba{B}-rank0.pt), a save folder, or "
                        "a run name")
    parser.add_argument("--out", type=Path, help="the folder to write (default: <output_root>/<run_name>/"
                        "huggingface/ba{B}, where export=hf writes it)")
    parser.add_argument("--precision", choices=PRECISIONS, default="float32",
                        help="dtype of the exported weights (default float32; bfloat16 halves the size)")
    return parser


def main(argv=None) -> int:
    from train.config.storage_args import roots, take

    argv, storage = take(sys.argv[1:] if argv is None else list(argv))
    args = parser().parse_args(argv)
    logging.basicConfig(level=logging.INFO, format="%(levelname)s: %(message)s")
    try:
        at = roots(storage)
        ckpt = locate(args.checkpoint, at)
        out = (args.out or default_out(ckpt, at)).resolve()
        replaceable(out)
        log.info("exporting %s (%s) as %s", ckpt.path, f"batch {ckpt.batch}" if ckpt.batch >= 0 else "a file of "
                 "the user's naming", args.precision)
        print(export(ckpt, out, args.precision))
    except UserError as err:
        print(err, file=sys.stderr)
        return 2
    return 0


if __name__ == "__main__":
    sys.exit(main())
