"""Drives a running `ondo serve`'s embedding routes with the official
`openai` and `ollama` packages, as RAG tools do, and prints what each got
as one JSON object.

    python embed_clients.py BASE_URL MODEL 'JSON LIST OF TEXTS'
"""

import base64
import json
import struct
import sys

import ollama
import openai


def main():
    base_url, model, texts = sys.argv[1], sys.argv[2], json.loads(sys.argv[3])
    client = openai.OpenAI(base_url=base_url + "/v1", api_key="unused", max_retries=0)
    floats = client.embeddings.create(model=model, input=texts, encoding_format="float")
    # Without encoding_format the SDK asks for base64 and decodes it itself.
    decoded = client.embeddings.create(model=model, input=texts)
    # Asked for explicitly, it hands over the base64 strings as sent.
    wire = client.embeddings.create(model=model, input=texts[0], encoding_format="base64")
    data = base64.b64decode(wire.data[0].embedding)
    wire_vector = list(struct.unpack("<%df" % (len(data) // 4), data))
    one = client.embeddings.create(model=model, input=texts[0])
    short = client.embeddings.create(model=model, input=texts[0], dimensions=16)
    local = ollama.Client(host=base_url)
    embed = local.embed(model=model, input=texts)
    single = local.embed(model=model, input=texts[0])
    legacy = local.embeddings(model=model, prompt=texts[0])
    print(
        json.dumps(
            {
                "openai": {
                    "object": floats.object,
                    "model": floats.model,
                    "indices": [d.index for d in floats.data],
                    "objects": [d.object for d in floats.data],
                    "embeddings": [d.embedding for d in floats.data],
                    "base64_decoded_by_sdk": [list(d.embedding) for d in decoded.data],
                    "base64_wire_first": wire_vector,
                    "single": one.data[0].embedding,
                    "short": short.data[0].embedding,
                    "usage": {
                        "prompt_tokens": floats.usage.prompt_tokens,
                        "total_tokens": floats.usage.total_tokens,
                    },
                },
                "ollama": {
                    "model": embed.model,
                    "embeddings": [list(v) for v in embed.embeddings],
                    "single": [list(v) for v in single.embeddings],
                    "legacy": list(legacy.embedding),
                    "prompt_eval_count": embed.prompt_eval_count,
                    "total_duration": embed.total_duration,
                    "load_duration": embed.load_duration,
                },
            }
        )
    )


if __name__ == "__main__":
    main()
