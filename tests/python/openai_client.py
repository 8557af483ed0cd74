"""Drives a running `ondo serve` with the official `openai` package, as any
OpenAI client would, and prints what it got as one JSON object.

    python openai_client.py BASE_URL SCENARIO 'JSON ARGS'

Scenarios:
  basics      models, chat (whole and streamed with usage), a follow-up turn,
              completions (whole and streamed)
  concurrent  N chats streamed at once, each with its own prompt
  drop        a long stream closed after a few chunks, then a short request
              timed to its first token (and one before, for comparison)
  give_up     a long prompt whose client stops waiting during its prefill
              (a read timeout), then a short request timed to its first
              token (and one before, for comparison)
  wrong_key   a request with a wrong API key: the status and error it got
  thinking    a chat with `enable_thinking` (whole and streamed, sampled):
              the reasoning as the client reads it (`reasoning_content`, an
              extra field) beside the answer, and usage's reasoning tokens
"""

import json
import sys
import time
from concurrent.futures import ThreadPoolExecutor

import openai


def client_for(base, args):
    return openai.OpenAI(
        base_url=base + "/v1",
        api_key=args.get("key", "no-key"),
        max_retries=0,
        timeout=120,
    )


def messages(args, user=None):
    return [
        {"role": "system", "content": args["system"]},
        {"role": "user", "content": user or args["user"]},
    ]


def chat_whole(client, args, msgs):
    answer = client.chat.completions.create(
        model=args["model"],
        messages=msgs,
        max_tokens=args["max_tokens"],
        temperature=0,
    )
    choice = answer.choices[0]
    return {
        "text": choice.message.content,
        "finish_reason": choice.finish_reason,
        "usage": answer.usage.to_dict(),
        "ondo": (answer.model_extra or {}).get("ondo"),
        "model": answer.model,
        "object": answer.object,
    }


def chat_streamed(client, args, msgs):
    stream = client.chat.completions.create(
        model=args["model"],
        messages=msgs,
        max_tokens=args["max_tokens"],
        temperature=0,
        stream=True,
        stream_options={"include_usage": True},
    )
    pieces, finish_reason, usage, ondo, roles = [], None, None, None, 0
    for chunk in stream:
        if chunk.usage is not None:
            usage = chunk.usage.to_dict()
        extra = chunk.model_extra or {}
        if "ondo" in extra:
            ondo = extra["ondo"]
        for choice in chunk.choices:
            if choice.delta.role:
                roles += 1
            elif choice.delta.content is not None:
                # Empty while a token's text is held back; a chunk all the same.
                pieces.append(choice.delta.content)
            if choice.finish_reason:
                finish_reason = choice.finish_reason
    return {
        "text": "".join(pieces),
        "content_chunks": len(pieces),
        "role_chunks": roles,
        "finish_reason": finish_reason,
        "usage": usage,
        "ondo": ondo,
    }


def basics(client, args):
    first = messages(args)
    chat = chat_whole(client, args, first)
    streamed = chat_streamed(client, args, first)
    follow_up = first + [
        {"role": "assistant", "content": chat["text"]},
        {"role": "user", "content": "And then?"},
    ]
    second = chat_whole(client, args, follow_up)
    completion = client.completions.create(
        model=args["model"], prompt=args["user"], max_tokens=args["max_tokens"]
    )
    completion_pieces = [
        c.choices[0].text
        for c in client.completions.create(
            model=args["model"],
            prompt=args["user"],
            max_tokens=args["max_tokens"],
            stream=True,
        )
        if c.choices
    ]
    return {
        "models": [m.id for m in client.models.list()],
        "model": client.models.retrieve(args["model"]).id,
        "chat": chat,
        "streamed": streamed,
        "follow_up": second,
        "completion": {
            "text": completion.choices[0].text,
            "finish_reason": completion.choices[0].finish_reason,
            "usage": completion.usage.to_dict(),
        },
        "completion_streamed": "".join(completion_pieces),
    }


