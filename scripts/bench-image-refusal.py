#!/usr/bin/env python3
"""Images over the limits against Ondo's server: how long a refusal takes,
and whether a conversation decoding beside the refusals slows.

    bench-image-refusal.py --ondo ONDO --model DIR [--reps 5] [--gen 256]

Two uploads, each through the OpenAI route as a data: URL: a 50 MB body
(an image of 37.5 MB of bytes, over the 20 MiB limit) and a 40-megapixel
PNG (a small file whose header names 8000x5000 pixels, over the 32
megapixel limit). Each is timed from the request's first byte sent to the
refusal read back; its status and message are kept. Then a text request of
GEN tokens runs alone, and again while another thread sends the uploads
one after another; the same 50 MB body cut short of its last brace (not
JSON: refused once read and scanned) gives the floor under the first; its decode rate (the server's `ondo.decode_tps`) with
them over without them says what the refusals cost a conversation.
Prints one JSON object.
"""

import argparse
import base64
import importlib.util
import io
import json
import os
import statistics
import threading
import time
import urllib.error
import urllib.request

HERE = os.path.dirname(os.path.abspath(__file__))


def bench_vision():
    spec = importlib.util.spec_from_file_location("bench_vision", os.path.join(HERE, "bench-vision.py"))
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def post(url, body):
    """(seconds, status, text) of one chat request with `body` (bytes are
    sent as they are)."""
    data = body if isinstance(body, bytes) else json.dumps(body).encode()
    request = urllib.request.Request(
        url + "/v1/chat/completions", data=data, headers={"content-type": "application/json"}
    )
    started = time.perf_counter()
    try:
        with urllib.request.urlopen(request, timeout=600) as answer:
            text = answer.read().decode()
            status = answer.status
    except urllib.error.HTTPError as error:
        text = error.read().decode()
        status = error.code
    return time.perf_counter() - started, status, text


def image_body(model, data_url):
    return {
        "model": model,
        "messages": [
            {
                "role": "user",
                "content": [
                    {"type": "image_url", "image_url": {"url": data_url}},
                    {"type": "text", "text": "What is this?"},
                ],
            }
        ],
        "max_tokens": 8,
    }


def large_png():
    """A PNG of 8000x5000 pixels of one colour: a small file."""
    from PIL import Image

    out = io.BytesIO()
    Image.new("RGB", (8000, 5000), (200, 210, 220)).save(out, "PNG", optimize=True)
    return out.getvalue()


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--ondo", required=True)
    parser.add_argument("--model", required=True)
    parser.add_argument("--reps", type=int, default=5)
    parser.add_argument("--gen", type=int, default=256)
    args = parser.parse_args()
    vision = bench_vision()
    png = base64.b64encode(large_png()).decode()
    heavy = base64.b64encode(os.urandom(37_500_000)).decode()
    uploads = {
        "50mb_upload": image_body(vision.REPO, "data:image/png;base64," + heavy),
        "40mp_image": image_body(vision.REPO, "data:image/png;base64," + png),
    }
    # The floor under the 50 MB refusal: the same bytes with the last brace
    # cut, which the server can refuse only after reading and scanning them
    # all (sending 50 MB over loopback and reading it is most of the time).
    floor = json.dumps(uploads["50mb_upload"]).encode()[:-1]
    text = {
        "model": vision.REPO,
        "messages": [{"role": "user", "content": "Tell me a long story."}],
        "max_tokens": args.gen,
        "temperature": 0,
        "ignore_eos": True,
    }
    server, url = vision.start_server(args.ondo, args.model)
    try:
        post(url, dict(text, max_tokens=4))
        refusals = {}
        for name, body in uploads.items():
            samples, status, message = [], None, ""
            for _ in range(args.reps):
                seconds, status, message = post(url, body)
                samples.append(seconds * 1e3)
            refusals[name] = {
                "status": status,
                "message": json.loads(message).get("error", {}).get("message", message)
                if message.startswith("{")
                else message,
                "ms": vision.spread(samples),
                "body_bytes": len(json.dumps(body)),
            }
        floor_samples = []
        for _ in range(args.reps):
            seconds, floor_status, _ = post(url, floor)
            floor_samples.append(seconds * 1e3)
        refusals["50mb_body_not_json"] = {
            "status": floor_status,
            "ms": vision.spread(floor_samples),
            "body_bytes": len(floor),
        }
        alone, beside = [], []
        for _ in range(args.reps):
            _, _, answer = post(url, text)
            alone.append(json.loads(answer)["ondo"]["decode_tps"])
            stop = threading.Event()

            def refuse_until_stopped():
                while not stop.is_set():
                    for body in uploads.values():
                        post(url, body)

            thread = threading.Thread(target=refuse_until_stopped)
            thread.start()
            _, _, answer = post(url, text)
            stop.set()
            thread.join()
            beside.append(json.loads(answer)["ondo"]["decode_tps"])
    finally:
        server.terminate()
        server.wait()
    print(
        json.dumps(
            {
                "model": args.model,
                "refusals": refusals,
                "decode_tps_alone": vision.spread(alone),
                "decode_tps_beside_refusals": vision.spread(beside),
                "decode_ratio": statistics.median(beside) / statistics.median(alone),
            },
            indent=1,
        )
    )


if __name__ == "__main__":
    main()
