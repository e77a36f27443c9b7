"""data_prep/fast_bpe.py: tiktoken-based ids are HF tokenizers' ids, exactly, or the document goes through HF.

The unmarked tests use tiny byte-level tokenizers written here (each a real tokenizers.Tokenizer): the cases where
tiktoken's algorithm and HF's differ, added tokens, normalisation, unsupported kinds. The e2e ones compare with
HF on everything in ../shared/data and on an adversarial set, with gpt-neox-20b and a GPT-2-style variant of it.
"""
from __future__ import annotations

import copy
import gzip
import json
import random
import unicodedata

import numpy as np
import pytest
from helpers import C4, SHARED, TOKENIZER, need_shared
from tokenizers import Tokenizer

from data_prep import fast_bpe
from data_prep.fast_bpe import NOT_IN_UTF8, FastEncoder, Unsupported, bytes_to_unicode
from data_prep.tokenizer import ENCODER_ENV, _fast_encoder

SLIMPAJAMA = SHARED / "slimpajama" / "redpajama-sample.slimpajama-schema.jsonl.zst"
TABLE = bytes_to_unicode()
SPACE = TABLE[ord(" ")]  # "Ġ"


@pytest.fixture(autouse=True)
def own_cache(tmp_path, monkeypatch):
    monkeypatch.setenv("DATA_PREP_CACHE", str(tmp_path / "cache"))


def tiny(merges: list[tuple[str, str]], added: list[dict] = (), normalizer=None) -> dict:
    """A byte-level BPE tokenizer.json: every UTF-8 byte, then the merges' results, then the added tokens."""
    vocab = {TABLE[b]: i for i, b in enumerate(b for b in range(256) if b not in NOT_IN_UTF8)}
    for a, b in merges:
        vocab.setdefault(a + b, len(vocab))
    added = [{"id": len(vocab) + i, "content": a["content"], "single_word": False, "lstrip": False, "rstrip": False,
              "normalized": a.get("normalized", False), "special": a.get("special", True)} for i, a in enumerate(added)]
    level = {"type": "ByteLevel", "add_prefix_space": False, "trim_offsets": True, "use_regex": True}
    return {"version": "1.0", "truncation": None, "padding": None, "added_tokens": added, "normalizer": normalizer,
            "pre_tokenizer": level, "post_processor": level, "decoder": level,
            "model": {"type": "BPE", "dropout": None, "unk_token": None, "continuing_subword_prefix": None,
                      "end_of_word_suffix": None, "fuse_unk": False, "byte_fallback": False, "ignore_merges": False,
                      "vocab": vocab, "merges": [f"{a} {b}" for a, b in merges]}}


def encoder(definition: dict, **kw) -> tuple[FastEncoder, Tokenizer]:
    hf = Tokenizer.from_str(json.dumps(definition))
    return FastEncoder(hf, definition, **kw), hf


def hf_ids(hf: Tokenizer, texts: list[str], bos=(), eos=()) -> np.ndarray:
    return np.array([i for enc in hf.encode_batch(texts) for i in (*bos, *enc.ids, *eos)], np.int32)


# -- where tiktoken's algorithm differs from HF's: the guard catches it ---------------------------------------------

# "bc" is merged first, and "abc" is made from ("ab", "c"): HF gives [a, bc] for "abc" (no merge (a, bc)); tiktoken
# finds the bytes "abc" among its ranks, either as a whole piece or by merging "a" with "bc".
NONCANONICAL = [("b", "c"), ("a", "b"), ("ab", "c")]


def test_a_token_tiktoken_would_make_differently_is_suspicious_and_goes_through_hf():
    fast, hf = encoder(tiny(NONCANONICAL))
    abc = fast.enc.encode_single_token(b"abc")
    assert fast.enc.encode_ordinary("abc") == [abc]  # tiktoken alone: not HF's answer
    assert hf.encode("abc").tokens == ["a", "bc"]
    assert fast.suspicious[abc] and fast.suspicious_tokens == 1
    texts = ["abc", "xabcx abc", "bc ab c", "abab"]
    assert np.array_equal(fast.encode_docs(texts, eos=[0]), hf_ids(hf, texts, eos=[0]))
    assert fast.hf_docs == 2  # the two holding "abc"; the others stayed on the fast path


def test_canonical_merges_are_not_suspicious_and_match_hf():
    merges = [(SPACE, "a"), ("a", "b"), (SPACE + "a", "b"), ("ab", "c"), ("c", "c"), ("cc", "cc")]
    fast, hf = encoder(tiny(merges))
    assert fast.suspicious_tokens == 0
    texts = ["abc ab abcc", "cccccc c cc", " a  ab   abc", "abcabcab"]
    assert np.array_equal(fast.encode_docs(texts, bos=[1], eos=[0]), hf_ids(hf, texts, bos=[1], eos=[0]))
    assert fast.hf_docs == 0


