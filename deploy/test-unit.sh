#!/bin/sh
# systemd-analyze verify of the configured aquad.service, with any warning counted as a failure.
# Usage: test-unit.sh UNIT AQUAD AQUACTL
#   UNIT     the unit as meson configured it
#   AQUAD    an executable to stand in for ExecStart's program (verify checks that it exists)
#   AQUACTL  one to stand in for ExecReload's
set -eu

unit=$1
aquad=$2
aquactl=$3

if ! command -v systemd-analyze >/dev/null 2>&1; then
        echo "SKIP: systemd-analyze not installed; the unit was not verified"
        exit 77
fi

dir=$(mktemp -d)
trap 'rm -rf "$dir"' EXIT
# The unit file keeps its name: verify derives the unit's type from it.
sed -e "s|^ExecStart=[^ ]*|ExecStart=$aquad|" -e "s|^ExecReload=[^ ]*|ExecReload=$aquactl|" \
        "$unit" >"$dir/aquad.service"

if ! grep -q "^ExecStart=$aquad " "$dir/aquad.service"; then
        echo "FAIL: no ExecStart= line to check in $unit"
        exit 1
fi
# A reload must wait for aquad's verdict: a signal alone would report success for a refused file.
if ! grep -q "^ExecReload=$aquactl reload$" "$dir/aquad.service"; then
        echo "FAIL: ExecReload= in $unit is not 'aquactl reload': $(grep '^ExecReload=' "$unit")"
        exit 1
fi
# systemd-analyze exits 0 on unknown keys and bad values, but says so on stderr.
out=$(systemd-analyze verify "$dir/aquad.service" 2>&1) && rc=0 || rc=$?
if [ "$rc" -ne 0 ] || [ -n "$out" ]; then
        echo "FAIL: systemd-analyze verify $unit (exit $rc):"
        echo "$out"
        exit 1
fi
echo "ok: systemd-analyze verify $unit"
