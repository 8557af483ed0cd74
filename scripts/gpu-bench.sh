#!/usr/bin/env bash
# Ondo against mlx-lm on a GPU, measured the same way every time: first the
# correctness check of Ondo's own CUDA kernel (scripts/gpu-matvec.py --check;
# the script stops if it fails), then the real Llama shapes with random 4-bit
# weights (ondo synth), prompts of 128 and 2048 tokens, both decode loop
# shapes, median of 5 after a warm-up, greedy tokens checked (mlx-lm asked
# twice where they differ), then every family `ondo synth --arch` offers at
# one shape with its token check, so that no family runs on the GPU
# unchecked. Writes under $OUT:
#   doctor.txt            what ondo doctor found (backend, device, MLX)
#   matvec-check.txt      scripts/gpu-matvec.py --check's output
#   bandwidth.json        the device's memory bandwidth, measured here
#   PRESET.json           ondo bench --peer mlx-lm --json, per preset
#   PRESET.graph.txt      one decode step's graph as MLX prints it
#   PRESET-FAMILY.json    ondo bench --peer mlx-lm --json, per family at
#                         FAMILY_PRESET (prompt 128, the pipelined loop)
#   PRESET-FAMILY.log     its standard error
#   gpu-bench.md          the table docs/BENCHMARKS.md quotes
#   concurrency-N.json    ondo bench --concurrency N --json: N streams at once
#                         on CONCURRENCY_PRESET, prompt 190 (and its .log)
#   concurrency.md        their table: aggregate tok/s against streams
# The script exits with status 1, after running everything else, when a
# token check finds a departure beyond rounding (or a run fails), and names
# the presets and families that did.
#
# Usage, on a machine with MLX's CUDA build (docs/BENCHMARKS.md, "On a GPU",
# says how to get one), with `ondo` and a python3 that imports mlx_lm:
#   OUT=results scripts/gpu-bench.sh                 all three presets, every family
#   OUT=results PRESETS=llama-3.2-3b PROMPTS=128 scripts/gpu-bench.sh
#   OUT=results PRESETS= FAMILIES="qwen3_moe gpt_oss" scripts/gpu-bench.sh
# Environment: ONDO (the binary, default `ondo`), PRESETS (empty for none), PROMPTS, REPS,
# GEN, MODELS (where the synthetic models are kept between runs), FAMILIES
# (default: every --arch value `ondo synth --help` lists; empty for none),
# FAMILY_PRESET (their shape, default llama-3.2-1b), FAMILY_PROMPTS (default
# 128), CONCURRENCY (streams at once, default 1,2,4,8,16; empty for none),
# CONCURRENCY_PRESET (default llama-3.2-3b), CONCURRENCY_REPS (default 3),
# MATVEC_QUICK=1 (the kernel check at bf16 in groups of 64 alone, the
# synthetic models' format). NO_MATVEC_CHECK=1 skips the kernel check, which
# needs CUDA: only for a dry run of this script's logic on a machine
# without a GPU (for example PRESETS=tiny FAMILIES="llama qwen3_moe"
# FAMILY_PRESET=tiny REPS=1 GEN=8 PROMPTS=16 NO_MATVEC_CHECK=1).
#
# A change measured against the binary before it: BASELINE names the other
# binary, PAIRS how many before/after pairs to run (default 3; the order
# alternates from pair to pair). Each side of pair N goes to OUT/pair-N/before
# and OUT/pair-N/after, and OUT/pairs.md lists every pair's ratios against
# mlx-lm and their medians: on a shared GPU one pair alone is noise. The
# kernel is checked once first; the pairs measure the presets alone.
#   OUT=results BASELINE=/tmp/ondo-before/ondo ONDO=/tmp/ondo/ondo \
#     PRESETS=llama-3.2-3b PROMPTS=128 scripts/gpu-bench.sh
set -euo pipefail

ondo=${ONDO:-ondo}
out=${OUT:?set OUT to the folder for the results}
presets=${PRESETS-llama-3.2-1b llama-3.2-3b llama-3.1-8b}
prompts=${PROMPTS:-128,2048}
reps=${REPS:-5}
gen=${GEN:-128}
models=${MODELS:-/tmp/ondo-gpu-models}
python=${ONDO_PYTHON:-python3}
here=$(cd "$(dirname "$0")" && pwd)
family_preset=${FAMILY_PRESET:-llama-3.2-1b}
family_prompts=${FAMILY_PROMPTS:-128}
concurrency=${CONCURRENCY-1,2,4,8,16}
concurrency_preset=${CONCURRENCY_PRESET:-llama-3.2-3b}
concurrency_reps=${CONCURRENCY_REPS:-3}
mkdir -p "$out" "$models"

