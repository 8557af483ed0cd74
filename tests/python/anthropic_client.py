"""Drives a running `ondo serve` with the official `anthropic` package, as
Claude Code and other Anthropic clients would, and prints what it got as one
JSON object.

    python anthropic_client.py BASE_URL SCENARIO 'JSON ARGS'

Scenarios:
  basics   a message (whole, then streamed with `messages.stream`), the
           prompt's tokens counted, and a follow-up turn
  tools    a tool the model calls (whole and streamed), its result sent
           back, and the answer to it
  keys     the key as x-api-key and as a Bearer token, and a wrong one: the
           status and error each got
  errors   requests the server refuses, as the client's exceptions
"""

import json
import sys

import anthropic


def client_for(base, args, **how):
    how.setdefault("api_key", args.get("key", "no-key"))
    return anthropic.Anthropic(base_url=base, max_retries=0, timeout=120, **how)


def messages(args, user=None):
    return [{"role": "user", "content": user or args["user"]}]


def usage(message):
    return message.usage.to_dict()


def whole(client, args, msgs, **extra):
    message = client.messages.create(
        model=args["model"],
        system=args["system"],
        messages=msgs,
        max_tokens=args["max_tokens"],
        # Greedy. The client has no sampling arguments (Claude models set
        # their own); the server reads them from the body, as before.
        extra_body={"temperature": 0},
        **extra,
    )
    return message


def described(message):
    return {
        "id": message.id,
        "type": message.type,
        "role": message.role,
        "model": message.model,
        "content": [block.to_dict() for block in message.content],
        "text": "".join(b.text for b in message.content if b.type == "text"),
        "stop_reason": message.stop_reason,
        "stop_sequence": message.stop_sequence,
        "usage": usage(message),
        "ondo": (message.model_extra or {}).get("ondo"),
    }


def streamed(client, args, msgs, **extra):
    events, texts = [], []
    with client.messages.stream(
        model=args["model"],
        system=args["system"],
        messages=msgs,
        max_tokens=args["max_tokens"],
        # Greedy. The client has no sampling arguments (Claude models set
        # their own); the server reads them from the body, as before.
        extra_body={"temperature": 0},
        **extra,
    ) as stream:
        for event in stream:
            events.append(event.type)
            if event.type == "text":
                texts.append(event.text)
        final = stream.get_final_message()
    got = described(final)
    got["events"] = events
    got["text_events"] = "".join(texts)
    return got


def basics(client, args):
    first = messages(args)
    answer = whole(client, args, first)
    stream = streamed(client, args, first)
    counted = client.messages.count_tokens(
        model=args["model"], system=args["system"], messages=first
    )
    follow_up = first + [
        {"role": "assistant", "content": answer.content[0].text},
        {"role": "user", "content": "And then?"},
    ]
    second = whole(client, args, follow_up)
    # The same turn with the system prompt as blocks and the user's text in
    # two blocks reads as the same conversation.
    blocks = client.messages.count_tokens(
        model=args["model"],
        system=[{"type": "text", "text": args["system"], "cache_control": {"type": "ephemeral"}}],
        messages=[{"role": "user", "content": [{"type": "text", "text": args["user"]}]}],
    )
    return {
        "whole": described(answer),
        "streamed": stream,
        "count_tokens": counted.input_tokens,
        "count_tokens_blocks": blocks.input_tokens,
        "follow_up": described(second),
    }


WEATHER = {
    "name": "get_weather",
    "description": "The weather in a city now",
    "input_schema": {
        "type": "object",
        "properties": {"city": {"type": "string"}},
        "required": ["city"],
    },
}


def tools(client, args):
    first = messages(args)
    call = whole(client, args, first, tools=[WEATHER])
    stream = streamed(client, args, first, tools=[WEATHER])
    uses = [b for b in call.content if b.type == "tool_use"]
    results = [
        {"type": "tool_result", "tool_use_id": use.id, "content": [{"type": "text", "text": "21 C, clear"}]}
        for use in uses
    ]
    answered = whole(
        client,
        args,
        first
        + [
            {"role": "assistant", "content": [b.to_dict() for b in call.content]},
            {"role": "user", "content": results},
        ],
        tools=[WEATHER],
    )
    refused = whole(client, args, first, tools=[WEATHER], tool_choice={"type": "none"})
    counted = client.messages.count_tokens(
        model=args["model"], system=args["system"], messages=first, tools=[WEATHER]
    )
    return {
        "call": described(call),
        "streamed": stream,
        "answered": described(answered),
        "tool_choice_none": described(refused),
        "count_tokens": counted.input_tokens,
    }


def status_of(work):
    try:
        work()
    except anthropic.APIStatusError as error:
        return {
            "status": error.status_code,
            "exception": type(error).__name__,
            "body": error.body,
            "retry_after": error.response.headers.get("retry-after"),
        }
    return {"status": 200}


def keys(base, args):
    def ask(client):
        return lambda: client.messages.create(
            model="tiny", max_tokens=1, messages=[{"role": "user", "content": "hi"}]
        )

    return {
        "x_api_key": status_of(ask(client_for(base, args, api_key=args["key"]))),
        "bearer": status_of(ask(client_for(base, args, api_key=None, auth_token=args["key"]))),
        "wrong": status_of(ask(client_for(base, args, api_key="not-the-key"))),
    }


def errors(client, args):
    hi = [{"role": "user", "content": "hi"}]
    image = {
        "type": "image",
        "source": {"type": "base64", "media_type": "image/png", "data": "iVBORw0KGgo="},
    }
    return {
        # The client insists on max_tokens; a raw post leaves it out.
        "no_max_tokens": status_of(
            lambda: client.post(
                "/v1/messages",
                body={"model": "tiny", "messages": hi},
                cast_to=anthropic.types.Message,
            )
        ),
        "image": status_of(
            lambda: client.messages.create(
                model="tiny",
                max_tokens=4,
                messages=[{"role": "user", "content": [image, {"type": "text", "text": "What is it?"}]}],
            )
        ),
        "unknown_model": status_of(
            lambda: client.messages.create(model="org/missing", max_tokens=4, messages=hi)
        ),
        "unknown_block": status_of(
            lambda: client.messages.create(
                model="tiny",
                max_tokens=4,
                messages=[{"role": "user", "content": [{"type": "hologram", "text": "hi"}]}],
            )
        ),
        "count_unknown_model": status_of(
            lambda: client.messages.count_tokens(model="org/missing", messages=hi)
        ),
    }


def main():
    base, scenario = sys.argv[1], sys.argv[2]
    args = json.loads(sys.argv[3]) if len(sys.argv) > 3 else {}
    if scenario == "keys":
        print(json.dumps(keys(base, args)))
        return
    scenarios = {"basics": basics, "tools": tools, "errors": errors}
    print(json.dumps(scenarios[scenario](client_for(base, args), args)))


if __name__ == "__main__":
    main()
