#!/usr/bin/env bash
# kubectl 1.33 (a real client; the one on these machines nearest to DRA's GA in 1.34) against
# kgpu-fake-apiserver reporting v1.34 and serving resource.k8s.io/v1: it applies deploy/dra's
# DeviceClasses (deploy/dra/deviceclasses.yaml; the stand-in serves no DaemonSet), claims and a claim template, and the ResourceSlices `kgpu dra slices` prints for
# simulated nodes; it lists them with the columns kube-apiserver's printers give; the stand-in
# refuses what kube-apiserver refuses (required fields, limits, formats, immutable fields) with
# its field paths; a claim's status subresource shows allocated,reserved. Where kubectl and the
# stand-in disagree, the stand-in is wrong (k8s.io/api resource/v1;
# kubernetes/kubernetes pkg/printers/internalversion/printers.go).
#
#   dra_kubectl_test.sh BIN_DIR SIM_LIB REPO_ROOT
#
# Exits 77 (skipped) without kubectl 1.33 (kubectl.1.33 beside the dispatcher or on PATH).
set -euo pipefail
BIN=$1 SIM_LIB=$2 ROOT=$(cd "$3" && pwd)
K133=$(command -v kubectl.1.33 || true)
if [ -z "$K133" ] && command -v kubectl >/dev/null; then
  cand="$(dirname "$(readlink -f "$(command -v kubectl)")")/kubectl.1.33"
  [ -x "$cand" ] && K133=$cand
fi
if [ -z "$K133" ]; then
  echo "SKIP: kubectl 1.33 is not installed (kubectl.1.33; the DRA kubectl test needs it)"
  exit 77
fi
WORK=$(mktemp -d /tmp/kgpu-dra-kubectl-XXXXXX)
PID=""
cleanup() {
  [ -n "$PID" ] && kill "$PID" 2>/dev/null && wait "$PID" 2>/dev/null || true
  rm -rf "$WORK"
}
trap cleanup EXIT
fail() { echo "FAIL: $*" >&2; echo "--- server log" >&2; tail -50 "$WORK/server.log" >&2 || true; exit 1; }

"$BIN/kgpu-fake-apiserver" --tls --token kubectl-token=admin --git-version v1.34.2 \
  --kubeconfig-out "$WORK/kubeconfig" --port-file "$WORK/port" >"$WORK/server.log" 2>&1 &
PID=$!
for _ in $(seq 1 300); do [ -s "$WORK/port" ] && break; sleep 0.1; done
[ -s "$WORK/port" ] || fail "the stand-in did not start"
export KUBECONFIG="$WORK/kubeconfig"
export HOME="$WORK"  # kubectl's discovery cache under $WORK/.kube
K() { timeout 60 "$K133" --request-timeout=20s "$@"; }
expect() {  # expect <pattern> <command...>
  local pat=$1; shift
  local out
  out=$("$@" 2>&1) || fail "'$*' failed: $out"
  grep -qE -- "$pat" <<<"$out" || fail "'$*' did not print /$pat/: $out"
  echo "ok: $* ~ /$pat/"
}
refused() {  # refused <pattern> <command...>: the command fails and prints the pattern
  local pat=$1; shift
  local out
  if out=$("$@" 2>&1); then fail "'$*' succeeded: $out"; fi
  grep -qE -- "$pat" <<<"$out" || fail "'$*' did not print /$pat/: $out"
  echo "ok (refused): $* ~ /$pat/"
}
slices() {  # slices <sim profile> <node> [kgpu dra slices flags...]
  local profile=$1 node=$2; shift 2
  KGPU_SIM_NODE=$profile KGPU_SIM_STATE="$WORK/$node.state" KGPU_NVML_LIBRARY="$SIM_LIB" \
    "$BIN/kgpu" dra slices --node-name "$node" "$@"
}

expect 'Server Version: v1\.34\.2' K version
expect 'resourceslices +resource\.k8s\.io/v1 +false +ResourceSlice' K api-resources
expect 'resourceclaims +resource\.k8s\.io/v1 +true +ResourceClaim' K api-resources

# The DeviceClasses kgpu ships.
expect 'deviceclass.resource.k8s.io/gpu-share.kgpu.io created' K apply -f "$ROOT/deploy/dra/deviceclasses.yaml"
expect '^gpu-share\.kgpu\.io +[0-9]+s' K get deviceclasses
expect 'gpu\.nvidia\.com' K get deviceclass gpu.nvidia.com -o 'jsonpath={.spec.selectors[0].cel.expression}'
expect '^1$' K get deviceclass mig.nvidia.com -o 'jsonpath={.metadata.generation}'

