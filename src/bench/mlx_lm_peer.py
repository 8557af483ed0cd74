"""mlx-lm side of `ondo bench --peer mlx-lm`: a JSON-lines generation worker.

    python src/bench/mlx_lm_peer.py MODEL_DIR [--process-start-ns NS]
    python src/bench/mlx_lm_peer.py MODEL_DIR --cold --prompt-ids 1,2,3 \
        [--max-tokens 1] [--prefill-step-size 2048] [--max-kv-size N] [--process-start-ns NS]

Serve mode loads the model once, prints
  {"event":"ready","load_ms","process_to_loaded_ms","spawn_to_loaded_ms",
   "mlx_version","mlx_lm_version","device","model_type"}
then answers each stdin line
  {"prompt_ids":[...],"max_tokens":128,"prefill_step_size":2048,"max_kv_size":null,
   "kv_bits":null,"kv_group_size":64,"quantized_kv_start":5000}
(an optional "id" is echoed back) with one line
  {"event":"result","generated_ids","prompt_tokens","generated_tokens",
   "ttft_ms","decode_ms","decode_tps","prefill_tps",
   "prompt_tps","generation_tps","peak_memory_bytes","kv_cache"}
or {"event":"error","message":...}, and keeps serving. A line
  {"score_ids":[...],"tokens":[A,B],"route_from":P}
asks, not timed, how the model scores tokens A and B as the next token after
score_ids, in its own dtype and again with every floating-point weight in
float32, answering
  {"event":"score","logits":[a,b],"logits_f32":[a,b],"rounding":R,"routing":...}
where R is the root mean square, over the whole vocabulary, of the model's
own logits minus the float32 ones: how far rounding moves a logit there.
For a model with routed experts, the positions from P (optional; default
the last of score_ids) to the last are fed one at a time, as decode steps
are, and "routing" is the expert choice nearest to a tie over them:
  {"layer","position","margin_f32","rounding","top_k","experts","ranks",
   "routed_layers"}
where margin_f32 is the float32 model's k-th best router score minus its
(k+1)-th at that layer and position, rounding the root mean square over
those positions of that layer's router scores in the model's own dtype minus
the float32 ones, and ranks what the block ranks ("softmax", "sigmoid" or
"logits"); the nearest is the one with the smallest margin in roundings. For
a model without routed experts "routing" is null. An empty line or EOF
exits. --cold answers the one request given on the command line with the
same fields plus "event":"cold", load_ms, process_to_loaded_ms and
process_to_first_token_ms, then exits.

Timing:
  ttft_ms      request line read -> first token id on the host (generate_step
               runs mx.eval on it before yielding it)
  decode_ms    first token -> last token; decode_tps = (generated-1)/decode_s
  prefill_tps  prompt_tokens / ttft_s
  prompt_tps, generation_tps, peak_memory_bytes
               stream_generate's own numbers from its last GenerationResponse
               (prompt_tps = prompt tokens / its time to first token;
               generation_tps = generated tokens, the first included, / time
               since the first token; peak memory is reset per request)
  process_to_loaded_ms / process_to_first_token_ms
               from the top of this script (time.perf_counter), or for
               spawn_to_loaded_ms and, when --process-start-ns is given,
               process_to_first_token_ms, from the parent's time.time_ns()
               taken right before it spawned this process.

Generation runs through mlx_lm.stream_generate with the greedy sampler. It
stops at the tokenizer's EOS ids, so they are cleared after loading (the
public TokenizerWrapper.eos_token_ids setter): every request yields exactly
max_tokens ids, like Ondo's benchmark.
"""

import time

# Taken before the heavy imports so start-up cost counts in the cold numbers.
SCRIPT_START = time.perf_counter()

import argparse
import inspect
import json
import re
import sys

import mlx.core as mx
import mlx.nn as nn
import mlx_lm
from mlx_lm import load, stream_generate
from mlx_lm.models.cache import KVCache, RotatingKVCache, make_prompt_cache
from mlx_lm.sample_utils import greedy_sampler
from mlx.utils import tree_map


def make_cache(model, max_kv_size):
    """make_prompt_cache, with max_kv_size honoured for every model.

    make_prompt_cache ignores max_kv_size when the model has its own
    make_cache (llama does in mlx-lm 0.32.2), so swap its plain KVCache layers
    for the RotatingKVCache(max_size=N, keep=4) it builds for other models.
    """
    cache = make_prompt_cache(model, max_kv_size=max_kv_size)
    if max_kv_size is None:
        return cache
    return [
        RotatingKVCache(max_size=max_kv_size, keep=4) if type(c) is KVCache else c
        for c in cache
    ]


