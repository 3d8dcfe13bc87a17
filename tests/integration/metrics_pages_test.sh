#!/usr/bin/env bash
# The /metrics pages of kgpu's control-plane servers, as the running binaries serve them over
# HTTP, checked by Prometheus' own linter: `promtool check metrics` must find nothing (these pages
# carry only kgpu_* names, so nothing is exempt), and every family must have HELP and TYPE.
#   - `kgpu extender` (--address; after a filter call with a malformed body, so that its
#     request and failure families have series);
#   - `kgpu slurm-bridge run --metrics-listen` (with no Slurm commands on its --slurm-bin-dir, so
#     kgpu_slurm_bridge_slurm_up is 0; the page is the same);
#   - `kgpu webhook --insecure-http` with --kubeconfig (after a patched mutate, a denied validate
#     and a malformed body, so that its request, denial, malformed and duration families have
#     series, and once its node informer has synced, so that the inventory families have too);
# all against the API server stand-in (kgpu-fake-apiserver). The exporter's page (kgpu exporter,
# kgpu node) is linted by tests/integration/exporter_prometheus_test.sh and
# tests/rules/check_golden.py, where dcgm-exporter's names need exemptions.
# Usage: metrics_pages_test.sh <kgpu> <kgpu-fake-apiserver>
set -euo pipefail
kgpu=$1 apiserver=$2
for tool in promtool curl python3; do
  command -v "$tool" >/dev/null || { echo "missing $tool: run scripts/install-deps.sh"; exit 1; }
done
work=$(mktemp -d /tmp/kgpu-metrics-pages-XXXXXX)
pids=()
cleanup() {
  for p in "${pids[@]}"; do kill "$p" 2>/dev/null || true; done
  for p in "${pids[@]}"; do wait "$p" 2>/dev/null || true; done
  rm -rf "$work"
}
trap cleanup EXIT
# shellcheck source=tests/integration/tap.sh
. "$(dirname "$0")/tap.sh"

# lint NAME FILE: promtool finds nothing; every family has HELP and TYPE.
lint() {
  local name=$1 page=$2 out rc=0
  out=$(promtool check metrics <"$page" 2>&1) || rc=$?
  if [ "$rc" -eq 0 ] && [ -z "$out" ]; then ok "$name: promtool check metrics finds nothing"; else
    bad "$name: promtool check metrics (exit $rc):"; echo "$out"; fi
  if python3 - "$page" <<'PY'; then ok "$name: every family has HELP and TYPE"; else bad "$name: a family without HELP or TYPE"; fi
import re, sys
helps, types, names = set(), set(), set()
for line in open(sys.argv[1], encoding="utf-8"):
    m = re.match(r"# (HELP|TYPE) (\S+)", line)
    if m:
        (helps if m.group(1) == "HELP" else types).add(m.group(2))
    elif line.strip() and not line.startswith("#"):
        names.add(re.match(r"[a-zA-Z_:][a-zA-Z0-9_:]*", line).group())
fams = {n for n in names if n in types} | {re.sub(r"_(bucket|sum|count)$", "", n) for n in names if n not in types}
missing = [f for f in sorted(fams) if f not in helps or f not in types]
for f in missing:
    print(f"  {f}: HELP {'yes' if f in helps else 'no'}, TYPE {'yes' if f in types else 'no'}")
if not names:
    print("  the page has no series")
sys.exit(1 if missing or not names else 0)
PY
}

# The API server stand-in, and a kubeconfig for it.
"$apiserver" --listen 127.0.0.1:0 --port-file "$work/apiserver.port" \
  --kubeconfig-out "$work/kubeconfig" >"$work/apiserver.log" 2>&1 &
pids+=($!)
retry 20 test -s "$work/apiserver.port" || { cat "$work/apiserver.log"; exit 1; }
retry 20 test -s "$work/kubeconfig" || { cat "$work/apiserver.log"; exit 1; }

# kgpu extender
ep=$(free_port)
"$kgpu" --log-level warn extender --insecure-http --kubeconfig "$work/kubeconfig" --address "127.0.0.1:$ep" \
  >"$work/extender.log" 2>&1 &
