"""An exact, faster encoder for byte-level BPE tokenizers (gpt-neox-20b, GPT-2 and others built the same way).

Tokenizing with HF `tokenizers` is most of a data_prep run. tiktoken runs byte-level BPE faster, but it is not
the same algorithm in three places; each is handled here so that the ids are HF's, always:

1. Added tokens (`<|endoftext|>`; gpt-neox's runs of 2-24 spaces, ids 50254-50276) are cut out of the text as
   HF does: leftmost-longest, the non-normalized ones in the raw text, the others after normalisation.
2. tiktoken merges two adjacent parts whenever their concatenation is a token, in the order of that token's
   rank; HF merges only the pairs listed in `merges`, in the order of the pair's rank. With ranks taken from
   the merges' order the two agree step by step, unless tiktoken makes a merge that is not the resulting
   token's own (first) merge, or takes a whole piece that is a token as that token where HF's merges would not
   reach it. Either leaves, in tiktoken's output, a token whose own bytes, encoded alone by tiktoken, take such
   a step (the merges inside a final token do not depend on its neighbours). Those tokens are found once by
   simulating tiktoken on every token; a document whose output holds one is encoded by HF.
3. Characters: the pre-tokenizer's regex runs in another engine (fancy-regex, not Oniguruma) and NFC in
   another library (Python's unicodedata, not unicode-normalization). A document holding a character on which
   they might disagree is encoded by HF: code points Python does not know (for NFC tokenizers), and those that
   `character_differences` finds to differ (checked over every code point for the pinned versions).

A tokenizer of another kind (another model, normalizer, pre-tokenizer or post-processor, added tokens with
lstrip/rstrip/single_word) is not reproduced: `build` raises `Unsupported` and data_prep uses HF for it.
"""
from __future__ import annotations

import array
import hashlib
import io
import json
import logging
import os
import re
import unicodedata
import zipfile
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from common import files

log = logging.getLogger(__name__)

# The pre-tokenizer regex of HF's ByteLevel (use_regex=true), i.e. GPT-2's.
GPT2_PATTERN = r"'s|'t|'re|'ve|'m|'ll|'d| ?\p{L}+| ?\p{N}+| ?[^\s\p{L}\p{N}]+|\s+(?!\S)|\s+"
# Bytes that never occur in UTF-8 text: a byte-level vocabulary may leave them out (gpt-neox does).
NOT_IN_UTF8 = frozenset({0xC0, 0xC1, *range(0xF5, 0x100)})
# Bump when the tables' meaning changes: cached tables of another version are not read.
TABLES_VERSION = 2

# (tokenizers, tiktoken) versions whose pre-tokenizer regexes were compared on every code point (probes "a"+c,
# "1"+c, "!"+c: letter, number, other or space), with the code points on which they differ. Other versions are
# checked at first use (a pass over every code point) and cached. tests/test_data_prep_fast_encoder.py repeats the
# check.
VERIFIED_REGEX = {("0.21.4", "0.14.0"): ()}


class Unsupported(Exception):
    """This tokenizer is not one the fast encoder reproduces exactly (the message says why)."""


def bytes_to_unicode() -> dict[int, str]:
    """GPT-2's byte -> printable character table, in which byte-level vocabularies are written."""
    bs = [*range(ord("!"), ord("~") + 1), *range(ord("¡"), ord("¬") + 1), *range(ord("®"), ord("ÿ") + 1)]
    cs = list(bs)
    n = 0
    for b in range(256):
        if b not in bs:
            bs.append(b)
            cs.append(256 + n)
            n += 1
    return dict(zip(bs, map(chr, cs)))


def _versions() -> tuple[str, str]:
    import tiktoken
    import tokenizers

    return tokenizers.__version__, tiktoken.__version__


