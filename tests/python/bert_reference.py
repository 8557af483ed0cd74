"""A small reference BERT embedder in MLX, written from the architecture
(not from Ondo's code), for the encoder parity test: learned absolute
positions and token types, post-LayerNorm layers, exact GELU, attention
over real tokens only; then CLS or mean pooling as 1_Pooling/config.json
says and L2 normalization when modules.json has a Normalize module.

    python bert_reference.py MODEL_DIR 'JSON LIST OF TEXTS'

Each text runs alone (no padding), tokenized with the folder's
tokenizer.json. Prints {"embeddings": [[...], ...], "tokens": [n, ...]}.
"""

import json
import math
import sys
from pathlib import Path

import mlx.core as mx
from tokenizers import Tokenizer


def layer_norm(x, w, b, eps):
    mean = x.mean(axis=-1, keepdims=True)
    var = ((x - mean) ** 2).mean(axis=-1, keepdims=True)
    return (x - mean) / mx.sqrt(var + eps) * w + b


def dense(x, weights, name):
    return x @ weights[name + ".weight"].T + weights[name + ".bias"]


def gelu(x):
    return 0.5 * x * (1 + mx.erf(x / math.sqrt(2)))


def encode(weights, config, ids):
    eps = config.get("layer_norm_eps", 1e-12)
    heads = config["num_attention_heads"]
    n = len(ids)
    x = (
        weights["embeddings.word_embeddings.weight"][mx.array(ids)]
        + weights["embeddings.position_embeddings.weight"][:n]
        + weights["embeddings.token_type_embeddings.weight"][0]
    )
    x = layer_norm(
        x, weights["embeddings.LayerNorm.weight"], weights["embeddings.LayerNorm.bias"], eps
    )
    size = x.shape[-1] // heads
    for i in range(config["num_hidden_layers"]):
        p = f"encoder.layer.{i}."

        def heads_of(t):
            return t.reshape(n, heads, size).transpose(1, 0, 2)

        q = heads_of(dense(x, weights, p + "attention.self.query"))
        k = heads_of(dense(x, weights, p + "attention.self.key"))
        v = heads_of(dense(x, weights, p + "attention.self.value"))
        scores = (q @ k.transpose(0, 2, 1)) / math.sqrt(size)
        attended = (mx.softmax(scores, axis=-1) @ v).transpose(1, 0, 2).reshape(n, -1)
        a = dense(attended, weights, p + "attention.output.dense")
        x = layer_norm(
            a + x,
            weights[p + "attention.output.LayerNorm.weight"],
            weights[p + "attention.output.LayerNorm.bias"],
            eps,
        )
        f = dense(gelu(dense(x, weights, p + "intermediate.dense")), weights, p + "output.dense")
        x = layer_norm(
            f + x,
            weights[p + "output.LayerNorm.weight"],
            weights[p + "output.LayerNorm.bias"],
            eps,
        )
    return x


def main():
    model_dir = Path(sys.argv[1])
    texts = json.loads(sys.argv[2])
    config = json.loads((model_dir / "config.json").read_text())
    weights = mx.load(str(model_dir / "model.safetensors"))
    weights = {k.removeprefix("bert."): v.astype(mx.float32) for k, v in weights.items()}
    pooling = json.loads((model_dir / "1_Pooling/config.json").read_text())
    modules = json.loads((model_dir / "modules.json").read_text())
    normalize = any(m["type"].endswith("Normalize") for m in modules)
    tokenizer = Tokenizer.from_file(str(model_dir / "tokenizer.json"))
    vectors, counts = [], []
    for text in texts:
        ids = tokenizer.encode(text).ids
        states = encode(weights, config, ids)
        if pooling.get("pooling_mode_cls_token"):
            vector = states[0]
        else:
            vector = states.mean(axis=0)
        if normalize:
            vector = vector / mx.linalg.norm(vector)
        vectors.append(vector.tolist())
        counts.append(len(ids))
    print(json.dumps({"embeddings": vectors, "tokens": counts}))


if __name__ == "__main__":
    main()
