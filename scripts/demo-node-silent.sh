#!/usr/bin/env bash
# A GPU that fails never goes silent: on a simulated node, GPU 5 falls off the bus while the
# exporter runs (kgpu_gpu_up turns 0, XID 79 is counted at once, one log line), then GPU 3 hangs
# and `kgpu doctor` still answers within its 2 s NVML deadline, naming the hung GPU.
#   scripts/demo-node-silent.sh <build dir>
set -euo pipefail
build=${1:?usage: demo-node-silent.sh <build dir>}
bin=$build/bin
export LD_LIBRARY_PATH=$build/simnvml/lib
work=$(mktemp -d /tmp/kgpu-silent-XXXXXX)
export KGPU_SIM_NODE=dgx-h100 KGPU_SIM_STATE=$work/node.state KGPU_SIM_NODE_NAME=demo-node NODE_NAME=demo-node
exporter=""
cleanup() {
  [ -n "$exporter" ] && kill "$exporter" 2>/dev/null && wait "$exporter" 2>/dev/null
  "$bin/kgpu-simctl" hang 3 0 >/dev/null 2>&1 || true
  rm -rf "$work"
}
trap cleanup EXIT
# until SECONDS COMMAND...: poll until COMMAND succeeds.
until_ok() { local n=$(( $1 * 5 )); shift; for _ in $(seq "$n"); do "$@" >/dev/null 2>&1 && return 0; sleep 0.2; done; return 1; }
port=$(python3 -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1", 0)); print(s.getsockname()[1])')
metrics() { curl -sf "http://127.0.0.1:$port/metrics"; }
gpu5() { metrics | grep -E '^(kgpu_gpu_up|kgpu_gpu_unhealthy_reason|DCGM_EXP_XID_ERRORS_TOTAL)\{gpu="5"' | sed 's/,pci_bus_id=[^}]*Hostname/,…,Hostname/; s/^/  /'; }

"$bin/kgpu-simctl" reset >/dev/null
"$bin/kgpu" --log-level warn exporter -a "127.0.0.1:$port" -c 200 >"$work/exporter.log" 2>&1 &
exporter=$!
until_ok 20 metrics || { cat "$work/exporter.log"; exit 1; }
echo "\$ kgpu-simctl lose 5      # GPU 5 falls off the bus (XID 79)"
"$bin/kgpu-simctl" lose 5
until_ok 20 sh -c "curl -sf http://127.0.0.1:$port/metrics | grep -q '^kgpu_gpu_up{gpu=\"5\".* 0\$'"
echo "\$ curl :$port/metrics | grep 'gpu=\"5\"'   # still visible: up 0, the reason, XID 79 counted now"
gpu5
echo "exporter log (once, not per collection):"
grep "GPU 5" "$work/exporter.log" | sed 's/^/  /'
"$bin/kgpu-simctl" restore 5
kill "$exporter"; wait "$exporter" 2>/dev/null || true; exporter=""

echo; echo "\$ kgpu-simctl hang 3 60000; time kgpu doctor   # a hung GPU: FAIL within the 2 s deadline"
"$bin/kgpu-simctl" hang 3 60000
start=$(date +%s.%N)
"$bin/kgpu" --log-level error doctor --kubelet-dir "$work" --mps-root "$work/mps" | grep -E 'GPUs healthy' | sed 's/^/  /' || true
awk -v a="$start" -v b="$(date +%s.%N)" 'BEGIN { printf "  doctor returned after %.1f s (the hang lasts 60 s)\n", b - a }'