def check_supported(definition: dict, hf_tokenizer=None) -> None:
    """Raise Unsupported unless tokenizer.json describes a tokenizer this module reproduces exactly."""
    model = definition.get("model") or {}
    if model.get("type") != "BPE":
        raise Unsupported(f"model is {model.get('type')!r}, not BPE")
    for key in ("dropout", "continuing_subword_prefix", "end_of_word_suffix"):
        if model.get(key):
            raise Unsupported(f"BPE {key}={model[key]!r}")
    for key in ("byte_fallback", "ignore_merges"):
        if model.get(key):
            raise Unsupported(f"BPE {key}=true")
    normalizer = definition.get("normalizer")
    if normalizer is not None and normalizer != {"type": "NFC"}:
        raise Unsupported(f"normalizer {normalizer.get('type')!r} (only none or NFC)")
    pre = definition.get("pre_tokenizer") or {}
    if pre.get("type") != "ByteLevel" or pre.get("add_prefix_space") or not pre.get("use_regex", True):
        raise Unsupported(f"pre-tokenizer {pre.get('type')!r} is not ByteLevel with GPT-2's regex and no prefix space")
    post = definition.get("post_processor")
    if post is not None and post.get("type") != "ByteLevel":
        raise Unsupported(f"post-processor {post.get('type')!r} may add tokens")
    for added in definition.get("added_tokens") or []:
        if added.get("single_word") or added.get("lstrip") or added.get("rstrip") or not added.get("content"):
            raise Unsupported(f"added token {added.get('content')!r} has single_word/lstrip/rstrip or is empty")
    if hf_tokenizer is not None and getattr(hf_tokenizer, "encode_special_tokens", False):
        raise Unsupported("encode_special_tokens is set")
    vocab = model.get("vocab") or {}
    table = bytes_to_unicode()
    missing = [b for b in range(256) if b not in NOT_IN_UTF8 and table[b] not in vocab]
    if missing:
        raise Unsupported(f"the vocabulary lacks byte tokens {missing[:5]}")


def _pairs(merges: list) -> list[tuple[str, str]]:
    # tokenizers writes merges as "a b" (older) or ["a", "b"] (0.20+)
    return [tuple(m.split(" ", 1)) if isinstance(m, str) else (m[0], m[1]) for m in merges]


def _bpe_tables(definition: dict) -> tuple[dict[bytes, int], np.ndarray, np.ndarray]:
    """tiktoken's ranks (byte b -> b, merge i -> 256 + i), rank -> HF id, and which ranks are suspicious."""
    decode = {ch: b for b, ch in bytes_to_unicode().items()}
    vocab = definition["model"]["vocab"]

    def raw(text: str) -> bytes:
        try:
            return bytes(decode[ch] for ch in text)
        except KeyError:
            raise Unsupported(f"vocabulary entry {text!r} is not byte-level") from None

    merges = _pairs(definition["model"]["merges"])
    ranks: dict[bytes, int] = {}
    rank_to_id = np.full(256 + len(merges), -1, np.int64)
    for b, ch in bytes_to_unicode().items():
        if ch in vocab:
            ranks[bytes([b])] = b
            rank_to_id[b] = vocab[ch]
    canonical: dict[int, tuple[bytes, bytes]] = {}  # rank -> the pair whose merge made that token first
    for i, (a, b) in enumerate(merges):
        left, right = raw(a), raw(b)
        token = left + right
        if token in ranks:
            continue  # made again by a later merge: tiktoken only knows the first rank
        ranks[token] = 256 + i
        rank_to_id[256 + i] = vocab[a + b]
        canonical[256 + i] = (left, right)

    def reached_canonically(token: bytes) -> bool:
        """tiktoken's merge loop on `token` alone ends in [token], every step being HF's own merge."""
        parts = [token[i:i + 1] for i in range(len(token))]
        while len(parts) > 1:
            best, at = None, -1
            for i in range(len(parts) - 1):
                r = ranks.get(parts[i] + parts[i + 1])
                if r is not None and (best is None or r < best):  # leftmost lowest rank, as tiktoken
                    best, at = r, i
            if best is None or canonical[best] != (parts[at], parts[at + 1]):
                return False
            parts[at:at + 2] = [parts[at] + parts[at + 1]]
        return True

    suspicious = np.zeros(len(rank_to_id), bool)
    for token, rank in ranks.items():
        if rank >= 256 and not reached_canonically(token):
            suspicious[rank] = True
    return ranks, rank_to_id, suspicious


def _ranges(codepoints) -> list[tuple[int, int]]:
    out: list[list[int]] = []
    for c in sorted(set(codepoints)):
        if out and out[-1][1] == c - 1:
            out[-1][1] = c
        else:
            out.append([c, c])
    return [tuple(r) for r in out]


def _all_codepoints() -> list[str]:
    return [chr(c) for c in range(0x110000) if not 0xD800 <= c < 0xE000]


