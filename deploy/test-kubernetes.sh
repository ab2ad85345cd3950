#!/bin/sh
# The Kubernetes manifests against the API's schemas, strictly (an unknown field fails), for the
# versions each needs: aquad.yaml from 1.29, lend-sidecar.yaml (DRA's resource.k8s.io/v1) from
# 1.34, both up to 1.37; the sidecar's lend.yaml with aqua-lend's own schema; and aquad's pod
# template's checksum/config annotation against its ConfigMap (config-checksum).
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

# The shipped annotation is the config's sha256, as a YAML parser reads the config; an edited
# config fails the check until --write, which makes it so again.
yaml_sum() {
        "$python" -c 'import hashlib, sys, yaml
docs = [d for d in yaml.safe_load_all(open(sys.argv[1])) if d["kind"] == "ConfigMap"]
print(hashlib.sha256(docs[0]["data"]["aquad.yaml"].encode()).hexdigest())' "$1"
}
sum=$("$dir/config-checksum" "$dir/aquad.yaml")
if ! out=$("$dir/config-checksum" --check "$dir/aquad.yaml" 2>&1); then
        echo "FAIL: $out"
        failed=1
elif [ "$sum" != "$(yaml_sum "$dir/aquad.yaml")" ]; then
        echo "FAIL: config-checksum says $sum, PyYAML's reading of the config $(yaml_sum "$dir/aquad.yaml")"
        failed=1
else
        echo "ok: checksum/config is the sha256 of the ConfigMap's aquad.yaml"
fi
# An edit: a changed value and a blank line inside the block.
sed 's/^    reclaim-deadline: 5s$/    reclaim-deadline: 8s\n/' "$dir/aquad.yaml" >"$tmp/edited.yaml"
if "$dir/config-checksum" --check "$tmp/edited.yaml" 2>/dev/null; then
        echo "FAIL: config-checksum --check passed an edited config"
        failed=1
elif ! "$dir/config-checksum" --write "$tmp/edited.yaml" ||
     ! "$dir/config-checksum" --check "$tmp/edited.yaml" ||
     [ "$(sed -n 's/^ *checksum\/config: "\(.*\)"$/\1/p' "$tmp/edited.yaml")" != "$(yaml_sum "$tmp/edited.yaml")" ]; then
        echo "FAIL: config-checksum --write did not set the edited config's sha256"
        failed=1
else
        echo "ok: an edited config fails the check until config-checksum --write"
fi
exit $failed
