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
cargo build --quiet -p ondo-app --features custom-protocol --locked
# The CLI writes the model the test hub serves; the hub stands in for huggingface.co.
cargo build --quiet -p ondo --bin ondo -p ondo-testhub --locked

stamp=tests/e2e/node_modules/.ondo-lock-hash
want=$(sha256sum tests/e2e/package-lock.json | cut -d' ' -f1)
if [ ! -f "$stamp" ] || [ "$(cat "$stamp")" != "$want" ]; then
  (cd tests/e2e && npm ci --no-audit --no-fund --loglevel=error >/dev/null)
  echo "$want" > "$stamp"
fi

cd tests/e2e
exec node app.test.mjs
