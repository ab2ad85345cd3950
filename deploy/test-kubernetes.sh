#!/bin/sh
# The Kubernetes manifests against the API's schemas, strictly (an unknown field fails), for the
# versions each needs: aquad.yaml from 1.29, lend-sidecar.yaml (DRA's resource.k8s.io/v1) from
# 1.34, both up to 1.37; and the sidecar's lend.yaml with aqua-lend's own schema.
# Usage: test-kubernetes.sh SETUP_VENV VENV AQUA_LEND MANIFEST_DIR: the build's virtual
# environment, brought up to date by python/setup-venv as the Python suite does.
set -eu
"$1" "$2" >/dev/null
python=$2/bin/python
lend=$3
dir=$4
if ! "$python" -m kubernetes_validate --version >/dev/null 2>&1; then
        echo "FAIL: kubernetes-validate is not in $2 (python/requirements-deploy.txt; python/setup-venv installs it)"
        exit 1
fi
failed=0
check() { # FILE VERSION: with --quiet only warnings and failures print
        if out=$("$python" -m kubernetes_validate --strict --quiet -k "$2" "$1" 2>&1) &&
           [ -z "$out" ]; then
                echo "ok: $(basename "$1") against Kubernetes $2"
        else
                echo "FAIL: $(basename "$1") against Kubernetes $2:"
                echo "$out"
                failed=1
        fi
}
for v in 1.29 1.32 1.37; do check "$dir/aquad.yaml" "$v"; done
for v in 1.34 1.37; do check "$dir/lend-sidecar.yaml" "$v"; done

tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
awk '/^  lend.yaml: \|/ {on = 1; next}
     on && /^    / {print substr($0, 5); next}
     on {exit}' "$dir/lend-sidecar.yaml" >"$tmp/lend.yaml"
if [ ! -s "$tmp/lend.yaml" ]; then
        echo "FAIL: no lend.yaml in the ConfigMap of lend-sidecar.yaml"
        failed=1
elif out=$("$lend" --check-config --config "$tmp/lend.yaml" 2>&1); then
        echo "ok: the sidecar's lend.yaml loads ($out)"
else
        echo "FAIL: the sidecar's lend.yaml: $out"
        failed=1
fi
# The pod is scraped where aqua-lend serves its metrics.
port=$(sed -n 's/^ *prometheus.io\/port: "\([0-9]*\)"/\1/p' "$dir/lend-sidecar.yaml")
if ! grep -q "^metrics: 0.0.0.0:$port$" "$tmp/lend.yaml"; then
        echo "FAIL: the sidecar's pod is scraped at port $port, but lend.yaml says $(grep '^metrics' "$tmp/lend.yaml")"
        failed=1
fi
exit $failed