def run(model, tokenizer, request: dict, received: float):
    """Generate for one request; `received` is its perf_counter arrival time.

    Returns the result and the first token's perf_counter and time_ns times.
    """
    prompt_ids = [int(t) for t in request["prompt_ids"]]
    max_tokens = int(request.get("max_tokens", 128))
    if not prompt_ids:
        raise ValueError("prompt_ids is empty")
    # MLX gathers out-of-range embedding rows without complaint.
    vocab = getattr(getattr(model, "args", None), "vocab_size", None)
    if vocab is not None and not all(0 <= t < vocab for t in prompt_ids):
        raise ValueError(f"prompt_ids must lie in [0, {vocab})")
    if max_tokens < 1:
        raise ValueError("max_tokens must be at least 1")
    cache = make_cache(model, request.get("max_kv_size"))

    mx.reset_peak_memory()
    generated, first, first_ns, last = [], None, None, None
    for response in stream_generate(
        model,
        tokenizer,
        prompt_ids,
        max_tokens=max_tokens,
        sampler=greedy_sampler,
        prompt_cache=cache,
        prefill_step_size=int(request.get("prefill_step_size", 2048)),
        # generate_step quantizes the cache after a pass that leaves it
        # holding quantized_kv_start positions.
        kv_bits=request.get("kv_bits"),
        kv_group_size=int(request.get("kv_group_size") or 64),
        quantized_kv_start=int(request.get("quantized_kv_start") or 0),
    ):
        last = time.perf_counter()
        if first is None:
            first, first_ns = last, time.time_ns()
        generated.append(int(response.token))
        final = response

    ttft_s, decode_s = first - received, last - first
    n = len(generated)
    result = {
        "event": "result",
        "generated_ids": generated,
        "prompt_tokens": len(prompt_ids),
        "generated_tokens": n,
        "ttft_ms": ttft_s * 1e3,
        "decode_ms": decode_s * 1e3,
        "decode_tps": (n - 1) / decode_s if n > 1 and decode_s > 0 else None,
        "prefill_tps": len(prompt_ids) / ttft_s,
        "prompt_tps": final.prompt_tps,
        "generation_tps": final.generation_tps,
        # GenerationResponse reports GB (bytes / 1e9).
        "peak_memory_bytes": round(final.peak_memory * 1e9),
        "kv_cache": "+".join(sorted({type(c).__name__ for c in cache})),
    }
    if "id" in request:
        result["id"] = request["id"]
    return result, first, first_ns


class Recording:
    """The outputs one router gave while recording was on (a plain object,
    so that MLX's module tree does not take the list for parameters)."""

    def __init__(self):
        self.active = False
        self.outputs = []


class RouterRecorder(nn.Module):
    """Stands in for a router module while scoring: calls it and keeps its
    output. Its child is the router itself, so widening the model's
    parameters to float32 widens the router too."""

    def __init__(self, router, recording):
        super().__init__()
        self.router = router
        self.recording = recording

    def __call__(self, x):
        out = self.router(x)
        if self.recording.active:
            self.recording.outputs.append(out)
        return out


class Router:
    """One block with routed experts: where its router module sits, how many
    experts it picks of how many, and what it ranks to pick them."""

    def __init__(self, layer, block, name, top_k, experts, ranks):
        self.layer, self.block, self.name = layer, block, name
        self.top_k, self.experts, self.ranks = top_k, experts, ranks
        self.module = block[name]
        self.recording = Recording()

    def ranked(self, output):
        """What the block ranks, from the router's output, in the output's
        own dtype (a bfloat16 softmax can tie where its logits do not)."""
        if self.ranks == "softmax":
            output = mx.softmax(output, axis=-1, precise=True)
        elif self.ranks == "sigmoid":
            output = mx.sigmoid(output)
        return output.astype(mx.float32).reshape(-1, self.experts)


def ranked_transform(block) -> str:
    """What a block's forward ranks to choose its experts: "softmax" or
    "sigmoid" where it applies one to the router's output before its top-k
    (argpartition, topk or argsort), else "logits". Read from the block's
    source, as mlx-lm writes each family in plain code; both functions keep
    the logits' order, so the choice only changes how a near tie is
    measured, never which experts are the top k."""
    try:
        source = inspect.getsource(type(block).__call__)
    except (OSError, TypeError):
        return "logits"
    choose = re.search(r"(argpartition|topk|argsort)\(", source)
    before = source[: choose.start()] if choose else source
    for name in ("softmax", "sigmoid"):
        if f"{name}(" in before:
            return name
    return "logits"


