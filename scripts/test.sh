#!/usr/bin/env bash
# Everything CI runs, in order. Every stage runs even when an earlier one
# failed, so one report shows all that is wrong; the exit status is non-zero
# if any stage failed. The last line sums the tests of every runner.
set -uo pipefail

root=$(cd "$(dirname "$0")/.." && pwd)
cd "$root"
export MLX_PYTHON="$root/.venv/bin/python"
export ONDO_PYTHON="$root/.venv/bin/python"
# Tests that compare with mlx-lm must run here, not skip.
export ONDO_REQUIRE_PYTHON=1
# MLX state is per process; keep the test binaries' MLX work on one thread.
export RUST_TEST_THREADS=1
export CARGO_TERM_COLOR=never
# Plain logs: the summary below reads the runners' own closing lines.
export NO_COLOR=1 FORCE_COLOR=0

logdir=$(mktemp -d)
failed_stages=()
passed=0
failed=0

sum_lines() { awk '{s += $1} END {print s + 0}'; }

stage() {
  local name=$1; shift
  local log="$logdir/$name.log"
  echo "=== $name: $*"
  local start=$SECONDS
  "$@" > >(tee "$log.raw") 2>&1
  local status=$?
  wait
  # Colour codes would hide the runners' counts from the greps below.
  sed 's/\x1b\[[0-9;]*m//g' "$log.raw" > "$log"
  # Sum what each runner reports: cargo's "test result" lines, vitest's
  # "Tests N passed", and node's test runner's "# pass N" / "# fail N".
  local p f
  p=$(grep -hoE 'test result: [a-zA-Z]+\. [0-9]+ passed' "$log" | grep -oE '[0-9]+ passed' | grep -oE '[0-9]+' | sum_lines)
  f=$(grep -hoE '; [0-9]+ failed' "$log" | grep -oE '[0-9]+' | sum_lines)
  passed=$((passed + ${p:-0})); failed=$((failed + ${f:-0}))
  p=$(grep -hE '^\s*Tests\s+.*[0-9]+ passed' "$log" | grep -oE '[0-9]+ passed' | grep -oE '[0-9]+' | sum_lines)
  f=$(grep -hE '^\s*Tests\s+.*[0-9]+ failed' "$log" | grep -oE '[0-9]+ failed' | grep -oE '[0-9]+' | sum_lines)
  passed=$((passed + ${p:-0})); failed=$((failed + ${f:-0}))
  p=$(grep -hE '^# pass [0-9]+$' "$log" | grep -oE '[0-9]+' | sum_lines)
  f=$(grep -hE '^# fail [0-9]+$' "$log" | grep -oE '[0-9]+' | sum_lines)
  passed=$((passed + ${p:-0})); failed=$((failed + ${f:-0}))
  if [ $status -ne 0 ]; then
    failed_stages+=("$name")
    echo "=== $name FAILED (exit $status, $((SECONDS - start)) s)"
  else
    echo "=== $name ok ($((SECONDS - start)) s)"
  fi
}

# The app embeds ui/dist at compile time, so the UI is built before any cargo
# stage that compiles src-tauri.
stage ui-build bash -c 'cd ui && npm run --silent build'
stage fmt cargo fmt --all --check
stage clippy cargo clippy --workspace --all-targets --locked -- -D warnings
# --no-fail-fast: a failing test binary must not hide the others' results.
stage cargo-test cargo test --workspace --locked --no-fail-fast
stage macos-check scripts/check-macos.sh
if [ -f ui/package.json ]; then
  stage ui-check bash -c 'cd ui && npm run --silent check'
  stage ui-unit bash -c 'cd ui && npm run --silent test'
  stage ui-browser bash -c 'cd ui && npm run --silent test:browser'
fi
if [ -x tests/e2e/run.sh ]; then
  stage e2e tests/e2e/run.sh
fi

echo
if [ ${#failed_stages[@]} -gt 0 ]; then
  echo "failed stages: ${failed_stages[*]}"
  # A stage can fail without a failing test (a lint, a build): count it.
  failed=$((failed + ${#failed_stages[@]}))
fi
echo "ondo: $passed passed, $failed failed"
[ ${#failed_stages[@]} -eq 0 ]
