#!/usr/bin/env bash
# `kgpu exporter` as a drop-in for dcgm-exporter 4.x, as a real process on a simulated node:
#  1. the GPU Operator's DaemonSet, unchanged: dcgm-exporter (a link to kgpu) with no args; DCGM_EXPORTER_LISTEN, DCGM_EXPORTER_KUBERNETES,
#     DCGM_EXPORTER_COLLECTORS (a custom counters CSV of the GPU Operator's shape), NODE_NAME, and
#     DCGM_REMOTE_HOSTENGINE_INFO (set by the operator when it runs a separate nv-hostengine);
#  2. the Helm chart's args, unchanged: dcgm-exporter -f /etc/dcgm-exporter/default-counters.csv (a file of
#     dcgm-exporter's image: the built-in default stands in);
#  3. dcgm-exporter's Go-style flags (-collectors, -rbmn) and label options (-o, --hostname-label, -d);
#  4. --web-config-file (Prometheus exporter-toolkit's format): HTTPS, and basic auth on every path;
#  5. exit codes: 2 for a refused or malformed flag, 1 for a bad web config or a GPU the node lacks.
# Every page served passes `promtool check metrics` but for the naming findings dcgm-exporter's own
# names cause, and has no series twice.
# Usage: exporter_dcgm_compat_test.sh <bin dir> <simulated NVML lib dir> <repo root>
set -euo pipefail
bin=$1
export LD_LIBRARY_PATH=$2
root=$3
for tool in promtool curl python3 openssl; do
  command -v "$tool" >/dev/null || { echo "missing $tool: run scripts/install-deps.sh"; exit 1; }
done
work=$(mktemp -d /tmp/kgpu-dcgm-compat-XXXXXX)
export KGPU_SIM_NODE=dgx-h100 KGPU_SIM_STATE=$work/node.state KGPU_SIM_NODE_NAME=compat-node
pids=()
cleanup() { for p in "${pids[@]}"; do kill "$p" 2>/dev/null || true; done; wait 2>/dev/null || true; rm -rf "$work"; }
trap cleanup EXIT
# shellcheck source=tests/integration/tap.sh
. "$(dirname "$0")/tap.sh"
# lint FILE NAME: promtool finds nothing but dcgm-exporter's naming (camelCase labels, counters
# without _total, names it keeps), and no series appears twice.
lint() {
  local out rc=0
  out=$(promtool check metrics <"$1" 2>&1) || rc=$?
  if [ "$rc" != 0 ] && [ "$rc" != 3 ]; then bad "$2: promtool cannot parse the page (rc $rc): $out"; return; fi
  local other
  other=$(grep -v '^$' <<<"$out" | grep -vE "label names should be written in 'snake_case' not 'camelCase'$|counter metrics should have \"_total\" suffix$|metric names should be written in 'snake_case' not 'camelCase'$|^DCGM_[A-Z0-9_]*COUNTER metric name should not include type 'counter'$" || true)
  if [ -n "$other" ]; then bad "$2: promtool check metrics found: $other"; else ok "$2: promtool check metrics passes"; fi
  local dups
  dups=$(grep -v '^#' "$1" | sed 's/ [^ ]*$//' | sort | uniq -d | head -3)
  if [ -n "$dups" ]; then bad "$2: series served twice: $dups"; else ok "$2: every series once"; fi
}
# start NAME COMMAND ENV... -- ARGS...: runs COMMAND ARGS with ENV, logging to $work/NAME.log.
start() {
  local name=$1 command=$2; shift 2
  local envs=()
  while [ "$1" != "--" ]; do envs+=("$1"); shift; done
  shift
  env "${envs[@]}" $command "$@" >"$work/$name.log" 2>&1 &
  pids+=($!)
}
# dcgm-exporter as the manifests start it: a link of that name to kgpu runs `kgpu exporter`.
mkdir -p "$work/bin"
ln -s "$bin/kgpu" "$work/bin/dcgm-exporter"

"$bin/kgpu-simctl" reset

# 1. The GPU Operator's DaemonSet (assets/state-dcgm-exporter): the image's dcgm-exporter, no args,
#    env only, a custom counters CSV.
csv=$root/tests/unit/testdata/dcgm-exporter/dcp-metrics-included.csv
[ -f "$csv" ] || { echo "missing $csv (the GPU Operator's dcp-metrics-included.csv shape)"; exit 1; }
p1=$(free_port)
start operator "$work/bin/dcgm-exporter" DCGM_EXPORTER_LISTEN=":$p1" DCGM_EXPORTER_KUBERNETES=true DCGM_EXPORTER_COLLECTORS="$csv" \
  NODE_NAME=compat-node DCGM_REMOTE_HOSTENGINE_INFO=nvidia-dcgm:5555 --
