#!/usr/bin/env bash
# `kgpu exporter` as a real process on a simulated node while `kgpu-simctl lose 5` makes GPU 5
# fall off the bus: the GPU must stay visible. Scraped over HTTP:
#   - kgpu_gpu_up{gpu="5",UUID=...} turns 0, with kgpu_gpu_unhealthy_reason{reason="lost"} 1;
#   - DCGM_EXP_XID_ERRORS_TOTAL{gpu="5",xid="79"} is 1 while the GPU is lost (not after restore);
#   - the exporter logs the transition once, however many collections see it;
#   - after `restore 5`, its readings are back at once; kgpu_gpu_up is 1 again and the reason gone
#     once --health-recover-after (here 2s; the device plugin's default health.recoverAfter, 5m,
#     otherwise) has passed, as the device plugin would serve the GPU to kubelet.
# Usage: exporter_lost_gpu_test.sh <bin dir> <simulated NVML lib dir>
set -euo pipefail
bin=$1
export LD_LIBRARY_PATH=$2
work=$(mktemp -d /tmp/kgpu-lost-XXXXXX)
export KGPU_SIM_NODE=dgx-h100 KGPU_SIM_STATE=$work/node.state KGPU_SIM_NODE_NAME=lost-node NODE_NAME=lost-node
pids=()
cleanup() { for p in "${pids[@]}"; do kill "$p" 2>/dev/null || true; done; wait 2>/dev/null || true; rm -rf "$work"; }
trap cleanup EXIT
# shellcheck source=tests/integration/tap.sh
. "$(dirname "$0")/tap.sh"
scrape() { curl -sf "http://127.0.0.1:$port/metrics" >"$work/metrics.txt"; }
# has REGEX: the last scrape has a line matching REGEX
has() { grep -Eq "$1" "$work/metrics.txt"; }
scrape_until() { scrape && has "$1"; }

"$bin/kgpu-simctl" reset
uuid5=$("$bin/kgpu" devices --json | python3 -c "import json,sys; print(json.load(sys.stdin)['gpus'][5]['uuid'])")
port=$(free_port)
"$bin/kgpu" exporter -a "127.0.0.1:$port" -c 200 --health-recover-after 2s >"$work/exporter.log" 2>&1 &
pids+=($!)
retry 20 curl -sf "http://127.0.0.1:$port/health" >/dev/null || { cat "$work/exporter.log"; exit 1; }

up5='^kgpu_gpu_up\{gpu="5",UUID="'$uuid5'",[^}]*Hostname="lost-node"[^}]*\}'
if retry 20 scrape_until "$up5 1$"; then ok "GPU 5 is up before the fault"; else bad "no kgpu_gpu_up 1 for GPU 5"; fi

"$bin/kgpu-simctl" lose 5
if retry 20 scrape_until "$up5 0$"; then ok "kgpu_gpu_up of GPU 5 is 0 after lose"; else bad "kgpu_gpu_up of GPU 5 did not turn 0"; fi
if retry 20 scrape_until '^DCGM_EXP_XID_ERRORS_TOTAL\{gpu="5",[^}]*xid="79"\} 1$'; then
  ok "XID 79 is counted while GPU 5 is lost"; else bad "no XID 79 count while GPU 5 is lost"; fi
if has '^kgpu_gpu_unhealthy_reason\{gpu="5",[^}]*reason="lost"\} 1$'; then ok "the reason is lost"; else bad "no reason=lost series"; fi
if has '^DCGM_FI_DEV_GPU_TEMP\{gpu="5",'; then bad "GPU 5 still has a temperature reading"; else ok "GPU 5's readings are absent, not zeroed"; fi
# Several more collections (200 ms apart) see the GPU lost: still one log line.
collections() { grep -E '^kgpu_exporter_collections_total ' "$work/metrics.txt" | awk '{print $2}'; }
scrape; c0=$(collections)
more_collections() { scrape && [ "$(collections)" -ge $((c0 + 5)) ]; }
retry 30 more_collections || bad "the exporter stopped collecting"
n=$(grep -c "GPU 5 ($uuid5) is lost" "$work/exporter.log" || true)
if [ "$n" = 1 ]; then ok "the loss is logged once ($(collections) collections)"; else bad "the loss was logged $n times"; cat "$work/exporter.log"; fi

"$bin/kgpu-simctl" restore 5
if retry 20 scrape_until '^DCGM_FI_DEV_GPU_TEMP\{gpu="5",'; then ok "GPU 5's readings are back after restore"; else
  bad "GPU 5's readings did not come back"; fi
if retry 20 scrape_until "$up5 1$"; then ok "kgpu_gpu_up of GPU 5 is 1 after restore"; else bad "GPU 5 did not come back"; fi
if has 'reason="lost"'; then bad "reason=lost is still served"; else ok "the reason is gone"; fi
if grep -q "GPU 5 ($uuid5) is readable again" "$work/exporter.log"; then ok "the recovery is logged"; else bad "the recovery is not logged"; fi

echo "$passes passed, $fails failed"
[ "$fails" -eq 0 ]
