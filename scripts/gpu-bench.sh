#!/usr/bin/env bash
# Ondo against mlx-lm on a GPU, measured the same way every time: the real
# Llama shapes with random 4-bit weights (ondo synth), prompts of 128 and
# 2048 tokens, both decode loop shapes, median of 5 after a warm-up, greedy
# tokens checked (mlx-lm asked twice where they differ). Writes under $OUT:
#   doctor.txt            what ondo doctor found (backend, device, MLX)
#   bandwidth.json        the device's memory bandwidth, measured here
#   PRESET.json           ondo bench --peer mlx-lm --json, per preset
#   PRESET.graph.txt      one decode step's graph as MLX prints it
#   gpu-bench.md          the table docs/BENCHMARKS.md quotes
#
# Usage, on a machine with MLX's CUDA build (docs/BENCHMARKS.md, "On a GPU",
# says how to get one), with `ondo` and a python3 that imports mlx_lm:
#   OUT=results scripts/gpu-bench.sh                 all three presets
#   OUT=results PRESETS=llama-3.2-3b PROMPTS=128 scripts/gpu-bench.sh
# Environment: ONDO (the binary, default `ondo`), PRESETS, PROMPTS, REPS,
# GEN, MODELS (where the synthetic models are kept between runs).
#
# A change measured against the binary before it: BASELINE names the other
# binary, PAIRS how many before/after pairs to run (default 3; the order
# alternates from pair to pair). Each side of pair N goes to OUT/pair-N/before
# and OUT/pair-N/after, and OUT/pairs.md lists every pair's ratios against
# mlx-lm and their medians: on a shared GPU one pair alone is noise.
#   OUT=results BASELINE=/tmp/ondo-before/ondo ONDO=/tmp/ondo/ondo \
#     PRESETS=llama-3.2-3b PROMPTS=128 scripts/gpu-bench.sh
set -euo pipefail

ondo=${ONDO:-ondo}
out=${OUT:?set OUT to the folder for the results}
presets=${PRESETS:-llama-3.2-1b llama-3.2-3b llama-3.1-8b}
prompts=${PROMPTS:-128,2048}
reps=${REPS:-5}
gen=${GEN:-128}
models=${MODELS:-/tmp/ondo-gpu-models}
python=${ONDO_PYTHON:-python3}
here=$(cd "$(dirname "$0")" && pwd)
mkdir -p "$out" "$models"

if [ -n "${BASELINE:-}" ]; then
  pairs=${PAIRS:-3}
  for pair in $(seq 1 "$pairs"); do
    order="before after"
    [ $((pair % 2)) -eq 0 ] && order="after before"
    mkdir -p "$out/pair-$pair"
    for side in $order; do
      binary=$ondo
      [ "$side" = before ] && binary=$BASELINE
      echo "== pair $pair of $pairs: $side"
      OUT="$out/pair-$pair/$side" ONDO="$binary" BASELINE="" "$0" > "$out/pair-$pair/$side.log" 2>&1 \
        || { tail -5 "$out/pair-$pair/$side.log"; exit 1; }
    done
  done
  "$python" "$here/gpu_bench_table.py" --pairs "$out" $presets | tee "$out/pairs.md"
  exit 0
fi

"$ondo" doctor > "$out/doctor.txt" 2>&1 || { cat "$out/doctor.txt"; exit 1; }
grep -iE "backend|device|mlx" "$out/doctor.txt" | head -5

# The bandwidth the roofline divides by: the best of a large read (a sum)
# and a large copy, each timed after a warm-up, median of 10.
"$python" - > "$out/bandwidth.json" <<'PY'
import json, statistics, time
import mlx.core as mx
n = 1 << 28  # 256 Mi float32: 1 GiB
x = mx.random.uniform(shape=(n,))
mx.eval(x)
def timed(f, nbytes):
    mx.eval(f())
    runs = []
    for _ in range(10):
        t = time.perf_counter(); mx.eval(f()); runs.append(time.perf_counter() - t)
    return nbytes / statistics.median(runs)
read = timed(lambda: x.sum(), x.nbytes)
copy = timed(lambda: x + 1, 2 * x.nbytes)
print(json.dumps({"read_bytes_per_s": read, "copy_bytes_per_s": copy,
                  "bytes_per_s": max(read, copy), "device": str(mx.default_device())}))
PY
cat "$out/bandwidth.json"

for preset in $presets; do
  dir=$models/$preset
  [ -f "$dir/config.json" ] || "$ondo" synth "$preset" "$dir" > /dev/null
  echo "== $preset: prompts $prompts, $reps reps, $gen tokens"
  # Exit status 1 means a token difference mlx-lm does not share: keep the
  # JSON (it says where) and go on with the other presets.
  status=0
  ONDO_DUMP_GRAPH=1 "$ondo" bench "$dir" --peer mlx-lm --prompt-tokens "$prompts" --gen "$gen" \
    --reps "$reps" --warmup 1 --loop pipelined,sync --cold 0 --json \
    > "$out/$preset.json" 2> "$out/$preset.graph.txt" || status=$?
  if [ "$status" -gt 1 ]; then tail -5 "$out/$preset.graph.txt"; exit "$status"; fi
done

"$python" "$here/gpu_bench_table.py" "$out" $presets | tee "$out/gpu-bench.md"
