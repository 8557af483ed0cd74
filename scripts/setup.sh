#!/usr/bin/env bash
# Installs what building, running and testing Ondo needs, and nothing that is
# already there. Safe to run again: each step checks first and stays quiet.
#
#   scripts/setup.sh core    Rust build needs: compilers, libclang, cmake, the MLX venv
#   scripts/setup.sh app     core + WebKitGTK/appindicator, npm packages of ui/
#   scripts/setup.sh test    app + Xvfb, Chromium, WebKitWebDriver, tauri-driver,
#                            the macOS std for `cargo check --target aarch64-apple-darwin`
#   scripts/setup.sh mac     on a Mac: MLX's official mlx-metal wheel (libmlx.dylib,
#                            mlx.metallib) unpacked into target/mlx-metal; build with
#                            MLX_PREFIX="$PWD/$(scripts/setup.sh mac-prefix)"
#   scripts/setup.sh mac-prefix   prints that prefix (anywhere; it installs nothing)
#
# ONDO_MLX=cuda (Linux with an NVIDIA GPU and a CUDA 13 driver) puts MLX's
# CUDA build of the same version in the venv instead of the CPU build; the
# binaries link the venv's libmlx either way, so `ONDO_MLX=cuda make release`
# gives an `ondo` that runs on the GPU. CI and the tests use the CPU build.
set -euo pipefail

level=${1:-test}
root=$(cd "$(dirname "$0")/.." && pwd)
cd "$root"

MLX_VERSION=0.32.4
MLX_LM_VERSION=0.32.2
# Where `mac` unpacks the mlx-metal wheel; src-tauri/tauri.conf.json bundles
# libmlx.dylib and mlx.metallib from its mlx/lib (src-tauri/tests/bundle.rs
# checks that the two agree).
MAC_MLX_DIR=target/mlx-metal
# The official clients the local server's tests drive it with.
OPENAI_VERSION=3.57.0
OLLAMA_VERSION=0.6.3
ANTHROPIC_VERSION=2.16.0
# Checks that outputs held to a JSON schema are valid against it.
JSONSCHEMA_VERSION=4.25.1
# Pillow: the image preprocessors of transformers and mlx-vlm that the
# vision tests compare Ondo's resizing with.
PILLOW_VERSION=13.0.0
# mlx-vlm: the reference for the vision models, as mlx-lm is for text.
# Installed without its dependencies (opencv, datasets, mlx-audio, a web
# server: none on the path from a folder to an answer); the one it imports
# beyond mlx-lm's is requests.
MLX_VLM_VERSION=0.7.10
REQUESTS_VERSION=2.34.2
TAURI_DRIVER_VERSION=2.1.0
# Which build of MLX the venv holds: the wheel's extra, and the package that
# carries libmlx for it (the other backend's package is removed, since both
# install the same mlx/lib/libmlx.so).
case "${ONDO_MLX:-cpu}" in
  cpu) MLX_EXTRA=cpu; MLX_BACKEND_PKG=mlx-cpu; MLX_OTHER_PKGS="mlx-cuda-12 mlx-cuda-13" ;;
  cuda) MLX_EXTRA=cuda13; MLX_BACKEND_PKG=mlx-cuda-13; MLX_OTHER_PKGS="mlx-cpu mlx-cuda-12" ;;
  *) echo "setup: ONDO_MLX is '${ONDO_MLX}'; use cpu (the default) or cuda" >&2; exit 2 ;;
esac

say() { printf '  setup: %s\n' "$*"; }

core_debs=(build-essential pkg-config cmake libclang-14-dev libclang-common-14-dev clang-14 python3-venv libopenblas0-serial)
app_debs=(file libwebkit2gtk-4.1-dev libayatana-appindicator3-dev librsvg2-dev libssl-dev libxdo-dev libgtk-3-dev libsoup-3.0-dev libjavascriptcoregtk-4.1-dev)
test_debs=(xvfb xauth imagemagick webkit2gtk-driver dbus-x11 at-spi2-core chromium chromium-driver fonts-dejavu-core trayer xdotool)

