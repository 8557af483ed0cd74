"""Load a model folder with mlx-lm and generate a few tokens greedily.

Prints one JSON object: the model type, the prompt's token ids and the
generated token ids, so Rust tests can compare Ondo's output with the
reference. Exits non-zero with a message when mlx-lm cannot load the folder.

    python tests/python/mlx_lm_generate.py MODEL_DIR --prompt "hi" --max-tokens 4

Options beyond the plain run:
  --prompt-ids 1,2,3        token ids given directly (instead of --prompt)
  --chat [--system-prompt]  wrap --prompt in the tokenizer's chat template,
                            with the generation prompt, as `mlx_lm.generate` does
  --max-kv-size N           rotating KV cache of N tokens, keeping the first 4
                            (make_prompt_cache; see make_cache for llama)
  --kv-bits N [--kv-group-size G] [--quantized-kv-start S]
                            generate_step's quantized KV cache: N bits (4 or
                            8), groups of G (default 64), once the cache holds
                            S positions (default mlx-lm's 5000)
  --logits-out PATH         write the first step's log-probabilities (float32
                            values, JSON list) to PATH
  --all-logits-out PATH     write every step's log-probabilities (a JSON list
                            of such lists) to PATH
  --followup TEXT [--followup-tokens N]
                            second chat turn on the same prompt cache (a fresh
                            one when it cannot be trimmed; implies
                            --chat); adds followup_prompt_ids,
                            followup_cached_tokens, followup_trimmed_tokens and
                            followup_generated_ids to the output

EOS is ignored: generate_step never stops on an end-of-sequence token, so
exactly --max-tokens (and --followup-tokens) ids are generated. `--ignore-eos`
is accepted and changes nothing.

Output keys: model_type, prompt_ids, generated_ids, kv_cache (the cache
classes used) and the followup_* keys.
"""

import argparse
import contextlib
import json
import sys

import mlx.core as mx
from mlx_lm import load
from mlx_lm.generate import generate_step
from mlx_lm.models.cache import (
    KVCache,
    RotatingKVCache,
    can_trim_prompt_cache,
    make_prompt_cache,
    trim_prompt_cache,
)


def parse_ids(text: str) -> list[int]:
    try:
        ids = [int(part) for part in text.split(",") if part.strip()]
    except ValueError:
        raise argparse.ArgumentTypeError(f"not a comma-separated id list: {text!r}")
    if not ids:
        raise argparse.ArgumentTypeError("--prompt-ids is empty")
    return ids


def chat_ids(tokenizer, messages: list[dict]) -> list[int]:
    # Same steps as `mlx_lm.generate`: render the template as text, then
    # encode without adding special tokens (the template carries the BOS).
    text = tokenizer.apply_chat_template(
        messages, tokenize=False, add_generation_prompt=True
    )
    return tokenizer.encode(text, add_special_tokens=False)


def generate(model, prompt_ids, cache, max_tokens, prefill_step_size, kv=None, every=None):
    """Greedy ids and the first step's log-probabilities; `kv` holds
    generate_step's KV quantization arguments, when there are any, and
    `every` (a list), when given, gets every step's log-probabilities."""
    ids, first_logprobs = [], None
    for token, logprobs in generate_step(
        mx.array(prompt_ids),
        model,
        max_tokens=max_tokens,
        prompt_cache=cache,
        prefill_step_size=prefill_step_size,
        **(kv or {}),
    ):
        if first_logprobs is None:
            first_logprobs = logprobs
        if every is not None:
            every.append(logprobs.astype(mx.float32).tolist())
        ids.append(int(token))
    return ids, first_logprobs


def make_cache(model, max_kv_size):
    """make_prompt_cache, with max_kv_size honoured for every model.

    make_prompt_cache ignores max_kv_size when the model has its own
    make_cache (llama does in mlx-lm 0.32.2, for sliding-window layers), so
    swap its plain KVCache layers for the RotatingKVCache(max_size=N, keep=4)
    that make_prompt_cache builds for models without one.
    """
    cache = make_prompt_cache(model, max_kv_size=max_kv_size)
    if max_kv_size is None:
        return cache
    return [
        RotatingKVCache(max_size=max_kv_size, keep=4) if type(c) is KVCache else c
        for c in cache
    ]