# -- added tokens and normalisation ----------------------------------------------------------------------------------

def whitespace_tokenizer(normalizer=None) -> dict:
    # gpt-neox's layout: specials matched in the raw text, runs of 2-6 spaces matched after normalisation.
    added = [{"content": "<|endoftext|>"}, {"content": "<|pad|>"}]
    added += [{"content": " " * n, "normalized": True, "special": False} for n in range(6, 1, -1)]
    return tiny([(SPACE, "a"), ("a", "a"), ("aa", "aa")], added, normalizer)


@pytest.mark.parametrize("normalizer", [None, {"type": "NFC"}])
def test_added_tokens_are_split_as_hf_splits_them(normalizer):
    fast, hf = encoder(whitespace_tokenizer(normalizer), unsafe=[])
    texts = ["a" + " " * n + "a" for n in range(1, 16)] + [
        "x<|endoftext|>y", "<|endoftext|><|pad|>", "a <|endoftext|>  a", "<|endoftext", "<|pad|>>|", "\t  \n   a",
        "aaaa   <|pad|>   aaaaa", "      ", "e\u0301 <|endoftext|>\u0338", ">\u0338", "A\u030a a\u0301\u0327"]
    for text in texts:
        assert fast.encode_docs([text]).tolist() == hf.encode(text).ids, text
    assert fast.hf_docs == 0


def test_normalised_and_raw_added_tokens_see_the_text_as_hf_does():
    # NFC would join ">" and U+0338 into one character; after a special token HF normalises the rest alone.
    fast, hf = encoder(whitespace_tokenizer({"type": "NFC"}), unsafe=[])
    text = "<|endoftext|>\u0338 and >\u0338"
    assert fast.encode_docs([text]).tolist() == hf.encode(text).ids
    assert unicodedata.normalize("NFC", text) != text


def test_unsafe_characters_send_the_document_to_hf():
    fast, hf = encoder(whitespace_tokenizer({"type": "NFC"}), unsafe=[(0x378, 0x379), (0x1F600, 0x1F600)])
    texts = ["plain", "with \u0378 inside", "an emoji \U0001F600", "another emoji \U0001F601"]
    assert np.array_equal(fast.encode_docs(texts), hf_ids(hf, texts))
    assert fast.hf_docs == 2


# -- which tokenizers take the fast path -----------------------------------------------------------------------------

@pytest.mark.parametrize("change, reason", [
    (lambda d: d["model"].update(type="WordPiece"), "not BPE"),
    (lambda d: d["model"].update(byte_fallback=True), "byte_fallback"),
    (lambda d: d.update(normalizer={"type": "Lowercase"}), "normalizer 'Lowercase'"),
    (lambda d: d.update(pre_tokenizer={"type": "Metaspace"}), "pre-tokenizer 'Metaspace'"),
    (lambda d: d["pre_tokenizer"].update(add_prefix_space=True), "no prefix space"),
    (lambda d: d.update(post_processor={"type": "TemplateProcessing"}), "may add tokens"),
    (lambda d: d["added_tokens"][0].update(lstrip=True), "lstrip"),
    (lambda d: d["model"]["vocab"].pop(TABLE[ord("q")]), "lacks byte tokens"),
])
def test_other_tokenizers_are_unsupported_and_say_why(change, reason):
    definition = copy.deepcopy(whitespace_tokenizer())
    change(definition)
    with pytest.raises(Unsupported, match=reason):
        fast_bpe.check_supported(definition)


def test_load_falls_back_to_tokenizers_and_says_why(monkeypatch):
    definition = whitespace_tokenizer({"type": "Lowercase"})
    hf = Tokenizer.from_str(json.dumps(definition))
    fast, encoder_note = _fast_encoder(hf, json.dumps(definition).encode())
    assert fast is None and "tokenizers" in encoder_note and "normalizer 'Lowercase'" in encoder_note
    monkeypatch.setenv(ENCODER_ENV, "tokenizers")
    fast, encoder_note = _fast_encoder(hf, json.dumps(whitespace_tokenizer()).encode())
    assert fast is None and ENCODER_ENV in encoder_note
    monkeypatch.delenv(ENCODER_ENV)
    fast, encoder_note = _fast_encoder(hf, json.dumps(whitespace_tokenizer()).encode())
    assert fast is not None and encoder_note.startswith("tiktoken")
    odd = whitespace_tokenizer()
    del odd["model"]["merges"]  # a layout the fast encoder does not expect: tokenizers, not a crash
    fast, encoder_note = _fast_encoder(hf, json.dumps(odd).encode())
    assert fast is None and "could not read" in encoder_note and "KeyError" in encoder_note


