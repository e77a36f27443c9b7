"""Load the tokenizer (a folder with tokenizer.json, or a hub name) and check it against the settings."""
from __future__ import annotations

import hashlib
import json
import logging
import os
from dataclasses import dataclass, field, replace

from omegaconf import OmegaConf
from tokenizers import Tokenizer

from common.paths import CONF
from data_prep import fast_bpe
from data_prep.errors import DataPrepError
from data_prep.facts import hub_name, vocab_fingerprint
from data_prep.fast_bpe import FastEncoder
from data_prep.settings import Settings

log = logging.getLogger(__name__)

INT32_LIMIT = 2**31


# DATA_PREP_ENCODER=tokenizers turns the fast encoder off (to compare with, or to rule it out).
ENCODER_ENV = "DATA_PREP_ENCODER"


@dataclass(frozen=True)
class LoadedTokenizer:
    tokenizer: Tokenizer
    fingerprint: str  # sha256 of the tokenizer definition: a different tokenizer means a different dataset
    vocab_fingerprint: str | None  # facts.vocab_fingerprint: what training compares with its own tokenizer
    vocab_size: int  # largest id + 1
    bos_ids: tuple[int, ...]
    eos_ids: tuple[int, ...]
    fast: FastEncoder | None = None  # the same ids as `tokenizer`, faster (data_prep/fast_bpe.py): with_encoder
    encoder: str = "tokenizers"  # which encoder tokenizes, and why, for the log and the summary
    definition: bytes = field(default=b"", repr=False)  # tokenizer.json, for the fast encoder
    parsed: dict | None = field(default=None, repr=False)


def _fast_encoder(tok: Tokenizer, definition: bytes, parsed: dict | None = None) -> tuple[FastEncoder | None, str]:
    """The fast, exact encoder when this tokenizer is one it reproduces; otherwise HF tokenizers, and why."""
    import tokenizers

    slow = f"tokenizers {tokenizers.__version__}"
    if os.environ.get(ENCODER_ENV, "").strip().lower() in ("tokenizers", "hf", "slow"):
        return None, f"{slow} ({ENCODER_ENV}={os.environ[ENCODER_ENV]})"
    try:
        fast = fast_bpe.build(tok, definition, parsed)
    except fast_bpe.Unsupported as err:
        return None, f"{slow} (the fast path reproduces byte-level BPE tokenizers such as gpt-neox-20b and GPT-2 " \
                     f"only; this one: {err})"
    except ImportError as err:
        return None, f"{slow} (fast path unavailable: {err})"
    except (KeyError, TypeError, ValueError, AttributeError) as err:
        # A tokenizer.json laid out in a way the fast encoder did not expect: tokenizers reads it as it always did.
        return None, f"{slow} (the fast encoder could not read this tokenizer.json: {type(err).__name__}: {err})"
    return fast, fast.describe()


def _from_file(path: str) -> tuple[Tokenizer, bytes]:
    with open(path, "rb") as fh:
        definition = fh.read()
    return Tokenizer.from_file(path), definition


def _from_hub(name: str) -> tuple[Tokenizer, bytes]:
    # transformers is slow to import and needs the network, so only hub names pay for it.
    try:
        from transformers import AutoTokenizer

        hf = AutoTokenizer.from_pretrained(name)
    except Exception as err:
        raise DataPrepError(
            "tokenizer", f"{name!r} is not a local folder with tokenizer.json, and loading it from the hub failed "
            f"({type(err).__name__}: {str(err).splitlines()[0][:200]})",
            "pass tokenizer=<folder containing tokenizer.json> (e.g. a hub checkout) when this machine is offline",
        ) from None
    if not getattr(hf, "is_fast", False):
        raise DataPrepError("tokenizer", f"{name!r} has no fast (Rust) tokenizer, which data_prep needs for speed",
                            "convert it once with transformers and pass the folder holding its tokenizer.json")
    text = hf.backend_tokenizer.to_str()
    return Tokenizer.from_str(text), text.encode()


def _load(name: str) -> tuple[Tokenizer, bytes]:
    """The tokenizer and its definition (tokenizer.json's bytes)."""
    path = os.path.expanduser(name)
    if os.path.isdir(path):
        file = os.path.join(path, "tokenizer.json")
        if not os.path.isfile(file):
            raise DataPrepError("tokenizer", f"folder {path} has no tokenizer.json",
                                "pass a folder holding a Hugging Face fast tokenizer (tokenizer.json)")
        return _from_file(file)
    if os.path.isfile(path) and path.endswith(".json"):
        return _from_file(path)
    if os.path.exists(path) or not hub_name(name):
        raise DataPrepError("tokenizer", f"{path} does not exist (or is not a tokenizer.json / folder)",
                            "pass tokenizer=<folder containing tokenizer.json>")
    return _from_hub(name)


