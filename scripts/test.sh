#!/usr/bin/env bash
# Everything CI runs, in order; or, given stage names, those stages alone:
#
#   scripts/test.sh                  every stage (`make test`, CI)
#   scripts/test.sh fmt clippy       these stages, in the order below
#   scripts/test.sh --list           the stages' names
#
# Every stage runs even when an earlier one failed, so one report shows all
# that is wrong; the exit status is non-zero if any stage failed. A stage
# fails when its files are missing, and a stage that runs tests fails when its
# runner reports none: a gate that checked nothing must not pass. The last
# line sums the tests of every runner.
set -uo pipefail

root=$(cd "$(dirname "$0")/.." && pwd)
cd "$root"

# The stages, in the order they run. The app embeds ui/dist at compile time,
# so ui-build comes before any cargo stage that compiles src-tauri.
all_stages=(ui-build fmt clippy cargo-test macos-check ui-check ui-unit ui-browser e2e)
# Those whose runner must report at least one test.
test_stages=(cargo-test ui-unit ui-browser e2e)
# Those that compile src-tauri, and so need ui/dist built first.
needs_ui_dist=(clippy cargo-test macos-check)

contains() {
  local wanted=$1; shift
  local item
  for item in "$@"; do [ "$item" = "$wanted" ] && return 0; done
  return 1
}

if [ "${1:-}" = "--list" ]; then
  printf '%s\n' "${all_stages[@]}"
  exit 0
fi
for name in "$@"; do
  if ! contains "$name" "${all_stages[@]}"; then
    echo "test.sh: no stage '$name'; the stages are: ${all_stages[*]}" >&2
    exit 2
  fi
done
wanted=("$@")
[ ${#wanted[@]} -eq 0 ] && wanted=("${all_stages[@]}")
for name in "${needs_ui_dist[@]}"; do
  contains "$name" "${wanted[@]}" && wanted+=(ui-build)
done

export MLX_PYTHON="$root/.venv/bin/python"
export ONDO_PYTHON="$root/.venv/bin/python"
# Tests that compare with mlx-lm must run here: ONDO_SKIP_PYTHON cannot skip
# them (tests/common/mod.rs).
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
ignored=0

sum_lines() { awk '{s += $1} END {print s + 0}'; }

# A file a stage cannot run without: its absence fails the stage, loudly.
need() {
  if [ ! -e "$1" ]; then
    echo "$1 is missing, so this stage cannot run; a clone of the repository has it (git status shows whether it was deleted)" >&2
    return 1
  fi
}

run_stage() {
  case $1 in
    ui-build) need ui/package.json && (cd ui && npm run --silent build) ;;
    fmt) cargo fmt --all --check ;;
    clippy) cargo clippy --workspace --all-targets --locked -- -D warnings ;;
    # --no-fail-fast: a failing test binary must not hide the others' results.
    cargo-test) cargo test --workspace --locked --no-fail-fast ;;
    macos-check) need scripts/check-macos.sh && scripts/check-macos.sh ;;
    ui-check) need ui/package.json && (cd ui && npm run --silent check) ;;
    ui-unit) need ui/package.json && (cd ui && npm run --silent test) ;;
    ui-browser) need ui/package.json && (cd ui && npm run --silent test:browser) ;;
    e2e) need tests/e2e/run.sh && tests/e2e/run.sh ;;
  esac
}

# Prints "passed failed ignored" as the runners in LOG report them: cargo's
# "test result" lines, vitest's "Tests  N passed | M failed | K skipped", and
# node's test runner's "# pass N" / "# fail N" / "# skipped N".
count_tests() {
  local log=$1 p=0 f=0 i=0 n
  n=$(grep -hoE 'test result: [a-zA-Z]+\. [0-9]+ passed' "$log" | grep -oE '[0-9]+' | sum_lines); p=$((p + n))
  n=$(grep -hoE 'test result: .*; [0-9]+ failed' "$log" | grep -oE '[0-9]+ failed' | grep -oE '[0-9]+' | sum_lines); f=$((f + n))
  n=$(grep -hoE 'test result: .*; [0-9]+ ignored' "$log" | grep -oE '[0-9]+ ignored' | grep -oE '[0-9]+' | sum_lines); i=$((i + n))
  n=$(grep -hE '^\s*Tests\s+.*[0-9]+ passed' "$log" | grep -oE '[0-9]+ passed' | grep -oE '[0-9]+' | sum_lines); p=$((p + n))
  n=$(grep -hE '^\s*Tests\s+.*[0-9]+ failed' "$log" | grep -oE '[0-9]+ failed' | grep -oE '[0-9]+' | sum_lines); f=$((f + n))
  n=$(grep -hE '^\s*Tests\s+.*[0-9]+ skipped' "$log" | grep -oE '[0-9]+ skipped' | grep -oE '[0-9]+' | sum_lines); i=$((i + n))
  n=$(grep -hE '^# pass [0-9]+$' "$log" | grep -oE '[0-9]+' | sum_lines); p=$((p + n))
  n=$(grep -hE '^# fail [0-9]+$' "$log" | grep -oE '[0-9]+' | sum_lines); f=$((f + n))
  n=$(grep -hE '^# skipped [0-9]+$' "$log" | grep -oE '[0-9]+' | sum_lines); i=$((i + n))
  echo "$p $f $i"
}

stage() {
  local name=$1
  local log="$logdir/$name.log"
  echo "=== $name"
  local start=$SECONDS
  run_stage "$name" > >(tee "$log.raw") 2>&1
  local status=$?
  wait
  # Colour codes would hide the runners' counts from the greps below.
  sed 's/\x1b\[[0-9;]*m//g' "$log.raw" > "$log"
  local p f i
  read -r p f i < <(count_tests "$log")
  passed=$((passed + p)); failed=$((failed + f)); ignored=$((ignored + i))
  if [ $status -eq 0 ] && contains "$name" "${test_stages[@]}" && [ $((p + f)) -eq 0 ]; then
    echo "=== $name: its runner reported no test run; a test stage that checked nothing fails"
    status=1
  fi
  if [ $status -ne 0 ]; then
    failed_stages+=("$name")
    echo "=== $name FAILED (exit $status, $((SECONDS - start)) s)"
  else
    local tests=""
    contains "$name" "${test_stages[@]}" && tests=", $p passed, $i ignored"
    echo "=== $name ok ($((SECONDS - start)) s$tests)"
  fi
}

for name in "${all_stages[@]}"; do
  contains "$name" "${wanted[@]}" && stage "$name"
done

echo
if [ ${#failed_stages[@]} -gt 0 ]; then
  echo "failed stages: ${failed_stages[*]}"
  # A stage can fail without a failing test (a lint, a build): count it.
  failed=$((failed + ${#failed_stages[@]}))
fi
echo "ondo: $passed passed, $failed failed, $ignored ignored"
[ ${#failed_stages[@]} -eq 0 ]
