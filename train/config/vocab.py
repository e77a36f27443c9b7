"""How many token ids a tokenizer produces, read from its tokenizer.json (no transformers import): the model's
vocabulary must cover them, and `data=mds` sizes model.vocab_size from it."""
import functools
import json
import os
from pathlib import Path

from data_prep.facts import tokenizer_file

# Hub tokenizers people name most, so neither the vocabulary rule nor the resolver needs a download:
# (ids, llm-foundry's padded vocab_size).
KNOWN = {"EleutherAI/gpt-neox-20b": (50277, 50368), "gpt2": (50257, 50304), "openai-community/gpt2": (50257, 50304)}
MOCK_IDS = 257  # train/task/mock_data.py: 256 byte ids and EOS
MPT_VOCAB = 50368  # MPTConfig's vocab_size, where a model (a YAML's) leaves it out


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
        st = path.stat()
        ids = _ids_in(str(path), st.st_mtime_ns, st.st_size)
    except OSError:
        return None, name
    return (ids, str(path.parent)) if ids else (None, name)


@functools.lru_cache(maxsize=16)
def _ids_in(path: str, mtime_ns: int, size: int) -> int | None:
    """The ids of one tokenizer.json as it is on disk (its time and size in the key: a file written again is read
    again). A tokenizer.json is megabytes of JSON, and a check, its vocabulary resolver and a sweep's points ask
    for the same file many times."""
    try:
        data = json.loads(Path(path).read_text())
        vocab = data["model"]["vocab"]  # {token: id} (BPE, WordPiece) or [[token, score], ...] (Unigram)
        top = max(vocab.values()) if isinstance(vocab, dict) else len(vocab) - 1
        for added in data.get("added_tokens") or []:
            top = max(top, added["id"])
        return top + 1
    except (OSError, ValueError, KeyError, TypeError):
        return None


def padded(ids: int) -> int:
    return -(-ids // 64) * 64


def vocab_size(name) -> int:
    """model.vocab_size for tokenizer `name`: llm-foundry's figure for known ones, else its ids rounded up to a
    multiple of 64 (an unknown size keeps the default; the vocabulary rule reports it if it is too small)."""
    name = str(name)
    if name in KNOWN:
        return KNOWN[name][1]
    ids, _ = tokenizer_ids(name)
    return padded(ids) if ids else MPT_VOCAB


def special_ids(name) -> dict:
    """{bos_token_id, eos_token_id: id} of a tokenizer's beginning and end of text, read from its files here
    (tokenizer_config.json, special_tokens_map.json, tokenizer.json of a folder or of the hub cache); {} for those
    that cannot be read."""
    path = tokenizer_file(str(name))
    if path is None:
        return {}
    folder, found = path.parent, {}
    for file in ("special_tokens_map.json", "tokenizer_config.json"):  # the latter wins, as transformers reads them
        try:
            found.update({k: v for k, v in json.loads((folder / file).read_text()).items()
                          if k in ("bos_token", "eos_token")})
        except (OSError, ValueError, AttributeError):
            continue
    try:
        data = json.loads(path.read_text())
        ids = {**(data["model"]["vocab"] if isinstance(data["model"]["vocab"], dict) else {}),
               **{t["content"]: t["id"] for t in data.get("added_tokens") or []}}
    except (OSError, ValueError, KeyError, TypeError):
        return {}
    out = {}
    for key, token in found.items():
        token = token.get("content") if isinstance(token, dict) else token
        if isinstance(token, str) and token in ids:
            out[f"{key}_id"] = ids[token]
    return out