install_debs() {
  local missing=()
  for pkg in "$@"; do
    dpkg-query -W -f='${Status}' "$pkg" 2>/dev/null | grep -q "install ok installed" || missing+=("$pkg")
  done
  [ ${#missing[@]} -eq 0 ] && return 0
  if [ "$(id -u)" -ne 0 ] || ! command -v apt-get >/dev/null; then
    echo "setup: missing Debian/Ubuntu packages: ${missing[*]}" >&2
    echo "setup: install them (sudo apt-get install ${missing[*]}) and run again" >&2
    exit 1
  fi
  say "installing ${missing[*]}"
  export DEBIAN_FRONTEND=noninteractive
  apt-get update -qq >/dev/null
  apt-get install -y -qq --no-install-recommends "${missing[@]}" >/dev/null
}

setup_venv() {
  local py=.venv/bin/python
  if [ -x "$py" ] && "$py" - <<PY 2>/dev/null
import importlib.metadata as m, sys
want = {"mlx": "$MLX_VERSION", "$MLX_BACKEND_PKG": "$MLX_VERSION", "mlx-lm": "$MLX_LM_VERSION",
        "openai": "$OPENAI_VERSION", "ollama": "$OLLAMA_VERSION",
        "anthropic": "$ANTHROPIC_VERSION", "jsonschema": "$JSONSCHEMA_VERSION",
        "pillow": "$PILLOW_VERSION", "mlx-vlm": "$MLX_VLM_VERSION",
        "requests": "$REQUESTS_VERSION"}
def installed(name):
    try:
        return m.version(name)
    except m.PackageNotFoundError:
        return None
ok = all(installed(name) == version for name, version in want.items())
ok = ok and not any(installed(name) for name in "$MLX_OTHER_PKGS".split())
sys.exit(0 if ok else 1)
PY
  then return 0; fi
  say "setting up .venv: mlx[$MLX_EXTRA]==$MLX_VERSION, mlx-lm==$MLX_LM_VERSION, openai==$OPENAI_VERSION, ollama==$OLLAMA_VERSION, anthropic==$ANTHROPIC_VERSION, jsonschema==$JSONSCHEMA_VERSION, pillow==$PILLOW_VERSION, mlx-vlm==$MLX_VLM_VERSION"
  [ -x "$py" ] || python3 -m venv .venv
  local other switched=""
  for other in $MLX_OTHER_PKGS; do
    if .venv/bin/pip show -q "$other" >/dev/null 2>&1; then
      say "removing $other (ONDO_MLX=${ONDO_MLX:-cpu} asks for $MLX_BACKEND_PKG)"
      .venv/bin/pip uninstall -q -y "$other"
      switched=1
    fi
  done
  .venv/bin/pip install -q --disable-pip-version-check "mlx[$MLX_EXTRA]==$MLX_VERSION" "mlx-lm==$MLX_LM_VERSION" \
    "openai==$OPENAI_VERSION" "ollama==$OLLAMA_VERSION" "anthropic==$ANTHROPIC_VERSION" \
    "jsonschema==$JSONSCHEMA_VERSION" "pillow==$PILLOW_VERSION" "requests==$REQUESTS_VERSION"
  .venv/bin/pip install -q --disable-pip-version-check --no-deps "mlx-vlm==$MLX_VLM_VERSION"
  if [ -n "$switched" ]; then
    # The package removed took the mlx/lib files both install with it;
    # reinstalling the chosen one puts them back.
    .venv/bin/pip install -q --disable-pip-version-check --force-reinstall --no-deps "$MLX_BACKEND_PKG==$MLX_VERSION"
  fi
}

setup_npm() {
  # Reinstall only when package-lock.json changed since the last install.
  local stamp=ui/node_modules/.ondo-lock-hash
  local want
  want=$(sha256sum ui/package-lock.json | cut -d' ' -f1)
  if [ -f "$stamp" ] && [ "$(cat "$stamp")" = "$want" ]; then return 0; fi
  say "installing ui/ npm packages"
  (cd ui && npm ci --no-audit --no-fund --loglevel=error >/dev/null)
  echo "$want" > "$stamp"
}

apple_std_installed() {
  local sysroot
  sysroot=$(rustc --print sysroot 2>/dev/null) || return 1
  [ -d "$sysroot/lib/rustlib/aarch64-apple-darwin/lib" ]
}

# `make test` type-checks the macOS code (scripts/check-macos.sh), so a
# target that cannot be added stops here, loudly, rather than let the check
# pass without checking. ONDO_SKIP_MACOS_CHECK=1 skips it knowingly (not in CI).
setup_apple_target() {
  apple_std_installed && return 0
  if [ -n "${ONDO_SKIP_MACOS_CHECK:-}" ] && [ -z "${CI:-}" ]; then
    say "not adding the aarch64-apple-darwin std (ONDO_SKIP_MACOS_CHECK is set); the macOS code will not be checked"
    return 0
  fi
  if ! command -v rustup >/dev/null; then
    echo "setup: the macOS type-check needs the aarch64-apple-darwin std, and rustup is not here to add it" >&2
    echo "setup: install Rust with rustup (https://rustup.rs) and run again" >&2
    [ -z "${CI:-}" ] && echo "setup: or skip the macOS check knowingly: ONDO_SKIP_MACOS_CHECK=1 make test" >&2
    exit 1
  fi
  say "adding the aarch64-apple-darwin std (type-checks the macOS code)"
  local output
  if ! output=$(rustup target add aarch64-apple-darwin 2>&1); then
    echo "$output" >&2
    echo "setup: could not add the aarch64-apple-darwin std, which the macOS type-check needs (above: why)" >&2
    [ -z "${CI:-}" ] && echo "setup: fix that and run again, or skip the macOS check knowingly: ONDO_SKIP_MACOS_CHECK=1 make test" >&2
    exit 1
  fi
}

# The Mac build links the same MLX release as Linux, from its mlx-metal
# wheel, built for the oldest macOS the app supports (tauri.conf.json's
# minimumSystemVersion): pip on a newer Mac would pick that Mac's wheel, whose
# mlx.metallib older macOS cannot load. docs/ARCHITECTURE.md, "Shipping on a
# Mac", says why.
setup_mlx_metal() {
  if [ "$(uname -s)" != Darwin ]; then
    echo "setup: the mlx-metal wheel is for macOS; run this on a Mac" >&2
    exit 1
  fi
  local min platform want stamp=$MAC_MLX_DIR/.ondo-wheel
  min=$(python3 -c 'import json, sys; print(json.load(open(sys.argv[1]))["bundle"]["macOS"]["minimumSystemVersion"])' \
    src-tauri/tauri.conf.json)
  platform="macosx_${min%%.*}_${min#*.}_arm64"
  want="mlx-metal==$MLX_VERSION $platform"
  if [ -f "$stamp" ] && [ "$(cat "$stamp")" = "$want" ]; then return 0; fi
  say "unpacking mlx-metal==$MLX_VERSION ($platform) into $MAC_MLX_DIR"
  rm -rf "$MAC_MLX_DIR"
  mkdir -p "$MAC_MLX_DIR/wheel"
  python3 -m pip download --quiet --disable-pip-version-check --no-deps \
    --only-binary=:all: --platform "$platform" "mlx-metal==$MLX_VERSION" -d "$MAC_MLX_DIR/wheel"
  python3 -m zipfile -e "$MAC_MLX_DIR"/wheel/mlx_metal-*.whl "$MAC_MLX_DIR"
  echo "$want" > "$stamp"
}

setup_tauri_driver() {
  command -v tauri-driver >/dev/null && return 0
  say "building tauri-driver $TAURI_DRIVER_VERSION (once)"
  cargo install --quiet --locked "tauri-driver@$TAURI_DRIVER_VERSION"
}

case "$level" in
  core) install_debs "${core_debs[@]}"; setup_venv ;;
  app) install_debs "${core_debs[@]}" "${app_debs[@]}"; setup_venv; setup_npm ;;
  test)
    install_debs "${core_debs[@]}" "${app_debs[@]}" "${test_debs[@]}"
    setup_venv; setup_npm; setup_apple_target; setup_tauri_driver ;;
  mac) setup_mlx_metal ;;
  mac-prefix) echo "$MAC_MLX_DIR/mlx" ;;
  *) echo "usage: scripts/setup.sh core|app|test|mac|mac-prefix" >&2; exit 2 ;;
esac
