#!/usr/bin/env python3
"""What the local server costs: decode speed and time to first token of
`ondo serve`, measured at the client from a streamed answer, against Ondo's
engine in-process (`ondo bench`) on the same model, in the same run; and
twelve streams at once (aggregate tokens/s, TTFT of the queued requests).

    scripts/bench-api.py [--ondo target/release/ondo] [--model tiny]
                         [--prompt-tokens 128] [--gen 128] [--rounds 7]

Each round runs one in-process repetition (`ondo bench --reps 1 --warmup 1`,
a process of its own), one streamed request to the server and one answered
whole (the server warm since a warm-up request), alternating the order. Requests are `/v1/completions` with
a prompt of token ids that differs per round (so no cache carries over),
greedy, `--gen` tokens with EOS ignored: the shape `ondo bench` runs.
Client-side TTFT is from sending the request to the first token's chunk;
client-side decode is (tokens - 1) / (last token's chunk - first token's).
Only the standard library is used on the client side, so the client adds
as little as a client can. Prints JSON and a Markdown table.
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
import threading
import time
from urllib.parse import urlparse


def start_server(ondo, env):
    server = subprocess.Popen(
        [ondo, "serve", "--port", "0", "--no-history"],
        env=env,
        stdout=subprocess.PIPE,
        stderr=subprocess.DEVNULL,
        text=True,
    )
    line = server.stdout.readline()
    url = next(word for word in line.split() if word.startswith("http://"))
    return server, urlparse(url)


def stream_completion(address, prompt_ids, gen):
    """One streamed request; client-side timings and Ondo's own record."""
    body = json.dumps(
        {
            "model": address["model"],
            "prompt": prompt_ids,
            "max_tokens": gen,
            "temperature": 0,
            "ignore_eos": True,
            "stream": True,
        }
    )
    connection = http.client.HTTPConnection(address["host"], address["port"], timeout=600)
    sent = time.perf_counter()
    connection.request("POST", "/v1/completions", body, {"Content-Type": "application/json"})
    response = connection.getresponse()
    if response.status != 200:
        raise RuntimeError(f"{response.status}: {response.read()[:500]!r}")
    first = last = None
    chunks = 0
    record = None
    for raw in response:
        line = raw.decode().strip()
        if not line.startswith("data: ") or line == "data: [DONE]":
            continue
        chunk = json.loads(line[len("data: ") :])
        now = time.perf_counter()
        if "ondo" in chunk:
            record = chunk["ondo"]
        # One chunk per token (its text may be empty while held back); the
        # chunk that ends the answer carries a finish_reason and no token.
        if chunk["choices"] and chunk["choices"][0]["finish_reason"] is None:
            chunks += 1
            first = first if first is not None else now
            last = now
    connection.close()
    tokens = record["generated_tokens"]
    # Text still held back at the end comes in one more chunk, right after
    # the last token's: at most one more than the tokens.
    if not tokens <= chunks <= tokens + 1:
        raise RuntimeError(f"{chunks} chunks for {tokens} tokens")
    return {
        "ttft_ms": (first - sent) * 1e3,
        "decode_tps": (tokens - 1) / (last - first),
        "server_ttft_ms": record["ttft_ms"],
        "server_decode_tps": record["decode_tps"],
        "queued_ms": record["queued_ms"],
        "tokens": tokens,
        "seconds": time.perf_counter() - sent,
    }


def whole_completion(address, prompt_ids, gen):
    """One request answered whole: the server's own record of it."""
    body = json.dumps(
        {
            "model": address["model"],
            "prompt": prompt_ids,
            "max_tokens": gen,
            "temperature": 0,
            "ignore_eos": True,
        }
    )
    connection = http.client.HTTPConnection(address["host"], address["port"], timeout=600)
    connection.request("POST", "/v1/completions", body, {"Content-Type": "application/json"})
    record = json.loads(connection.getresponse().read())["ondo"]
    connection.close()
    return {"server_ttft_ms": record["ttft_ms"], "server_decode_tps": record["decode_tps"]}


def in_process(ondo, env, model, prompt_tokens, gen):
    """One measured repetition of `ondo bench` (after its own warm-up)."""
    out = subprocess.run(
        [
            ondo, "bench", model,
            "--prompt-tokens", str(prompt_tokens), "--gen", str(gen),
            "--reps", "1", "--warmup", "1", "--cold", "0", "--loop", "pipelined",
            "--json",
        ],
        env=env, check=True, capture_output=True, text=True,
    ).stdout
    found = {}

    def walk(node):
        if isinstance(node, dict):
            for key in ("ttft_ms", "decode_tps"):
                value = node.get(key)
                if isinstance(value, dict) and value.get("samples"):
                    found.setdefault(key, value["samples"][0])
            for value in node.values():
                walk(value)
        elif isinstance(node, list):
            for value in node:
                walk(value)

    walk(json.loads(out))
    return found