# -- e2e: gpt-neox-20b (and a GPT-2-style variant) against HF on real and adversarial text ----------------------------

def shared_documents() -> dict[str, list[str]]:
    import zstandard

    docs = {}
    for path in sorted(C4.glob("c4-train.*.json.gz")):
        with gzip.open(path, "rb") as fh:
            docs[path.name] = [json.loads(line)["text"] for line in fh]
    with zstandard.open(SLIMPAJAMA, "rt") as fh:
        docs[SLIMPAJAMA.name] = [json.loads(line)["text"] for line in fh]
    return docs


def adversarial() -> list[str]:
    texts = []
    for n in range(1, 31):  # every whitespace run up to 30, between words, at the ends, alone
        for ws in (" " * n, "\t" * n, "\n" * n, (" \t\n" * n)[:n], ("\t " * n)[:n], (" \n" * n)[:n]):
            texts += [f"word{ws}word", f"{ws}lead", f"trail{ws}", ws, f"x{ws}<|endoftext|>{ws}y", f"1{ws}2"]
    texts += ["\r\n\r\n  \r\n", "a\u00a0\u00a0b", "\u3000\u3000x", "\u2028\u2029 \u0085", "  \u200b  ", "\f\v \f"]
    texts += [  # unicode normalisation: composed, decomposed, singletons, compatibility (NFC keeps), Hangul
        "e\u0301 \u00e9 E\u0301\u0323 \u1e0b\u0323 q\u0307\u0323", "\u212b \u2126 \u212a", "\ufb01 \u2460 \u00bd",
        "\u1100\u1161\u11a8 \uac01 \u1100 \u1161", "\u0958 \u0915\u093c", "a\u0308\u0301\u0302\u0303\u0304" * 5,
        "\u0041\u030a\u0301", "\u1037\u103a \u1039\u103a", "Z\u0351\u0352\u0357\u0358" * 10, ">\u0338 =\u0338",
        "a\u1dfa\u0338", "x a\u0338\U00016ff0 y", "\u0898\u0301 \u1ac0"]  # marks newer than tokenizers' NFC
    texts += [  # special tokens inside text
        "before<|endoftext|>after", "<|endoftext|>", "<|endoftext|><|endoftext|><|padding|>", "<|endoftext",
        "endoftext|>", "<|endoftext|>\u0338", "  <|padding|>  ", "<<|endoftext|>>", "<|ENDOFTEXT|>", "<|endof text|>"]
    texts += [  # emoji, CJK, scripts, combining marks, very long words, code, numbers, contractions
        "\U0001F600\U0001F44D\U0001F3FD \U0001F468\u200d\U0001F469\u200d\U0001F467 \U0001F1EB\U0001F1F7 \u2764\ufe0f",
        "\u4e2d\u6587\u5b57\u7b26\u3002\u65e5\u672c\u8a9e\u306e\u6587\u7ae0\u3002\ud55c\uad6d\uc5b4 \u0627\u0644\u0639\u0631\u0628\u064a\u0629",
        "\u0928\u092e\u0938\u094d\u0924\u0947 \u0e2a\u0e27\u0e31\u0e2a\u0e14\u0e35 \u05e9\u05b8\u05c1\u05dc\u05d5\u05b9\u05dd",
        "\U00020000\U0002a6d6 \U0001d400\U0001d7ff \ue000\uf8ff \U000f0000", "\u0378\u0379 \U000e01ef \U0010fffd",
        "a" * 10000, "abc" * 3000, "9" * 5000, "-" * 4000, "=" * 3000 + "\n" + "_" * 3000, "Ġ" * 500, "\u00e9" * 3000,
        "aGVsbG8gd29ybGQ=" * 500, " " * 5000 + "x", "x" + "\t" * 3000, "\u4e2d" * 5000,
        "def f(x):\n    return x  # two\n\tif x:\n\t\tpass\n        \n", "It's they'll we've I'M 'S 'll 're",
        "3.14159 1,000,000 2024-01-01 0x1F 1e-10 \u0661\u0662\u0663 \u2167", "don't   stop  'til", "''''' 's's's",
        "\x00\x01\x1f\x7f \ufeff\ufffd", "Mixed\u00a0spaces\u2003and\u2009thin\u202fones", "\u0130\u0131 \u00df\u1e9e",
    ]
    rng = random.Random(25)
    pool = list(" \t\n  ab\u00e9e\u0301\u4e2d\U0001F600<|endoftext|>12'\u00a0\u3000-\u0338>\u1037\u103a")
    texts += ["".join(rng.choice(pool) for _ in range(rng.randint(1, 80))) for _ in range(3000)]
    return texts


