"""Drives a running `ondo serve` through the official `openai` package's
Responses API (`client.responses`), as Codex CLI and other agents would, and
prints what it got as one JSON object.

    python responses_client.py BASE_URL SCENARIO 'JSON ARGS'

Scenarios:
  basics  a response (whole, then streamed with `responses.stream`), a
          follow-up through previous_response_id, one not stored and a
          follow-up naming it, retrieve and delete
  tools   a function the model calls (whole and streamed), its output sent
          back as a function_call_output, and the answer to it
  errors  requests the server refuses, as the client's exceptions
"""

import json
import sys

import openai

from openai_client import client_for


def request(args, extra):
    """The arguments of a greedy request: the test's and `extra`."""
    return {
        "model": args["model"],
        "instructions": args["system"],
        "input": args["user"],
        "max_output_tokens": args["max_tokens"],
        "temperature": 0,
        **extra,
    }


def create(client, args, **extra):
    return client.responses.create(**request(args, extra))


def described(response):
    return {
        "id": response.id,
        "object": response.object,
        "status": response.status,
        "incomplete_details": response.incomplete_details.to_dict()
        if response.incomplete_details
        else None,
        "model": response.model,
        # Computed by the client from the output items.
        "output_text": response.output_text,
        "output": [item.to_dict() for item in response.output],
        "usage": response.usage.to_dict() if response.usage else None,
        "previous_response_id": response.previous_response_id,
        "store": (response.model_extra or {}).get("store", getattr(response, "store", None)),
        "metadata": response.metadata,
        "instructions": response.instructions,
        "ondo": (response.model_extra or {}).get("ondo"),
    }


def streamed(client, args, **extra):
    events, texts, arguments = [], [], []
    with client.responses.stream(**request(args, extra)) as stream:
        final = None
        for event in stream:
            events.append(event.type)
            if event.type == "response.output_text.delta":
                texts.append(event.delta)
            if event.type == "response.function_call_arguments.delta":
                arguments.append(event.delta)
            # The helper's final response is a completed one's; a response
            # cut at max_output_tokens ends with response.incomplete, which
            # carries it (the helper fills in its output items).
            if event.type in ("response.completed", "response.incomplete"):
                final = event.response
    got = described(final)
    got["events"] = events
    got["text_deltas"] = "".join(texts)
    got["argument_deltas"] = "".join(arguments)
    return got


def status_of(work):
    try:
        work()
    except openai.APIStatusError as error:
        return {
            "status": error.status_code,
            "exception": type(error).__name__,
            "body": error.body,
        }
    return {"status": 200}


def basics(client, args):
    first = create(client, args, metadata={"purpose": "test"})
    stream = streamed(client, args)
    follow_up = create(client, args, input="And then?", previous_response_id=first.id)
    unstored = create(client, args, store=False)
    after_unstored = status_of(
        lambda: create(client, args, input="And then?", previous_response_id=unstored.id)
    )
    retrieved = client.responses.retrieve(first.id)
    client.responses.delete(first.id)
    after_delete = status_of(lambda: client.responses.retrieve(first.id))
    return {
        "whole": described(first),
        "streamed": stream,
        "follow_up": described(follow_up),
        "unstored": described(unstored),
        "after_unstored": after_unstored,
        "retrieved": described(retrieved),
        "after_delete": after_delete,
    }


WEATHER = {
    "type": "function",
    "name": "get_weather",
    "description": "The weather in a city now",
    "parameters": {
        "type": "object",
        "properties": {"city": {"type": "string"}},
        "required": ["city"],
    },
    "strict": True,
}


def tools(client, args):
    call = create(client, args, tools=[WEATHER])
    stream = streamed(client, args, tools=[WEATHER])
    calls = [item for item in call.output if item.type == "function_call"]
    outputs = [
        {"type": "function_call_output", "call_id": c.call_id, "output": "21 C, clear"}
        for c in calls
    ]
    answered = create(client, args, tools=[WEATHER], input=outputs, previous_response_id=call.id)
    # The same round trip with the whole conversation sent back, unstored.
    whole_input = [{"role": "user", "content": args["user"]}] + [
        item.to_dict() for item in call.output
    ] + outputs
    resent = create(client, args, tools=[WEATHER], input=whole_input, store=False)
    refused = create(client, args, tools=[WEATHER], tool_choice="none")
    return {
        "call": described(call),
        "streamed": stream,
        "answered": described(answered),
        "resent": described(resent),
        "tool_choice_none": described(refused),
    }


def errors(client, args):
    return {
        "json_schema": status_of(
            lambda: client.responses.create(
                model="tiny",
                input="hi",
                text={"format": {"type": "json_schema", "name": "x", "schema": {"type": "strng"}}},
            )
        ),
        "image": status_of(
            lambda: client.responses.create(
                model="tiny",
                input=[
                    {
                        "role": "user",
                        "content": [
                            {"type": "input_text", "text": "What is it?"},
                            {"type": "input_image", "image_url": "data:image/png;base64,iVBORw0KGgo="},
                        ],
                    }
                ],
            )
        ),
        "web_search": status_of(
            lambda: client.responses.create(
                model="tiny", input="hi", tools=[{"type": "web_search"}]
            )
        ),
        "unknown_model": status_of(
            lambda: client.responses.create(model="org/missing", input="hi")
        ),
        "unknown_previous": status_of(
            lambda: client.responses.create(
                model="tiny", input="hi", previous_response_id="resp_missing"
            )
        ),
    }


def main():
    base, scenario = sys.argv[1], sys.argv[2]
    args = json.loads(sys.argv[3]) if len(sys.argv) > 3 else {}
    scenarios = {"basics": basics, "tools": tools, "errors": errors}
    print(json.dumps(scenarios[scenario](client_for(base, args), args)))


if __name__ == "__main__":
    main()