def regex_differences() -> list[int]:
    """Code points whose class (letter, number, space, other) differs between the two pre-tokenizer regexes.

    A tiny BPE in both libraries whose only merges join a probe ("a", "1", "!") with any following byte: the
    probe and the character end up in one token exactly when the regex keeps them in one piece.
    """
    import tiktoken
    from tokenizers import Tokenizer, models, pre_tokenizers

    table = bytes_to_unicode()
    vocab = {table[b]: b for b in range(256)}
    ranks = {bytes([b]): b for b in range(256)}
    merges = []
    for probe in "a1!":
        for b in range(256):
            vocab[probe + table[b]] = ranks[probe.encode() + bytes([b])] = 256 + len(merges)
            merges.append((probe, table[b]))
    hf = Tokenizer(models.BPE(vocab, merges))
    hf.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=True)
    tk = tiktoken.Encoding("probe", pat_str=GPT2_PATTERN, mergeable_ranks=ranks, special_tokens={})
    chars = _all_codepoints()
    differ = set()
    step = 8192
    for probe in "a1!":
        blocks = ["".join(" " + probe + c for c in chars[i:i + step]) for i in range(0, len(chars), step)]
        for k, (a, b) in enumerate(zip(hf.encode_batch_fast(blocks), tk.encode_ordinary_batch(blocks))):
            if a.ids != b:
                for c in chars[k * step:(k + 1) * step]:
                    s = " " + probe + c
                    if hf.encode(s).ids != tk.encode_ordinary(s):
                        differ.add(ord(c))
    return sorted(differ)


# Marks of Unicode 1.1 (combining classes 1, 7, 9, 10, 103, 129, 220, 230, 240), which every NFC knows alike.
OLD_MARKS = "\u0334\u093c\u094d\u05b0\u0e38\u0f71\u0316\u0301\u0345"


def normalization_differences() -> list[int]:
    """Code points on which HF's NFC and Python's differ: alone, after a base, beside marks of every combining
    class (a class known differently shows as another order), and as the composition of their decomposition."""
    from tokenizers import normalizers

    hf_nfc = normalizers.NFC().normalize_str

    def differs(text: str) -> bool:
        return hf_nfc(text) != unicodedata.normalize("NFC", text)

    chars = _all_codepoints()
    marked = [c for c in chars if unicodedata.combining(c)]
    # One mark per combining class that both sides order alike against the old marks, to probe the others with.
    probes = dict.fromkeys(OLD_MARKS)
    for m in marked:
        if unicodedata.combining(m) not in {unicodedata.combining(p) for p in probes} and not any(
                differs("a" + m + p) or differs("a" + p + m) for p in OLD_MARKS):
            probes[m] = None
    differ = set()
    for c in chars:
        decomposed = unicodedata.normalize("NFD", c)
        if decomposed == c and not unicodedata.combining(c):
            continue
        if differs(c) or differs("a" + c) or (unicodedata.combining(c) and any(
                differs("a" + p + c) or differs("a" + c + p) for p in probes)):
            differ.add(ord(c))
        if differs(decomposed):
            # What composes differently: c, and the characters of its decomposition newer than Unicode 3.2 (older
            # ones compose alike everywhere, and a new composition of old characters is excluded from NFC).
            differ.add(ord(c))
            differ.update(ord(d) for d in decomposed if unicodedata.ucd_3_2_0.category(d) == "Cn")
    # A character that only one side's NFC changes on its own: a quick full pass.
    joined = "\n".join(chars)
    if differs(joined):
        differ.update(ord(c) for c in chars if differs(c))
    return sorted(differ)


def _cache_dir() -> Path:
    return Path(os.environ.get("DATA_PREP_CACHE") or Path(os.environ.get("XDG_CACHE_HOME") or "~/.cache").expanduser()
                / "data_prep")


def _cached(name: str, compute):
    """compute(), kept in the cache folder (JSON, or numpy arrays for a name ending in .npz: quicker to load than
    JSON and, unlike pickle, no code); an unwritable cache only costs the time."""
    path = _cache_dir() / name
    arrays = name.endswith(".npz")
    try:
        if arrays:
            with np.load(path, allow_pickle=False) as data:
                return {k: data[k] for k in data.files}
        return json.loads(path.read_text())
    except (OSError, ValueError, KeyError, EOFError, zipfile.BadZipFile):  # none, or cut short: computed again
        pass
    value = compute()
    data = io.BytesIO()
    if arrays:
        np.savez(data, **value)
    else:
        data.write(json.dumps(value).encode())
    try:
        files.atomic_write(path, data.getvalue())
    except files.DiskFull as err:
        log.info(f"data_prep: note: cannot cache {path} ({err.problem})")
    except OSError as err:
        log.info(f"data_prep: note: cannot cache {path} ({err.strerror or err})")
    return value


