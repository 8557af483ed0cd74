"""Sends one image and a question to a running `ondo serve` through each
official client, as their users send images, and prints the answers as one
JSON object.

    python vision_clients.py BASE_URL 'JSON ARGS'

ARGS: model, image (a PNG file), question, max_tokens, and optionally
follow_up: then only the openai client asks the question and, in the same
conversation, the follow-up, and the output holds both answers with the
server's `ondo` records (first, second). Otherwise the keys of the output:
openai (chat completions, an image_url part with a data: URL), responses
(an input_image part), ollama (the chat's images, which the client reads
from the file), anthropic (an image block with a base64 source).
"""

import base64
import json
import sys

import anthropic
import ollama
import openai


def main():
    base, args = sys.argv[1], json.loads(sys.argv[2])
    data = base64.b64encode(open(args["image"], "rb").read()).decode()
    url = "data:image/png;base64," + data
    model, question, limit = args["model"], args["question"], args["max_tokens"]
    out = {}

    client = openai.OpenAI(base_url=base + "/v1", api_key="no-key", max_retries=0, timeout=120)
    if "follow_up" in args:
        first = [
            {
                "role": "user",
                "content": [
                    {"type": "image_url", "image_url": {"url": url}},
                    {"type": "text", "text": question},
                ],
            }
        ]
        answers = []
        for messages in [first, None]:
            if messages is None:
                messages = first + [
                    {"role": "assistant", "content": answers[0]["text"]},
                    {"role": "user", "content": args["follow_up"]},
                ]
            answer = client.chat.completions.create(
                model=model, messages=messages, max_tokens=limit, temperature=0
            )
            answers.append(
                {"text": answer.choices[0].message.content, "ondo": answer.to_dict()["ondo"]}
            )
        print(json.dumps({"first": answers[0], "second": answers[1]}))
        return
    answer = client.chat.completions.create(
        model=model,
        messages=[
            {
                "role": "user",
                "content": [
                    {"type": "image_url", "image_url": {"url": url}},
                    {"type": "text", "text": question},
                ],
            }
        ],
        max_tokens=limit,
        temperature=0,
    )
    out["openai"] = answer.choices[0].message.content
    out["openai_prompt_tokens"] = answer.to_dict()["ondo"]["prompt_tokens"]

    response = client.responses.create(
        model=model,
        input=[
            {
                "role": "user",
                "content": [
                    {"type": "input_image", "image_url": url},
                    {"type": "input_text", "text": question},
                ],
            }
        ],
        max_output_tokens=limit,
        temperature=0,
    )
    out["responses"] = response.output_text

    chat = ollama.Client(host=base, timeout=120).chat(
        model=model,
        messages=[{"role": "user", "content": question, "images": [args["image"]]}],
        options={"num_predict": limit, "temperature": 0},
    )
    out["ollama"] = chat.message.content

    message_in = [
        {
            "role": "user",
            "content": [
                {
                    "type": "image",
                    "source": {"type": "base64", "media_type": "image/png", "data": data},
                },
                {"type": "text", "text": question},
            ],
        }
    ]
    message = anthropic.Anthropic(
        base_url=base, api_key="no-key", max_retries=0, timeout=120
    ).messages.create(
        model=model,
        max_tokens=limit,
        extra_body={"temperature": 0},
        messages=message_in,
    )
    out["anthropic"] = "".join(b.text for b in message.content if b.type == "text")
    out["anthropic_count"] = (
        anthropic.Anthropic(base_url=base, api_key="no-key", max_retries=0, timeout=120)
        .messages.count_tokens(model=model, messages=message_in)
        .input_tokens
    )
    print(json.dumps(out))


if __name__ == "__main__":
    main()
