#!/usr/bin/env bash
# `kgpu exporter` on a simulated node, checked by Prometheus' own tools:
#  1. `promtool check metrics` finds nothing beyond the findings dcgm-exporter's own names cause
#     (listed in promtool_allowed_findings.txt: a new finding fails this test);
#  2. a real Prometheus (Debian's package, on loopback, temporary data dir) scrapes the exporter
#     and its HTTP API returns the simulated values;
#  3. the deploy/monitoring alert rules fire in that Prometheus: GPU temperature above 85 °C
#     (its 5m `for:` shortened to 0s for the test) and an XID.
# Usage: exporter_prometheus_test.sh <bin dir> <simulated NVML lib dir> <repo root>
set -euo pipefail
bin=$1
export LD_LIBRARY_PATH=$2
root=$3
here=$(cd "$(dirname "$0")" && pwd)
for tool in promtool prometheus curl python3; do
  command -v "$tool" >/dev/null || { echo "missing $tool: run scripts/install-deps.sh"; exit 1; }
done
work=$(mktemp -d /tmp/kgpu-prom-XXXXXX)
export KGPU_SIM_NODE=dgx-h100 KGPU_SIM_STATE=$work/node.state KGPU_SIM_NODE_NAME=prom-node NODE_NAME=prom-node
pids=()
cleanup() { for p in "${pids[@]}"; do kill "$p" 2>/dev/null || true; done; wait 2>/dev/null || true; rm -rf "$work"; }
trap cleanup EXIT
# shellcheck source=tests/integration/tap.sh
. "$(dirname "$0")/tap.sh"

"$bin/kgpu-simctl" reset
"$bin/kgpu-simctl" set 2 temp=71 util=64
ep=$(free_port)
"$bin/kgpu" --log-level warn exporter -a "127.0.0.1:$ep" -c 500 >"$work/exporter.log" 2>&1 &
pids+=($!)
retry 20 curl -sf "http://127.0.0.1:$ep/health" >/dev/null || { cat "$work/exporter.log"; exit 1; }

# 1. promtool's linter.
curl -sf "http://127.0.0.1:$ep/metrics" >"$work/metrics.txt"
promtool check metrics <"$work/metrics.txt" >"$work/lint.txt" 2>&1 || true
grep -v '^$' "$work/lint.txt" | sort -u >"$work/findings.txt" || true
unexpected=$(comm -23 "$work/findings.txt" <(grep -v '^#' "$here/promtool_allowed_findings.txt" | sort -u))
if [ -z "$unexpected" ]; then ok "promtool check metrics: only dcgm-exporter's own naming findings"; else
  bad "promtool check metrics found:"; echo "$unexpected"; fi
# kgpu's own metrics are lint-clean, apart from the dcgm-exporter GPU labels the per-GPU health
# families share (listed above).
if grep '^kgpu_' "$work/findings.txt" | grep -vq "^kgpu_gpu_[a-z_]* label names should be written in 'snake_case' not 'camelCase'$"; then
  bad "kgpu's own metrics have lint findings"; else ok "kgpu_* metrics are lint-clean (but for the GPU labels)"; fi

# 2. A real Prometheus scraping the exporter, with the alert rules (temperature `for:` shortened).
sed '/alert: KgpuGPUTemperatureHigh/,/for:/ s/for: 5m/for: 0s/' "$root/deploy/monitoring/kgpu-alerts.rules.yaml" >"$work/rules.yaml"
grep -A2 'alert: KgpuGPUTemperatureHigh' "$work/rules.yaml" | grep -q 'for: 0s' || { echo "could not shorten the rule"; exit 1; }
pp=$(free_port)
cat >"$work/prometheus.yml" <<YAML
global:
  scrape_interval: 1s
  evaluation_interval: 1s
rule_files: ["$work/rules.yaml"]
scrape_configs:
  - job_name: kgpu-exporter
    static_configs: [{targets: ["127.0.0.1:$ep"]}]
YAML
prometheus --config.file="$work/prometheus.yml" --storage.tsdb.path="$work/data" \
  --web.listen-address="127.0.0.1:$pp" --log.level=warn >"$work/prometheus.log" 2>&1 &
pids+=($!)
retry 30 curl -sf "http://127.0.0.1:$pp/-/ready" >/dev/null || { cat "$work/prometheus.log"; exit 1; }
api="http://127.0.0.1:$pp/api/v1"
value_of() {  # value_of PROMQL -> the first sample's value
  curl -sf "$api/query" --data-urlencode "query=$1" |
    python3 -c 'import json,sys; r=json.load(sys.stdin)["data"]["result"]; print(r[0]["value"][1] if r else "")'
}
check_value() { [ "$(value_of "$1")" = "$2" ]; }
if retry 30 check_value 'DCGM_FI_DEV_GPU_TEMP{gpu="2",Hostname="prom-node"}' 71; then ok "Prometheus has GPU 2's simulated temperature (71)"; else
  bad "GPU temperature not in Prometheus: '$(value_of 'DCGM_FI_DEV_GPU_TEMP{gpu="2"}')'"; fi
if retry 10 check_value 'DCGM_FI_DEV_GPU_UTIL{gpu="2"}' 64; then ok "Prometheus has GPU 2's utilisation (64)"; else bad "GPU utilisation"; fi
if retry 10 check_value 'count(DCGM_FI_DEV_FB_USED)' 8; then ok "8 GPUs of framebuffer series"; else bad "FB series count"; fi

firing() {  # firing ALERT LABEL VALUE
  curl -sf "$api/alerts" | python3 -c '
import json, sys
alerts = json.load(sys.stdin)["data"]["alerts"]
sys.exit(0 if any(a["labels"].get("alertname") == sys.argv[1] and a["labels"].get(sys.argv[2]) == sys.argv[3]
                  and a["state"] == "firing" for a in alerts) else 1)' "$@"
}
if firing KgpuGPUTemperatureHigh gpu 0; then bad "temperature alert fired before the fault"; else ok "no temperature alert at idle"; fi
"$bin/kgpu-simctl" set 0 temp=90
if retry 30 firing KgpuGPUTemperatureHigh gpu 0; then ok "GPU 0 at 90 C fires KgpuGPUTemperatureHigh"; else bad "temperature alert did not fire"; fi
"$bin/kgpu-simctl" xid 3 48
if retry 30 firing KgpuGPUXidError gpu 3; then ok "XID 48 on GPU 3 fires KgpuGPUXidError"; else bad "XID alert did not fire"; fi
if retry 10 check_value 'DCGM_EXP_XID_ERRORS_TOTAL{gpu="3",xid="48"}' 1; then ok "DCGM_EXP_XID_ERRORS_TOTAL counts the XID"; else bad "XID counter"; fi

echo "$passes passed, $fails failed"
[ "$fails" -eq 0 ]
