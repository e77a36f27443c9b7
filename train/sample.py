"""`python -m train.sample MODEL PROMPT [PROMPT ...] [--max-new-tokens N] [--temperature T] [--top-k K] [--seed S]`:
continuations of prompts from an exported model.

MODEL is an exported Hugging Face folder, or a run name (its newest export under the storage's outputs). Works
offline from the folder alone. Prints each prompt with its continuation; `--temperature 0` is greedy decoding.
"""
import argparse
import logging
import sys

from common.errors import UserError

log = logging.getLogger(__name__)


def generate(model, tokenizer, prompts: list[str], max_new_tokens: int, temperature: float, top_k: int,
             seed: int) -> list[str]:
    """One continuation per prompt (the new text only)."""
    import torch

    sampling = {"do_sample": True, "temperature": temperature, "top_k": top_k} if temperature > 0 else \
        {"do_sample": False}
    out = []
    for prompt in prompts:  # one at a time: no padding, so each continuation is what the prompt alone gives
        torch.manual_seed(seed)  # for each prompt: its sample does not depend on the prompts given before it
        ids = tokenizer(prompt, return_tensors="pt")
        ids.pop("token_type_ids", None)  # a tokenizer made for other models (BERT-like) offers them; MPT refuses them
        with torch.no_grad():
            tokens = model.generate(**ids, max_new_tokens=max_new_tokens, use_cache=True,
                                    pad_token_id=tokenizer.eos_token_id, **sampling)
        out.append(tokenizer.decode(tokens[0, ids["input_ids"].shape[1]:], skip_special_tokens=True))
    return out


def _past_max_seq_len(model, tokenizer, prompts: list[str], max_new_tokens: int) -> UserError | None:
    """A prompt and its continuation longer than the model's max_seq_len: MPT refuses the sequence part way through
    generating (a ValueError, or a tensor size error with alibi), GPT-2 past its positions (an IndexError), every
    prompt's output lost. Said before, with the longest --max-new-tokens every prompt fits."""
    from train.hf_model import refuses_past

    limit = refuses_past(model.config.to_dict())
    if not isinstance(limit, int):
        return None
    longest = max(len(tokenizer(p)["input_ids"]) for p in prompts)
    if longest + max_new_tokens <= limit:
        return None
    if longest >= limit:
        return UserError("PROMPT", f"a prompt of {longest} tokens leaves no room in the model's {limit} positions",
                         "a shorter prompt")
    return UserError("--max-new-tokens", f"{max_new_tokens} new tokens after a prompt of {longest} tokens pass the "
                     f"model's {limit} positions (its max_seq_len, or GPT-2's n_positions: it refuses longer "
                     "sequences)", f"--max-new-tokens {limit - longest} or fewer")


def parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="python -m train.sample", description=__doc__.split("\n\n")[0])
    parser.add_argument("model", help="an exported Hugging Face folder, or a run name")
    parser.add_argument("prompts", nargs="+", metavar="PROMPT")
    parser.add_argument("--max-new-tokens", type=int, default=32)
    parser.add_argument("--temperature", type=float, default=0.8, help="0: greedy (default 0.8)")
    parser.add_argument("--top-k", type=int, default=50)
    parser.add_argument("--seed", type=int, default=17)
    return parser


def main(argv=None) -> int:
    from train.config.storage_args import roots, take

    argv, storage = take(sys.argv[1:] if argv is None else list(argv))
    args = parser().parse_args(argv)
    logging.basicConfig(level=logging.INFO, format="%(levelname)s: %(message)s")
    problems = [f"error: --{k.replace('_', '-')}: must be positive, got {v}" for k, v in
                (("max_new_tokens", args.max_new_tokens), ("top_k", args.top_k)) if v <= 0]
    if args.temperature < 0:
        problems.append(f"error: --temperature: must be 0 (greedy) or more, got {args.temperature}")
    if not all(args.prompts):  # no token to continue from: generate fails part way
        problems.append("error: PROMPT: an empty prompt; the model continues a text of at least one token")
    if problems:
        print("\n".join(problems), file=sys.stderr)
        return 2
    try:
        from train import hf_model

        folder = hf_model.find_folder(args.model, roots(storage))
        log.info("sampling from %s", folder)
        model, tokenizer = hf_model.load(folder)
        too_long = _past_max_seq_len(model, tokenizer, args.prompts, args.max_new_tokens)
    except UserError as err:
        print(err, file=sys.stderr)
        return 2
    if too_long:
        print(too_long, file=sys.stderr)
        return 2
    texts = generate(model, tokenizer, args.prompts, args.max_new_tokens, args.temperature, args.top_k, args.seed)
    for prompt, text in zip(args.prompts, texts):
        print(f"{prompt}{text}\n---")
    why = undecodable(texts, len(tokenizer))
    if why:
        log.warning(why)
    return 0


def undecodable(texts: list[str], vocab: int) -> str | None:
    """Why a continuation shows U+FFFD, where one does: its tokens decode to bytes that are no UTF-8 text."""
    if not any("\ufffd" in t for t in texts):
        return None
    mock = " (data=mock's byte-level tokenizer: a model trained on its synthetic token stream continues with bytes, " \
        "not text; train on real data, e.g. data=c4, for text)" if vocab <= 512 else ""
    return f"the continuations hold bytes that are not UTF-8 text, shown as \ufffd{mock}"


if __name__ == "__main__":
    sys.exit(main())
