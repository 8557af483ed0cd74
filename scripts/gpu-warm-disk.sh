#!/usr/bin/env bash
# The prompt cache on disk and the quantized KV cache, measured on a GPU
# against one model (ondo synth PRESET, llama-3.2-3b: random 4-bit bf16 weights),
# each part a ratio taken in the same call. Writes under $OUT:
#   prompt-cache.txt   scripts/bench-prompt-cache.py: TTFT after a restart,
#                      a PREFIX-token prefix read from disk against prefilled
#   memory-float.json, memory-kv4.json
#                      ondo bench --peer mlx-lm at a CONTEXT-token prompt,
#                      float and 4-bit KV cache (peak memory of both sides)
#   memory-runs.jsonl  Ondo's runs of those (kv_cache_bytes, kv_bits)
#   decode-float.md, decode-kv4.md, decode-kv8.md
#                      ondo bench --peer mlx-lm at prompt 128, 128 tokens,
#                      the KV cache quantized from the first token on both sides
#   concurrency-kv4.txt, concurrency-float.txt
#                      scripts/bench-concurrency.sh at 8 streams: Ondo's batch
#                      (its KV cache in 4 bits, then float) against
#                      mlx_lm.server, which has no kv_bits
#
#   OUT=results ONDO=/tmp/ondo/ondo scripts/gpu-warm-disk.sh
#   OUT=results PARTS="prompt-cache memory" scripts/gpu-warm-disk.sh
# Environment: ONDO (the binary), ONDO_PYTHON (python3 with mlx_lm), MODELS,
# PARTS (default: prompt-cache memory decode concurrency), PREFIX (16000),
# CONTEXT (32768), REPS (5), DECODE_SIDES (float kv4 kv8), CONCURRENCY_SIDES
# (kv4 float), PRESET (llama-3.2-3b; `tiny` for a dry run of
# this script's logic on a CPU with small PREFIX and CONTEXT).
set -uo pipefail
root=$(cd "$(dirname "$0")/.." && pwd)
ondo=${ONDO:-ondo}
out=${OUT:?set OUT to the folder for the results}
python=${ONDO_PYTHON:-python3}
models=${MODELS:-/tmp/ondo-gpu-models}
parts=${PARTS:-prompt-cache memory decode concurrency}
prefix=${PREFIX:-16000}
context=${CONTEXT:-32768}
reps=${REPS:-5}
mkdir -p "$out" "$models"
export ONDO_HOME=${ONDO_HOME:-$models/home} ONDO_NO_KEYCHAIN=1
preset=${PRESET:-llama-3.2-3b}
model=$models/$preset
[ -f "$model/config.json" ] || "$ondo" synth "$preset" "$model" > /dev/null
kv4=(--kv-bits 4 --quantized-kv-start 0)
failed=()

for part in $parts; do
  echo "== $part"
  case $part in
    prompt-cache)
      "$python" "$root/scripts/bench-prompt-cache.py" --ondo "$ondo" --model "$model" \
        --prefix "$prefix" --reps 3 > "$out/prompt-cache.txt" 2>&1 || failed+=(prompt-cache)
      ;;
    memory)
      for side in float kv4; do
        extra=()
        [ "$side" = kv4 ] && extra=("${kv4[@]}")
        "$ondo" bench "$model" --peer mlx-lm --prompt-tokens "$context" --gen 8 --reps 1 \
          --warmup 0 --loop pipelined --cold 0 --json "${extra[@]}" \
          > "$out/memory-$side.json" 2> "$out/memory-$side.log" || failed+=("memory $side")
      done
      "$ondo" report --kind bench --last 2 --format jsonl --out "$out/memory-runs.jsonl" \
        || failed+=("report")
      ;;
    decode)
      for side in ${DECODE_SIDES:-float kv4 kv8}; do
        extra=()
        [ "$side" = kv4 ] && extra=("${kv4[@]}")
        [ "$side" = kv8 ] && extra=(--kv-bits 8 --quantized-kv-start 0)
        "$ondo" bench "$model" --peer mlx-lm --prompt-tokens 128 --gen 128 --reps "$reps" \
          --loop pipelined --cold 0 --markdown "${extra[@]}" \
          > "$out/decode-$side.md" 2> "$out/decode-$side.log" || failed+=("decode $side")
      done
      ;;
    concurrency)
      for side in ${CONCURRENCY_SIDES:-kv4 float}; do
        extra=()
        [ "$side" = kv4 ] && extra=("${kv4[@]}")
        ONDO_BIN=$ondo ONDO_PYTHON=$python "$root/scripts/bench-concurrency.sh" "$preset" 8 3 \
          "${extra[@]}" > "$out/concurrency-$side.txt" 2>&1 || failed+=("concurrency $side")
      done
      ;;
    *) echo "unknown part $part" >&2; failed+=("$part") ;;
  esac
done
if [ ${#failed[@]} -gt 0 ]; then
  echo "failed: ${failed[*]}" >&2
  exit 1
fi