# Claims written for NVIDIA's driver, and kgpu's share class.
cat >"$WORK/claims.yaml" <<'YAML'
apiVersion: resource.k8s.io/v1
kind: ResourceClaim
metadata:
  name: one-gpu
spec:
  devices:
    requests:
    - name: gpu
      exactly:
        deviceClassName: gpu.nvidia.com
        selectors:
        - cel:
            expression: "device.attributes['gpu.nvidia.com'].productName.matches('L4')"
---
apiVersion: resource.k8s.io/v1
kind: ResourceClaim
metadata:
  name: small-mig
spec:
  devices:
    requests:
    - name: mig
      firstAvailable:
      - name: one-g
        deviceClassName: mig.nvidia.com
        selectors:
        - cel:
            expression: "device.attributes['gpu.nvidia.com'].profile == '1g.5gb'"
      - name: two-g
        deviceClassName: mig.nvidia.com
    constraints:
    - requests: [mig]
      matchAttribute: resource.kubernetes.io/pcieRoot
---
apiVersion: resource.k8s.io/v1
kind: ResourceClaimTemplate
metadata:
  name: share-20gi
spec:
  spec:
    devices:
      requests:
      - name: share
        exactly:
          deviceClassName: gpu-share.kgpu.io
          capacity:
            requests:
              memory: 20Gi
              cores: "30"
YAML
expect 'resourceclaimtemplate.resource.k8s.io/share-20gi created' K apply -f "$WORK/claims.yaml"
expect '^one-gpu +pending +[0-9]+s' K get resourceclaims
expect '^small-mig +pending' K get resourceclaims
expect '^share-20gi +[0-9]+s' K get resourceclaimtemplates

# The slices kgpu publishes: a dynamic-MIG node and a node with two shared GPUs.
cat >"$WORK/shares.yaml" <<'YAML'
version: v1
sharing:
  timeSlicing:
    resources:
    - name: nvidia.com/gpu
      rename: kgpu.io/gpu
      replicas: 4
      devices: ["0", "1"]
YAML
slices dgx-a100-mig node-b --dynamic-mig >"$WORK/node-b.json" || fail "kgpu dra slices (node-b)"
slices l4x4 node-a --config-file "$WORK/shares.yaml" >"$WORK/node-a.json" || fail "kgpu dra slices (node-a)"
expect 'resourceslice.resource.k8s.io/node-b-gpu.nvidia.com-3 created' K apply -f "$WORK/node-b.json"
expect 'resourceslice.resource.k8s.io/node-a-gpu.nvidia.com-0 created' K apply -f "$WORK/node-a.json"
expect '^node-a-gpu\.nvidia\.com-0 +node-a +gpu\.nvidia\.com +node-a +[0-9]+s' K get resourceslices
expect '^node-b-gpu\.nvidia\.com-1 +node-b +gpu\.nvidia\.com +node-b' K get resourceslices
out=$(K get resourceslices --field-selector spec.nodeName=node-a -o name) || fail "field selector: $out"
[ "$out" = "resourceslice.resource.k8s.io/node-a-gpu.nvidia.com-0" ] || fail "spec.nodeName=node-a selected: $out"
echo "ok: --field-selector spec.nodeName=node-a"
[ "$(K get resourceslices --field-selector spec.driver=gpu.nvidia.com -o name | wc -l)" -eq 5 ] ||
  fail "spec.driver=gpu.nvidia.com did not select the 5 slices"
refused 'field label not supported: spec.bogus' K get resourceslices --field-selector spec.bogus=x
expect '^true$' K get resourceslice node-a-gpu.nvidia.com-0 -o 'jsonpath={.spec.devices[0].allowMultipleAllocations}'
expect '^8\.9\.0$' K get resourceslice node-a-gpu.nvidia.com-0 \
  -o "jsonpath={.spec.devices[0].attributes.cudaComputeCapability.version}"
expect 'gpu-0-counter-set' K get resourceslice node-b-gpu.nvidia.com-1 -o 'jsonpath={.spec.sharedCounters[*].name}'