def unsafe_characters(nfc: bool) -> list[tuple[int, int]]:
    """Ranges of code points that send a document to HF."""
    tok_v, tik_v = _versions()
    key = (tok_v, tik_v)
    if key in VERIFIED_REGEX:
        ranges = _ranges(VERIFIED_REGEX[key])
    else:
        log.warning(f"data_prep: checking tiktoken {tik_v}'s pre-tokenizer regex against tokenizers {tok_v} on every "
                    f"character (once; cached in {_cache_dir()})")
        ranges = _ranges(_cached(f"regex-v{TABLES_VERSION}-{tok_v}-{tik_v}.json", regex_differences))
    if nfc:
        ranges += _cached(f"nfc-v{TABLES_VERSION}-{tok_v}-{unicodedata.unidata_version}.json", _nfc_unsafe)
    return _merge(ranges)


def _merge(ranges) -> list[tuple[int, int]]:
    out: list[list[int]] = []
    for a, b in sorted(ranges):
        if out and a <= out[-1][1] + 1:
            out[-1][1] = max(out[-1][1], b)
        else:
            out.append([a, b])
    return [tuple(r) for r in out]


def _nfc_unsafe() -> list[tuple[int, int]]:
    # Characters Python's Unicode data does not know may be known to the tokenizer's, and normalise there.
    unknown = [ord(c) for c in _all_codepoints() if unicodedata.category(c) == "Cn"]
    return _merge(_ranges(normalization_differences()) + _ranges(unknown))


class _Characters:
    """Does a text hold one of these code points? A table over all code points, indexed with the text as UTF-32:
    faster than Python's regex with a class of these ranges."""

    def __init__(self, ranges):
        self.table = np.zeros(0x110000, bool)
        for a, b in ranges:
            self.table[a:b + 1] = True

    def search(self, text: str) -> bool:
        return bool(self.table[np.frombuffer(text.encode("utf-32-le"), np.uint32)].any())


def _literals(contents: list[str]) -> re.Pattern | None:
    # Longest first: Python's regex then takes, at the leftmost position, the longest token (HF's leftmost-longest).
    if not contents:
        return None
    return re.compile("|".join(re.escape(c) for c in sorted(set(contents), key=len, reverse=True)))


@dataclass
class _AddedTokens:
    pattern: re.Pattern | None
    prefixes: tuple[str, ...]  # a text without any of these holds no such token (cheap `in` checks)
    ids: dict[str, int]

    @classmethod
    def of(cls, tokens: dict[str, int]) -> "_AddedTokens":
        return cls(_literals(list(tokens)), tuple(sorted({c[:2] for c in tokens})), tokens)

    def may_occur(self, text: str) -> bool:
        for prefix in self.prefixes:  # a loop, not any(): this runs for every document
            if prefix in text:
                return True
        return False


