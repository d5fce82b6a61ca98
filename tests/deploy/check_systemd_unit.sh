#!/usr/bin/env bash
# ctest systemd_unit_verify: `systemd-analyze verify` of deploy/systemd/*.service, with ExecStart
# pointed at the binary just built (verify checks that it exists). Any warning fails the test.
# Exit 77 (skipped) without systemd-analyze.
set -u
src=$1 bin=$2
command -v systemd-analyze > /dev/null || { echo "SKIP: systemd-analyze not installed (apt-get install systemd)"; exit 77; }
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
rc=0
for unit in "$src"/deploy/systemd/*.service; do
  name=$(basename "$unit")
  sed "s|/usr/bin/ingero-pipeline|$bin|" "$unit" > "$tmp/$name"
  out=$(SYSTEMD_LOG_LEVEL=notice systemd-analyze verify "$tmp/$name" 2>&1)
  status=$?
  # verify reports some problems only as messages; a clean unit prints nothing.
  if [ $status -ne 0 ] || [ -n "$out" ]; then
    echo "$name: systemd-analyze verify failed (status $status):"
    echo "$out"
    rc=1
  else
    echo "$name: verified"
  fi
  # The hardening this unit promises (docs/deploy.md): present, so a later edit cannot drop it silently.
  for key in 'ProtectSystem=strict' 'NoNewPrivileges=yes' 'StateDirectory=' 'Restart=on-failure' \
    'CapabilityBoundingSet=CAP_BPF CAP_PERFMON' 'ProtectKernelModules=yes' 'PrivateTmp=yes'; do
    grep -q "^$key" "$unit" || { echo "$name: missing $key"; rc=1; }
  done
  if grep -q '^CapabilityBoundingSet=.*CAP_SYS_ADMIN' "$unit"; then
    echo "$name: CAP_SYS_ADMIN in the bounding set (only for kernels < 5.8, docs/deploy.md)"
    rc=1
  fi
done
exit $rc
