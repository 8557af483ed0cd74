#!/usr/bin/env python3
"""Decode held to JSON against free decode on the same model and prompt.

    scripts/bench-constrained.py [--preset small] [--reps 5] [--tokens 128]
                                 [--ondo target/release/ondo] [--model DIR]

Each round runs `ondo run` three ways, in turn and in a rotating order: free
text (--ignore-eos, so it writes every token), --json-object, and a JSON
schema whose one field is a list of strings (so random weights keep writing
until the budget). Prints, per way, the median and spread of decode tok/s,
time to first token and the mask time per token, and the ratio of each
held way's median decode rate to free decode's. The model is `ondo synth
PRESET` (random weights) unless --model names a folder.
"""

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
PROMPT = "Write down everything you know about the sea."
SCHEMA = {
    "type": "object",
    "properties": {"notes": {"type": "array", "items": {"type": "string"}}},
    "required": ["notes"],
}
WAYS = {
    "free": ["--ignore-eos"],
    "json_object": ["--json-object"],
    "json_schema": ["--json-schema", json.dumps(SCHEMA)],
}


def run(ondo, model, tokens, extra):
    out = subprocess.run(
        [ondo, "run", model, PROMPT, "--json", "--no-history", "--max-tokens", str(tokens), *extra],
        capture_output=True,
        text=True,
        check=True,
    )
    return json.loads(out.stdout)


def spread(values):
    return f"{statistics.median(values):.2f} ({min(values):.2f}-{max(values):.2f})"


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--preset", default="small")
    parser.add_argument("--model")
    parser.add_argument("--reps", type=int, default=5)
    parser.add_argument("--tokens", type=int, default=128)
    parser.add_argument("--ondo", default=os.path.join(ROOT, "target/release/ondo"))
    args = parser.parse_args()
    with tempfile.TemporaryDirectory() as work:
        model = args.model
        if model is None:
            model = os.path.join(work, args.preset)
            subprocess.run([args.ondo, "synth", args.preset, model], check=True, capture_output=True)
        # One run first so the page cache holds the weights for every way.
        run(args.ondo, model, 8, [])
        results = {way: [] for way in WAYS}
        names = list(WAYS)
        for rep in range(args.reps):
            order = names[rep % len(names):] + names[: rep % len(names)]
            for way in order:
                results[way].append(run(args.ondo, model, args.tokens, WAYS[way]))
                print(f"round {rep + 1} {way}: {results[way][-1]['decode_tps']:.1f} tok/s", file=sys.stderr)
    free = statistics.median(r["decode_tps"] for r in results["free"])
    free_ttft = statistics.median(r["ttft_ms"] for r in results["free"])
    print(f"model: {args.model or 'ondo synth ' + args.preset}; {args.reps} rounds; up to {args.tokens} tokens")
    print("| way | decode tok/s, median (min-max) | ratio to free | TTFT ms | TTFT - free, ms | mask ms/token | tokens |")
    print("|---|---|---|---|---|---|---|")
    for way in names:
        rows = results[way]
        decode = [r["decode_tps"] for r in rows]
        ttft = [r["ttft_ms"] for r in rows]
        masks = [r["constraint"]["mask_ms_per_token"] for r in rows if r.get("constraint")]
        tokens = [r["generated_tokens"] for r in rows]
        ratio = statistics.median(decode) / free if free else float("nan")
        print(
            f"| {way} | {spread(decode)} | {ratio:.3f} | {spread(ttft)} | "
            f"{statistics.median(ttft) - free_ttft:+.1f} | {spread(masks) if masks else '-'} | "
            f"{min(tokens)}-{max(tokens)} |"
        )


if __name__ == "__main__":
    main()
