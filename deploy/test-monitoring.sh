#!/bin/sh
# What deploy/ gives an operator's Prometheus and Grafana: the alerting rules load
# (promtool check rules), behave as their unit tests say (promtool test rules), and every query of
# the Grafana dashboard is PromQL Prometheus accepts (checked as recording rules), each panel with
# a query and an id of its own. That the metrics they name are the ones aquad serves is
# tests/test-ops.c's job (it scrapes a running aquad).
# Usage: test-monitoring.sh DEPLOY_DIR
set -eu

deploy=$1
tools=${XDG_CACHE_HOME:-$HOME/.cache}/aqua/tools
promtool=$(command -v promtool || true)
[ -n "$promtool" ] || [ ! -x "$tools/promtool" ] || promtool=$tools/promtool
if [ -z "$promtool" ]; then
        echo "skipped: no promtool (scripts/bootstrap takes it from Debian's prometheus package)"
        exit 77
fi
dir=$(mktemp -d)
trap 'rm -rf "$dir"' EXIT
failed=0

run() {
        what=$1
        shift
        if out=$("$@" 2>&1); then
                echo "ok: $what"
        else
                printf 'FAIL: %s\n%s\n' "$what" "$out"
                failed=1
        fi
}

run "promtool check rules aqua-rules.yml" "$promtool" check rules "$deploy/prometheus/aqua-rules.yml"
run "promtool test rules aqua-rules.test.yml" \
        sh -c 'cd "$1" && "$2" test rules aqua-rules.test.yml' sh "$deploy/prometheus" "$promtool"

# The dashboard's queries as recording rules, its variables given values, for promtool to parse.
if python3 - "$deploy/grafana/aqua.json" "$dir/dashboard-rules.yml" <<'PY'
import json, sys
d = json.load(open(sys.argv[1]))
problems, rules, ids = [], [], set()
for p in d["panels"]:
    if p["id"] in ids:
        problems.append("panel id %s twice" % p["id"])
    ids.add(p["id"])
    if p["type"] == "row":
        continue
    if not p.get("targets"):
        problems.append("panel %r has no query" % p["title"])
    for t in p.get("targets", []):
        expr = t["expr"].replace("$job", "aqua").replace("$instance", ".*")
        rules.append("      - record: aqua_dashboard:panel_%d_%s\n        expr: %s\n"
                     % (p["id"], t["refId"], json.dumps(expr)))
if problems:
    sys.exit("; ".join(problems))
open(sys.argv[2], "w").write("groups:\n  - name: dashboard\n    rules:\n" + "".join(rules))
print("%d queries in %d panels" % (len(rules), len(ids)))
PY
then
        run "the dashboard's queries parse" "$promtool" check rules "$dir/dashboard-rules.yml"
else
        echo "FAIL: deploy/grafana/aqua.json"
        failed=1
fi
exit $failed
