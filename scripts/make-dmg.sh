#!/usr/bin/env bash
# `make dmg`: builds Ondo.app and its disk image on an Apple Silicon Mac, then
# checks that the app would start on a Mac that never built Ondo:
#  - libmlx.dylib is in Contents/Frameworks, mlx.metallib in Contents/Resources
#    (byte for byte the wheel's), the ondo CLI in Contents/MacOS;
#  - no binary loads a library by a path of this machine (otool -L: only the
#    system's libraries and @rpath), none has an rpath to one (otool -l: only
#    @executable_path/../Frameworks), and none needs a newer macOS than the
#    bundle's minimum;
#  - Info.plist says LSUIElement and the minimum macOS; the signature verifies;
#  - the ondo doctor inside the disk image passes with this build's MLX folder
#    moved away, and its MLX loaded libmlx and mlx.metallib from the app.
# What goes where, and why: docs/ARCHITECTURE.md, "Shipping on a Mac".
#
# Signing: APPLE_SIGNING_IDENTITY (Tauri's variable) names a Developer ID
# certificate in the keychain; with APPLE_ID, APPLE_PASSWORD and APPLE_TEAM_ID
# set too, Tauri notarizes. Without it everything is signed ad hoc: the app
# runs on this Mac, and Gatekeeper stops it on others after a download.
# On a Mac without a logged-in desktop, set CI=true (Tauri then skips styling
# the disk image's Finder window).
#
# Written for macOS's own bash 3.2: no arrays that may be empty, no mapfile.
set -euo pipefail
root=$(cd "$(dirname "$0")/.." && pwd)
cd "$root"

fail() {
  echo "make dmg: $*" >&2
  exit 1
}
step() { printf '\n== %s\n' "$*"; }

[ "$(uname -s)" = Darwin ] || fail "this builds the Mac app, so it runs on a Mac (Apple Silicon, macOS 14 or later)"
[ "$(uname -m)" = arm64 ] || fail "this needs an Apple Silicon Mac: the bundled libmlx and its Metal kernels are arm64 only"
[ -z "${CARGO_TARGET_DIR:-}" ] || fail "unset CARGO_TARGET_DIR: src-tauri/tauri.conf.json names files under target/"
for tool in cargo rustup npm python3 otool install_name_tool codesign hdiutil plutil shasum; do
  command -v "$tool" >/dev/null ||
    fail "$tool is missing (Xcode's command-line tools: xcode-select --install; Rust: rustup.rs; Node 20+)"
done

conf=src-tauri/tauri.conf.json
target=aarch64-apple-darwin
release=target/$target/release

# conf_value KEY...: one value of tauri.conf.json (keys may hold dots and
# slashes, which plutil's key paths cannot).
conf_value() {
  python3 - "$conf" "$@" <<'PY'
import json, sys
value = json.load(open(sys.argv[1]))
for key in sys.argv[2:]:
    value = value[int(key)] if isinstance(value, list) else value[key]
print(value)
PY
}

# What the bundle takes from where (paths in tauri.conf.json are relative to
# src-tauri); the build below must write exactly these.
product=$(conf_value productName)
macos_min=$(conf_value bundle macOS minimumSystemVersion)
dylib_src=src-tauri/$(conf_value bundle macOS frameworks 0)
metallib_src=src-tauri/$(conf_value bundle macOS files Resources/mlx.metallib)
cli_src=src-tauri/$(conf_value bundle macOS files MacOS/ondo)
identity=${APPLE_SIGNING_IDENTITY:--}

# The rpaths (LC_RPATH) of a Mach-O file, one a line.
rpaths() {
  otool -l "$1" | awk '$1 == "cmd" { want = ($2 == "LC_RPATH") } want && $1 == "path" { print $2 }'
}

# The oldest macOS a Mach-O file runs on (LC_BUILD_VERSION's minos).
minos() {
  otool -l "$1" | awk '$1 == "cmd" { want = ($2 == "LC_BUILD_VERSION") } want && $1 == "minos" { print $2; exit }'
}

# version_le A B: A is B or older ("14.0" "14.5").
version_le() {
  python3 -c 'import sys; a, b = (tuple(int(p) for p in v.split(".")) for v in sys.argv[1:]); sys.exit(0 if a <= b else 1)' "$1" "$2"
}

# sign FILE: with the identity Tauri signs the app with (Tauri does not sign
# bundle.macOS.files, so the CLI is signed here); ad hoc without one.
sign() {
  if [ "$identity" = "-" ]; then
    codesign --force --sign - "$1"
  else
    codesign --force --sign "$identity" --options runtime --timestamp "$1"
  fi
}

