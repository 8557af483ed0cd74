#!/usr/bin/env bash
# Launches the desktop app with its window open. On a Linux machine without a
# display (a server, a CI box) it starts a virtual one (Xvfb) with a tray host
# (trayer) first and says how to look at it.
set -euo pipefail
app=${1:?usage: scripts/launch-app.sh PATH_TO_ondo-app}

if [ "$(uname -s)" = "Linux" ] && [ -z "${DISPLAY:-}" ]; then
  export DISPLAY=:77
  if ! xdpyinfo -display "$DISPLAY" >/dev/null 2>&1 && ! [ -e /tmp/.X11-unix/X77 ]; then
    Xvfb "$DISPLAY" -screen 0 1280x800x24 -nolisten tcp >/dev/null 2>&1 &
    sleep 1
  fi
  pgrep -x trayer >/dev/null || (trayer --edge top --align right --widthtype request --height 24 >/dev/null 2>&1 &)
  echo "No display found: running on a virtual one ($DISPLAY)."
  echo "Screenshot: DISPLAY=$DISPLAY import -window root shot.png"
fi
exec "$app" --show
