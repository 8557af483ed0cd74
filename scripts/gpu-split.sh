#!/usr/bin/env bash
# A model split over two ranks on one GPU machine: both ranks are processes
# here, on the same card, joined by MLX's ring backend over 127.0.0.1 (a
# one-GPU machine has no second card for NCCL). `ondo bench --hostfile`
# runs the model alone, split by layers and split by heads, alternating,
# with greedy tokens compared; the table and the JSON go to $OUT. What it
# shows: that a split runs on the CUDA backend with the same tokens, and
# what the ring costs a step there; not what two cards would gain (both
# ranks share one card's bandwidth).
#
#   OUT=results ONDO=/tmp/ondo/ondo scripts/gpu-split.sh
# Environment: ONDO (the binary), MODELS, PRESET (llama-3.2-3b, 4-bit;
# `tiny` for a dry run on a CPU), REPS (5), GEN (128), PROMPT (128).
set -uo pipefail
ondo=${ONDO:-ondo}
out=${OUT:?set OUT to the folder for the results}
models=${MODELS:-/tmp/ondo-gpu-models}
preset=${PRESET:-llama-3.2-3b}
mkdir -p "$out" "$models"
export ONDO_HOME=${ONDO_HOME:-$models/home} ONDO_NO_KEYCHAIN=1
model=$models/split-$preset
bits=(--bits 4)
[ "$preset" = tiny ] && bits=()
[ -f "$model/config.json" ] || "$ondo" synth "$preset" "$model" "${bits[@]}" > /dev/null || exit 1
hosts=$models/two-here.json
echo '["localhost", "127.0.0.1"]' > "$hosts"
# One split run first, its words kept: a failure here says why in full.
"$ondo" run "$model" --hostfile "$hosts" --max-tokens 16 --no-history "one split run" \
  > "$out/split-run.txt" 2>&1 || { echo "the split run failed: see split-run.txt"; exit 1; }
# A prompt in many prefill chunks: the ranks agree between chunks whether
# to go on (a one-element sum each time), on the GPU's streams too.
"$ondo" run "$model" --hostfile "$hosts" --max-tokens 8 --prefill-step-size 32 --no-history \
  "$(printf 'the sea and the sky %.0s' $(seq 40))" \
  > "$out/split-chunks.txt" 2>&1 || { echo "the chunked split run failed: see split-chunks.txt"; exit 1; }
"$ondo" bench "$model" --hostfile "$hosts" --split pipeline,tensor \
  --prompt-tokens "${PROMPT:-128}" --gen "${GEN:-128}" --reps "${REPS:-5}" --warmup 1 \
  > "$out/split-bench.txt" 2> "$out/split-bench.log"
rc=$?
# Every run's record, the split's fields included.
"$ondo" report --last 40 --format jsonl --out "$out/split-runs.jsonl" 2>/dev/null || true
exit $rc
