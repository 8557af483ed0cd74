"""mlx-lm's side of the prompt cache tests (tests/disk_cache.rs).

continue FILE MODEL COMMON REST MAX
    Reads a prompt cache file Ondo wrote with mlx-lm's load_prompt_cache,
    cuts it to its first COMMON tokens, feeds the comma-separated token ids
    REST and decodes MAX tokens greedily. Prints {"ids", "classes", "offset"}.

after-file FILE MODEL QUERY MAX
    What `mlx_lm.generate --prompt-cache-file FILE --prompt QUERY` computes
    (the chat rendered with the query and cut where the query starts),
    greedily, as token ids. Prints {"ids"}.
"""

import json
import sys

import mlx.core as mx
from mlx_lm import load
from mlx_lm.generate import generate_step
from mlx_lm.models.cache import load_prompt_cache, trim_prompt_cache


def greedy(logits):
    return mx.argmax(logits, axis=-1)


def decode(model, prompt, cache, max_tokens):
    ids = []
    for token, _ in generate_step(
        mx.array(prompt), model, prompt_cache=cache, max_tokens=max_tokens, sampler=greedy
    ):
        ids.append(int(token))
    return ids


def main():
    mode, path, model_dir = sys.argv[1:4]
    model, tokenizer = load(model_dir)
    cache, metadata = load_prompt_cache(path, return_metadata=True)
    if mode == "continue":
        common, rest, max_tokens = int(sys.argv[4]), sys.argv[5], int(sys.argv[6])
        offset = cache[0].offset if hasattr(cache[0], "offset") else None
        held = len(metadata["ondo_tokens"].split(","))
        if held > common:
            trim_prompt_cache(cache, held - common)
        rest = [int(t) for t in rest.split(",")]
        ids = decode(model, rest, cache, max_tokens)
        print(json.dumps({
            "ids": ids,
            "classes": [type(c).__name__ for c in cache],
            "offset": offset,
            "model": metadata.get("model"),
        }))
    elif mode == "after-file":
        query, max_tokens = sys.argv[4], int(sys.argv[5])
        messages = [{"role": "user", "content": query}]
        full = tokenizer.apply_chat_template(messages, tokenize=False, add_generation_prompt=True)
        messages[-1]["content"] = "<query>"
        marked = tokenizer.apply_chat_template(messages, tokenize=False, add_generation_prompt=True)
        text = full[marked.index("<query>"):]
        prompt = tokenizer.encode(text, add_special_tokens=False)
        print(json.dumps({"ids": decode(model, prompt, cache, max_tokens)}))
    else:
        raise SystemExit(f"unknown mode {mode}")


if __name__ == "__main__":
    main()
