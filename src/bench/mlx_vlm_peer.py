"""mlx-vlm side of `ondo bench --image FILE --peer mlx-vlm`: a JSON-lines worker.

    python src/bench/mlx_vlm_peer.py MODEL_DIR

Loads the model once with mlx_vlm.load, prints
  {"event":"ready","load_ms","mlx_version","mlx_vlm_version","device","model_type"}
then answers each stdin line
  {"system":"...","question":"...","images":["/path/a.png",...],
   "max_tokens":64,"prefill_step_size":2048}
with one line
  {"event":"result","generated_ids","prompt_tokens","generated_tokens",
   "ttft_ms","decode_ms","decode_tps","peak_memory_bytes"}
or {"event":"error","message":...}, and keeps serving. An empty line or EOF
exits.

A request is what mlx-vlm's own generate does for one chat turn: the chat
template over a system turn and a user turn of the images and the question,
the processor (decoding and resizing the files, tokenizing), then
generate_step with the greedy sampler, which embeds the image (vision tower
and projector) and prefills before it yields the first token.

Timing:
  ttft_ms     request line read -> first token id on the host (the template,
              the processor, the vision tower, the prefill, the first step)
  decode_ms   first token -> last token; decode_tps = (generated-1)/decode_s
  peak_memory_bytes
              MLX's peak, reset per request

generate_step yields exactly as many ids as asked: it does not stop at the
end of sequence (mlx-vlm's generate does that around it), so every request
makes max_tokens ids, like Ondo's benchmark with EOS ignored.
"""

import argparse
import json
import sys
import time

import mlx.core as mx
import mlx_vlm
from mlx_vlm import load
from mlx_vlm.generate import generate_step
from mlx_vlm.utils import load_image


def run(model, processor, request: dict, received: float) -> dict:
    content = [{"type": "image"} for _ in request["images"]]
    content.append({"type": "text", "text": request["question"]})
    messages = []
    if request.get("system"):
        messages.append({"role": "system", "content": request["system"]})
    messages.append({"role": "user", "content": content})
    prompt = processor.tokenizer.apply_chat_template(
        messages, tokenize=False, add_generation_prompt=True
    )
    mx.reset_peak_memory()
    inputs = processor(
        text=[prompt],
        images=[load_image(path) for path in request["images"]],
        add_special_tokens=False,
        return_tensors="mlx",
    )
    ids = mx.array(inputs["input_ids"])
    pixels = mx.array(inputs["pixel_values"])
    # What else the processor gives (Qwen's image grids) goes to the model
    # as mlx-vlm's own generate passes it.
    extra = {
        key: mx.array(value)
        for key, value in inputs.items()
        if key not in ("input_ids", "pixel_values", "attention_mask")
    }
    mask = mx.ones(ids.shape, dtype=mx.int32)
    max_tokens = int(request["max_tokens"])
    generated = []
    first = None
    steps = generate_step(
        ids,
        model,
        pixels,
        mask,
        max_tokens=max_tokens,
        temperature=0.0,
        prefill_step_size=int(request.get("prefill_step_size", 2048)),
        **extra,
    )
    for (token, _), _ in zip(steps, range(max_tokens)):
        generated.append(int(token))
        if first is None:
            first = time.perf_counter()
    last = time.perf_counter()
    decode_s = last - first
    return {
        "event": "result",
        "generated_ids": generated,
        "prompt_tokens": int(ids.shape[1]),
        "generated_tokens": len(generated),
        "ttft_ms": (first - received) * 1e3,
        "decode_ms": decode_s * 1e3,
        "decode_tps": (len(generated) - 1) / decode_s if decode_s > 0 else None,
        "peak_memory_bytes": int(mx.get_peak_memory()),
    }


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("model")
    args = parser.parse_args()

    # The protocol owns stdout; anything a library prints goes to stderr.
    protocol, sys.stdout = sys.stdout, sys.stderr

    def emit(message: dict) -> None:
        protocol.write(json.dumps(message) + "\n")
        protocol.flush()

    started = time.perf_counter()
    try:
        model, processor = load(args.model)
    except Exception as error:
        emit({"event": "error", "message": f"load failed: {type(error).__name__}: {error}"})
        return 1
    emit(
        {
            "event": "ready",
            "load_ms": (time.perf_counter() - started) * 1e3,
            "mlx_version": mx.__version__,
            "mlx_vlm_version": mlx_vlm.__version__,
            "device": str(mx.default_device()),
            "model_type": getattr(model.config, "model_type", None),
        }
    )
    while True:
        line = sys.stdin.readline()
        received = time.perf_counter()
        if not line.strip():  # "" at EOF, "\n" for an empty line
            break
        try:
            emit(run(model, processor, json.loads(line), received))
        except Exception as error:  # one bad request must not end the worker
            emit({"event": "error", "message": f"{type(error).__name__}: {error}"})
    return 0


if __name__ == "__main__":
    sys.exit(main())
