#!/usr/bin/env bash
# kgpu exporter in place of dcgm-exporter, started the way the GPU Operator starts dcgm-exporter:
# its environment (DCGM_EXPORTER_LISTEN, DCGM_EXPORTER_COLLECTORS with the Operator's counters file,
# every commented row enabled, NODE_NAME), plus a Prometheus exporter-toolkit web config (basic
# auth) and an XID window (-x). On the simulated 8x H100 node: nothing omitted, the tensor pipe from
# NVML's GPM, the last XID 0 from the start, XIDs counted in the window.
#   scripts/demo-exporter-dropin.sh <build dir>
set -euo pipefail
build=${1:?usage: demo-exporter-dropin.sh <build dir>}
bin=$build/bin
root=$(cd "$(dirname "$0")/.." && pwd)
export LD_LIBRARY_PATH=$build/simnvml/lib
work=$(mktemp -d /tmp/kgpu-dropin-XXXXXX)
export KGPU_SIM_NODE=dgx-h100 KGPU_SIM_STATE=$work/node.state KGPU_SIM_NODE_NAME=demo-node
exporter=""
cleanup() {
  [ -n "$exporter" ] && kill "$exporter" 2>/dev/null && wait "$exporter" 2>/dev/null
  rm -rf "$work"
}
trap cleanup EXIT
until_ok() { local n=$(($1 * 5)); shift; for _ in $(seq "$n"); do "$@" >/dev/null 2>&1 && return 0; sleep 0.2; done; return 1; }
port=$(python3 -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1", 0)); print(s.getsockname()[1])')
csv=$root/tests/unit/testdata/dcgm-exporter/dcp-metrics-included.csv
# bcrypt of "scrape-me" (the hash tests/integration/exporter_dcgm_compat_test.sh uses).
cat >"$work/web.yml" <<'YAML'
basic_auth_users:
  prometheus: $2y$04$TaSX4BmfD2fT/aAH5uEeDu45mtnClmDr7q6Q0KNg6ToZEUDXxSxly
YAML
metrics() { curl -sf -u prometheus:scrape-me "http://127.0.0.1:$port/metrics"; }
# A sample line without the labels every series repeats.
short() { sed -E 's/,UUID="[^"]*",pci_bus_id="[^"]*",device="[^"]*",modelName="[^"]*"//; s/,Hostname="[^"]*"//;
  s/,DCGM_FI_[A-Z_]*VERSION="[^"]*"//g; s/,DCGM_FI_DEV_(SERIAL|BRAND|OEM_INFOROM_VER|ECC_INFOROM_VER|POWER_INFOROM_VER|INFOROM_IMAGE_VER)="[^"]*"//g; s/^/  /'; }

"$bin/kgpu-simctl" reset >/dev/null
"$bin/kgpu-simctl" set 0 util=80 memutil=35 >/dev/null
echo "\$ DCGM_EXPORTER_LISTEN=:$port DCGM_EXPORTER_COLLECTORS=<the GPU Operator's dcp-metrics-included.csv, all $(grep -c '^DCGM' "$csv") rows on> \\"
echo "  NODE_NAME=demo-node kgpu exporter --web-config-file web.yml -x 60000 -c 500"
DCGM_EXPORTER_LISTEN="127.0.0.1:$port" DCGM_EXPORTER_COLLECTORS="$csv" NODE_NAME=demo-node \
  "$bin/kgpu" exporter --web-config-file "$work/web.yml" -x 60000 -c 500 >"$work/exporter.log" 2>&1 &
exporter=$!
until_ok 20 metrics || { cat "$work/exporter.log"; exit 1; }
echo "exporter log (nothing omitted: every row is served from NVML, PROF_* through GPM on Hopper):"
sed 's/^/  /' "$work/exporter.log"
echo "\$ curl :$port/metrics               # without credentials"
curl -s -o /dev/null -w '  HTTP %{http_code}\n' "http://127.0.0.1:$port/metrics"
echo "\$ curl -u prometheus:… :$port/metrics | wc -l"
echo "  $(metrics | grep -vc '^#') series in $(metrics | grep -c '^# TYPE') families"
until_ok 10 sh -c "curl -sf -u prometheus:scrape-me http://127.0.0.1:$port/metrics | grep -q '^DCGM_FI_PROF_PIPE_TENSOR_ACTIVE{gpu=\"0\"'"
echo "GPU 0 at 80% (kgpu-simctl set 0 util=80): Grafana 12239's Tensor panel has data, from NVML's GPM:"
metrics | grep -E '^DCGM_FI_PROF_(PIPE_TENSOR_ACTIVE|SM_ACTIVE|DRAM_ACTIVE)\{gpu="0"' | short
echo "before any XID, the last XID is 0 on every GPU (increase() and dashboards see the first one):"
metrics | grep -E '^DCGM_FI_DEV_XID_ERRORS\{gpu="2"' | short
echo "\$ kgpu-simctl xid 2 13; kgpu-simctl xid 2 13; kgpu-simctl xid 2 31"
for x in 13 13 31; do "$bin/kgpu-simctl" xid 2 "$x" >/dev/null; done
until_ok 10 sh -c "curl -sf -u prometheus:scrape-me http://127.0.0.1:$port/metrics | grep -q '^DCGM_EXP_XID_ERRORS_COUNT{gpu=\"2\".*xid=\"31\"'"
metrics | grep -E '^(DCGM_FI_DEV_XID_ERRORS|DCGM_EXP_XID_ERRORS_COUNT)\{gpu="2"' | short
echo "the CSV's label rows (driver, NVML, brand, serial, inforom, VBIOS) on every series, as dcgm-exporter writes them:"
metrics | grep -E '^DCGM_FI_DEV_GPU_TEMP\{gpu="0"' | sed 's/^/  /'