if retry 20 curl -sf "http://127.0.0.1:$p1/health" -o /dev/null; then ok "GPU Operator env: serves"; else
  bad "GPU Operator env: no /health"; cat "$work/operator.log"; fi
curl -sf "http://127.0.0.1:$p1/metrics" >"$work/operator.txt" || true
if grep -Eq '^DCGM_FI_DEV_GPU_TEMP\{gpu="0",UUID="GPU-[^"]+",pci_bus_id="[^"]+",device="nvidia0",modelName="NVIDIA H100 80GB HBM3",Hostname="compat-node"' "$work/operator.txt"; then
  ok "GPU Operator env: dcgm-exporter's labels, Hostname from NODE_NAME"; else bad "GPU Operator env: no GPU_TEMP series with dcgm-exporter's labels"; fi
families=$(grep -c '^# TYPE ' "$work/operator.txt" || true)
if [ "$families" -ge 10 ]; then ok "GPU Operator env: $families families from the custom CSV"; else bad "only $families families"; fi
lint "$work/operator.txt" "GPU Operator env"
if grep -q 'remote-hostengine-info (DCGM_REMOTE_HOSTENGINE_INFO) nvidia-dcgm:5555: kgpu reads NVML directly' "$work/operator.log"; then
  ok "DCGM_REMOTE_HOSTENGINE_INFO is accepted and said to be unused"; else bad "no note on DCGM_REMOTE_HOSTENGINE_INFO"; cat "$work/operator.log"; fi

# 2. The Helm chart's args and env (deployment/values.yaml, templates/daemonset.yaml).
p2=$(free_port)
start helm "$work/bin/dcgm-exporter" DCGM_EXPORTER_KUBERNETES=true DCGM_EXPORTER_LISTEN=":$p2" NODE_NAME=compat-node -- \
  -f /etc/dcgm-exporter/default-counters.csv
if retry 20 curl -sf "http://127.0.0.1:$p2/health" -o /dev/null; then ok "Helm chart args: serve"; else
  bad "Helm chart args: no /health"; cat "$work/helm.log"; fi
curl -sf "http://127.0.0.1:$p2/metrics" >"$work/helm.txt" || true
if grep -q '^DCGM_FI_DEV_GPU_UTIL{gpu="0",' "$work/helm.txt"; then ok "Helm chart args: default counters"; else
  bad "Helm chart args: no DCGM_FI_DEV_GPU_UTIL"; fi
if [ -f /etc/dcgm-exporter/default-counters.csv ] || grep -q "built-in default counters stand in" "$work/helm.log"; then
  ok "dcgm-exporter's image CSV path means the built-in default"; else bad "no note on the image CSV path"; fi
lint "$work/helm.txt" "Helm chart args"

# 3. Go-style flags (one dash, -rbmn) and dcgm-exporter's label options.
p3=$(free_port)
start gostyle "$bin/kgpu exporter" NODE_NAME=compat-node -- -address "127.0.0.1:$p3" -collectors "$csv" -rbmn -o \
  --hostname-label hostname -d g:0,1 -x 60000 --log-format json
if retry 20 curl -sf "http://127.0.0.1:$p3/health" -o /dev/null; then ok "Go-style flags: serve"; else
  bad "Go-style flags: no /health"; cat "$work/gostyle.log"; fi
curl -sf "http://127.0.0.1:$p3/metrics" >"$work/gostyle.txt" || true
temps=$(grep '^DCGM_FI_DEV_GPU_TEMP{' "$work/gostyle.txt" || true)
if grep -q 'modelName="NVIDIA-H100-80GB-HBM3"' <<<"$temps" && grep -q 'uuid="GPU-' <<<"$temps" &&
   grep -q 'hostname="compat-node"' <<<"$temps" && ! grep -q 'UUID=' <<<"$temps"; then
  ok "-rbmn, -o and --hostname-label rename as dcgm-exporter"; else bad "labels: $temps"; fi
if [ "$(grep -c . <<<"$temps")" = 2 ] && grep -q '{gpu="1",' <<<"$temps"; then ok "-d g:0,1 selects two GPUs"; else
  bad "-d g:0,1 served: $temps"; fi
lint "$work/gostyle.txt" "Go-style flags"
# kgpu's lines are JSON objects (none in the text format), with slog's level names.
json_log() {
  python3 - "$1" <<'PY'
import json, re, sys
lines = [l for l in open(sys.argv[1]) if l.strip()]
logs = [json.loads(l) for l in lines if l.startswith("{")]
text = [l for l in lines if re.match(r"^\d{4}-\d\d-\d\dT\S+ [TDIWEC] \[", l)]
sys.exit(0 if logs and not text and all(o["level"] in ("DEBUG", "INFO", "WARN", "ERROR") and "msg" in o for o in logs) else 1)
PY
}
if json_log "$work/gostyle.log"; then
  ok "--log-format json: every log line is a JSON object"; else bad "--log-format json: not JSON"; cat "$work/gostyle.log"; fi

