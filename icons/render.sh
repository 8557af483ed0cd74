#!/usr/bin/env bash
# Renders Ondo's icons from the SVG sources in this folder with ImageMagick,
# then the bundle icons with the Tauri CLI. Needs `npm ci` in ui/ first.
# Run it after editing an SVG here; the PNG, ICNS and ICO outputs are committed.
set -euo pipefail
cd "$(dirname "$0")"

# App icon, 1024 px.
convert -background none source.svg -depth 8 source.png

# macOS template image: black ink, the mask as alpha. Rendered large, then
# scaled down so the edges are antialiased.
for size in 22 44; do
  name=tray-template.png
  [ "$size" = 44 ] && name=tray-template@2x.png
  convert -background black tray-template-mask.svg -colorspace Gray -resize "${size}x${size}" /tmp/ondo-tray-mask.png
  convert -size "${size}x${size}" xc:black /tmp/ondo-tray-mask.png -alpha off \
    -compose CopyOpacity -composite -depth 8 "PNG32:$name"
done
rm -f /tmp/ondo-tray-mask.png

# Linux and Windows tray: the app tile, small (tray hosts there show colour).
convert -background none source.svg -resize 64x64 -depth 8 PNG32:tray.png

# Bundle icons for the desktop targets, made by the Tauri CLI (offline) from
# source.png; the Windows store, Android and iOS sets it also writes are left out.
bundle_tmp=$(mktemp -d)
(cd ../ui && npx --no-install tauri icon ../icons/source.png -o "$bundle_tmp" >/dev/null 2>&1)
cp "$bundle_tmp"/{32x32.png,64x64.png,128x128.png,128x128@2x.png,icon.png,icon.icns,icon.ico} .
rm -rf "$bundle_tmp"
