"""One rank of mlx-lm's own split run: load a model folder with
`mlx_lm.utils.sharded_load` over the group MLX's launcher variables
describe (MLX_RANK, MLX_HOSTFILE; the ring backend), split by heads
(`--split tensor`, mlx-lm's `shard`) or by layers (`--split pipeline`), and
generate greedily from the given token ids. Rank 0 prints one JSON object,
{"generated_ids": [...], "decode_tps": ...} (tokens after the first over
the time since the first, mlx-lm's generation rate); the other ranks print
nothing.

    MLX_RANK=0 MLX_HOSTFILE=hosts.json python mlx_lm_sharded_generate.py \
        MODEL_DIR --prompt-ids 1,2,3 --max-tokens 8 --split tensor
"""

import argparse
import json
import time

import mlx.core as mx
from mlx_lm.generate import generate_step
from mlx_lm.utils import sharded_load


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("model")
    parser.add_argument("--prompt-ids", required=True)
    parser.add_argument("--max-tokens", type=int, default=8)
    parser.add_argument("--split", choices=["tensor", "pipeline"], default="tensor")
    args = parser.parse_args()
    group = mx.distributed.init(strict=True, backend="ring")
    if args.split == "tensor":
        model, _ = sharded_load(args.model, tensor_group=group)
    else:
        model, _ = sharded_load(args.model, pipeline_group=group)
    prompt = mx.array([int(t) for t in args.prompt_ids.split(",")])
    ids = []
    first_at = None
    for token, _ in generate_step(prompt, model, max_tokens=args.max_tokens):
        ids.append(int(token))
        if first_at is None:
            first_at = time.perf_counter()
    elapsed = time.perf_counter() - first_at if first_at is not None else 0.0
    decode_tps = (len(ids) - 1) / elapsed if elapsed > 0 else 0.0
    if group.rank() == 0:
        print(json.dumps({"generated_ids": ids, "decode_tps": decode_tps}))


if __name__ == "__main__":
    main()
