#!/usr/bin/env bash
# The end-to-end test with what it needs: builds ui/dist and the app binary
# that serves it (custom-protocol), installs this folder's npm packages when
# package-lock.json changed, then drives the app (app.test.mjs). Needs the
# tools of `scripts/setup.sh test` (Xvfb, trayer, WebKitWebDriver, tauri-driver).
set -euo pipefail
root=$(cd "$(dirname "$0")/../.." && pwd)
cd "$root"
export MLX_PYTHON="${MLX_PYTHON:-$root/.venv/bin/python}"

(cd ui && npm run --silent build)
# One cargo call for all three: the app, the CLI (which writes the model the
# test hub serves) and the test hub (which stands in for huggingface.co). Two
# calls would resolve features twice and build the core twice.
cargo build --quiet --locked --bins -p ondo-app --features ondo-app/custom-protocol \
  -p ondo -p ondo-testhub

stamp=tests/e2e/node_modules/.ondo-lock-hash
want=$(sha256sum tests/e2e/package-lock.json | cut -d' ' -f1)
if [ ! -f "$stamp" ] || [ "$(cat "$stamp")" != "$want" ]; then
  (cd tests/e2e && npm ci --no-audit --no-fund --loglevel=error >/dev/null)
  echo "$want" > "$stamp"
fi

cd tests/e2e
exec node app.test.mjs
