"""Reference embeddings for a decoder embedding model (Qwen3-Embedding's
form) from mlx-lm's own model classes, as the parity test compares them:
each text tokenized with the folder's tokenizer (its post-processor appends
the end-of-text token, as sentence-transformers feeds it), run alone
through mlx-lm's model body to the final norm, the last token's state
taken and scaled to unit length.

    python embed_reference.py MODEL_DIR 'JSON LIST OF TEXTS'

Prints {"embeddings": [[...], ...], "tokens": [n, ...]}.
"""

import json
import sys
from pathlib import Path

import mlx.core as mx
from mlx_lm.utils import load_model
from tokenizers import Tokenizer


def main():
    model_dir = Path(sys.argv[1])
    texts = json.loads(sys.argv[2])
    model, _ = load_model(model_dir)
    tokenizer = Tokenizer.from_file(str(model_dir / "tokenizer.json"))
    vectors, counts = [], []
    for text in texts:
        ids = tokenizer.encode(text).ids
        # mlx-lm's Model wraps the transformer body as `.model`, which
        # returns the hidden states after the final norm.
        hidden = model.model(mx.array([ids]))
        last = hidden[0, -1].astype(mx.float32)
        last = last / mx.linalg.norm(last)
        vectors.append(last.tolist())
        counts.append(len(ids))
    print(json.dumps({"embeddings": vectors, "tokens": counts}))


if __name__ == "__main__":
    main()
