#!/usr/bin/env bash
# Captures the golden scrapes in tests/rules/golden/: what a real `kgpu exporter` serves on
# simulated nodes, with every kind of series the alert rules and the Grafana dashboard read.
# tests/rules/check_golden.py (ctest rules.golden) holds the rules, the dashboard and the promtool
# test inputs to these files, and re-captures with the built binary to see that they are not stale.
#
#   tests/rules/capture_golden.sh [BIN_DIR [SIMNVML_DIR [OUT_DIR]]]
#
# BIN_DIR: where kgpu and kgpu-simctl are (default: build/release/bin, else build/dev/bin);
# SIMNVML_DIR: the simulated libnvidia-ml.so.1 (default: BIN_DIR/../simnvml/lib);
# OUT_DIR: default tests/rules/golden. Re-run it after the exporter's series change, and commit
# the files. Needs curl and python3 (tests/rules/fake_podresources.py, kubelet's PodResources).
#
# The scenes (values vary from run to run; names and label sets do not):
#   exporter-dgx-h100.prom      8x H100, node golden-h100:
#     GPU 0  whole GPU held by ml/train-0 (container main); one XID 31 on it
#     GPU 1  shared: kgpu.io/gpu containers serve/a-0 (hard, 20000 MiB) and serve/b-0 (mps,
#            30000 MB), so per-pod series and kgpu_pod_gpu_memory_limit_bytes
#     GPU 2  2 double-bit ECC errors (reason ecc)
#     GPU 3  an XID storm: 40 x XID 13, then XID 94 (reason xid)
#     GPU 5  held by ml/train-5, fallen off the bus (kgpu-simctl lose: reason lost, XID 79,
#            readings absent)
#     GPU 7  row remapping failed (reason row_remap_failure)
#   exporter-dgx-a100-mig.prom  8x A100 with MIG on GPUs 0 and 1, node golden-a100-mig:
#     GPU 0  GPU instance 3 (1g.5gb) held by ml/nb-0, XID 31 on it; GPU instance 1 (3g.20gb)
#            down after a fatal XID 94 on it (reason xid)
#     GPU 1  a whole-GPU XID 43 (repeated on each GPU instance's series)
#     GPU 2  whole GPU (MIG off) held by ml/train-1
set -euo pipefail

root=$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)
here="$root/tests/rules"
bin=${1:-}
if [ -z "$bin" ]; then
  for cand in "$root/build/release/bin" "$root/build/dev/bin"; do
    if [ -x "$cand/kgpu" ] && [ -x "$cand/kgpu-simctl" ]; then bin=$cand; break; fi
  done
fi
[ -n "$bin" ] && [ -x "$bin/kgpu" ] && [ -x "$bin/kgpu-simctl" ] ||
  { echo "capture_golden: no kgpu and kgpu-simctl in '${bin:-build/release/bin or build/dev/bin}'" >&2; exit 1; }
bin=$(cd "$bin" && pwd)
nvml=${2:-$bin/../simnvml/lib}
[ -e "$nvml/libnvidia-ml.so.1" ] || { echo "capture_golden: no libnvidia-ml.so.1 in $nvml" >&2; exit 1; }
nvml=$(cd "$nvml" && pwd)
out=${3:-$here/golden}
mkdir -p "$out"
for tool in curl python3; do
  command -v "$tool" >/dev/null || { echo "capture_golden: $tool not found" >&2; exit 1; }
done

work=$(mktemp -d "${TMPDIR:-/tmp}/kgpu-golden.XXXXXX")
pids=()
cleanup() {
  for p in "${pids[@]}"; do kill "$p" 2>/dev/null || true; done
  for p in "${pids[@]}"; do wait "$p" 2>/dev/null || true; done
  rm -rf "$work"
}
trap cleanup EXIT
export LD_LIBRARY_PATH=$nvml
# shellcheck source=tests/integration/tap.sh
. "$(dirname "$0")/../integration/tap.sh"
uuid_of() { "$bin/kgpu" devices --json | python3 -c "import json,sys; print(json.load(sys.stdin)['gpus'][$1]['uuid'])"; }
mig_uuid_of() {  # mig_uuid_of GPU GI
  "$bin/kgpu" devices --json | python3 -c "
import json, sys
g = json.load(sys.stdin)['gpus'][$1]
print(next(m['uuid'] for m in g['migDevices'] if m['gpuInstanceId'] == $2))"
}

