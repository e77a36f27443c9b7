"""Mock data, like Megatron's: a synthetic token stream written as MDS, and a byte-level tokenizer beside it.

The stream is learnable (each document counts up from a random start with a random stride), so a tiny model's
loss visibly falls within a few dozen steps. Generation is deterministic: every rank may write it, the first
complete copy is renamed into place, and the others are thrown away.
"""
import json
import shutil
from pathlib import Path

from common import files

EOS = "<|endoftext|>"
BYTES = 256  # token ids 0..255 are bytes; 256 is EOS


def write_tokenizer(folder: Path) -> None:
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers

    alphabet = sorted(pre_tokenizers.ByteLevel.alphabet())
    tok = Tokenizer(models.BPE(vocab={c: i for i, c in enumerate(alphabet)}, merges=[]))
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    tok.add_special_tokens([EOS])
    folder.mkdir(parents=True, exist_ok=True)
    tok.save(str(folder / "tokenizer.json"))
    (folder / "tokenizer_config.json").write_text(json.dumps({
        "tokenizer_class": "PreTrainedTokenizerFast", "eos_token": EOS, "bos_token": EOS, "unk_token": EOS,
        "pad_token": EOS, "model_max_length": 1 << 30,
        # what a causal LM takes: without it the tokenizer also returns token_type_ids, which MPT's generate()
        # refuses (`model_kwargs are not used by the model`), so `generate(**tokenizer(text))` would fail
        "model_input_names": ["input_ids", "attention_mask"]}))


def token_stream(n_tokens: int, seed: int):
    import numpy as np

    rng = np.random.default_rng(seed)
    out, total = [], 0
    while total < n_tokens:
        length = int(rng.integers(16, 256))
        doc = (rng.integers(0, BYTES) + rng.integers(1, 4) * np.arange(length)) % BYTES
        out += [doc, [BYTES]]
        total += length + 1
    return np.concatenate(out)[:n_tokens].astype(np.int32)


def write_split(folder: Path, samples: int, seq_len: int, seed: int) -> None:
    """The same shard writer data_prep uses (byte-identical to streaming's MDSWriter, without importing it)."""
    from data_prep.mds import ShardWriter

    folder.mkdir(parents=True, exist_ok=True)
    writer = ShardWriter(folder, seq_len, compression=None, size_limit=1 << 26)  # streaming's default size_limit
    writer.add(token_stream(samples * seq_len, seed).reshape(samples, seq_len))
    writer.finish()


def other_counts(folder, train_samples: int, val_samples: int) -> list:
    """[(key, asked, held)] where the complete mock set in `folder` holds other counts than asked; [] where it holds
    these or there is none. Light: the checks read it before anything is written."""
    from data_prep.facts import samples_in

    held = [samples_in(Path(folder) / split) for split in ("train", "val")]
    if None in held:
        return []
    return [(key, asked, has) for key, asked, has in zip(("data.train_samples", "data.val_samples"),
                                                          (train_samples, val_samples), held) if asked != has]


def ensure(folder: str, seq_len: int, train_samples: int, val_samples: int) -> Path:
    """Write the mock dataset at `folder` unless a complete one is already there."""
    final = Path(folder)
    if (final / "val" / "index.json").is_file():
        # the checks refuse other counts before a run (train/checks/node.py); points of one sweep asking other
        # counts of one folder pass them, as none is there yet when they are checked
        wrong = other_counts(final, train_samples, val_samples)
        if wrong:
            from common.errors import UserError

            key, asked, has = wrong[0]
            raise UserError(key, f"{asked} asked, but the mock set in {final} holds {has} (written by another run)",
                            "one count for every run of this folder; or storage.data_local_root=<another folder>")
        return final
    tmp = files.temp_name(final)
    shutil.rmtree(tmp, ignore_errors=True)
    write_tokenizer(tmp / "tokenizer")
    write_split(tmp / "train", train_samples, seq_len, seed=0)
    write_split(tmp / "val", val_samples, seq_len, seed=1)
    final.parent.mkdir(parents=True, exist_ok=True)
    files.publish(tmp, final)  # another rank may have finished first; its copy is identical
    return final