def find_routers(model) -> list:
    """Every block with routed experts, in layer order. The generic rule
    mlx-lm's families follow: a block has its k as an integer `top_k` or
    `num_experts_per_tok`, its expert count as `num_experts` or
    `num_local_experts` (its own, or its switch layers' `num_experts`), and
    a direct child Linear (`gate`, `router`) with one output per expert."""
    routers = []
    for path, block in model.named_modules():
        top_k = next(
            (v for a in ("top_k", "num_experts_per_tok")
             if isinstance(v := getattr(block, a, None), int)),
            None,
        )
        if top_k is None:
            continue
        experts = None
        for _, inner in block.named_modules():
            for attribute in ("num_experts", "num_local_experts"):
                value = getattr(inner, attribute, None)
                if isinstance(value, int) and experts is None:
                    experts = value
        if experts is None or top_k >= experts:
            continue
        linears = [
            (name, child)
            for name, child in block.children().items()
            if isinstance(child, (nn.Linear, nn.QuantizedLinear))
            and child.weight.shape[0] == experts
        ]
        linears.sort(key=lambda nc: nc[0] not in ("gate", "router"))
        if not linears:
            continue
        layer = next((int(part) for part in path.split(".") if part.isdigit()), len(routers))
        routers.append(Router(layer, block, linears[0][0], top_k, experts, ranked_transform(block)))
    routers.sort(key=lambda r: r.layer)
    return routers


