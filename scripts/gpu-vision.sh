#!/usr/bin/env bash
# Images on a GPU: Ondo's server against mlx-vlm on one folder of ARCH
# (gemma3: Gemma 3's own SigLIP tower, 896 pixels, 256 tokens an image;
# qwen3_vl: Qwen3-VL 4B's tower, the image at its own size), one
# 896x896 PNG, 5 repetitions alternating sides (scripts/bench-vision.py):
# the time to first token (image decoded, resized, encoded, prompt
# prefilled) and the decode rate after the image. Writes $OUT/vision-ARCH.json;
# then the same through `ondo bench --image --peer mlx-vlm` (the engine in
# process, encode and prefill apart) into $OUT/vision-ARCH-bench.json.
#
#   OUT=results ONDO=/tmp/ondo/ondo scripts/gpu-vision.sh
# Environment: ONDO (the binary), ONDO_PYTHON (python3 with mlx_vlm),
# MODELS, PRESET (llama-3.2-3b: a 3B-shaped text model, 4-bit; `tiny` for
# a dry run on a CPU), ARCH (gemma3 or qwen3_vl), REPS (5), GEN (64).
set -uo pipefail
root=$(cd "$(dirname "$0")/.." && pwd)
ondo=${ONDO:-ondo}
out=${OUT:?set OUT to the folder for the results}
python=${ONDO_PYTHON:-python3}
models=${MODELS:-/tmp/ondo-gpu-models}
preset=${PRESET:-llama-3.2-3b}
mkdir -p "$out" "$models"
export ONDO_HOME=${ONDO_HOME:-$models/home} ONDO_NO_KEYCHAIN=1
arch=${ARCH:-gemma3}
model=$models/$arch-$preset
[ -f "$model/config.json" ] || "$ondo" synth "$preset" "$model" --arch "$arch" > /dev/null || exit 1
image=$models/screen-896.png
"$python" - "$image" <<'PY' || exit 1
import sys
import numpy as np
from PIL import Image
rng = np.random.default_rng(0)
pixels = np.full((896, 896, 3), 240, np.uint8)
pixels[:120] = (30, 90, 200)
pixels[300:700, 100:800] = rng.integers(0, 255, (400, 700, 3), dtype=np.uint8)
Image.fromarray(pixels).save(sys.argv[1])
PY
"$python" "$root/scripts/bench-vision.py" --ondo "$ondo" --model "$model" --image "$image" \
  --reps "${REPS:-5}" --gen "${GEN:-64}" > "$out/vision-$arch.json" 2> "$out/vision-$arch.log"
"$ondo" bench "$model" --image "$image" --peer mlx-vlm --python "$python" --reps "${REPS:-5}" \
  --warmup 1 --gen "${GEN:-64}" --json > "$out/vision-$arch-bench.json" 2>> "$out/vision-$arch.log"
