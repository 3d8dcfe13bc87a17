#!/usr/bin/env bash
# Several processes on one simulated node: two `kgpu health` watchers and `kgpu-simctl` as the
# injector, all separate processes sharing the node's state file. Each injected fault must reach
# both watchers, and `kgpu devices` in a third process must see a lost GPU.
# Usage: multiprocess_health_test.sh <bin dir> <simulated NVML lib dir>
set -euo pipefail
bin=$1
export LD_LIBRARY_PATH=$2
work=$(mktemp -d /tmp/kgpu-mp-XXXXXX)
export KGPU_SIM_NODE=dgx-a100-mig KGPU_SIM_STATE=$work/node.state KGPU_SIM_NODE_NAME=mp-node
pids=()
cleanup() { for p in "${pids[@]}"; do kill "$p" 2>/dev/null || true; done; wait 2>/dev/null || true; rm -rf "$work"; }
trap cleanup EXIT
# shellcheck source=tests/integration/tap.sh
. "$(dirname "$0")/tap.sh"
# wait_for FILE PATTERN: up to 10 s
wait_for() { for _ in $(seq 100); do grep -q -- "$2" "$1" && return 0; sleep 0.1; done; return 1; }

"$bin/kgpu-simctl" reset
uuid() { "$bin/kgpu" devices --json | python3 -c "import json,sys; d=json.load(sys.stdin); print(d['gpus'][$1]['uuid'])"; }
mig_uuid() { "$bin/kgpu" devices --json | python3 -c "import json,sys; d=json.load(sys.stdin); m=d['gpus'][$1]['migDevices'][$2]; print(m['uuid'], m['gpuInstanceId'], m['computeInstanceId'])"; }
g2=$(uuid 2); g5=$(uuid 5); g0=$(uuid 0)
read -r m1 m1gi m1ci < <(mig_uuid 0 1)

for w in a b; do
  "$bin/kgpu" --log-level warn health --duration 60 --probe-interval 200ms --recover-after 0s >"$work/$w.log" 2>&1 &
  pids+=($!)
done
for w in a b; do wait_for "$work/$w.log" "watching" || { cat "$work/$w.log"; exit 1; }; done

"$bin/kgpu-simctl" xid 2 48
for w in a b; do
  if wait_for "$work/$w.log" "change: $g2 Unhealthy: XID 48"; then ok "watcher $w sees XID 48 on GPU 2"; else bad "watcher $w missed XID 48"; fi
done

"$bin/kgpu-simctl" xid 0 94 --gi "$m1gi" --ci "$m1ci"
for w in a b; do
  if wait_for "$work/$w.log" "change: $m1 Unhealthy: XID 94 on MIG instance"; then ok "watcher $w sees the MIG XID"; else bad "watcher $w missed the MIG XID"; fi
  if grep -q "change: $g0 Unhealthy" "$work/$w.log"; then bad "watcher $w marked the parent GPU"; else ok "watcher $w left the parent GPU healthy"; fi
done

"$bin/kgpu-simctl" lose 5
for w in a b; do
  if wait_for "$work/$w.log" "change: $g5 Unhealthy: GPU is lost"; then ok "watcher $w sees GPU 5 lost"; else bad "watcher $w missed the lost GPU"; fi
done
if "$bin/kgpu" devices | grep -E "^5 .* lost" >/dev/null; then ok "kgpu devices shows GPU 5 lost"; else bad "kgpu devices does not show GPU 5 lost"; fi
if "$bin/kgpu" doctor >"$work/doctor.txt"; then bad "doctor passed with a lost GPU"; else
  grep -q "\[FAIL\] GPUs healthy .*GPU 5 is lost" "$work/doctor.txt" && ok "doctor fails on the lost GPU" || bad "doctor output: $(cat "$work/doctor.txt")"
fi
"$bin/kgpu-simctl" restore 5
for w in a b; do
  if wait_for "$work/$w.log" "change: $g5 Healthy"; then ok "watcher $w sees GPU 5 back"; else bad "watcher $w missed the recovery"; fi
done

"$bin/kgpu-simctl" xid 3 43
sleep 0.5
if grep -q "change: $(uuid 3) Unhealthy" "$work/a.log"; then bad "application XID 43 changed health"; else ok "application XID 43 is ignored"; fi

echo "$passes passed, $fails failed"
[ "$fails" -eq 0 ]