def gpt2_style(definition: dict) -> dict:
    """gpt-neox's vocabulary as GPT-2's tokenizer.json is laid out: no normalizer, one added token (normalized)."""
    d = copy.deepcopy(definition)
    d["normalizer"] = None
    d["added_tokens"] = [dict(d["added_tokens"][0], normalized=True)]
    return d


@pytest.fixture(scope="module")
def neox():
    need_shared()
    definition = json.loads((TOKENIZER / "tokenizer.json").read_text())
    return definition


def assert_identical(fast: FastEncoder, hf: Tokenizer, texts: list[str]) -> None:
    expected = [enc.ids for enc in hf.encode_batch(texts)]
    got = fast.encode_docs(texts, eos=[0])
    if not np.array_equal(got, np.array([i for ids in expected for i in (*ids, 0)], np.int32)):
        wrong = [t for t, ids in zip(texts, expected) if fast.encode_docs([t]).tolist() != ids]
        pytest.fail(f"{len(wrong)} of {len(texts)} documents differ from HF, e.g. {wrong[0][:200]!r}")


@pytest.mark.e2e
@pytest.mark.parametrize("kind", ["gpt-neox-20b", "gpt2-style"])
def test_every_shared_document_is_identical_to_hf(neox, kind):
    definition = neox if kind == "gpt-neox-20b" else gpt2_style(neox)
    fast, hf = encoder(definition)
    assert fast.suspicious_tokens == 0  # gpt-neox's merges: tiktoken takes HF's steps for every token
    total = 0
    for texts in shared_documents().values():
        assert_identical(fast, hf, texts)
        total += len(texts)
    assert total == 2362
    assert fast.hf_docs < total * 0.02, f"{fast.hf_docs} of {total} documents went through HF"


@pytest.mark.e2e
@pytest.mark.parametrize("kind", ["gpt-neox-20b", "gpt2-style"])
def test_adversarial_text_is_identical_to_hf(neox, kind):
    definition = neox if kind == "gpt-neox-20b" else gpt2_style(neox)
    fast, hf = encoder(definition)
    texts = adversarial()
    assert_identical(fast, hf, texts)
    for text in texts:  # one by one too: a document's ids do not depend on its neighbours in the chunk
        assert fast.encode_docs([text]).tolist() == hf.encode(text).ids, text[:200]


@pytest.mark.e2e
def test_a_mark_whose_order_nfc_knows_differently_goes_through_hf(neox):
    from tokenizers import normalizers

    fast, hf = encoder(neox)
    text = "a\u1dfa\u0338"  # U+1DFA (Unicode 14) has combining class 218 in Python; tokenizers' NFC does not know it
    assert unicodedata.normalize("NFC", text) != normalizers.NFC().normalize_str(text)
    assert fast.encode_docs([text]).tolist() == hf.encode(text).ids and fast.hf_docs == 1
    fast.unsafe = None  # without the character guard, Python's NFC would give other ids
    assert fast.encode_docs([text]).tolist() != hf.encode(text).ids


@pytest.mark.e2e
def test_neox_whitespace_runs_use_the_added_tokens(neox):
    fast, hf = encoder(neox)
    for n in range(2, 31):
        ids = fast.encode_docs([f"a{' ' * n}b"]).tolist()
        assert ids == hf.encode(f"a{' ' * n}b").ids
        assert set(ids) & set(range(50254, 50277)), n
    assert fast.hf_docs == 0


@pytest.mark.e2e
def test_pinned_versions_regex_and_nfc_tables_are_what_the_module_assumes():
    """Every code point through both pre-tokenizer regexes (the claim in VERIFIED_REGEX), and NFC's differences
    are all in what the encoder treats as unsafe."""
    key = fast_bpe._versions()
    assert key in fast_bpe.VERIFIED_REGEX, f"tokenizers/tiktoken {key} not verified: add its regex_differences()"
    assert fast_bpe.regex_differences() == list(fast_bpe.VERIFIED_REGEX[key])
    unsafe = fast_bpe._Characters(fast_bpe.unsafe_characters(nfc=True))
    differences = fast_bpe.normalization_differences()
    assert differences and all(unsafe.search(chr(c)) for c in differences)
    assert not unsafe.search("plain ascii, caf\u00e9, \u4e2d\u6587, \u2014 \u201cquoted\u201d \U0001F600")