mlx_prefix=$(scripts/setup.sh mac-prefix)
mlx_dir=${mlx_prefix%/mlx}
moved=$mlx_dir.moved-by-make-dmg
# A run stopped during the doctor check below left the folder moved.
if [ -d "$moved" ] && [ ! -d "$mlx_dir" ]; then mv "$moved" "$mlx_dir"; fi

step "MLX: the mlx-metal wheel for macOS $macos_min"
scripts/setup.sh mac
export MLX_PREFIX="$root/$mlx_prefix"
for file in "$dylib_src" "$metallib_src"; do
  [ -f "$file" ] || fail "tauri.conf.json bundles $file, but scripts/setup.sh mac did not unpack it there"
done
# Compared with the bundle's copy later, when the folder has been moved away.
metallib_sha256=$(shasum -a 256 "$metallib_src" | cut -d ' ' -f 1)
# The binaries record libmlx's install name when they link: it must be
# @rpath's. The wheel's is; a libmlx built elsewhere may name its folder.
if [ "$(otool -D "$dylib_src" | sed -n 2p)" != "@rpath/libmlx.dylib" ]; then
  install_name_tool -id @rpath/libmlx.dylib "$dylib_src"
  codesign --force --sign - "$dylib_src"
fi

step "The UI and the release binaries for $target (macOS $macos_min and later)"
rustup target list --installed | grep -qx "$target" || rustup target add "$target"
[ -d ui/node_modules ] || npm --prefix ui ci --no-audit --no-fund
npm --prefix ui run build
# ONDO_MACOS_BUNDLE=1: no rpath to this machine's MLX folder (build.rs).
export MACOSX_DEPLOYMENT_TARGET=$macos_min ONDO_MACOS_BUNDLE=1
cargo build --release --locked --target "$target" --bin ondo
cargo build --release --locked --target "$target" -p ondo-app --features custom-protocol
[ -f "$cli_src" ] || fail "tauri.conf.json bundles $cli_src, but cargo did not write the CLI there"

step "Install names and rpaths"
for binary in "$release/ondo" "$release/ondo-app"; do
  # A libmlx recorded by an absolute path becomes @rpath's.
  while read -r old; do
    echo "  $binary: $old -> @rpath/libmlx.dylib"
    install_name_tool -change "$old" @rpath/libmlx.dylib "$binary"
  done < <(otool -L "$binary" | awk 'NR > 1 { print $1 }' | grep '/libmlx\.dylib$' | grep -v '^@rpath/' || true)
  # Folders of this machine (ONDO_MACOS_BUNDLE=1 leaves none; this is the guard).
  while read -r dir; do
    echo "  $binary: rpath $dir removed"
    install_name_tool -delete_rpath "$dir" "$binary"
  done < <(rpaths "$binary" | grep -v '^@' || true)
  if ! rpaths "$binary" | grep -qx '@executable_path/../Frameworks'; then
    install_name_tool -add_rpath @executable_path/../Frameworks "$binary"
  fi
  # install_name_tool voids the linker's signature; Tauri signs the app's
  # main binary again when it bundles, and the CLI is signed just below.
  codesign --force --sign - "$binary"
done
sign "$cli_src"

step "$product.app and its disk image"
if [ "$identity" = "-" ]; then
  # Ad hoc, and without the hardened runtime: that is for notarization,
  # which needs a Developer ID anyway.
  ui/node_modules/.bin/tauri bundle --bundles app,dmg --target "$target" --features custom-protocol \
    --config '{"bundle":{"macOS":{"signingIdentity":"-","hardenedRuntime":false}}}'
else
  ui/node_modules/.bin/tauri bundle --bundles app,dmg --target "$target" --features custom-protocol
fi
app=$release/bundle/macos/$product.app
dmg=""
for candidate in "$release"/bundle/dmg/"$product"_*_aarch64.dmg; do
  [ -f "$candidate" ] && dmg=$candidate
done
[ -d "$app" ] || fail "tauri bundle wrote no $app"
[ -n "$dmg" ] || fail "tauri bundle wrote no disk image under $release/bundle/dmg"

