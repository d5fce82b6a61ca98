#!/bin/sh
# ctest driver of the MCP conformance test: installs @modelcontextprotocol/sdk from npm into a
# cache under the build tree on first run, then runs conformance.mjs with Node.
# Exit 77 (ctest SKIP) with the reason when node/npm or the install is unavailable.
#   run_conformance.sh <ingero-pipeline> <shared data dir> <cache dir> <script dir>
set -u
bin=$1 data=$2 cache=$3 src=$4
if ! command -v node >/dev/null 2>&1; then echo "SKIP: node not found on PATH"; exit 77; fi
if ! command -v npm >/dev/null 2>&1; then echo "SKIP: npm not found on PATH"; exit 77; fi
major=$(node -p 'process.versions.node.split(".")[0]')
if [ "$major" -lt 18 ]; then echo "SKIP: Node $major is too old (the SDK needs >= 18)"; exit 77; fi
if [ ! -d "$data" ]; then echo "SKIP: shared sample data not found at $data"; exit 77; fi
mkdir -p "$cache"
if [ ! -f "$cache/node_modules/@modelcontextprotocol/sdk/package.json" ]; then
  echo "installing @modelcontextprotocol/sdk into $cache (first run)"
  [ -f "$cache/package.json" ] || echo '{"private":true,"type":"module"}' > "$cache/package.json"
  if ! (cd "$cache" && timeout 300 npm install --no-audit --no-fund --loglevel=error @modelcontextprotocol/sdk@1 >install.log 2>&1); then
    echo "SKIP: npm install of @modelcontextprotocol/sdk failed (offline?); see $cache/install.log"
    tail -5 "$cache/install.log"
    exit 77
  fi
fi
echo "SDK $(node -p "require('$cache/node_modules/@modelcontextprotocol/sdk/package.json').version")"
# The script runs from the cache so that Node resolves the SDK from its node_modules.
cp "$src/conformance.mjs" "$cache/conformance.mjs" || exit 1
exec timeout 300 node "$cache/conformance.mjs" "$bin" "$data"