class FastEncoder:
    """Documents -> HF's ids through tiktoken; a document the guards doubt is encoded by the HF tokenizer."""

    def __init__(self, hf_tokenizer, definition: dict, unsafe: list | None = None, key: str | None = None):
        """unsafe: code point ranges for the character guard (default: as found for the installed libraries);
        key: names the BPE tables in the cache (default: a hash of the model's vocabulary and merges)."""
        import tiktoken

        check_supported(definition, hf_tokenizer)
        self.hf = hf_tokenizer
        self.nfc = definition.get("normalizer") is not None
        key = key or hashlib.sha256(json.dumps(definition["model"], sort_keys=True).encode()).hexdigest()
        tables = _cached(f"bpe-v{TABLES_VERSION}-{key[:16]}.npz", lambda: _tables_arrays(definition))
        blob, ends = tables["token_bytes"].tobytes(), tables["token_ends"].tolist()
        ranks = dict(zip((blob[a:b] for a, b in zip([0, *ends], ends)), tables["ranks"].tolist()))
        rank_to_id = tables["rank_to_id"]
        suspicious = np.zeros(len(rank_to_id), bool)
        suspicious[tables["suspicious"]] = True
        added = definition.get("added_tokens") or []
        vocab_size = max([*definition["model"]["vocab"].values(), *(a["id"] for a in added)]) + 1
        # An HF id x travels as rank `base + x` (added tokens, BOS/EOS, documents HF encoded), so that one
        # lookup turns a whole chunk into ids.
        self.base = len(rank_to_id)
        self.lut = np.concatenate([rank_to_id, np.arange(vocab_size)]).astype(np.int32)
        self.suspicious = np.concatenate([suspicious, np.zeros(vocab_size, bool)])
        self.suspicious_tokens = int(suspicious.sum())
        self.enc = tiktoken.Encoding("data_prep-bpe", pat_str=GPT2_PATTERN, mergeable_ranks=ranks, special_tokens={})
        self.encode_ordinary = self.enc.encode_ordinary
        norm = (lambda s: unicodedata.normalize("NFC", s)) if self.nfc else (lambda s: s)
        self.raw_added = _AddedTokens.of({a["content"]: a["id"] for a in added if not a.get("normalized")})
        self.norm_added = _AddedTokens.of({norm(a["content"]): a["id"] for a in added if a.get("normalized")})
        unsafe = unsafe_characters(self.nfc) if unsafe is None else unsafe
        self.unsafe = _Characters(unsafe) if unsafe else None
        self.hf_docs = 0  # documents this process sent to HF (guards), for the run's figures

    def describe(self) -> str:
        import tiktoken

        return f"tiktoken {tiktoken.__version__} (exact; doubtful documents through tokenizers)"

    def _segment(self, text: str) -> list[int] | None:
        """Ranks of a piece of text between non-normalized added tokens."""
        if self.nfc and not text.isascii() and not unicodedata.is_normalized("NFC", text):
            text = unicodedata.normalize("NFC", text)
            if self.unsafe is not None and self.unsafe.search(text):
                return None
        if not self.norm_added.may_occur(text):
            return self.encode_ordinary(text)
        out: list[int] = []
        pos = 0
        for m in self.norm_added.pattern.finditer(text):
            if m.start() > pos:
                out += self.encode_ordinary(text[pos:m.start()])
            out.append(self.base + self.norm_added.ids[m.group()])
            pos = m.end()
        if pos < len(text):
            out += self.encode_ordinary(text[pos:])
        return out

    def ranks(self, text: str) -> list[int] | None:
        """The document's ranks, or None when a guard sends it to HF."""
        if self.unsafe is not None and not text.isascii() and self.unsafe.search(text):
            return None
        if not self.raw_added.may_occur(text):
            return self._segment(text)
        out: list[int] = []
        pos = 0
        for m in self.raw_added.pattern.finditer(text):
            if m.start() > pos:
                part = self._segment(text[pos:m.start()])
                if part is None:
                    return None
                out += part
            out.append(self.base + self.raw_added.ids[m.group()])
            pos = m.end()
        if pos < len(text):
            part = self._segment(text[pos:])
            if part is None:
                return None
            out += part
        return out

    def encode_docs(self, texts: list[str], bos=(), eos=()) -> np.ndarray:
        """int32 bos + ids + eos of every document, in order: exactly what HF's encode_batch gives."""
        bos = [self.base + i for i in bos]
        eos = [self.base + i for i in eos]
        docs = [self.ranks(t) for t in texts]
        doubtful = {k for k, d in enumerate(docs) if d is None}
        flat, starts = self._join(docs, bos, eos)
        hits = np.flatnonzero(self.suspicious[flat])
        if len(hits):
            doubtful.update((np.searchsorted(starts, hits, side="right") - 1).tolist())
        if doubtful:
            order = sorted(doubtful)
            for k, enc in zip(order, self.hf.encode_batch_fast([texts[k] for k in order])):
                docs[k] = [self.base + i for i in enc.ids]
            self.hf_docs += len(order)
            flat, _ = self._join(docs, bos, eos)
        return self.lut[flat]

    @staticmethod
    def _join(docs, bos, eos) -> tuple[np.ndarray, np.ndarray]:
        # array.array takes lists of ints faster than np.array (which checks every item's type)
        flat = array.array("i")
        starts = np.empty(len(docs), np.int64)
        for k, d in enumerate(docs):
            starts[k] = len(flat)
            flat.fromlist(bos)
            if d:
                flat.fromlist(d)
            flat.fromlist(eos)
        return np.frombuffer(flat, np.int32), starts


def _tables_arrays(definition: dict) -> dict[str, np.ndarray]:
    ranks, rank_to_id, suspicious = _bpe_tables(definition)
    return {"token_bytes": np.frombuffer(b"".join(ranks), np.uint8),
            "token_ends": np.cumsum([len(t) for t in ranks], dtype=np.int64),
            "ranks": np.array(list(ranks.values()), np.int64), "rank_to_id": rank_to_id,
            "suspicious": np.flatnonzero(suspicious)}


def build(hf_tokenizer, definition: bytes, parsed: dict | None = None) -> FastEncoder:
    """The fast encoder for this tokenizer (tokenizer.json's content, and that parsed if at hand), or Unsupported."""
    if parsed is None:
        try:
            parsed = json.loads(definition)
        except ValueError as err:
            raise Unsupported(f"tokenizer.json is not JSON ({err})") from None
    # The file's hash names the cached tables: cheaper than hashing the parsed model again.
    return FastEncoder(hf_tokenizer, parsed, key=hashlib.sha256(definition).hexdigest())
