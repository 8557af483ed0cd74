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

if ! rustup target list --installed 2>/dev/null | grep -q aarch64-apple-darwin; then
  echo "macos-check: skipped, the aarch64-apple-darwin std is not installed (rustup target add aarch64-apple-darwin)"
  exit 0
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