# 4. --web-config-file: HTTPS and basic auth, as Prometheus' exporter-toolkit serves them.
(
  cd "$work"
  printf 'subjectAltName=IP:127.0.0.1,DNS:localhost\nextendedKeyUsage=serverAuth\n' >server.ext
  openssl req -x509 -newkey ec -pkeyopt ec_paramgen_curve:P-256 -nodes -keyout ca.key -out ca.pem -days 2 \
    -subj /CN=kgpu-test-ca -addext basicConstraints=critical,CA:TRUE -addext keyUsage=critical,keyCertSign
  openssl req -newkey ec -pkeyopt ec_paramgen_curve:P-256 -nodes -keyout server.key -out server.csr -subj /CN=localhost
  openssl x509 -req -in server.csr -CA ca.pem -CAkey ca.key -CAcreateserial -out server.pem -days 2 -extfile server.ext
) >/dev/null 2>&1
# bcrypt of "scrape-me" (Python: crypt.crypt("scrape-me", crypt.mksalt(crypt.METHOD_BLOWFISH, rounds=16)),
# written with the $2y$ prefix htpasswd uses; the same hash).
cat >"$work/web.yml" <<'YAML'
tls_server_config:
  cert_file: server.pem
  key_file: server.key
basic_auth_users:
  prometheus: $2y$04$TaSX4BmfD2fT/aAH5uEeDu45mtnClmDr7q6Q0KNg6ToZEUDXxSxly
YAML
p4=$(free_port)
start web "$bin/kgpu exporter" NODE_NAME=compat-node DCGM_EXPORTER_WEB_CONFIG_FILE="$work/web.yml" -- -a "127.0.0.1:$p4"
https=(curl -s --cacert "$work/ca.pem")
code() { "${https[@]}" -o /dev/null -w '%{http_code}' "$@"; }
authed_health() { [ "$(code -u prometheus:scrape-me "https://127.0.0.1:$p4/health")" = 200 ]; }
if retry 20 authed_health; then
  ok "web config: HTTPS with basic auth serves"; else bad "web config: no authenticated /health"; cat "$work/web.log"; fi
if [ "$(code "https://127.0.0.1:$p4/metrics")" = 401 ]; then ok "web config: /metrics without credentials is 401"; else
  bad "web config: /metrics without credentials"; fi
if "${https[@]}" -D - -o /dev/null "https://127.0.0.1:$p4/metrics" | grep -qi '^www-authenticate: Basic'; then
  ok "web config: WWW-Authenticate: Basic"; else bad "web config: no WWW-Authenticate"; fi
if [ "$(code "https://127.0.0.1:$p4/health")" = 401 ]; then ok "web config: basic auth covers /health too"; else
  bad "web config: /health without credentials"; fi
if [ "$(code -u prometheus:wrong "https://127.0.0.1:$p4/metrics")" = 401 ]; then ok "web config: a wrong password is 401"; else
  bad "web config: wrong password accepted"; fi
if curl -sf "http://127.0.0.1:$p4/metrics" -o /dev/null 2>&1; then bad "web config: plain HTTP served"; else
  ok "web config: no plain HTTP"; fi
"${https[@]}" -u prometheus:scrape-me "https://127.0.0.1:$p4/metrics" >"$work/web.txt" || true
if grep -q '^DCGM_FI_DEV_GPU_TEMP{gpu="0",' "$work/web.txt"; then ok "web config: metrics over HTTPS"; else
  bad "web config: no metrics over HTTPS"; fi
lint "$work/web.txt" "web config"

# 5. Exit codes: usage (2) for a refused or malformed flag, bad input (1) behind a flag.
printf 'basic_auth_users:\n  alice: plain-text\n' >"$work/bad-web.yml"
check_exit() {  # WANT_CODE WANT_TEXT ARGS...
  local want=$1 text=$2 rc=0; shift 2
  timeout 30 "$bin/kgpu" exporter -a 127.0.0.1:0 "$@" >"$work/exit.log" 2>&1 || rc=$?
  if [ "$rc" = "$want" ] && grep -qF -- "$text" "$work/exit.log"; then ok "kgpu exporter $* exits $want"; else
    bad "kgpu exporter $*: exit $rc (want $want): $(cat "$work/exit.log")"; fi
}
check_exit 2 "--nvml-library" --fake-gpus
check_exit 2 "DRA" --kubernetes-enable-dra
check_exit 2 "--devices" -d x
check_exit 2 "no CPU entities" -p g
check_exit 2 "kgpu listens on -a/--address itself" --web-systemd-socket
check_exit 1 "bad-web.yml:2:10: basic_auth_users.alice: not a bcrypt hash" --web-config-file "$work/bad-web.yml"
check_exit 1 "-d/--devices names GPU 42" -d g:42

echo "$passes passed, $fails failed"
[ "$fails" -eq 0 ]
