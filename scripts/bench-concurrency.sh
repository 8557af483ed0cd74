#!/usr/bin/env bash
# Several streams at once on one model: Ondo's engine in process, `ondo
# serve` and mlx_lm.server over HTTP on 127.0.0.1, each given the same
# streams at each level (`ondo bench --concurrency`), alternating who goes
# first. Prints the table (aggregate tok/s, per-stream tok/s, TTFT p50/p95,
# scaling over one stream, ratio to Ondo's engine).
#
#   scripts/bench-concurrency.sh [PRESET] [LEVELS] [REPS] [EXTRA ondo bench ARGS...]
#       default: small 1,2,4,8 3
#
# Every side runs the same synthesized model (`ondo synth PRESET`), put in a
# Hugging Face cache of its own as the repo `bench/PRESET` (a server is
# given repo ids, not folders); set SYNTH_ARGS to change how it is written
# (e.g. SYNTH_ARGS="--bits 4"). MLX_SERVER_ARGS adds options to
# mlx_lm.server (e.g. "--kv-bits 4 --quantized-kv-start 0", with which it
# serves one request at a time).
set -euo pipefail
root=$(cd "$(dirname "$0")/.." && pwd)
preset=${1:-small}
levels=${2:-1,2,4,8}
reps=${3:-3}
shift $(( $# < 3 ? $# : 3 ))
python=${ONDO_PYTHON:-$root/.venv/bin/python}
ondo=${ONDO_BIN:-$root/target/release/ondo}
[ -x "$ondo" ] || { echo "build first: cargo build --release --bin ondo" >&2; exit 1; }
work=$(mktemp -d)
pids=()
trap 'kill "${pids[@]}" 2>/dev/null || true; rm -rf "$work"' EXIT
export ONDO_HOME=$work/home ONDO_NO_KEYCHAIN=1 HF_HUB_CACHE=$work/hf HF_HUB_OFFLINE=1
repo=bench/$preset
commit=0123456789abcdef0123456789abcdef01234567
snapshot=$HF_HUB_CACHE/models--bench--$preset/snapshots/$commit
mkdir -p "$HF_HUB_CACHE/models--bench--$preset/refs"
echo -n "$commit" > "$HF_HUB_CACHE/models--bench--$preset/refs/main"
# shellcheck disable=SC2086
"$ondo" synth "$preset" "$snapshot" ${SYNTH_ARGS:-} >/dev/null
most=${levels##*,}

free_port() {
  "$python" -c 'import socket; s = socket.socket(); s.bind(("127.0.0.1", 0)); print(s.getsockname()[1])'
}
wait_for() {
  for _ in $(seq 600); do
    curl -sf "http://127.0.0.1:$1$2" >/dev/null && return 0
    sleep 0.2
  done
  echo "the server on port $1 did not start" >&2
  exit 1
}

ondo_port=$(free_port)
"$ondo" serve --port "$ondo_port" --max-batch "$most" --no-history >"$work/serve.log" 2>&1 &
pids+=($!)
mlx_port=$(free_port)
# shellcheck disable=SC2086
"$python" -m mlx_lm.server --model "$repo" \
  --host 127.0.0.1 --port "$mlx_port" --decode-concurrency "$most" \
  --prompt-concurrency "$most" ${MLX_SERVER_ARGS:-} >"$work/mlx.log" 2>&1 &
pids+=($!)
wait_for "$ondo_port" /v1/models
wait_for "$mlx_port" /v1/models
size=$(du -sbL "$snapshot" | cut -f1)
echo "model: ondo synth $preset ${SYNTH_ARGS:-}, $((size / 1048576)) MiB; levels $levels; $reps rounds each"

"$ondo" bench "$repo" --concurrency "$levels" --reps "$reps" \
  --endpoint "serve=http://127.0.0.1:$ondo_port/v1#$repo" \
  --endpoint "mlx=http://127.0.0.1:$mlx_port/v1#$repo" "$@"
