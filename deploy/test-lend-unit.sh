#!/bin/sh
# systemd-analyze verify of aqua-lend@.service as instance 0 (aquad.service beside it, which it
# requires), any warning counted as a failure. Usage: test-lend-unit.sh LEND_UNIT AQUAD_UNIT
# AQUA_LEND AQUAD AQUACTL (the built programs stand in for the installed ones).
set -eu
if ! command -v systemd-analyze >/dev/null 2>&1; then
        echo "SKIP: systemd-analyze not installed; the unit was not verified"
        exit 77
fi
dir=$(mktemp -d)
trap 'rm -rf "$dir"' EXIT
sed -e "s|^ExecStart=[^ ]*|ExecStart=$3|" "$1" >"$dir/aqua-lend@.service"
sed -e "s|^ExecStart=[^ ]*|ExecStart=$4|" -e "s|^ExecReload=[^ ]*|ExecReload=$5|" "$2" \
        >"$dir/aquad.service"
grep -q "^ExecStart=$3 --device %i " "$dir/aqua-lend@.service" ||
        { echo "FAIL: ExecStart= of $1 does not pass the instance as --device"; exit 1; }
ln -s aqua-lend@.service "$dir/aqua-lend@0.service"
out=$(cd "$dir" && systemd-analyze verify "$dir/aqua-lend@0.service" 2>&1) && rc=0 || rc=$?
if [ "$rc" -ne 0 ] || [ -n "$out" ]; then
        echo "FAIL: systemd-analyze verify $1 as aqua-lend@0 (exit $rc):"
        echo "$out"
        exit 1
fi
echo "ok: systemd-analyze verify $1 as aqua-lend@0"