def decode_path(model, ids: list[int], route_from: int, routers: list):
    """The float32 logits for the token after `ids`, and each router's
    ranked scores [rows, experts] (float32) at positions route_from onward
    with the position of each row. The positions before route_from are fed
    in chunks, as generation prefills a prompt (no [L, vocab] array at
    once); the rest one at a time, as decode steps are, so their rounding is
    a decode step's."""
    cache = make_prompt_cache(model)
    tokens = mx.array(ids)
    for start in range(0, route_from, 512):
        model(tokens[None, start : min(start + 512, route_from)], cache=cache)
        mx.eval([c.state for c in cache])
    for router in routers:
        router.recording.outputs = []
        router.recording.active = True
    ranked = [[] for _ in routers]
    positions = [[] for _ in routers]
    try:
        for position in range(route_from, len(ids)):
            logits = model(tokens[None, position : position + 1], cache=cache)
            for scores, rows_at, router in zip(ranked, positions, routers):
                for out in router.recording.outputs:
                    scores.append(router.ranked(out))
                    rows_at.extend([position] * (out.size // router.experts))
                router.recording.outputs = []
            # The head is evaluated only where its logits are asked for.
            mx.eval([c.state for c in cache], ranked)
    finally:
        for router in routers:
            router.recording.active = False
            router.recording.outputs = []
    logits = logits[0, -1].astype(mx.float32)
    mx.eval(logits)
    # A router its block did not call (none of mlx-lm's) has no rows.
    return logits, [
        (mx.concatenate(scores, axis=0) if scores else None, rows_at)
        for scores, rows_at in zip(ranked, positions)
    ]


def nearest_routing_tie(routers, native, exact):
    """The expert choice nearest to a tie on the path, in roundings of its
    layer (see the module doc), or None for a model without routers."""
    nearest = None
    for router, (own, _), (f32, row_positions) in zip(routers, native, exact):
        if own is None or f32 is None:
            continue
        rounding = mx.sqrt(mx.mean(mx.square(own - f32))).item()
        ordered = mx.sort(f32, axis=-1)[:, ::-1]
        margins = ordered[:, router.top_k - 1] - ordered[:, router.top_k]
        at = mx.argmin(margins).item()
        margin = margins[at].item()
        if rounding > 0:
            roundings = margin / rounding
        else:
            roundings = 0.0 if margin <= 0 else float("inf")
        if nearest is None or (roundings, margin) < nearest[0]:
            nearest = ((roundings, margin), {
                "layer": router.layer,
                "position": row_positions[at],
                "margin_f32": margin,
                "rounding": rounding,
                "top_k": router.top_k,
                "experts": router.experts,
                "ranks": router.ranks,
                "routed_layers": len(routers),
            })
    return nearest[1] if nearest else None


def score(model, routers: list, request: dict) -> dict:
    """How the model ranks two candidate next tokens, how much rounding in
    its own dtype moves a logit at that position, and for routed experts the
    expert choice nearest to a tie on the way (see the module doc)."""
    ids = [int(t) for t in request["score_ids"]]
    tokens = [int(t) for t in request["tokens"]]
    if not ids:
        raise ValueError("score_ids is empty")
    route_from = request.get("route_from")
    route_from = len(ids) - 1 if route_from is None else int(route_from)
    if not 0 <= route_from < len(ids):
        raise ValueError(f"route_from must lie in [0, {len(ids)})")
    if not routers:
        # Nothing to record: the prefix in chunks, the last position alone.
        route_from = len(ids) - 1
    # The recorders stand in for the routers only while scoring, so the
    # timed generation runs the model as loaded.
    for router in routers:
        router.block[router.name] = RouterRecorder(router.module, router.recording)
    try:
        native, native_routes = decode_path(model, ids, route_from, routers)
        params = model.parameters()
        widen = lambda p: p.astype(mx.float32) if mx.issubdtype(p.dtype, mx.floating) else p
        model.update(tree_map(widen, params))
        try:
            exact, exact_routes = decode_path(model, ids, route_from, routers)
        finally:
            model.update(params)
    finally:
        for router in routers:
            router.block[router.name] = router.module
    rounding = mx.sqrt(mx.mean(mx.square(native - exact))).item()
    result = {
        "event": "score",
        "logits": [native[t].item() for t in tokens],
        "logits_f32": [exact[t].item() for t in tokens],
        "rounding": rounding,
        "routing": nearest_routing_tie(routers, native_routes, exact_routes),
    }
    if "id" in request:
        result["id"] = request["id"]
    return result


def parse_ids(text: str) -> list[int]:
    return [int(part) for part in text.split(",") if part.strip()]


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("model")
    parser.add_argument("--process-start-ns", type=int)
    parser.add_argument("--cold", action="store_true")
    parser.add_argument("--prompt-ids", type=parse_ids)
    parser.add_argument("--max-tokens", type=int, default=1)
    parser.add_argument("--prefill-step-size", type=int, default=2048)
    parser.add_argument("--max-kv-size", type=int)
    args = parser.parse_args()
    if args.cold and not args.prompt_ids:
        parser.error("--cold needs --prompt-ids")

    # The protocol owns stdout; anything a library prints goes to stderr.
    protocol, sys.stdout = sys.stdout, sys.stderr

    def emit(message: dict) -> None:
        protocol.write(json.dumps(message) + "\n")
        protocol.flush()

    load_start = time.perf_counter()
    try:
        model, tokenizer = load(args.model)
    except Exception as error:
        emit({"event": "error", "message": f"load failed: {type(error).__name__}: {error}"})
        return 1
    # stream_generate stops at EOS; the benchmark wants exactly max_tokens.
    tokenizer.eos_token_ids = []
    loaded, loaded_ns = time.perf_counter(), time.time_ns()
    startup = {
        "load_ms": (loaded - load_start) * 1e3,
        "process_to_loaded_ms": (loaded - SCRIPT_START) * 1e3,
        "spawn_to_loaded_ms": (
            (loaded_ns - args.process_start_ns) / 1e6
            if args.process_start_ns is not None
            else None
        ),
    }

    if args.cold:
        request = {
            "prompt_ids": args.prompt_ids,
            "max_tokens": args.max_tokens,
            "prefill_step_size": args.prefill_step_size,
            "max_kv_size": args.max_kv_size,
        }
        result, first, first_ns = run(model, tokenizer, request, time.perf_counter())
        if args.process_start_ns is not None:
            to_first = (first_ns - args.process_start_ns) / 1e6
        else:
            to_first = (first - SCRIPT_START) * 1e3
        emit({**result, "event": "cold", **startup, "process_to_first_token_ms": to_first})
        return 0

    routers = find_routers(model)
    emit(
        {
            "event": "ready",
            **startup,
            "mlx_version": mx.__version__,
            "mlx_lm_version": mlx_lm.__version__,
            "device": str(mx.default_device()),
            "model_type": getattr(model, "model_type", None),
        }
    )
    while True:
        line = sys.stdin.readline()
        received = time.perf_counter()
        if not line.strip():  # "" at EOF, "\n" for an empty line
            break
        try:
            request = json.loads(line)
            if "score_ids" in request:
                emit(score(model, routers, request))
                continue
            result, _, _ = run(model, tokenizer, request, received)
            emit(result)
        except Exception as error:  # one bad request must not end the worker
            emit({"event": "error", "message": f"{type(error).__name__}: {error}"})
    return 0


if __name__ == "__main__":
    sys.exit(main())
