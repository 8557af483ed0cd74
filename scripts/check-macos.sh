#!/usr/bin/env bash
# Type-checks the macOS code (everything behind cfg(target_os = "macos")) from
# Linux: `cargo check --target aarch64-apple-darwin` for the whole workspace.
# It cannot link (that needs a Mac); it catches type errors in macOS-only code.
#  - mlx-sys: MLX_SYS_CHECK_ONLY=1 uses checked-in bindings instead of the
#    Metal build (third_party/mlx-sys/PATCHES.md, change 6).
#  - C code of dependencies (objc2's exception helper, oniguruma) goes through
#    a stand-in compiler that writes empty objects: checking needs none.
set -euo pipefail
root=$(cd "$(dirname "$0")/.." && pwd)
cd "$root"

# A check that cannot run is a failure, not a pass: `make test` and CI must
# not report the macOS code as checked when it was not. A developer on a
# machine that cannot add the target may skip it knowingly with
# ONDO_SKIP_MACOS_CHECK=1 (never in CI, where CI is set).
sysroot=$(rustc --print sysroot 2>/dev/null || true)
if [ -z "$sysroot" ] || [ ! -d "$sysroot/lib/rustlib/aarch64-apple-darwin/lib" ]; then
  if command -v rustup >/dev/null; then
    why="the aarch64-apple-darwin std is not installed"
    fix="rustup target add aarch64-apple-darwin (or make setup)"
  else
    why="the aarch64-apple-darwin std is not installed, and without rustup it cannot be added"
    fix="install Rust with rustup (https://rustup.rs), then rustup target add aarch64-apple-darwin"
  fi
  if [ -n "${ONDO_SKIP_MACOS_CHECK:-}" ] && [ -z "${CI:-}" ]; then
    echo "macos-check: skipped because ONDO_SKIP_MACOS_CHECK is set: $why; the macOS code was NOT checked"
    exit 0
  fi
  echo "macos-check: FAILED: the macOS code cannot be type-checked: $why." >&2
  echo "macos-check: to fix it: $fix" >&2
  if [ -z "${CI:-}" ]; then
    echo "macos-check: or, where that is impossible, skip it knowingly: ONDO_SKIP_MACOS_CHECK=1 make test" >&2
  fi
  exit 1
fi

export MLX_SYS_CHECK_ONLY=1
export CC_aarch64_apple_darwin="$root/scripts/apple-cc-standin.sh"
export CXX_aarch64_apple_darwin="$root/scripts/apple-cc-standin.sh"
export AR_aarch64_apple_darwin=ar
export SDKROOT=/nonexistent
# The app's build script copies the bundle's libmlx.dylib
# (bundle.macOS.frameworks) out of the mlx-metal wheel, which only a Mac
# unpacks; checking needs no library.
export TAURI_CONFIG='{"bundle":{"macOS":{"frameworks":null}}}'
# A separate target dir keeps these check artifacts from invalidating the
# Linux build's.
cargo check --workspace --all-targets --locked --target aarch64-apple-darwin \
  --target-dir target/macos-check
echo "macos-check: the workspace type-checks for aarch64-apple-darwin"

# A Mac builds no CUDA code: none of the library's sources, as rustc listed
# them for the check, is under src/engine/backend/cuda/ (compiled on Linux
# alone, where MLX's CUDA backend runs).
deps=(target/macos-check/aarch64-apple-darwin/debug/deps/ondo-*.d)
if [ ! -e "${deps[0]}" ]; then
  echo "macos-check: FAILED: rustc wrote no list of the library's sources to look in" >&2
  exit 1
fi
if grep -l "src/engine/backend/cuda/" "${deps[@]}" >&2; then
  echo "macos-check: FAILED: the macOS build compiles CUDA code (src/engine/backend/cuda/)" >&2
  exit 1
fi
sources=$(tr ' ' '\n' < "${deps[0]}" | grep -c '^/.*\.rs$' || true)
echo "macos-check: no CUDA code in the macOS build ($sources Rust sources, none under src/engine/backend/cuda/)"
