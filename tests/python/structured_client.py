"""Asks a running `ondo serve` for output held to a JSON schema through each
official client, the way applications ask for it, and prints what came back
as one JSON object: each reply's text, whether `jsonschema` finds it valid
against the schema asked for, and the record Ondo attached.

    python structured_client.py BASE_URL SCENARIO 'JSON ARGS'

Scenarios:
  dialects  openai chat (response_format json_schema, whole and streamed,
            and the client's own `parse` with a Pydantic model), the
            Responses API (text.format, and `responses.parse`), ollama
            (format as a schema, and "json"), anthropic (output_format)
  tools     a call forced by tool_choice (openai chat "required", the
            Responses API's function by name, anthropic "any"): a call to
            the tool, its arguments valid against its parameters
  errors    a schema the server cannot hold the output to, through each
            client, as the client's exception
"""

import json
import sys
from typing import Literal

import anthropic
import jsonschema
import ollama
import openai
import pydantic

from openai_client import client_for


class Person(pydantic.BaseModel):
    """What the Pydantic helpers ask for: OpenAI's SDK turns it into a
    strict schema and parses the reply back into it."""

    model_config = pydantic.ConfigDict(extra="forbid")
    role: Literal["admin", "user"]
    # Bounded, so that even random weights finish the number.
    age: int = pydantic.Field(ge=0, le=99)


def checked(text, schema):
    """The text, and whether it is JSON valid against `schema`."""
    try:
        jsonschema.validate(json.loads(text), schema)
        return {"text": text, "valid": True}
    except (ValueError, jsonschema.ValidationError) as error:
        return {"text": text, "valid": False, "why": str(error)[:300]}


def dialects(base, args):
    schema = args["schema"]
    model = args["model"]
    user = args["user"]
    budget = args["max_tokens"]
    client = client_for(base, args)
    got = {}

    format_ = {
        "type": "json_schema",
        "json_schema": {"name": "person", "schema": schema, "strict": True},
    }
    chat = client.chat.completions.create(
        model=model,
        messages=[{"role": "user", "content": user}],
        max_tokens=budget,
        temperature=0,
        response_format=format_,
    )
    got["chat"] = checked(chat.choices[0].message.content, schema)
    got["chat"]["finish_reason"] = chat.choices[0].finish_reason
    got["chat"]["ondo"] = (chat.model_extra or {}).get("ondo")

    pieces = []
    with client.chat.completions.create(
        model=model,
        messages=[{"role": "user", "content": user}],
        max_tokens=budget,
        temperature=0,
        response_format=format_,
        stream=True,
    ) as stream:
        for chunk in stream:
            if chunk.choices and chunk.choices[0].delta.content:
                pieces.append(chunk.choices[0].delta.content)
    got["chat_streamed"] = checked("".join(pieces), schema)

    # The SDK's own structured-output helper: a Pydantic model in, a parsed
    # object out (it raises when the reply is not valid).
    parsed = client.chat.completions.parse(
        model=model,
        messages=[{"role": "user", "content": user}],
        max_tokens=budget,
        temperature=0,
        response_format=Person,
    )
    person = parsed.choices[0].message.parsed
    got["chat_parse"] = {
        "parsed": person.model_dump() if person else None,
        "text": parsed.choices[0].message.content,
    }

    response = client.responses.create(
        model=model,
        input=user,
        max_output_tokens=budget,
        temperature=0,
        text={"format": {"type": "json_schema", "name": "person", "schema": schema, "strict": True}},
    )
    got["responses"] = checked(response.output_text, schema)
    got["responses"]["format_echoed"] = response.text.format.type
    parsed = client.responses.parse(
        model=model,
        input=user,
        max_output_tokens=budget,
        temperature=0,
        text_format=Person,
    )
    got["responses_parse"] = {
        "parsed": parsed.output_parsed.model_dump() if parsed.output_parsed else None
    }

    local = ollama.Client(host=base, timeout=120)
    options = {"temperature": 0, "num_predict": budget}
    answer = local.chat(
        model=model,
        messages=[{"role": "user", "content": user}],
        format=schema,
        options=options,
    )
    got["ollama_chat"] = checked(answer.message.content, schema)
    answer = local.generate(model=model, prompt=user, format="json", options=options)
    got["ollama_generate_json"] = checked(answer.response, {"type": "object"})
    got["ollama_generate_json"]["done_reason"] = answer.done_reason

    claude = anthropic.Anthropic(base_url=base, api_key=args.get("key", "no-key"), max_retries=0)
    message = claude.messages.create(
        model=model,
        max_tokens=budget,
        messages=[{"role": "user", "content": user}],
        extra_body={"output_config": {"format": {"type": "json_schema", "schema": schema}}},
    )
    got["anthropic"] = checked(
        "".join(block.text for block in message.content if block.type == "text"), schema
    )
    got["anthropic"]["stop_reason"] = message.stop_reason
    return got


