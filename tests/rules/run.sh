#!/usr/bin/env bash
# Checks deploy/monitoring: the alert rules (promtool check + unit tests), the Grafana dashboard's
# queries (as recording rules in tests/rules/dashboard.rules.yaml, generated and unit-tested the
# same way), that the generated PrometheusRule matches the plain rule file, that every manifest
# and the dashboard are valid and agree with each other, and that every metric and label they use,
# and every unit test's input series, is what kgpu exporter serves (the golden scrapes in
# tests/rules/golden, check_golden.py). Registered in tests/CMakeLists.txt as `rules.alerts`;
# `rules.golden` also re-captures the golden scrapes with the built binary.
#
#   tests/rules/run.sh [REPO_ROOT]
#
# Needs promtool (Debian package prometheus) and python3 with PyYAML (python3-yaml);
# scripts/install-deps.sh installs both. Uses `kubectl kustomize` when kubectl is installed.
set -euo pipefail

root=$(cd "${1:-$(dirname "${BASH_SOURCE[0]}")/../..}" && pwd)
cd "$root"
mon=deploy/monitoring

step() { printf '\n== %s\n' "$*"; }

command -v promtool >/dev/null || { echo "run.sh: promtool not found (apt-get install prometheus)" >&2; exit 1; }
py=
for cand in python3 /usr/bin/python3; do
  if command -v "$cand" >/dev/null && "$cand" -c 'import yaml' 2>/dev/null; then py=$cand; break; fi
done
[ -n "$py" ] || { echo "run.sh: no python3 with PyYAML (apt-get install python3-yaml)" >&2; exit 1; }

tmp=$(mktemp -d "${TMPDIR:-/tmp}/kgpu-rules.XXXXXX")
trap 'rm -rf "$tmp"' EXIT

step "promtool $(promtool --version 2>&1 | head -n1 | sed 's/^promtool, //')"

step "promtool check rules $mon/kgpu-alerts.rules.yaml"
promtool check rules --lint-fatal "$mon/kgpu-alerts.rules.yaml"

step "tests/rules/dashboard.rules.yaml is what check_monitoring.py makes of the dashboard"
"$py" tests/rules/check_monitoring.py "$root" "$tmp/dashboard.rules.yaml"
if ! diff -u tests/rules/dashboard.rules.yaml "$tmp/dashboard.rules.yaml"; then
  echo "run.sh: tests/rules/dashboard.rules.yaml is stale: run python3 tests/rules/check_monitoring.py . tests/rules/dashboard.rules.yaml" >&2
  exit 1
fi
echo "up to date"

step "promtool check rules tests/rules/dashboard.rules.yaml (the dashboard's PromQL parses)"
promtool check rules --lint-fatal tests/rules/dashboard.rules.yaml

step "promtool test rules tests/rules/*.test.yaml (the alerts, and the dashboard's queries)"
promtool test rules tests/rules/*.test.yaml

step "$mon/prometheusrule.yaml is what gen-prometheusrule.sh makes of the rule file"
"$mon/gen-prometheusrule.sh" "$tmp/prometheusrule.yaml"
if ! diff -u "$mon/prometheusrule.yaml" "$tmp/prometheusrule.yaml"; then
  echo "run.sh: $mon/prometheusrule.yaml is stale: run $mon/gen-prometheusrule.sh" >&2
  exit 1
fi
echo "up to date"

step "grafana-dashboard.json is valid JSON"
"$py" -m json.tool "$mon/grafana-dashboard.json" >/dev/null
echo "OK"

step "rules, dashboard and test inputs against the golden scrapes (tests/rules/check_golden.py)"
"$py" tests/rules/check_golden.py "$root"

if command -v kubectl >/dev/null; then
  step "kubectl kustomize $mon"
  kubectl kustomize "$mon" >"$tmp/kustomized.yaml"
  grep -E '^kind: ' "$tmp/kustomized.yaml" | sort | uniq -c
else
  step "kubectl not installed: kustomize build skipped"
fi

printf '\nrules.alerts: PASS\n'
