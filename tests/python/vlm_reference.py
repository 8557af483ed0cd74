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

For a Qwen3-VL or Qwen 3.5 folder (config.json model_type qwen3_vl or
qwen3_5) the features are the tower's main output followed by its DeepStack
outputs (float32, [1 + K, total image tokens, out_hidden]; K is 0 for
Qwen 3.5), and it prints as well "grid" ([t, gh, gw] per image),
"positions" (the 3 x L M-RoPE positions of the prompt) and "rope_delta"
(what decode adds to the cache offset). VLM_PREFILL_STEP, when set, is
generate_step's prefill_step_size, so a test can split an image across
prefill chunks.
"""

import json
import os
import sys

import mlx.core as mx
import numpy as np
from mlx_vlm import load
from mlx_vlm.generate import generate_step
from mlx_vlm.utils import load_image

QWEN_TYPES = ("qwen3_vl", "qwen3_5")


def greedy(input_ids, model, pixel_values, mask, max_tokens, **kwargs):
    tokens = []
    for (token, _), _ in zip(
        generate_step(input_ids, model, pixel_values, mask, temperature=0.0, **kwargs), range(int(max_tokens))
    ):
        tokens.append(int(token.item() if hasattr(token, "item") else token))
    return tokens


def answer_text(processor, tokens, eos):
    eos = set(eos if isinstance(eos, list) else [eos])
    answer = []
    for token in tokens:
        if token in eos:
            break
        answer.append(token)
    return processor.tokenizer.decode(answer, skip_special_tokens=True)


def gemma(model, processor, config, inputs, input_ids, pixel_values, max_tokens, out):
    # The tower runs in the embeddings' dtype, as get_input_embeddings
    # casts it (a quantized embedding's weight is packed integers).
    embeds_dtype = model.language_model.model.embed_tokens(mx.array([[0]])).dtype
    states, _, _ = model.vision_tower(
        pixel_values.transpose(0, 2, 3, 1).astype(embeds_dtype),
        output_hidden_states=True,
    )
    features = model.multi_modal_projector(states).astype(mx.float32)
    mx.eval(features)
    np.asarray(features).astype(np.float32).tofile(out)
    mask = mx.ones(input_ids.shape, dtype=mx.int32)
    tokens = greedy(input_ids, model, pixel_values, mask, max_tokens)
    return {
        "input_ids": np.asarray(input_ids)[0].tolist(),
        "tokens": tokens,
        "shape": list(features.shape),
        "text": answer_text(processor, tokens, config.get("eos_token_id") or []),
    }


def qwen(model, processor, config, inputs, input_ids, pixel_values, max_tokens, out):
    grid = mx.array(inputs["image_grid_thw"])
    # The tower runs in its patch kernel's dtype, as get_input_embeddings
    # casts the pixels before calling it.
    dtype = model.vision_tower.patch_embed.proj.weight.dtype
    main, deep = model.vision_tower(pixel_values.astype(dtype), grid)
    features = mx.stack([main, *deep]).astype(mx.float32)
    mx.eval(features)
    np.asarray(features).astype("<f4").tofile(out)
    mask = mx.ones(input_ids.shape, dtype=mx.int32)
    # The same call get_input_embeddings makes: positions for the whole
    # prompt, [3, batch, L], and the delta decode adds to the cache offset.
    positions, delta = model.language_model.get_rope_index(input_ids, grid, None, mask)
    # generate passes the processor's extra outputs (image_grid_thw) to
    # generate_step as keyword arguments; the prefill step is optional.
    kwargs = {"image_grid_thw": grid}
    step = os.environ.get("VLM_PREFILL_STEP")
    if step:
        kwargs["prefill_step_size"] = int(step)
    tokens = greedy(input_ids, model, pixel_values, mask, max_tokens, **kwargs)
    # Real Qwen3-VL configs may keep eos_token_id under text_config only.
    eos = config.get("eos_token_id") or config.get("text_config", {}).get("eos_token_id") or []
    return {
        "input_ids": np.asarray(input_ids)[0].tolist(),
        "tokens": tokens,
        "shape": list(features.shape),
        "text": answer_text(processor, tokens, eos),
        "grid": np.asarray(grid).tolist(),
        "positions": np.asarray(positions)[:, 0, :].tolist(),
        "rope_delta": int(np.asarray(delta).reshape(-1)[0]),
    }


def main():
    model_dir, prompt_file, max_tokens, out = sys.argv[1:5]
    paths = sys.argv[5:]
    config = json.load(open(f"{model_dir}/config.json"))
    model, processor = load(model_dir)
    prompt = open(prompt_file, encoding="utf-8").read()
    images = [load_image(p) for p in paths]
    inputs = processor(text=[prompt], images=images, add_special_tokens=False, return_tensors="mlx")
    input_ids = mx.array(inputs["input_ids"])
    pixel_values = mx.array(inputs["pixel_values"])
    run = qwen if config.get("model_type") in QWEN_TYPES else gemma
    meta = run(model, processor, config, inputs, input_ids, pixel_values, max_tokens, out)
    print(json.dumps(meta))


if __name__ == "__main__":
    main()
