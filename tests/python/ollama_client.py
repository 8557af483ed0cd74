"""Drives a running `ondo serve` with the official `ollama` package, as any
Ollama client would, and prints what it got as one JSON object.

    python ollama_client.py BASE_URL SCENARIO 'JSON ARGS'

Scenarios:
  basics      list, show, chat and generate (whole and streamed), ps
  keep_alive  a model loaded ahead, kept for a while, forever, then unloaded
  thinking    a chat with `think` (whole and streamed, sampled): the
              reasoning as the client reads it (`message.thinking`)
"""

import json
import sys

import ollama


def options(args):
    return {"num_predict": args["max_tokens"], "temperature": 0}


def messages(args):
    return [
        {"role": "system", "content": args["system"]},
        {"role": "user", "content": args["user"]},
    ]


def counters(response):
    return {
        key: response[key]
        for key in (
            "done",
            "done_reason",
            "total_duration",
            "load_duration",
            "prompt_eval_count",
            "prompt_eval_duration",
            "eval_count",
            "eval_duration",
        )
    }


def basics(client, args):
    model = args["model"]
    chat = client.chat(model=model, messages=messages(args), options=options(args), stream=False)
    pieces = []
    last = None
    for part in client.chat(
        model=model, messages=messages(args), options=options(args), stream=True
    ):
        pieces.append(part.message.content)
        last = part
    generated = client.generate(
        model=model, prompt=args["user"], system=args["system"], options=options(args), stream=False
    )
    generated_pieces = [
        part.response
        for part in client.generate(
            model=model,
            prompt=args["user"],
            system=args["system"],
            options=options(args),
            stream=True,
        )
    ]
    shown = client.show(model)
    return {
        "models": [m.model for m in client.list().models],
        "chat": {"text": chat.message.content, "role": chat.message.role, **counters(chat)},
        "chat_streamed": {
            "text": "".join(pieces),
            "parts": len(pieces),
            **counters(last),
        },
        "generate": {"text": generated.response, **counters(generated)},
        "generate_streamed": "".join(generated_pieces),
        "show": {
            "family": shown.details.family,
            "quantization_level": shown.details.quantization_level,
            "capabilities": shown.capabilities,
            "context_length": (shown.modelinfo or {}).get(
                f"{shown.details.family}.context_length"
            ),
        },
        "ps": [m.model for m in client.ps().models],
    }


def keep_alive(client, args):
    model = args["model"]
    seen = {}
    # No prompt: load only, kept 5 minutes.
    loaded = client.generate(model=model, keep_alive="5m")
    seen["load"] = {
        "done_reason": loaded.done_reason,
        "ps": [(m.model, m.expires_at.isoformat()) for m in client.ps().models],
    }
    client.chat(
        model=model,
        messages=messages(args),
        options=options(args),
        stream=False,
        keep_alive=-1,
    )
    seen["forever"] = [(m.model, m.expires_at.isoformat()) for m in client.ps().models]
    client.generate(model=model, prompt=args["user"], options=options(args), keep_alive=0)
    seen["after_zero"] = [m.model for m in client.ps().models]
    client.generate(model=model, keep_alive="10m")
    unloaded = client.generate(model=model, keep_alive=0)
    seen["unload"] = {
        "done_reason": unloaded.done_reason,
        "ps": [m.model for m in client.ps().models],
    }
    return seen


def thinking(client, args):
    asked = dict(
        model=args["model"],
        messages=messages(args),
        options={"num_predict": args["max_tokens"], "temperature": 1.0, "seed": args["seed"]},
        think=True,
    )
    whole = client.chat(**asked, stream=False)
    thoughts, content = [], []
    for part in client.chat(**asked, stream=True):
        thoughts.append(part.message.thinking or "")
        content.append(part.message.content or "")
    return {
        "whole": {"thinking": whole.message.thinking, "text": whole.message.content},
        "streamed": {"thinking": "".join(thoughts), "text": "".join(content)},
    }


SCENARIOS = {"basics": basics, "keep_alive": keep_alive, "thinking": thinking}


def main():
    base, scenario = sys.argv[1], sys.argv[2]
    args = json.loads(sys.argv[3]) if len(sys.argv) > 3 else {}
    client = ollama.Client(host=base, timeout=120)
    print(json.dumps(SCENARIOS[scenario](client, args)))


if __name__ == "__main__":
    main()