# -- e2e: python -m data_prep with and without the fast encoder ------------------------------------------------------

def data_prep(out_root, tokenizer, inputs, env=None):
    import os
    import subprocess
    import sys

    from helpers import ROOT

    cmd = [sys.executable, "-m", "data_prep", "dataset=jsonl", f"input=[{','.join(map(str, inputs))}]",
           f"out_root={out_root}", f"tokenizer={tokenizer}", "concat_tokens=512", "progress=false", "num_parts=2"]
    proc = subprocess.run(cmd, cwd=ROOT, capture_output=True, text=True, timeout=300, env={**os.environ, **(env or {})})
    assert proc.returncode == 0, f"{' '.join(cmd)}\n{proc.stdout[-3000:]}\n{proc.stderr[-3000:]}"
    return proc, json.loads((out_root / "train" / "data_prep_summary.json").read_text())


def dataset_files(split):
    return {str(p.relative_to(split)): p.read_bytes() for p in sorted(split.rglob("*"))
            if p.is_file() and p.name != "data_prep_summary.json"}


@pytest.mark.e2e
def test_data_prep_writes_the_same_bytes_with_either_encoder_and_says_which(tmp_path, neox):
    inputs = [*sorted(C4.glob("c4-train.*.json.gz")), SLIMPAJAMA]
    fast_proc, fast = data_prep(tmp_path / "fast", TOKENIZER, inputs)
    slow_proc, slow = data_prep(tmp_path / "slow", TOKENIZER, inputs, {"DATA_PREP_ENCODER": "tokenizers"})
    assert fast["this_run"]["encoder"].startswith("tiktoken ")
    assert slow["this_run"]["encoder"].startswith("tokenizers ") and "DATA_PREP_ENCODER" in slow["this_run"]["encoder"]
    assert "encoder" in fast_proc.stdout and "tiktoken" in fast_proc.stdout
    assert fast["docs"] == slow["docs"] == 2362 - fast["skipped_lines"] and fast["tokens"] == slow["tokens"] > 2_000_000
    files = dataset_files(tmp_path / "fast" / "train")
    assert any(name.endswith(".mds") for name in files)
    assert files == dataset_files(tmp_path / "slow" / "train")


@pytest.mark.e2e
def test_a_tokenizer_outside_the_fast_path_still_works_and_the_summary_says_so(tmp_path, neox):
    folder = tmp_path / "prefix-space-neox"
    folder.mkdir()
    for path in TOKENIZER.iterdir():
        (folder / path.name).write_bytes(path.read_bytes())
    definition = copy.deepcopy(neox)
    definition["pre_tokenizer"]["add_prefix_space"] = True  # a GPT-2 family member this encoder does not reproduce
    (folder / "tokenizer.json").write_text(json.dumps(definition))
    first = sorted(C4.glob("c4-train.*.json.gz"))[0]
    proc, summary = data_prep(tmp_path / "out", folder, [first])
    assert summary["this_run"]["encoder"].startswith("tokenizers ")
    assert "add_prefix_space" in summary["this_run"]["encoder"] or "prefix space" in summary["this_run"]["encoder"]
    assert "encoder" in proc.stdout and "prefix space" in proc.stdout
    hf = Tokenizer.from_file(str(folder / "tokenizer.json"))
    assert summary["tokens"] == sum(len(e.ids) + 1 for e in hf.encode_batch([json.loads(line)["text"]
                                                                           for line in gzip.open(first)]))


def test_a_cache_file_cut_short_or_emptied_is_computed_again(tmp_path):
    """The encoder's tables are kept in the cache folder; one cut short (a full disk, a copy interrupted) or emptied
    stopped every run with that tokenizer (zipfile.BadZipFile, EOFError), where an unreadable JSON one was rebuilt."""
    from data_prep.fast_bpe import _cached

    calls = []

    def compute():
        calls.append(1)
        return {"a": np.arange(5000, dtype=np.int32)}

    assert list(_cached("t.npz", compute)["a"]) == list(range(5000)) and len(calls) == 1
    assert list(_cached("t.npz", compute)["a"]) == list(range(5000)) and len(calls) == 1  # from the cache
    path = tmp_path / "cache" / "t.npz"
    for damage in (path.read_bytes()[:1000], b""):
        path.write_bytes(damage)
        assert list(_cached("t.npz", compute)["a"]) == list(range(5000))
    assert len(calls) == 3 and not list(path.parent.glob("*.tmp"))
