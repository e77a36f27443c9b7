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


def held(folder) -> tuple | None:
    """(train samples, val samples) of the complete mock set in `folder`, None where there is none. Light: the
    checks read it before anything is written."""
    counts = []
    for split in ("train", "val"):
        try:
            index = json.loads((Path(folder) / split / "index.json").read_text())
            counts.append(sum(int(shard["samples"]) for shard in index["shards"]))
        except (OSError, ValueError, KeyError, TypeError):
            return None
    return tuple(counts)


def ensure(folder: str, seq_len: int, train_samples: int, val_samples: int) -> Path:
    """Write the mock dataset at `folder` unless a complete one is already there."""
    final = Path(folder)
    if (final / "val" / "index.json").is_file():
        there = held(final)
        if there is not None and there != (train_samples, val_samples):
            # the checks refuse it before a run (train/checks/node.py); points of one sweep asking other counts of
            # one folder pass them, as none is there yet when they are checked
            from common.errors import UserError

            key = "data.train_samples" if there[0] != train_samples else "data.val_samples"
            raise UserError(key, f"{(train_samples, val_samples)[key.endswith('val_samples')]} asked, but the mock "
                            f"set in {final} holds {there[key.endswith('val_samples')]} (written by another run)",
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
