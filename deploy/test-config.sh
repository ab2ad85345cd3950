#!/bin/sh
# The shipped configurations load with aquad's own schema: the default aquad.yaml, the same with
# every commented key switched on, and the ConfigMap inside the Kubernetes manifest (with what
# the manifest around it needs: a metrics address Prometheus can scrape, the privileged
# Pod Security level for its namespace).
# Usage: test-config.sh AQUAD AQUAD_YAML K8S_MANIFEST
set -eu

aquad=$1
default=$2
manifest=$3

dir=$(mktemp -d)
trap 'rm -rf "$dir"' EXIT
failed=0

check() {
        if out=$("$aquad" --check-config -c "$1" 2>&1); then
                echo "ok: $2"
        else
                echo "FAIL: $2: $out"
                failed=1
        fi
}

check "$default" "the default aquad.yaml"

# Uncomment every key ("#key:" and the "#  nested" lines under it). Names that need to exist on
# this machine (groups, users) are swapped for root so the check does not depend on them.
sed -e 's/^#\([a-z]\)/\1/' -e 's/^#  /  /' "$default" |
        sed -e 's/^socket-group: .*/socket-group: root/' \
            -e 's/^\(  users: \).*/\1[root]/' -e 's/^\(  groups: \).*/\1[root]/' \
            -e 's/^\(    - user: \).*/\1root/' \
            -e 's/^\(    users: \).*/\1[root]/' -e 's/^\(    groups: \).*/\1[root]/' \
            -e 's/^\(      keys: \).*/\1["Yne@$w-vo<fVvi]a<NY6T1ed:M$fCG*[IaLV{hID"]/' \
            >"$dir/all.yaml"
# aquad's key pair beside it (the key pair of ZeroMQ's CURVE RFC: valid Z85, no secret).
printf 'public-key: rq:rM>}U?@Lns47E1%%kR.o@n%%FcmmsL/@{H8]yf7\nsecret-key: JTKVSB%%%%)wK0E.X)V>+}o?pNmC{O&4W4b!Ni{Lh6\n' \
        >"$dir/aquad.key"
chmod 600 "$dir/aquad.key" # a secret key others may read is refused
# The plan it names sits beside it.
printf 'pairs:\n  - {producer: 1, consumer: 0}\n' >"$dir/plan.yaml"
printf 'devices: [{memory: 80GiB, uuid: GPU-a}, {memory: 80GiB, uuid: GPU-b}]\nall-linked: true\n' \
        >"$dir/topology.yaml"
if grep -q '^#[a-z]' "$dir/all.yaml"; then
        echo "FAIL: keys left commented: $(grep '^#[a-z]' "$dir/all.yaml")"
        failed=1
fi
check "$dir/all.yaml" "aquad.yaml with every key set"

# The ConfigMap's aquad.yaml: the block under "aquad.yaml: |", four spaces in.
awk '/^  aquad.yaml: \|/ {on = 1; next}
     on && /^    / {print substr($0, 5); next}
     on && /^$/ {print; next}
     on {exit}' "$manifest" >"$dir/k8s.yaml"
if [ ! -s "$dir/k8s.yaml" ]; then
        echo "FAIL: no aquad.yaml in the ConfigMap of $manifest"
        failed=1
else
        check "$dir/k8s.yaml" "the Kubernetes ConfigMap"
        # Prometheus scrapes the pod's address (the node's, with hostNetwork) at the annotated
        # port: the metrics address must be that port on every address, not the loopback.
        port=$(sed -n 's/^ *prometheus.io\/port: "\([0-9]*\)"/\1/p' "$manifest")
        metrics=$(sed -n 's/^metrics: *//p' "$dir/k8s.yaml")
        if [ -n "$port" ] && [ "$metrics" != "0.0.0.0:$port" ]; then
                echo "FAIL: the pod is scraped at port $port but the ConfigMap binds metrics: $metrics"
                failed=1
        fi
fi
# hostIPC, hostPID, hostNetwork and hostPath volumes: only the privileged Pod Security level.
if ! grep -q '^    pod-security.kubernetes.io/enforce: privileged$' "$manifest"; then
        echo "FAIL: the namespace of $manifest is not labelled pod-security.kubernetes.io/enforce: privileged"
        failed=1
fi
exit $failed
