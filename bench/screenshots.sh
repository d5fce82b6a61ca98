#!/bin/sh
# Makes the README's pictures from the cpu_contention demo trace:
#   docs/img/report.png        the `explain --html` report, rendered by headless Chromium
# and checks that the `export --format perfetto` timeline of the same trace is written. The
# timeline cannot be screenshotted offline: ui.perfetto.dev is a web app (no network here) and
# chrome://tracing needs its Load dialog, so the README says how to open the file instead.
#
# Usage: bench/screenshots.sh [path/to/ingero-pipeline]   (default: build/ingero-pipeline)
# Needs: chromium and libjs-chart.js (Debian packages).
set -eu
BIN=${1:-build/ingero-pipeline}
ROOT=$(cd "$(dirname "$0")/.." && pwd)
OUT="$ROOT/docs/img"
CHROME=$(command -v chromium || command -v chromium-browser || true)
if [ -z "$CHROME" ]; then
  echo "screenshots: chromium not found (apt-get install chromium)" >&2
  exit 3
fi
mkdir -p "$OUT"
TMP=$(mktemp -d)
trap 'rm -rf "$TMP"' EXIT
"$BIN" demo cpu_contention --save "$TMP/cpu.db" >/dev/null
"$BIN" explain --db "$TMP/cpu.db" --html "$TMP/report.html" >/dev/null
"$BIN" export --format perfetto --db "$TMP/cpu.db" -o "$TMP/timeline.json.gz" -q
# --virtual-time-budget lets the page's scripts finish before the capture; the charts are
# drawn without animation, so the picture is the final state.
"$CHROME" --headless --no-sandbox --disable-gpu --hide-scrollbars --virtual-time-budget=5000 \
  --window-size=1280,1900 --screenshot="$OUT/report.png" "file://$TMP/report.html" 2>/dev/null
echo "screenshots: wrote $OUT/report.png"