# A changed spec bumps the generation (the node's shares withdrawn: same names, new devices).
slices l4x4 node-a >"$WORK/node-a-plain.json" || fail "kgpu dra slices (node-a, no shares)"
expect 'configured' K apply -f "$WORK/node-a-plain.json"
expect '^2$' K get resourceslice node-a-gpu.nvidia.com-0 -o 'jsonpath={.metadata.generation}'
expect 'configured|unchanged' K apply -f "$WORK/node-a-plain.json"
expect '^2$' K get resourceslice node-a-gpu.nvidia.com-0 -o 'jsonpath={.metadata.generation}'

# What kube-apiserver refuses.
cat >"$WORK/bad-claim.yaml" <<'YAML'
apiVersion: resource.k8s.io/v1
kind: ResourceClaim
metadata:
  name: bad
spec:
  devices:
    requests:
    - name: Gpu
      exactly:
        allocationMode: Some
YAML
refused 'spec.devices.requests\[0\]\.name: Invalid value: "Gpu": a lowercase RFC 1123 label' K create -f "$WORK/bad-claim.yaml"
refused 'exactly.deviceClassName: Required value' K create -f "$WORK/bad-claim.yaml"
refused 'allocationMode: Unsupported value: "Some": supported values: "All", "ExactCount"' K create -f "$WORK/bad-claim.yaml"
refused 'The ResourceClaim "one-gpu" is invalid: spec: Invalid value: .*field is immutable' \
  K patch resourceclaim one-gpu --type=merge \
  -p '{"spec":{"devices":{"requests":[{"name":"gpu","exactly":{"deviceClassName":"mig.nvidia.com"}}]}}}'
refused 'spec.nodeName: Invalid value: "node-z": field is immutable' \
  K patch resourceslice node-a-gpu.nvidia.com-0 --type=merge -p '{"spec":{"nodeName":"node-z"}}'
refused 'attributes\[driverVersion\]\.version: Invalid value: "550\.90\.07": must be a string compatible with semver' \
  K patch resourceslice node-a-gpu.nvidia.com-0 --type=json \
  -p '[{"op":"replace","path":"/spec/devices/0/attributes/driverVersion/version","value":"550.90.07"}]'
python3 - "$WORK/node-a-plain.json" "$WORK/big.json" <<'PY'
import copy, json, sys
s = json.load(open(sys.argv[1]))["items"][0]
s["metadata"] = {"name": "too-big"}
d = s["spec"]["devices"][0]
s["spec"]["devices"] = [dict(copy.deepcopy(d), name=f"gpu-{i}") for i in range(129)]
json.dump(s, open(sys.argv[2], "w"))
PY
refused 'spec.devices: Too many: 129: must have at most 128 items' K create -f "$WORK/big.json"
refused 'requestPolicy: Forbidden: allowed only when allowMultipleAllocations is true' \
  K patch resourceslice node-a-gpu.nvidia.com-0 --type=json \
  -p '[{"op":"add","path":"/spec/devices/0/capacity/memory/requestPolicy","value":{"default":"1Gi"}}]'

# The claim's status subresource: what the scheduler writes at allocation and reservation.
expect 'patched' K patch resourceclaim one-gpu --subresource=status --type=merge -p \
  '{"status":{"allocation":{"devices":{"results":[{"request":"gpu","driver":"gpu.nvidia.com","pool":"node-a","device":"gpu-2"}]}},"reservedFor":[{"resource":"pods","name":"p","uid":"0000-1"}]}}'
expect '^one-gpu +allocated,reserved' K get resourceclaims
refused 'status.allocation.devices.results\[0\]\.request: Invalid value: "nope"' \
  K patch resourceclaim small-mig --subresource=status --type=merge -p \
  '{"status":{"allocation":{"devices":{"results":[{"request":"nope","driver":"gpu.nvidia.com","pool":"node-b","device":"gpu-0-mig-1g5gb-19-0"}]}}}}'
expect 'patched' K patch resourceclaim small-mig --subresource=status --type=merge -p \
  '{"status":{"allocation":{"devices":{"results":[{"request":"mig/one-g","driver":"gpu.nvidia.com","pool":"node-b","device":"gpu-0-mig-1g5gb-19-0"}]}}}}'
expect '^small-mig +allocated +' K get resourceclaims
# The main resource does not write status.
expect 'patched|no change' K patch resourceclaim one-gpu --type=merge -p '{"status":{"reservedFor":null}}'
expect '^one-gpu +allocated,reserved' K get resourceclaims

echo "dra_kubectl_test: PASS"
