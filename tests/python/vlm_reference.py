"""mlx-vlm's side of the vision model tests (tests/vision.rs).

    vlm_reference.py MODEL_DIR PROMPT_FILE MAX_TOKENS OUT IMAGE...

PROMPT_FILE holds a prompt as the chat template rendered it (one image
marker per image, not yet expanded). mlx-vlm loads the folder and its
processor, which expands the markers and tokenizes the prompt and turns the
images into pixel values; its vision tower and projector give the image
features; its generate_step gives MAX_TOKENS greedy tokens. Writes the
features (float32, [images, tokens, hidden]) to OUT and prints
{"input_ids", "tokens", "shape", "text"}: text is the tokens up to the first
end-of-sequence id, decoded as a server's answer reads.
"""

import json
import sys

import mlx.core as mx
import numpy as np
from mlx_vlm import load
from mlx_vlm.generate import generate_step
from mlx_vlm.utils import load_image


def main():
    model_dir, prompt_file, max_tokens, out = sys.argv[1:5]
    paths = sys.argv[5:]
    model, processor = load(model_dir)
    prompt = open(prompt_file, encoding="utf-8").read()
    images = [load_image(p) for p in paths]
    inputs = processor(text=[prompt], images=images, add_special_tokens=False, return_tensors="mlx")
    input_ids = mx.array(inputs["input_ids"])
    pixel_values = mx.array(inputs["pixel_values"])
    states, _, _ = model.vision_tower(
        pixel_values.transpose(0, 2, 3, 1).astype(model.language_model.model.embed_tokens.weight.dtype),
        output_hidden_states=True,
    )
    features = model.multi_modal_projector(states).astype(mx.float32)
    mx.eval(features)
    np.asarray(features).astype(np.float32).tofile(out)
    mask = mx.ones(input_ids.shape, dtype=mx.int32)
    tokens = []
    for (token, _), _ in zip(
        generate_step(input_ids, model, pixel_values, mask, temperature=0.0), range(int(max_tokens))
    ):
        tokens.append(int(token.item() if hasattr(token, "item") else token))
    eos = json.load(open(f"{model_dir}/config.json")).get("eos_token_id") or []
    eos = set(eos if isinstance(eos, list) else [eos])
    answer = []
    for token in tokens:
        if token in eos:
            break
        answer.append(token)
    print(
        json.dumps(
            {
                "input_ids": np.asarray(input_ids)[0].tolist(),
                "tokens": tokens,
                "shape": list(features.shape),
                "text": processor.tokenizer.decode(answer, skip_special_tokens=True),
            }
        )
    )


if __name__ == "__main__":
    main()