# check_app APP: what a clean Mac needs of the bundle; fails naming each gap.
check_app() {
  local app=$1 contents=$1/Contents problems="" file binary name dep dir min
  for file in Frameworks/libmlx.dylib Resources/mlx.metallib MacOS/ondo-app MacOS/ondo; do
    [ -f "$contents/$file" ] || problems="$problems\n  Contents/$file is missing"
  done
  [ "$(shasum -a 256 "$contents/Resources/mlx.metallib" 2>/dev/null | cut -d ' ' -f 1)" = "$metallib_sha256" ] ||
    problems="$problems\n  Contents/Resources/mlx.metallib is not the wheel's"
  [ "$(plutil -extract LSUIElement raw -o - "$contents/Info.plist" 2>/dev/null)" = true ] ||
    problems="$problems\n  Info.plist: LSUIElement is not true (the app would show in the Dock)"
  [ "$(plutil -extract LSMinimumSystemVersion raw -o - "$contents/Info.plist" 2>/dev/null)" = "$macos_min" ] ||
    problems="$problems\n  Info.plist: LSMinimumSystemVersion is not $macos_min"
  for binary in "$contents"/MacOS/* "$contents"/Frameworks/*.dylib; do
    [ -f "$binary" ] || continue
    name=${binary#"$contents"/}
    while read -r dep; do
      case "$dep" in
        /System/Library/* | /usr/lib/* | @rpath/*) ;;
        *) problems="$problems\n  $name loads $dep, a path of the build machine" ;;
      esac
    done < <(otool -L "$binary" | awk 'NR > 1 { print $1 }')
    while read -r dir; do
      case "$dir" in
        @*) ;;
        *) problems="$problems\n  $name has the rpath $dir, a folder of the build machine" ;;
      esac
    done < <(rpaths "$binary")
    min=$(minos "$binary")
    if [ -z "$min" ] || ! version_le "$min" "$macos_min"; then
      problems="$problems\n  $name needs macOS ${min:-?}, but the bundle says $macos_min"
    fi
  done
  for binary in "$contents"/MacOS/*; do
    rpaths "$binary" | grep -qx '@executable_path/../Frameworks' ||
      problems="$problems\n  ${binary#"$contents"/} has no rpath to Contents/Frameworks"
  done
  codesign --verify --deep --strict "$app" 2>/dev/null ||
    problems="$problems\n  the signature does not verify (codesign --verify --deep --strict)"
  if [ -n "$problems" ]; then
    printf '%b\n' "$problems" >&2
    fail "$app is not what a clean Mac needs"
  fi
  echo "  $app: libmlx, mlx.metallib and the CLI inside; no path of this machine; macOS $macos_min"
}

step "The bundle"
check_app "$app"

step "The disk image's ondo doctor, with this build's MLX folder moved away"
mount=$(cd "$(mktemp -d /tmp/ondo-dmg.XXXXXX)" && pwd -P)
scratch=$(mktemp -d /tmp/ondo-doctor.XXXXXX)
restore() {
  hdiutil detach -quiet "$mount" 2>/dev/null || true
  if [ -d "$moved" ] && [ ! -d "$mlx_dir" ]; then mv "$moved" "$mlx_dir"; fi
  rm -rf "$scratch"
}
trap restore EXIT
mv "$mlx_dir" "$moved"
hdiutil attach -quiet -nobrowse -readonly -mountpoint "$mount" "$dmg"
check_app "$mount/$product.app"
report=$scratch/doctor.json
if ! ONDO_HOME="$scratch/ondo" "$mount/$product.app/Contents/MacOS/ondo" doctor --json >"$report"; then
  cat "$report" >&2
  fail "the bundled ondo doctor failed (its report is above)"
fi
python3 - "$report" "$mount/$product.app/Contents" "$macos_min" <<'PY'
import json, os, sys
report = json.load(open(sys.argv[1]))
contents, minimum = os.path.realpath(sys.argv[2]), sys.argv[3]
metal = report.get("metal") or {}
inside = lambda path, folder: bool(path) and os.path.realpath(path).startswith(os.path.join(contents, folder) + "/")
problems = []
if not inside(metal.get("metallib"), "Resources"):
    problems.append(f"MLX loaded its kernels from {metal.get('metallib')}, not from the app's Resources")
if not inside(metal.get("libmlx"), "Frameworks"):
    problems.append(f"the doctor ran libmlx from {metal.get('libmlx')}, not from the app's Frameworks")
needs = metal.get("metallib_macos")
version = lambda text: tuple(int(part) for part in text.split("."))
if needs is None or version(needs) > version(minimum):
    problems.append(f"mlx.metallib is for macOS {needs} and later; the bundle promises {minimum}")
for problem in problems:
    print("  " + problem, file=sys.stderr)
if problems:
    sys.exit(1)
print(f"  ondo doctor passed on {metal.get('device_name')}: kernels from {metal['metallib']} "
      f"(macOS {needs} and later), libmlx from {metal['libmlx']}")
PY

step "Done"
echo "  $app"
echo "  $dmg ($(du -h "$dmg" | cut -f1))"
