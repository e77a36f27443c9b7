"""How many token ids a tokenizer produces, read from its tokenizer.json (no transformers import): the model's
vocabulary must cover them, and `data=mds` sizes model.vocab_size from it."""
import json
import os

from data_prep.facts import tokenizer_file

# Hub tokenizers people name most, so neither the vocabulary rule nor the resolver needs a download:
# (ids, llm-foundry's padded vocab_size).
KNOWN = {"EleutherAI/gpt-neox-20b": (50277, 50368), "gpt2": (50257, 50304), "openai-community/gpt2": (50257, 50304)}
MOCK_IDS = 257  # train/task/mock_data.py: 256 byte ids and EOS
DEFAULT_VOCAB = 50368


def looks_like_path(name: str) -> bool:
    return name.startswith(("/", ".", "~")) or os.path.exists(name)


def tokenizer_ids(name: str) -> tuple[int | None, str]:
    """(ids the tokenizer produces, where that figure comes from); None when it cannot be known here."""
    if name in KNOWN:
        return KNOWN[name][0], name
    path = tokenizer_file(name)  # a folder's tokenizer.json, or the hub cache's
    if path is None:
        return None, name
    try:
        data = json.loads(path.read_text())
        vocab = data["model"]["vocab"]  # {token: id} (BPE, WordPiece) or [[token, score], ...] (Unigram)
        top = max(vocab.values()) if isinstance(vocab, dict) else len(vocab) - 1
        for added in data.get("added_tokens") or []:
            top = max(top, added["id"])
        return top + 1, str(path.parent)
    except (OSError, ValueError, KeyError, TypeError):
        return None, name


def padded(ids: int) -> int:
    return -(-ids // 64) * 64


def vocab_size(name) -> int:
    """model.vocab_size for tokenizer `name`: llm-foundry's figure for known ones, else its ids rounded up to a
    multiple of 64 (an unknown size keeps the default; the vocabulary rule reports it if it is too small)."""
    name = str(name)
    if name in KNOWN:
        return KNOWN[name][1]
    ids, _ = tokenizer_ids(name)
    return padded(ids) if ids else DEFAULT_VOCAB