pids+=($!)
if retry 30 curl -sf "http://127.0.0.1:$ep/healthz" >/dev/null; then
  curl -s -o /dev/null -X POST -H 'Content-Type: application/json' -d '{"Pod":{},"NodeNames":5}' \
    "http://127.0.0.1:$ep/gpu/filter" || true
  if curl -sf "http://127.0.0.1:$ep/metrics" >"$work/extender.prom"; then lint "kgpu extender" "$work/extender.prom"; else
    bad "kgpu extender: GET /metrics failed"; fi
else
  bad "kgpu extender did not start"; cat "$work/extender.log"
fi

# kgpu slurm-bridge run --metrics-listen
mkdir -p "$work/no-slurm"
bp=$(free_port)
"$kgpu" --log-level warn slurm-bridge run --kubeconfig "$work/kubeconfig" --leader-elect=false \
  --slurm-bin-dir "$work/no-slurm" --interval 200ms --metrics-listen "127.0.0.1:$bp" \
  >"$work/bridge.log" 2>&1 &
pids+=($!)
has_reconciled() { curl -sf "http://127.0.0.1:$bp/metrics" >"$work/bridge.prom" && grep -q '^kgpu_slurm_bridge_' "$work/bridge.prom"; }
if retry 30 has_reconciled; then lint "kgpu slurm-bridge" "$work/bridge.prom"; else
  bad "kgpu slurm-bridge served no kgpu_slurm_bridge_* metrics"; cat "$work/bridge.log"; fi

# kgpu webhook --insecure-http (plain HTTP as the extender above; the page is the same over HTTPS)
wp=$(free_port)
"$kgpu" --log-level error webhook --insecure-http --address "127.0.0.1:$wp" --kubeconfig "$work/kubeconfig" \
  --smallest-gpu-memory-mib 40960 >"$work/webhook.log" 2>&1 &
pids+=($!)
review() {  # review PATH UID CONTAINER-LIMITS-JSON: POST one AdmissionReview of a one-container pod
  curl -sf -o /dev/null -X POST -H 'Content-Type: application/json' "http://127.0.0.1:$wp$1" -d \
    '{"apiVersion":"admission.k8s.io/v1","kind":"AdmissionReview","request":{"uid":"'"$2"'",
      "kind":{"group":"","version":"v1","kind":"Pod"},"resource":{"group":"","version":"v1","resource":"pods"},
      "operation":"CREATE","object":{"apiVersion":"v1","kind":"Pod","metadata":{"name":"p","namespace":"default"},
      "spec":{"containers":[{"name":"c","image":"cuda","resources":{"limits":'"$3"'}}]}}}}'
}
webhook_synced() { curl -sf "http://127.0.0.1:$wp/metrics" >"$work/webhook.prom" && grep -qx 'kgpu_webhook_inventory_synced 1' "$work/webhook.prom"; }
if retry 30 curl -sf "http://127.0.0.1:$wp/healthz" >/dev/null; then
  review /mutate m1 '{"kgpu.io/gpu-memory":"10240"}' || bad "kgpu webhook: POST /mutate failed"
  review /validate v1 '{"nvidia.com/gpu":"1","kgpu.io/gpu":"1"}' || bad "kgpu webhook: POST /validate failed"
  curl -s -o /dev/null -X POST -H 'Content-Type: application/json' -d '{' "http://127.0.0.1:$wp/validate" || true
  retry 30 webhook_synced || bad "kgpu webhook: its node informer did not sync"
  if curl -sf "http://127.0.0.1:$wp/metrics" >"$work/webhook.prom"; then
    for want in 'kgpu_webhook_requests_total{operation="mutate",result="patched",resource="pods"} 1' \
                'kgpu_webhook_denials_total{operation="validate",reason="whole_gpus_and_shares"} 1' \
                'kgpu_webhook_malformed_reviews_total{operation="validate"} 1'; do
      if grep -qxF "$want" "$work/webhook.prom"; then ok "kgpu webhook: $want"; else bad "kgpu webhook: no $want"; fi
    done
    lint "kgpu webhook" "$work/webhook.prom"
  else
    bad "kgpu webhook: GET /metrics failed"
  fi
else
  bad "kgpu webhook did not start"; cat "$work/webhook.log"
fi

echo "$passes passed, $fails failed"
[ "$fails" -eq 0 ]
