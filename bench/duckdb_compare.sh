#!/usr/bin/env bash
# DuckDB (one thread) vs `ingero-pipeline bench` on the same Ingero SQLite trace, in one run
# (bench/duckdb/compare.mjs explains what is timed). Installs @duckdb/node-api from the lock file
# on first use (needs the npm registry once; node_modules is git-ignored).
#
#   bench/duckdb_compare.sh [TRACE=/tmp/big5m.db] [BIN=build/ingero-pipeline] [extra compare.mjs args]
#
# JSON on stdout, the markdown table on stderr (and in --markdown FILE when given).
set -euo pipefail
here=$(cd "$(dirname "$0")" && pwd)
trace=${1:-/tmp/big5m.db}
bin=${2:-build/ingero-pipeline}
shift $(( $# > 2 ? 2 : $# ))
if [ ! -d "$here/duckdb/node_modules/@duckdb/node-api" ]; then
  (cd "$here/duckdb" && npm ci --no-audit --no-fund >&2)
fi
echo "load average before: $(cut -d' ' -f1-3 /proc/loadavg)" >&2
exec node "$here/duckdb/compare.mjs" --trace "$trace" --bin "$bin" "$@"
