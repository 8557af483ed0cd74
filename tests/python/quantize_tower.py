"""Quantizes a synthetic Gemma 3 folder's vision tower in place, as mlx-vlm's
converter does when not told to skip it: every tower matrix a Linear or an
Embedding holds (not the patch convolution, the norms or the projector's raw
weight) becomes affine BITS-bit in groups of 64 (packed weight, scales,
biases), and config.json gets a quantization block. The text model stays in
floats.

    quantize_tower.py DIR BITS
"""

import json
import sys

import mlx.core as mx


def main():
    folder, bits = sys.argv[1], int(sys.argv[2])
    path = f"{folder}/model.safetensors"
    tensors, metadata = mx.load(path, return_metadata=True)
    out = {}
    for name, value in tensors.items():
        tower = name.startswith("vision_tower.")
        matrix = name.endswith(".weight") and value.ndim == 2
        if tower and matrix and "patch_embedding" not in name:
            stem = name[: -len(".weight")]
            weight, scales, biases = mx.quantize(value, group_size=64, bits=bits)
            out[name], out[f"{stem}.scales"], out[f"{stem}.biases"] = weight, scales, biases
        else:
            out[name] = value
    mx.save_safetensors(path, out, metadata=metadata)
    config_path = f"{folder}/config.json"
    config = json.load(open(config_path))
    config["quantization"] = {"group_size": 64, "bits": bits}
    json.dump(config, open(config_path, "w"), indent=2)
    print(json.dumps({"quantized": sum(1 for n in out if n.endswith(".scales"))}))


if __name__ == "__main__":
    main()