def cache_offset(cache) -> int | None:
    for layer in cache:
        if hasattr(layer, "offset"):
            return int(layer.offset)
    return None


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("model")
    source = parser.add_mutually_exclusive_group()
    source.add_argument("--prompt", default="Hello from Ondo")
    source.add_argument("--prompt-ids", type=parse_ids)
    parser.add_argument("--max-tokens", type=int, default=4)
    parser.add_argument("--prefill-step-size", type=int, default=2048)
    parser.add_argument("--chat", action="store_true")
    parser.add_argument("--system-prompt")
    parser.add_argument("--max-kv-size", type=int)
    parser.add_argument("--kv-bits", type=int)
    parser.add_argument("--kv-group-size", type=int, default=64)
    parser.add_argument("--quantized-kv-start", type=int)
    parser.add_argument("--logits-out")
    parser.add_argument("--all-logits-out")
    parser.add_argument("--followup")
    parser.add_argument("--followup-tokens", type=int)
    parser.add_argument("--ignore-eos", action="store_true", help="always on")
    args = parser.parse_args()

    chat = args.chat or args.followup is not None
    if chat and args.prompt_ids is not None:
        parser.error("--chat/--followup need --prompt text, not --prompt-ids")
    if args.system_prompt is not None and not chat:
        parser.error("--system-prompt needs --chat")
    if args.kv_bits is not None and args.followup is not None:
        parser.error("--kv-bits applies to one turn; --followup does not take it")
    if args.followup_tokens is not None and args.followup is None:
        parser.error("--followup-tokens needs --followup")

    # Anything a library prints must not land in the JSON on stdout.
    with contextlib.redirect_stdout(sys.stderr):
        try:
            model, tokenizer = load(args.model)
        except Exception as error:  # report any loader failure as a test failure
            print(f"mlx_lm.load failed for {args.model}: {error!r}", file=sys.stderr)
            return 1

        messages = []
        if args.system_prompt is not None:
            messages.append({"role": "system", "content": args.system_prompt})
        messages.append({"role": "user", "content": args.prompt})
        if args.prompt_ids is not None:
            prompt_ids = args.prompt_ids
        elif chat:
            prompt_ids = chat_ids(tokenizer, messages)
        else:
            prompt_ids = tokenizer.encode(args.prompt)
        prompt_ids = [int(t) for t in prompt_ids]

        # One explicit cache (what generate_step would build itself) so a
        # follow-up turn can continue on it.
        cache = make_cache(model, args.max_kv_size)
        kv = None
        if args.kv_bits is not None:
            kv = {"kv_bits": args.kv_bits, "kv_group_size": args.kv_group_size}
            if args.quantized_kv_start is not None:
                kv["quantized_kv_start"] = args.quantized_kv_start
        every = [] if args.all_logits_out is not None else None
        generated, first_logprobs = generate(
            model, prompt_ids, cache, args.max_tokens, args.prefill_step_size, kv, every
        )
        result = {
            "model_type": getattr(model, "model_type", None),
            "prompt_ids": prompt_ids,
            "generated_ids": generated,
            "kv_cache": "+".join(sorted({type(c).__name__ for c in cache})),
        }

        if args.all_logits_out is not None:
            with open(args.all_logits_out, "w") as file:
                json.dump(every, file)

        if args.logits_out is not None:
            values = first_logprobs.astype(mx.float32).tolist()
            with open(args.logits_out, "w") as file:
                json.dump(values, file)

        if args.followup is not None:
            result.update(
                followup(model, tokenizer, args, messages, cache, prompt_ids, generated)
            )

    print(json.dumps(result))
    return 0


def followup(model, tokenizer, args, messages, cache, prompt_ids, generated) -> dict:
    """Turn 2 on the turn-1 cache: feed only what the cache does not hold."""
    cached = prompt_ids + generated
    # generate_step feeds every yielded token back before it stops, so the
    # cache should hold the prompt and all generated ids; check, don't assume.
    offset = cache_offset(cache)
    if offset is not None and offset != len(cached):
        raise RuntimeError(f"cache holds {offset} tokens, expected {len(cached)}")

    turn2 = messages + [
        {"role": "assistant", "content": tokenizer.decode(generated)},
        {"role": "user", "content": args.followup},
    ]
    full = [int(t) for t in chat_ids(tokenizer, turn2)]

    common = 0
    while common < min(len(cached), len(full)) and cached[common] == full[common]:
        common += 1
    # generate_step needs at least one new token to produce logits.
    common = min(common, len(full) - 1)
    trim = len(cached) - common
    if trim > 0 and not can_trim_prompt_cache(cache):
        # A cache with state layers (lfm2's convolutions) cannot drop its
        # tail: mlx-lm starts over, reusing nothing.
        cache = make_cache(model, args.max_kv_size)
        common, trim = 0, len(cached)
    elif trim > 0:
        # The re-rendered assistant text need not re-tokenize to the same ids,
        # so drop the cache's diverging tail (impossible once a rotating cache
        # has wrapped around).
        trimmed = trim_prompt_cache(cache, trim)
        if trimmed != trim:
            raise RuntimeError(f"could trim {trimmed} of {trim} cached tokens")

    tokens = args.followup_tokens if args.followup_tokens is not None else args.max_tokens
    ids, _ = generate(model, full[common:], cache, tokens, args.prefill_step_size)
    return {
        "followup_prompt_ids": full,
        "followup_cached_tokens": common,
        "followup_trimmed_tokens": trim,
        "followup_generated_ids": ids,
    }


if __name__ == "__main__":
    sys.exit(main())