def concurrent(client, args):
    prompts = [f"Question number {n}: what is {n} times {n}?" for n in range(args["clients"])]

    def one(prompt):
        started = time.perf_counter()
        got = chat_streamed(client, args, messages(args, prompt))
        got["seconds"] = time.perf_counter() - started
        return got

    with ThreadPoolExecutor(max_workers=len(prompts)) as pool:
        streamed = list(pool.map(one, prompts))
    # The same prompts one by one, whole: what each stream should have said.
    alone = [chat_whole(client, args, messages(args, p))["text"] for p in prompts]
    return {"streamed": streamed, "alone": alone}


def first_token_seconds(client, args):
    started = time.perf_counter()
    stream = client.chat.completions.create(
        model=args["model"],
        messages=messages(args),
        max_tokens=4,
        temperature=0,
        stream=True,
    )
    first = None
    for chunk in stream:
        if first is None and chunk.choices and chunk.choices[0].delta.content:
            first = time.perf_counter() - started
    return first


def drop(client, args):
    before = first_token_seconds(client, args)
    stream = client.chat.completions.create(
        model=args["model"],
        messages=messages(args),
        max_tokens=args["long_tokens"],
        temperature=0,
        stream=True,
        extra_body={"ignore_eos": True},
    )
    received = 0
    for chunk in stream:
        if chunk.choices and chunk.choices[0].delta.content:
            received += 1
            if received == 5:
                break
    # Close the connection mid-answer, as a client that gives up does.
    stream.close()
    dropped_at = time.perf_counter()
    after = first_token_seconds(client, args)
    return {
        "before": before,
        "after": after,
        "after_drop": time.perf_counter() - dropped_at,
        "received": received,
    }


def give_up(client, args):
    before = first_token_seconds(client, args)
    impatient = client.with_options(timeout=args["patience_s"])
    given_up = False
    try:
        stream = impatient.chat.completions.create(
            model=args["model"],
            messages=messages(args, user=args["long_user"]),
            max_tokens=4,
            temperature=0,
            stream=True,
        )
        for _ in stream:
            pass
    except openai.APITimeoutError:
        # The client closed the connection, as one that gives up does.
        given_up = True
    gave_up_at = time.perf_counter()
    after = first_token_seconds(client, args)
    return {
        "before": before,
        "after": after,
        "after_giving_up": time.perf_counter() - gave_up_at,
        "given_up": given_up,
    }


def wrong_key(client, args):
    try:
        client.models.list()
    except openai.AuthenticationError as error:
        return {"status": error.status_code, "body": error.body}
    return {"status": 200}


def usage_with_reasoning(usage):
    details = usage.completion_tokens_details
    return {
        "completion_tokens": usage.completion_tokens,
        "reasoning_tokens": details.reasoning_tokens if details else None,
    }


def thinking(client, args):
    asked = dict(
        model=args["model"],
        messages=messages(args),
        max_tokens=args["max_tokens"],
        temperature=1.0,
        seed=args["seed"],
        extra_body={"chat_template_kwargs": {"enable_thinking": True}},
    )
    whole = client.chat.completions.create(**asked)
    message = whole.choices[0].message
    stream = client.chat.completions.create(
        **asked, stream=True, stream_options={"include_usage": True}
    )
    reasoning, content, usage = [], [], None
    for chunk in stream:
        if chunk.usage is not None:
            usage = usage_with_reasoning(chunk.usage)
        for choice in chunk.choices:
            extra = choice.delta.model_extra or {}
            if extra.get("reasoning_content"):
                reasoning.append(extra["reasoning_content"])
            if choice.delta.content:
                content.append(choice.delta.content)
    return {
        "whole": {
            "reasoning": (message.model_extra or {}).get("reasoning_content"),
            "text": message.content,
            "finish_reason": whole.choices[0].finish_reason,
            "usage": usage_with_reasoning(whole.usage),
        },
        "streamed": {"reasoning": "".join(reasoning), "text": "".join(content), "usage": usage},
    }


SCENARIOS = {
    "basics": basics,
    "concurrent": concurrent,
    "drop": drop,
    "give_up": give_up,
    "wrong_key": wrong_key,
    "thinking": thinking,
}


def main():
    base, scenario = sys.argv[1], sys.argv[2]
    args = json.loads(sys.argv[3]) if len(sys.argv) > 3 else {}
    print(json.dumps(SCENARIOS[scenario](client_for(base, args), args)))


if __name__ == "__main__":
    main()