def _preset_vocab(name: str, seen: tuple = ()) -> int | None:
    """model.vocab_size as a preset sets it, following the preset's own defaults (e.g. gpt-375m -> gpt175b)."""
    path = CONF / "model" / f"{name}.yaml"
    if not path.is_file() or name in seen:
        known = ", ".join(sorted(p.stem for p in (CONF / "model").glob("*.yaml")))
        raise DataPrepError("model_preset", f"no preset {name!r} in conf/model (known: {known})",
                            "pass one of those, or model_vocab_size=<int>")
    node = OmegaConf.load(path)
    size = OmegaConf.select(node, "model.vocab_size", throw_on_resolution_failure=False)
    if size is not None:
        return size
    for parent in node.get("defaults") or []:
        if isinstance(parent, str) and parent != "_self_":
            size = _preset_vocab(parent, seen + (name,))
            if size is not None:
                return size
    return None


def model_vocab_size(settings: Settings) -> int | None:
    """The vocab of the model the data is for: given directly, or as conf/recipe/mpt.yaml (the recipe every model
    preset shares) + conf/model/<preset> set it.

    Read from the YAML files rather than composed with Hydra, so that data_prep does not depend on the
    training app's plugins and resolvers.
    """
    if settings.model_vocab_size is not None or settings.model is None:
        return settings.model_vocab_size
    size = _preset_vocab(settings.model)
    if size is None:
        size = OmegaConf.select(OmegaConf.load(CONF / "recipe" / "mpt.yaml"), "model.vocab_size",
                                throw_on_resolution_failure=False)
    if not isinstance(size, int) or isinstance(size, bool):
        raise DataPrepError("model_preset", f"cannot find an integer model.vocab_size for preset {settings.model!r}",
                            "pass model_vocab_size=<int>")
    return size


def _largest_id(parsed) -> int | None:
    """From tokenizer.json as parsed: cheaper than asking the tokenizer for its whole vocabulary."""
    vocab = (parsed.get("model") or {}).get("vocab") if isinstance(parsed, dict) else None
    if not isinstance(vocab, dict) or not vocab:
        return None
    added = [a.get("id") for a in parsed.get("added_tokens") or [] if isinstance(a, dict)]
    ids = [*vocab.values(), *added]
    return max(ids) if all(isinstance(i, int) for i in ids) else None


def load_tokenizer(settings: Settings) -> LoadedTokenizer:
    tok, definition = _load(settings.tokenizer)
    fingerprint = hashlib.sha256(definition).hexdigest()
    try:
        parsed = json.loads(definition)
        vocab = vocab_fingerprint(parsed)
    except ValueError:
        parsed = vocab = None
    # A tokenizer.json may carry truncation/padding meant for a model's inputs; for corpora that would cut documents.
    tok.no_truncation()
    tok.no_padding()
    largest = _largest_id(parsed)
    if largest is None:
        ids = tok.get_vocab(with_added_tokens=True)
        largest = max(ids.values()) if ids else tok.get_vocab_size(True) - 1
    vocab_size = largest + 1
    if vocab_size > INT32_LIMIT:
        raise DataPrepError("tokenizer", f"ids reach {vocab_size - 1}, which does not fit the int32 tokens column")
    model_vocab = model_vocab_size(settings)
    if model_vocab is not None and vocab_size > model_vocab:
        which = f"model_preset={settings.model}" if settings.model and settings.model_vocab_size is None else "model_vocab_size"
        raise DataPrepError(which, f"the tokenizer's ids reach {vocab_size - 1} but the model's vocab_size is "
                            f"{model_vocab}: those tokens would index past the embedding table",
                            "use the model's own tokenizer, or a model whose vocab_size >= " + str(vocab_size))
    bos = tuple(tok.encode(settings.bos_text, add_special_tokens=False).ids) if settings.bos_text else ()
    eos = tuple(tok.encode(settings.eos_text, add_special_tokens=False).ids) if settings.eos_text else ()
    adds_specials = tok.encode("test").ids != tok.encode("test", add_special_tokens=False).ids
    if not bos and not eos and not adds_specials:
        raise DataPrepError("eos_text", "is empty, bos_text is empty and the tokenizer adds no special tokens, "
                            "so documents would run into each other with no separator",
                            "pass eos_text='<|endoftext|>' (or the tokenizer's own end-of-text token)")
    for key, ids in (("bos_text", bos), ("eos_text", eos)):
        if len(ids) > 1:
            log.warning(f"data_prep: note: {key} tokenizes to {len(ids)} tokens {list(ids)}, not one special "
                        "token")
    return LoadedTokenizer(tok, fingerprint, vocab, vocab_size, bos, eos, definition=definition,
                           parsed=parsed if isinstance(parsed, dict) else None)


def with_encoder(loaded: LoadedTokenizer) -> LoadedTokenizer:
    """The tokenizer with the encoder that will tokenize: the fast one builds (and caches) its tables, so it comes
    after every check: a refused run writes nothing, not even the cache."""
    fast, encoder = _fast_encoder(loaded.tokenizer, loaded.definition, loaded.parsed)
    log.info(f"data_prep: encoder: {encoder}")
    return replace(loaded, fast=fast, encoder=encoder)