def tools(base, args):
    """A call forced by tool_choice in each dialect: the reply is a call to
    the tool, its arguments valid against the tool's parameters."""
    parameters = args["parameters"]
    model = args["model"]
    budget = args["max_tokens"]
    function = {"name": "get_weather", "description": "The weather in a city", "parameters": parameters}
    got = {}
    client = client_for(base, args)
    chat = client.chat.completions.create(
        model=model,
        messages=[{"role": "user", "content": "Weather in Paris?"}],
        max_tokens=budget,
        temperature=0,
        tools=[{"type": "function", "function": function}],
        tool_choice="required",
    )
    calls = chat.choices[0].message.tool_calls or []
    got["chat"] = {
        "finish_reason": chat.choices[0].finish_reason,
        "names": [c.function.name for c in calls],
        "arguments": [checked(c.function.arguments, parameters) for c in calls],
        "content": chat.choices[0].message.content,
    }
    response = client.responses.create(
        model=model,
        input="Weather in Paris?",
        max_output_tokens=budget,
        temperature=0,
        tools=[{"type": "function", **function}],
        tool_choice={"type": "function", "name": "get_weather"},
    )
    calls = [item for item in response.output if item.type == "function_call"]
    got["responses"] = {
        "names": [c.name for c in calls],
        "arguments": [checked(c.arguments, parameters) for c in calls],
    }
    claude = anthropic.Anthropic(base_url=base, api_key="no-key", max_retries=0)
    message = claude.messages.create(
        model=model,
        max_tokens=budget,
        messages=[{"role": "user", "content": "Weather in Paris?"}],
        tools=[{"name": "get_weather", "description": "The weather in a city", "input_schema": parameters}],
        tool_choice={"type": "any"},
    )
    uses = [block for block in message.content if block.type == "tool_use"]
    got["anthropic"] = {
        "stop_reason": message.stop_reason,
        "names": [u.name for u in uses],
        "arguments": [checked(json.dumps(u.input), parameters) for u in uses],
    }
    return got


def errors(base, args):
    bad = {"type": "object", "properties": {"a": {"type": "strng"}}}
    model = args["model"]
    got = {}
    client = client_for(base, args)
    try:
        client.chat.completions.create(
            model=model,
            messages=[{"role": "user", "content": "hi"}],
            response_format={
                "type": "json_schema",
                "json_schema": {"name": "bad", "schema": bad, "strict": True},
            },
        )
        got["openai"] = None
    except openai.BadRequestError as error:
        got["openai"] = {"status": error.status_code, "message": error.message}
    try:
        ollama.Client(host=base, timeout=60).chat(
            model=model, messages=[{"role": "user", "content": "hi"}], format=bad
        )
        got["ollama"] = None
    except ollama.ResponseError as error:
        got["ollama"] = {"status": error.status_code, "message": error.error}
    claude = anthropic.Anthropic(base_url=base, api_key="no-key", max_retries=0)
    try:
        claude.messages.create(
            model=model,
            max_tokens=8,
            messages=[{"role": "user", "content": "hi"}],
            extra_body={"output_config": {"format": {"type": "json_schema", "schema": bad}}},
        )
        got["anthropic"] = None
    except anthropic.BadRequestError as error:
        got["anthropic"] = {"status": error.status_code, "message": str(error)}
    return got


def main():
    base, scenario, raw = sys.argv[1], sys.argv[2], sys.argv[3]
    args = json.loads(raw)
    print(json.dumps({"dialects": dialects, "tools": tools, "errors": errors}[scenario](base, args)))


if __name__ == "__main__":
    main()
