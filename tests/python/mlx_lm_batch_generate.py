"""Load a model folder with mlx-lm and decode several prompts together.

Runs mlx-lm's continuous batching (`BatchGenerator`, what `batch_generate`
and `mlx_lm.server` run) greedily on token-id prompts, ignoring EOS, and
prints one JSON object: {"generated_ids": [[...], ...]}, one list per prompt
in the order given. With --logprobs-out PATH it also writes, per prompt,
the log-probabilities (float32 values over the vocabulary) of each step.

    python tests/python/mlx_lm_batch_generate.py MODEL_DIR \\
        --prompts '[[1,2,3],[4,5]]' --max-tokens 8 [--logprobs-out PATH]

Exits non-zero with a message when mlx-lm cannot load the folder.
"""

import argparse
import contextlib
import json
import sys

import mlx.core as mx
from mlx_lm import load
from mlx_lm.generate import BatchGenerator


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("model")
    parser.add_argument("--prompts", required=True, help="a JSON list of id lists")
    parser.add_argument("--max-tokens", type=int, default=8)
    parser.add_argument("--logprobs-out")
    args = parser.parse_args()
    prompts = [[int(t) for t in p] for p in json.loads(args.prompts)]
    if not prompts or not all(prompts):
        parser.error("--prompts needs one or more non-empty id lists")

    # Anything a library prints must not land in the JSON on stdout.
    with contextlib.redirect_stdout(sys.stderr):
        try:
            model, _ = load(args.model)
        except Exception as error:  # report any loader failure as a test failure
            print(f"mlx_lm.load failed for {args.model}: {error!r}", file=sys.stderr)
            return 1
        # No stop tokens: every prompt gets exactly --max-tokens ids.
        generator = BatchGenerator(model, stop_tokens=None, max_tokens=args.max_tokens)
        uids = generator.insert(prompts, [args.max_tokens] * len(prompts))
        tokens = {uid: [] for uid in uids}
        logprobs = {uid: [] for uid in uids}
        while responses := generator.next_generated():
            for response in responses:
                tokens[response.uid].append(int(response.token))
                if args.logprobs_out is not None:
                    logprobs[response.uid].append(
                        response.logprobs.astype(mx.float32).tolist()
                    )
        generator.close()

    if args.logprobs_out is not None:
        with open(args.logprobs_out, "w") as file:
            json.dump([logprobs[uid] for uid in uids], file)
    print(json.dumps({"generated_ids": [tokens[uid] for uid in uids]}))
    return 0


if __name__ == "__main__":
    sys.exit(main())