def summary(values):
    return {
        "median": statistics.median(values),
        "min": min(values),
        "max": max(values),
        "samples": values,
    }


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--ondo", default="target/release/ondo")
    parser.add_argument("--model", default="tiny")
    parser.add_argument("--prompt-tokens", type=int, default=128)
    parser.add_argument("--gen", type=int, default=128)
    parser.add_argument("--rounds", type=int, default=7)
    parser.add_argument("--concurrent", type=int, default=12)
    args = parser.parse_args()

    home = tempfile.mkdtemp(prefix="ondo-bench-api-")
    env = dict(os.environ, ONDO_HOME=home)
    server, url = start_server(args.ondo, env)
    address = {"host": url.hostname, "port": url.port, "model": args.model}
    rng = random.Random(7)
    prompt = lambda: [rng.randrange(3, 1000) for _ in range(args.prompt_tokens)]
    try:
        stream_completion(address, prompt(), args.gen)  # warm-up: load, first kernels
        api, whole, local = [], [], []
        for n in range(args.rounds):
            sides = [
                lambda: api.append(stream_completion(address, prompt(), args.gen)),
                lambda: whole.append(whole_completion(address, prompt(), args.gen)),
                lambda: local.append(
                    in_process(args.ondo, env, args.model, args.prompt_tokens, args.gen)
                ),
            ]
            for side in sides if n % 2 == 0 else reversed(sides):
                side()

        # Twelve clients at once, each its own prompt.
        results = [None] * args.concurrent
        prompts = [prompt() for _ in range(args.concurrent)]

        def one(i):
            results[i] = stream_completion(address, prompts[i], args.gen)

        threads = [threading.Thread(target=one, args=(i,)) for i in range(args.concurrent)]
        started = time.perf_counter()
        for thread in threads:
            thread.start()
        for thread in threads:
            thread.join()
        wall = time.perf_counter() - started
    finally:
        server.terminate()
        server.wait()

    ttfts = sorted(r["ttft_ms"] for r in results)
    report = {
        "model": args.model,
        "prompt_tokens": args.prompt_tokens,
        "gen": args.gen,
        "rounds": args.rounds,
        "api_client": {
            "ttft_ms": summary([r["ttft_ms"] for r in api]),
            "decode_tps": summary([r["decode_tps"] for r in api]),
        },
        "api_server": {
            "ttft_ms": summary([r["server_ttft_ms"] for r in api]),
            "decode_tps": summary([r["server_decode_tps"] for r in api]),
        },
        "api_whole": {
            "ttft_ms": summary([r["server_ttft_ms"] for r in whole]),
            "decode_tps": summary([r["server_decode_tps"] for r in whole]),
        },
        "in_process": {
            "ttft_ms": summary([r["ttft_ms"] for r in local]),
            "decode_tps": summary([r["decode_tps"] for r in local]),
        },
        # Each round's API sample against the in-process one of the same
        # round: the machine's mood cancels out.
        "paired": {
            "decode_ratio": summary(
                [x["decode_tps"] / y["decode_tps"] for x, y in zip(api, local)]
            ),
            "ttft_overhead_ms": summary(
                [x["ttft_ms"] - y["ttft_ms"] for x, y in zip(api, local)]
            ),
            "whole_decode_ratio": summary(
                [x["server_decode_tps"] / y["decode_tps"] for x, y in zip(whole, local)]
            ),
        },
        "concurrent": {
            "clients": args.concurrent,
            "aggregate_tps": sum(r["tokens"] for r in results) / wall,
            "ttft_p50_ms": ttfts[len(ttfts) // 2],
            "ttft_p95_ms": ttfts[min(len(ttfts) - 1, round(0.95 * (len(ttfts) - 1)))],
            "wall_s": wall,
        },
    }
    print(json.dumps(report, indent=1))

    def cell(s, digits=1):
        return f"{s['median']:.{digits}f} ({s['min']:.{digits}f}–{s['max']:.{digits}f})"

    a, l = report["api_client"], report["in_process"]
    print()
    print("| | TTFT ms | decode tok/s |")
    print("|---|---|---|")
    print(f"| in-process (`ondo bench`) | {cell(l['ttft_ms'])} | {cell(l['decode_tps'])} |")
    print(f"| `ondo serve`, at the client | {cell(a['ttft_ms'])} | {cell(a['decode_tps'])} |")
    s = report["api_server"]
    print(f"| `ondo serve`, its own record | {cell(s['ttft_ms'])} | {cell(s['decode_tps'])} |")
    w = report["api_whole"]
    print(f"| `ondo serve`, whole answers, its own record | {cell(w['ttft_ms'])} | {cell(w['decode_tps'])} |")
    ratio = a["decode_tps"]["median"] / l["decode_tps"]["median"]
    overhead = a["ttft_ms"]["median"] - l["ttft_ms"]["median"]
    paired = report["paired"]
    print(
        f"\ndecode through the API / in-process: {ratio:.3f}x of the medians, "
        f"{paired['decode_ratio']['median']:.3f}x "
        f"({paired['decode_ratio']['min']:.3f}–{paired['decode_ratio']['max']:.3f}) round by round; "
        f"TTFT overhead {overhead:+.1f} ms of the medians, "
        f"{paired['ttft_overhead_ms']['median']:+.1f} ms round by round"
    )
    print(
        f"whole answers through the API / in-process, round by round: "
        f"{paired['whole_decode_ratio']['median']:.3f}x "
        f"({paired['whole_decode_ratio']['min']:.3f}–{paired['whole_decode_ratio']['max']:.3f})"
    )
    c = report["concurrent"]
    print(
        f"{c['clients']} streams at once: {c['aggregate_tps']:.0f} tok/s in all, "
        f"TTFT p50 {c['ttft_p50_ms']:.0f} ms, p95 {c['ttft_p95_ms']:.0f} ms"
    )


if __name__ == "__main__":
    sys.exit(main())