# scene NAME PROFILE NODE: starts the PodResources stand-in (pods from $work/NAME.pods.json, CDI
# specs in $work/NAME.cdi) and the exporter; sets $port.
scene() {
  local name=$1
  "$bin/kgpu-simctl" reset
  python3 "$here/fake_podresources.py" "$work/$name.sock" "$work/$name.pods.json" >"$work/$name.podresources.log" 2>&1 &
  pids+=($!)
  retry 10 test -S "$work/$name.sock" || { cat "$work/$name.podresources.log" >&2; exit 1; }
  port=$(free_port)
  mkdir -p "$work/$name.proc" "$work/$name.cdi"
  "$bin/kgpu" exporter -a "127.0.0.1:$port" -c 200 -k --pod-resources-interval 200ms \
    --pod-resources-kubelet-socket "$work/$name.sock" --cdi-spec-dir "$work/$name.cdi" \
    --proc-root "$work/$name.proc" --kubelet-checkpoint "$work/$name.no-checkpoint" \
    >"$work/$name.exporter.log" 2>&1 &
  pids+=($!)
  retry 20 curl -sf "http://127.0.0.1:$port/health" >/dev/null || { cat "$work/$name.exporter.log" >&2; exit 1; }
}
scrape() { curl -sf -H 'Accept-Encoding: identity' "http://127.0.0.1:$port/metrics" >"$work/page.prom"; }
# until_scraped REGEX...: scrapes until every REGEX matches a line of the page
until_scraped() {
  local deadline=$((SECONDS + 20)) re ok
  while [ "$SECONDS" -lt "$deadline" ]; do
    ok=1
    scrape || ok=0
    if [ "$ok" = 1 ]; then
      for re in "$@"; do grep -Eq "$re" "$work/page.prom" || { ok=0; break; }; done
    fi
    [ "$ok" = 1 ] && return 0
    sleep 0.2
  done
  echo "capture_golden: the exporter never served every one of: $*" >&2
  for re in "$@"; do grep -Eq "$re" "$work/page.prom" || echo "  missing: $re" >&2; done
  cat "$work"/*.exporter.log >&2
  exit 1
}
# write NAME DESCRIPTION: the last scrape, under a header, as OUT/NAME
write() {
  {
    echo "# Golden scrape: \`kgpu exporter\` on a simulated node, captured by tests/rules/capture_golden.sh"
    echo "# ($("$bin/kgpu" --version 2>/dev/null | head -n1)). Do not edit: re-run the script."
    echo "# $2"
    cat "$work/page.prom"
  } >"$out/$1"
  echo "capture_golden: wrote $out/$1 ($(grep -vc '^#' "$out/$1") series)"
}

# ---------------------------------------------------------------- 8x H100
export KGPU_SIM_NODE=dgx-h100 KGPU_SIM_STATE=$work/h100.state KGPU_SIM_NODE_NAME=golden-h100 NODE_NAME=golden-h100
"$bin/kgpu-simctl" reset
g0=$(uuid_of 0) g1=$(uuid_of 1) g5=$(uuid_of 5)
cat >"$work/h100.pods.json" <<JSON
[{"namespace": "ml", "name": "train-0",
  "containers": [{"name": "main", "devices": [{"resource": "nvidia.com/gpu", "ids": ["$g0"]}]}]},
 {"namespace": "ml", "name": "train-5",
  "containers": [{"name": "main", "devices": [{"resource": "nvidia.com/gpu", "ids": ["$g5"]}]}]},
 {"namespace": "serve", "name": "a-0",
  "containers": [{"name": "main", "devices": [{"resource": "kgpu.io/gpu", "ids": ["$g1::0"]}]}]},
 {"namespace": "serve", "name": "b-0",
  "containers": [{"name": "main", "devices": [{"resource": "kgpu.io/gpu", "ids": ["$g1::1"]}]}]}]
JSON
mkdir -p "$work/h100.cdi"
# The CDI specs the device plugin writes for the two share containers (api/share_cdi.h names them).
cat >"$work/h100.cdi/kgpu.io-share_${g1}_0.json" <<JSON
{"cdiVersion": "0.6.0", "kind": "kgpu.io/share", "devices": [{"name": "${g1}_0", "containerEdits": {"env": [
  "NVIDIA_VISIBLE_DEVICES=$g1", "KGPU_ENFORCEMENT=hard", "KGPU_CUDA_MEMORY_LIMIT=$g1=20000Mi"]}}]}
JSON
cat >"$work/h100.cdi/kgpu.io-share_${g1}_1.json" <<JSON
{"cdiVersion": "0.6.0", "kind": "kgpu.io/share", "devices": [{"name": "${g1}_1", "containerEdits": {"env": [
  "NVIDIA_VISIBLE_DEVICES=$g1", "KGPU_ENFORCEMENT=mps", "CUDA_MPS_PINNED_DEVICE_MEM_LIMIT=0=30000M"]}}]}
JSON
scene h100
"$bin/kgpu-simctl" set 0 util=85 memutil=40 temp=71
"$bin/kgpu-simctl" xid 0 31
"$bin/kgpu-simctl" ecc 2 dbe 2
for _ in $(seq 40); do "$bin/kgpu-simctl" xid 3 13; done
"$bin/kgpu-simctl" xid 3 94
"$bin/kgpu-simctl" lose 5
"$bin/kgpu-simctl" set 7 remapped_failure=1
until_scraped \
  '^kgpu_gpu_up\{gpu="5",.*pod="train-5".*\} 0$' \
  '^kgpu_gpu_unhealthy_reason\{gpu="5",.*pod="train-5".*reason="lost".*\} 1$' \
  '^kgpu_gpu_unhealthy_reason\{gpu="3",.*reason="xid".*\} 1$' \
  '^kgpu_gpu_unhealthy_reason\{gpu="2",.*reason="ecc".*\} 1$' \
  '^kgpu_gpu_unhealthy_reason\{gpu="7",.*reason="row_remap_failure".*\} 1$' \
  '^DCGM_EXP_XID_ERRORS_TOTAL\{gpu="3",.*xid="13".*\} 40$' \
  '^DCGM_EXP_XID_ERRORS_TOTAL\{gpu="3",.*xid="94".*\} 1$' \
  '^DCGM_EXP_XID_ERRORS_TOTAL\{gpu="0",.*pod="train-0".*xid="31".*\} 1$' \
  '^DCGM_EXP_XID_ERRORS_TOTAL\{gpu="5",.*xid="79".*\} 1$' \
  '^DCGM_FI_DEV_FB_USED\{gpu="1",.*pod="a-0".*\} ' \
  '^kgpu_pod_gpu_memory_limit_bytes\{gpu="1",.*enforcement="mps",.*pod="b-0".*\} ' \
  '^DCGM_FI_DEV_GPU_UTIL\{gpu="0",.*pod="train-0".*\} '
write exporter-dgx-h100.prom "8x H100 (dgx-h100): GPU 0 held by ml/train-0 (XID 31); GPU 1 shared by serve/a-0 (hard) and serve/b-0 (mps); GPU 2 2 DBEs; GPU 3 XID storm (40x 13, 94); GPU 5 held by ml/train-5, lost; GPU 7 row remap failure."

# ---------------------------------------------------------------- 8x A100, MIG on GPUs 0 and 1
export KGPU_SIM_NODE=dgx-a100-mig KGPU_SIM_STATE=$work/mig.state KGPU_SIM_NODE_NAME=golden-a100-mig NODE_NAME=golden-a100-mig
"$bin/kgpu-simctl" reset
m03=$(mig_uuid_of 0 3) g2=$(uuid_of 2)
cat >"$work/mig.pods.json" <<JSON
[{"namespace": "ml", "name": "nb-0",
  "containers": [{"name": "jupyter", "devices": [{"resource": "nvidia.com/mig-1g.5gb", "ids": ["$m03"]}]}]},
 {"namespace": "ml", "name": "train-1",
  "containers": [{"name": "main", "devices": [{"resource": "nvidia.com/gpu", "ids": ["$g2"]}]}]}]
JSON
scene mig
"$bin/kgpu-simctl" xid 0 31 --gi 3 --ci 0
"$bin/kgpu-simctl" xid 0 94 --gi 1 --ci 0
"$bin/kgpu-simctl" xid 1 43
until_scraped \
  '^DCGM_EXP_XID_ERRORS_TOTAL\{gpu="0",.*GPU_I_ID="3",.*pod="nb-0".*xid="31".*\} 1$' \
  '^DCGM_EXP_XID_ERRORS_TOTAL\{gpu="1",.*GPU_I_ID="7",.*xid="43".*\} 1$' \
  '^DCGM_FI_DEV_FB_USED\{gpu="2",.*pod="train-1".*\} ' \
  '^kgpu_gpu_up\{gpu="0",.*GPU_I_ID="3",.*pod="nb-0".*\} 1$' \
  '^kgpu_gpu_up\{gpu="0",.*GPU_I_ID="1",.*\} 0$' \
  '^kgpu_gpu_unhealthy_reason\{gpu="0",.*GPU_I_ID="1",.*reason="xid".*\} 1$'
write exporter-dgx-a100-mig.prom "8x A100 (dgx-a100-mig), MIG on GPUs 0 and 1: GPU 0 GI 3 held by ml/nb-0 (XID 31 on it), GI 1 down (XID 94); GPU 1 whole-GPU XID 43; GPU 2 held by ml/train-1."
