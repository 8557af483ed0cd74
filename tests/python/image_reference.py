"""Pillow's and transformers' side of the image tests (tests/vision.rs).

pixels FILE OUT [W H FILTER]
    The file as mlx-vlm's load_image opens it (EXIF orientation applied,
    RGB), resized with Pillow's Image.resize((W, H), FILTER) when a size is
    given (FILTER 2 bilinear, 3 bicubic). Writes the RGB bytes to OUT and
    prints {"width", "height"}.

gemma3 FILE OUT CONFIG
    transformers' Gemma3ImageProcessorPil (the Pillow backend) built from
    the preprocessor_config.json at CONFIG, given the file as load_image
    opens it. Writes the float32 pixel values to OUT and prints {"shape"}.

qwen3_vl FILE OUT DIR
    mlx-vlm's own Qwen3-VL image processor, with the settings it reads from
    DIR (preprocessor_config.json, then processor_config.json's
    "image_processor"), given the file as load_image opens it. Writes the
    float32 little-endian pixel values ([patches, C*T*P*P]) to OUT and prints
    {"shape", "grid": [t, gh, gw]}.
"""

import json
import sys

import numpy as np
from PIL import Image, ImageOps


def load(path):
    image = Image.open(path)
    image = ImageOps.exif_transpose(image)
    return image.convert("RGB")


def main():
    mode, path, out = sys.argv[1:4]
    image = load(path)
    if mode == "pixels":
        if len(sys.argv) > 4:
            width, height, resample = (int(v) for v in sys.argv[4:7])
            image = image.resize((width, height), resample=resample)
        open(out, "wb").write(image.tobytes())
        print(json.dumps({"width": image.width, "height": image.height}))
    elif mode == "gemma3":
        from transformers.models.gemma3.image_processing_pil_gemma3 import Gemma3ImageProcessorPil

        config = json.load(open(sys.argv[4]))
        config.pop("image_processor_type", None)
        config.pop("processor_class", None)
        processor = Gemma3ImageProcessorPil(**config)
        values = processor(images=[image], return_tensors="np")["pixel_values"][0]
        values = np.ascontiguousarray(values, dtype=np.float32)
        open(out, "wb").write(values.tobytes())
        print(json.dumps({"shape": list(values.shape)}))
    elif mode == "qwen3_vl":
        # mlx-vlm installs this numpy processor for qwen3_vl and qwen3_5 in
        # place of transformers' one, so it is the reference Ondo must match.
        from mlx_vlm.models.qwen3_vl.processing_qwen3_vl import (
            Qwen3VLImageProcessor,
            _qwen_vl_image_kwargs,
        )

        processor = Qwen3VLImageProcessor(**_qwen_vl_image_kwargs(sys.argv[4]))
        result = processor(images=[image])
        values = np.ascontiguousarray(result["pixel_values"], dtype="<f4")
        open(out, "wb").write(values.tobytes())
        grid = [int(v) for v in result["image_grid_thw"][0]]
        print(json.dumps({"shape": list(values.shape), "grid": grid}))
    else:
        raise SystemExit(f"unknown mode {mode}")


if __name__ == "__main__":
    main()
