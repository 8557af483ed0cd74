#!/usr/bin/env bash
# Download speed of `ondo pull` against Python's huggingface_hub
# (`snapshot_download`) from the same hub server on 127.0.0.1 (ondo-testhub),
# same model, alternating, fresh cache each time. Prints each time and the
# median per side with the ratio. Loopback measures the client's own cost
# (HTTP, hashing, writing), not a network.
#
#   scripts/bench-download.sh [PRESET] [REPS]     (default: small 5)
set -euo pipefail
root=$(cd "$(dirname "$0")/.." && pwd)
preset=${1:-small}
reps=${2:-5}
python=${ONDO_PYTHON:-$root/.venv/bin/python}
ondo=$root/target/release/ondo
hub=$root/target/release/ondo-testhub
[ -x "$ondo" ] && [ -x "$hub" ] || {
  echo "build first: cargo build --release --bin ondo -p ondo-testhub" >&2
  exit 1
}
work=$(mktemp -d)
trap 'kill $hub_pid 2>/dev/null || true; rm -rf "$work"' EXIT
ONDO_HOME=$work/home "$ondo" synth "$preset" "$work/model" >/dev/null
"$hub" --repo "bench/$preset=$work/model" > "$work/hub.out" &
hub_pid=$!
until grep -q listening "$work/hub.out"; do sleep 0.1; done
url=$(sed -n 's/.*listening on //p' "$work/hub.out")
size=$(du -sb "$work/model" | cut -f1)
echo "model: ondo synth $preset, $((size / 1048576)) MiB; hub $url; $reps repetitions each"

ondo_pull() {
  HF_ENDPOINT=$url HF_HUB_CACHE=$work/cache-ondo ONDO_NO_KEYCHAIN=1 \
    "$ondo" pull "bench/$preset" --json > /dev/null
}
hf_pull() {
  HF_ENDPOINT=$url HF_HUB_CACHE=$work/cache-hf HF_HUB_DISABLE_TELEMETRY=1 \
    HF_HUB_DISABLE_PROGRESS_BARS=1 "$python" -c \
    "import sys; from huggingface_hub import snapshot_download; snapshot_download(sys.argv[1])" \
    "bench/$preset"
}
time_ms() {
  local start end
  start=$(date +%s%N)
  "$@"
  end=$(date +%s%N)
  echo $(((end - start) / 1000000))
}
ours=()
theirs=()
for i in $(seq 1 "$reps"); do
  rm -rf "$work/cache-ondo" "$work/cache-hf"
  if [ $((i % 2)) -eq 1 ]; then
    ours+=("$(time_ms ondo_pull)")
    theirs+=("$(time_ms hf_pull)")
  else
    theirs+=("$(time_ms hf_pull)")
    ours+=("$(time_ms ondo_pull)")
  fi
  echo "  rep $i: ondo ${ours[-1]} ms, huggingface_hub ${theirs[-1]} ms"
done
median() { printf '%s\n' "$@" | sort -n | awk '{a[NR]=$1} END {print (NR % 2) ? a[(NR+1)/2] : (a[NR/2] + a[NR/2+1]) / 2}'; }
spread() { printf '%s\n' "$@" | sort -n | awk 'NR==1 {min=$1} {max=$1} END {print min "-" max}'; }
m_ours=$(median "${ours[@]}")
m_theirs=$(median "${theirs[@]}")
echo "ondo pull:              median $m_ours ms ($(spread "${ours[@]}"))"
echo "huggingface_hub $("$python" -c 'import huggingface_hub; print(huggingface_hub.__version__)'): median $m_theirs ms ($(spread "${theirs[@]}"))"
awk -v a="$m_ours" -v b="$m_theirs" 'BEGIN {printf "time ratio ondo / huggingface_hub: %.2fx (below 1 is faster)\n", a / b}'