# Every architecture `ondo synth --arch` takes, from its help's list of
# possible values ("- NAME" or "- NAME: what it is"). awk reads to the end,
# so that `ondo` never writes into a closed pipe.
synth_families() {
  "$ondo" synth --help | awk '
    /^ *--arch/ { arch = 1; next }
    /^ *--/ || /\[default/ { arch = 0 }
    arch && match($0, /^ *- [a-z0-9_]+/) {
      name = substr($0, RSTART, RLENGTH); sub(/^ *- /, "", name); print name
    }'
}
if [ -z "${FAMILIES+set}" ]; then
  families=$(synth_families)
  [ -n "$families" ] || { echo "could not read the families from $ondo synth --help" >&2; exit 1; }
else
  families=$FAMILIES
fi

# Ondo's own CUDA kernel, checked against MLX's in float32 before anything
# runs on it.
if [ "${NO_MATVEC_CHECK:-}" = 1 ]; then
  echo "== kernel check skipped (NO_MATVEC_CHECK=1): a dry run, not a result"
else
  quick=()
  [ "${MATVEC_QUICK:-}" = 1 ] && quick=(--quick)
  echo "== scripts/gpu-matvec.py --check ${quick[*]}"
  "$python" "$here/gpu-matvec.py" --check ${quick[@]+"${quick[@]}"} > "$out/matvec-check.txt" 2>&1 \
    || { cat "$out/matvec-check.txt"; echo "Ondo's CUDA kernel failed its check" >&2; exit 1; }
  tail -1 "$out/matvec-check.txt"
fi

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
      OUT="$out/pair-$pair/$side" ONDO="$binary" BASELINE="" NO_MATVEC_CHECK=1 FAMILIES="" CONCURRENCY="" \
        "$0" > "$out/pair-$pair/$side.log" 2>&1 \
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

# Runs one token-checked comparison: NAME, then ondo bench's arguments;
# writes OUT/NAME.json (and the bench's standard error to $log). A run
# whose token check found a departure beyond rounding, or that failed,
# joins $failed. `ondo bench` exits with 1 for both, so the JSON's verdict
# tells them apart.
failed=()
checked_bench() {
  local name=$1; shift
  local status=0
  "$ondo" bench "$@" --json > "$out/$name.json" 2> "$log" || status=$?
  [ "$status" -eq 0 ] && return 0
  local verdict
  verdict=$("$python" -c 'import json, sys; print(json.load(open(sys.argv[1]))["token_verdict"])' \
    "$out/$name.json" 2> /dev/null || true)
  if [ "$verdict" = different ]; then
    failed+=("$name (tokens beyond rounding)")
  else
    tail -5 "$log"
    failed+=("$name (ondo bench failed, status $status: $log)")
  fi
}

for preset in $presets; do
  dir=$models/$preset
  [ -f "$dir/config.json" ] || "$ondo" synth "$preset" "$dir" > /dev/null
  echo "== $preset: prompts $prompts, $reps reps, $gen tokens"
  log=$out/$preset.graph.txt
  ONDO_DUMP_GRAPH=1 checked_bench "$preset" "$dir" --peer mlx-lm --prompt-tokens "$prompts" \
    --gen "$gen" --reps "$reps" --warmup 1 --loop pipelined,sync --cold 0
done

rows=()
for family in $families; do
  name=$family_preset-$family
  dir=$models/$name
  [ -f "$dir/config.json" ] || "$ondo" synth "$family_preset" "$dir" --arch "$family" > /dev/null
  echo "== $name: prompt $family_prompts, $reps reps, $gen tokens"
  log=$out/$name.log
  checked_bench "$name" "$dir" --peer mlx-lm --prompt-tokens "$family_prompts" --gen "$gen" \
    --reps "$reps" --warmup 1 --loop pipelined --cold 0
  rows+=("$name")
done

"$python" "$here/gpu_bench_table.py" "$out" $presets --families ${rows[@]+"${rows[@]}"} \
  | tee "$out/gpu-bench.md"

# Streams at once on one model, Ondo's engine: each level its own run (a
# run cut short keeps the levels it finished), prompts of about 190 tokens,
# $gen tokens each; concurrency.md has the table: aggregate tok/s over each
# round's wall time, scaling over one stream, TTFT p50/p95.
if [ -n "$concurrency" ]; then
  dir=$models/$concurrency_preset
  [ -f "$dir/config.json" ] || "$ondo" synth "$concurrency_preset" "$dir" > /dev/null
  for level in ${concurrency//,/ }; do
    echo "== $concurrency_preset: $level streams at once, prompt 190, $gen tokens each"
    "$ondo" bench "$dir" --concurrency "$level" --prompt-tokens 190 --gen "$gen" \
      --reps "$concurrency_reps" --warmup 1 --json > "$out/concurrency-$level.json" \
      2> "$out/concurrency-$level.log" \
      || failed+=("concurrency $level (ondo bench failed: $out/concurrency-$level.log)")
  done
  "$python" - "$out" "$concurrency_preset" ${concurrency//,/ } <<'PY' | tee "$out/concurrency.md"
import json, sys
out, preset, levels = sys.argv[1], sys.argv[2], sys.argv[3:]
print(f"| {preset}, streams | aggregate tok/s (min-max) | x one stream | stream tok/s | TTFT p50 ms | TTFT p95 ms |")
print("|---|---|---|---|---|---|")
single = None
for level in levels:
    try:
        row = json.load(open(f"{out}/concurrency-{level}.json"))["rows"][0]
    except (OSError, ValueError, KeyError, IndexError):
        print(f"| {level} | (no result) | | | | |")
        continue
    agg = row["aggregate_tps"]
    single = single or agg["median"]
    print(f"| {level} | {agg['median']:.0f} ({agg['min']:.0f}-{agg['max']:.0f}) | {agg['median'] / single:.2f}x "
          f"| {row['stream_decode_tps']['median']:.0f} | {row['ttft_p50_ms']['median']:.0f} | {row['ttft_p95_ms']['median']:.0f} |")
PY
fi

if [ ${#failed[@]} -gt 0 ]; then
  printf 'FAILED: %s\n' "${failed[@]}" >&2
  exit 1
fi
