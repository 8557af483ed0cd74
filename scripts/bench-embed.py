#!/usr/bin/env python3
"""What batching embeddings buys: one `/v1/embeddings` request carrying 64
short texts against the same 64 texts sent as 64 requests one after
another, on `ondo serve` and an encoder written by `ondo synth` (BERT of
the `small` preset's size unless told otherwise), in the same run.

    scripts/bench-embed.py [--ondo target/release/ondo] [--preset small]
                           [--texts 64] [--rounds 7]

Each round times both shapes at the client (the server warm after a
warm-up of each), alternating which goes first, with texts that differ per
round. Only the standard library is used on the client side. Prints JSON
and a Markdown row: the ratio (separate time / batched time) per round,
its median and range. Ratios only: absolute times on shared machines are
not claims.
"""

import argparse
import http.client
import json
import os
import random
import statistics
import subprocess
import sys
import tempfile
import time
from urllib.parse import urlparse

WORDS = (
    "the sea was calm and boats came home before a storm while the town slept "
    "under lamps that hummed softly over quiet streets of stone and old wood"
).split()


def texts_for(rng, count):
    return [" ".join(rng.choice(WORDS) for _ in range(rng.randint(6, 14))) for _ in range(count)]


def post(connection, model, texts):
    body = json.dumps({"model": model, "input": texts})
    connection.request("POST", "/v1/embeddings", body, {"Content-Type": "application/json"})
    response = connection.getresponse()
    payload = response.read()
    if response.status != 200:
        sys.exit(f"the server answered {response.status}: {payload[:300]!r}")
    return json.loads(payload)


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--ondo", default="target/release/ondo")
    parser.add_argument("--preset", default="small")
    parser.add_argument("--texts", type=int, default=64)
    parser.add_argument("--rounds", type=int, default=7)
    args = parser.parse_args()

    home = tempfile.mkdtemp(prefix="ondo-bench-embed-")
    env = dict(
        os.environ,
        ONDO_HOME=os.path.join(home, "ondo"),
        HF_HOME=os.path.join(home, "hf"),
        HF_HUB_OFFLINE="1",
    )
    env.pop("HF_HUB_CACHE", None)
    # The server serves models by name: the encoder goes where a download
    # of `ondo-bench/encoder` would be, in this run's own cache.
    model = "ondo-bench/encoder"
    commit = "0" * 40
    repo = os.path.join(home, "hf", "hub", "models--ondo-bench--encoder")
    model_dir = os.path.join(repo, "snapshots", commit)
    os.makedirs(os.path.join(repo, "refs"))
    with open(os.path.join(repo, "refs", "main"), "w") as ref:
        ref.write(commit)
    subprocess.run(
        [args.ondo, "synth", args.preset, model_dir, "--encoder", "bert"],
        env=env,
        check=True,
        stdout=subprocess.DEVNULL,
    )
    server = subprocess.Popen(
        [args.ondo, "serve", "--port", "0", "--no-history"],
        env=env,
        stdout=subprocess.PIPE,
        stderr=subprocess.DEVNULL,
        text=True,
    )
    try:
        url = urlparse(next(w for w in server.stdout.readline().split() if w.startswith("http://")))
        connection = http.client.HTTPConnection(url.hostname, url.port, timeout=600)
        rng = random.Random(0)
        # Warm-up: the load, and both shapes once.
        post(connection, model, texts_for(rng, args.texts))
        for text in texts_for(rng, 4):
            post(connection, model, [text])
        ratios, batched_s, separate_s = [], [], []
        for round_index in range(args.rounds):
            texts = texts_for(rng, args.texts)
            timings = {}
            order = ["batched", "separate"] if round_index % 2 == 0 else ["separate", "batched"]
            for shape in order:
                start = time.perf_counter()
                if shape == "batched":
                    answer = post(connection, model, texts)
                    assert len(answer["data"]) == len(texts)
                else:
                    for text in texts:
                        post(connection, model, [text])
                timings[shape] = time.perf_counter() - start
            batched_s.append(timings["batched"])
            separate_s.append(timings["separate"])
            ratios.append(timings["separate"] / timings["batched"])
    finally:
        server.terminate()
        server.wait()
    result = {
        "preset": args.preset,
        "texts": args.texts,
        "rounds": args.rounds,
        "ratio_per_round": [round(r, 2) for r in ratios],
        "ratio_median": round(statistics.median(ratios), 2),
        "ratio_min": round(min(ratios), 2),
        "ratio_max": round(max(ratios), 2),
    }
    print(json.dumps(result, indent=2))
    print()
    print("| encoder | texts | rounds | 64 requests / 1 batch (median) | range |")
    print("|---|---|---|---|---|")
    print(
        f"| bert `{args.preset}` | {args.texts} | {args.rounds} | "
        f"{result['ratio_median']:.2f}x | {result['ratio_min']:.2f}x–{result['ratio_max']:.2f}x |"
    )


if __name__ == "__main__":
    main()
