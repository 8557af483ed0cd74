"""Turns a synthetic Llama (`ondo synth tiny`) into a model that answers by
rote, so that tests can see a tool call and the answer to its result come
out of a real generation: random weights never call a tool.

    python make_tool_caller.py FOLDER 'JSON RULES'

RULES maps the text a prompt ends with to what the model then says, e.g.
{"\\n\\n": ["<call token>"], ":": [" sunny"]}: after the last token of the
key it says the value's tokens one by one, then <|eot_id|>. One added token
(id 2047, the unused pad token) is renamed to CALL, given as the rules'
"call" entry, and may be said like any other.

How: every layer's output projections are zeroed, so the residual stream is
the current token's embedding; the output head (untied from the embedding)
has, for each next token, the normalized embeddings of the tokens it
follows. The head's largest logit is then that next token's, by a wide
margin (a random embedding is nearly orthogonal to the others).
"""

import json
import sys
from pathlib import Path

import mlx.core as mx
import tokenizers

CALL_ID = 2047
EOT = "<|eot_id|>"
SCALE = 4.0


def main():
    folder = Path(sys.argv[1])
    rules = json.loads(sys.argv[2])
    call = rules.pop("call")

    tokenizer_path = folder / "tokenizer.json"
    spec = json.loads(tokenizer_path.read_text())
    for token in spec["added_tokens"]:
        if token["id"] == CALL_ID:
            token["content"] = call
            token["special"] = False
    tokenizer_path.write_text(json.dumps(spec))
    config_path = folder / "tokenizer_config.json"
    tokenizer_config = json.loads(config_path.read_text())
    tokenizer_config["added_tokens_decoder"][str(CALL_ID)]["content"] = call
    tokenizer_config["added_tokens_decoder"][str(CALL_ID)]["special"] = False
    config_path.write_text(json.dumps(tokenizer_config, indent=2))

    tokenizer = tokenizers.Tokenizer.from_file(str(tokenizer_path))
    eot = tokenizer.token_to_id(EOT)

    def ids(text):
        return tokenizer.encode(text, add_special_tokens=False).ids

    follows = []
    for ends_with, says in rules.items():
        chain = [ids(ends_with)[-1]] + [i for piece in says for i in ids(piece)] + [eot]
        follows.extend(zip(chain, chain[1:]))
    if len({before for before, _ in follows}) != len(follows):
        sys.exit(f"a token is followed by two different ones: {follows}")

    weights_path = folder / "model.safetensors"
    weights = mx.load(str(weights_path))
    for name in list(weights):
        if name.endswith(("self_attn.o_proj.weight", "mlp.down_proj.weight")):
            weights[name] = mx.zeros_like(weights[name])
    weights["model.norm.weight"] = mx.ones_like(weights["model.norm.weight"])
    embed = weights["model.embed_tokens.weight"]
    unit = embed / mx.linalg.norm(embed, axis=-1, keepdims=True)
    head = mx.zeros_like(embed)
    for before, after in follows:
        head[after] = head[after] + SCALE * unit[before]
    weights["lm_head.weight"] = head
    mx.save_safetensors(str(weights_path), weights)

    config_path = folder / "config.json"
    config = json.loads(config_path.read_text())
    config["tie_word_embeddings"] = False
    config_path.write_text(json.dumps(config, indent=2))


if __name__ == "__main__":
    main()
