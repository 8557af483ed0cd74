#!/usr/bin/env python3
"""One image and a question, Ondo's server against mlx-vlm on the same model
folder and file, in one process, alternating sides.

    bench-vision.py --ondo ONDO --model DIR --image FILE [--reps 5] [--gen 64]

Ondo: `ondo serve` (warm: one load before the first timed request), each
request through the OpenAI route with the image as a data: URL; its `ondo`
record gives the time to first token (decoding and resizing the image, the
vision tower and projector, the prefill, the first token), the encode time
alone, and the decode rate. mlx-vlm: the model loaded once in this process;
a request is its processor (decoding, resizing, tokenizing) and
generate_step, timed to its first token and to its last. Each repetition
has its own system prompt, so neither side reuses the image tokens of the
one before (Ondo would: the same image at the same place is not encoded
again). Prints one JSON object: per side the samples, medians and spread,
and the ratios Ondo / mlx-vlm.
"""

import argparse
import base64
import importlib.util
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
import urllib.request

HERE = os.path.dirname(os.path.abspath(__file__))


def spread(values):
    return {
        "median": statistics.median(values),
        "min": min(values),
        "max": max(values),
        "samples": values,
    }


#: The name the server knows the model by: a Hugging Face cache of this
#: script's own holds it (the server takes repo ids, not folders).
REPO = "ondo-bench/vision"


def start_server(ondo, model):
    cache = tempfile.mkdtemp(prefix="bench-vision-hf-")
    repo = os.path.join(cache, "models--" + REPO.replace("/", "--"))
    commit = "0" * 40
    os.makedirs(os.path.join(repo, "snapshots"))
    os.makedirs(os.path.join(repo, "refs"))
    os.symlink(os.path.abspath(model), os.path.join(repo, "snapshots", commit))
    with open(os.path.join(repo, "refs", "main"), "w") as ref:
        ref.write(commit)
    server = subprocess.Popen(
        [ondo, "serve", "--port", "0"],
        stdout=subprocess.PIPE,
        stderr=subprocess.DEVNULL,
        text=True,
        env={**os.environ, "HF_HUB_CACHE": cache, "HF_HUB_OFFLINE": "1"},
    )
    line = server.stdout.readline()
    url = next(word for word in line.split() if word.startswith("http://"))
    return server, url


def ondo_request(url, model, data_url, question, system, gen):
    body = {
        "model": model,
        "messages": [
            {"role": "system", "content": system},
            {
                "role": "user",
                "content": [
                    {"type": "image_url", "image_url": {"url": data_url}},
                    {"type": "text", "text": question},
                ],
            },
        ],
        "max_tokens": gen,
        "temperature": 0,
        "ignore_eos": True,
    }
    request = urllib.request.Request(
        url + "/v1/chat/completions",
        data=json.dumps(body).encode(),
        headers={"content-type": "application/json"},
    )
    with urllib.request.urlopen(request, timeout=600) as answer:
        return json.loads(answer.read())["ondo"]


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--ondo", required=True)
    parser.add_argument("--model", required=True)
    parser.add_argument("--image", required=True)
    parser.add_argument("--question", default="Describe this image in detail.")
    parser.add_argument("--reps", type=int, default=5)
    parser.add_argument("--gen", type=int, default=64)
    args = parser.parse_args()

    from mlx_vlm import load

    # mlx-vlm's side is the one `ondo bench --image --peer mlx-vlm` runs.
    spec = importlib.util.spec_from_file_location(
        "mlx_vlm_peer", os.path.join(HERE, "..", "src", "bench", "mlx_vlm_peer.py")
    )
    peer = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(peer)

    data = base64.b64encode(open(args.image, "rb").read()).decode()
    data_url = "data:image/png;base64," + data
    server, url = start_server(args.ondo, args.model)
    try:
        # The load, and the first compilations, out of the timed requests.
        ondo_request(url, REPO, data_url, args.question, "Warm up.", 4)
        model, processor = load(args.model)

        def vlm_once(system):
            request = {
                "system": system,
                "question": args.question,
                "images": [args.image],
                "max_tokens": args.gen,
                "prefill_step_size": 2048,
            }
            return peer.run(model, processor, request, time.perf_counter())

        vlm_once("Warm up.")
        ondo_runs, vlm_runs = [], []
        for rep in range(args.reps):
            system = f"Repetition {rep} of the benchmark."
            if rep % 2 == 0:
                ondo_runs.append(ondo_request(url, REPO, data_url, args.question, system, args.gen))
                vlm_runs.append(vlm_once(system))
            else:
                vlm_runs.append(vlm_once(system))
                ondo_runs.append(ondo_request(url, REPO, data_url, args.question, system, args.gen))
    finally:
        server.terminate()
        server.wait()

    ondo = {
        "ttft_ms": spread([r["ttft_ms"] for r in ondo_runs]),
        "image_encode_ms": spread([r["image_encode_ms"] for r in ondo_runs]),
        "prefill_ms": spread([r["prefill_ms"] for r in ondo_runs]),
        "decode_tps": spread([r["decode_tps"] for r in ondo_runs]),
        "prompt_tokens": ondo_runs[0]["prompt_tokens"],
        "image_tokens": ondo_runs[0]["image_tokens"],
    }
    vlm = {
        "ttft_ms": spread([r["ttft_ms"] for r in vlm_runs]),
        "decode_tps": spread([r["decode_tps"] for r in vlm_runs]),
        "prompt_tokens": vlm_runs[0]["prompt_tokens"],
    }
    print(
        json.dumps(
            {
                "model": args.model,
                "image": args.image,
                "gen": args.gen,
                "reps": args.reps,
                "ondo": ondo,
                "mlx_vlm": vlm,
                "ttft_ratio": ondo["ttft_ms"]["median"] / vlm["ttft_ms"]["median"],
                "decode_ratio": ondo["decode_tps"]["median"] / vlm["decode_tps"]["median"],
            },
            indent=1,
        )
    )


if __name__ == "__main__":
    sys.exit(main())
