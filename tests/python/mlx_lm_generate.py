"""Load a model folder with mlx-lm and generate a few tokens greedily.

Prints one JSON object: the model type, the prompt's token ids and the
generated token ids, so Rust tests can compare Ondo's output with the
reference. Exits non-zero with a message when mlx-lm cannot load the folder.

    python tests/python/mlx_lm_generate.py MODEL_DIR --prompt "hi" --max-tokens 4
"""

import argparse
import json
import sys

import mlx.core as mx
from mlx_lm import load
from mlx_lm.generate import generate_step


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("model")
    parser.add_argument("--prompt", default="Hello from Ondo")
    parser.add_argument("--max-tokens", type=int, default=4)
    parser.add_argument("--prefill-step-size", type=int, default=2048)
    args = parser.parse_args()

    try:
        model, tokenizer = load(args.model)
    except Exception as error:  # report any loader failure as a test failure
        print(f"mlx_lm.load failed for {args.model}: {error!r}", file=sys.stderr)
        return 1

    prompt_ids = tokenizer.encode(args.prompt)
    generated = []
    for token, _ in generate_step(
        mx.array(prompt_ids),
        model,
        max_tokens=args.max_tokens,
        prefill_step_size=args.prefill_step_size,
    ):
        generated.append(int(token))
    print(
        json.dumps(
            {
                "model_type": model.model_type if hasattr(model, "model_type") else None,
                "prompt_ids": [int(t) for t in prompt_ids],
                "generated_ids": generated,
            }
        )
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())
