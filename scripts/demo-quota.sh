#!/usr/bin/env bash
# GPU quota in the demo: the API server stand-in with three GPU nodes (inventory annotations) and the
# example quotas of deploy/quota; a pod over team-a's quota is refused with the apiserver's message,
# a two-share pod is charged its exact total memory, `kgpu quota` shows used vs hard in
# GPU-equivalents and `kgpu quota plan` divides the cluster 50/30/20.
#   scripts/demo-quota.sh <build dir>
set -euo pipefail
build=${1:?usage: demo-quota.sh <build dir>}
bin=$build/bin root=$(cd "$(dirname "$0")/.." && pwd)
work=$(mktemp -d /tmp/kgpu-demo-quota-XXXXXX)
api=""
cleanup() { [ -n "$api" ] && kill "$api" 2>/dev/null && wait "$api" 2>/dev/null; rm -rf "$work"; }
trap cleanup EXIT
inv() {  # inv NODE GPU_JSON...: a Node with a kgpu.io/gpu-inventory annotation
  local node=$1; shift
  python3 -c 'import json,sys
node=sys.argv[1]; gpus=[json.loads(g) for g in sys.argv[2:]]
for i,g in enumerate(gpus): g.update(i=i, uuid=f"GPU-{node}-{i}", health="ok"); g.setdefault("model","NVIDIA A100-SXM4-80GB"); g.setdefault("memMiB",81920)
ann=json.dumps({"v":1,"gpus":gpus,"migStrategy":"mixed"})
print(json.dumps({"apiVersion":"v1","kind":"Node","metadata":{"name":node,"annotations":{"kgpu.io/gpu-inventory":ann}}}))' "$node" "$@"
}
# The same three nodes as the cluster step: whole (8 x H100), mig (A100 40GB, one GPU in seven
# 1g.5gb instances, the others whole), share (8 x H200 serving shares).
h100='{"model":"NVIDIA H100 80GB HBM3","memMiB":81559}'
a100='{"model":"NVIDIA A100-SXM4-40GB","memMiB":40960}'
h200='{"model":"NVIDIA H200","memMiB":143771,"slots":16}'
mig='{"model":"NVIDIA A100-SXM4-40GB","memMiB":40960,"mig":['$(for k in 0 1 2 3 4 5 6; do printf '{"uuid":"MIG-%s","profile":"1g.5gb","memMiB":4864}%s' $k "$([ $k = 6 ] || echo ,)"; done)']}'
{
  inv whole "$h100" "$h100" "$h100" "$h100" "$h100" "$h100" "$h100" "$h100"
  inv mig "$mig" "$a100" "$a100" "$a100" "$a100" "$a100" "$a100" "$a100"
  inv share "$h200" "$h200" "$h200" "$h200" "$h200" "$h200" "$h200" "$h200"
} >"$work/nodes.json"
q=$root/deploy/quota
"$bin/kgpu-fake-apiserver" --preload "$work/nodes.json" --preload "$q/namespaces.yaml" --preload "$q/team-a-whole-gpus.yaml" \
  --preload "$q/team-b-mig.yaml" --preload "$q/team-c-shares.yaml" --preload "$q/mig-multi-tenant.yaml" \
  --kubeconfig-out "$work/kc" --port-file "$work/port" >"$work/api.log" 2>&1 &
api=$!
for _ in $(seq 300); do [ -s "$work/port" ] && break; sleep 0.1; done
url="http://127.0.0.1:$(cat "$work/port")"
pod() {  # pod NAMESPACE NAME LIMITS_JSON: create it, print the outcome
  local out
  out=$(curl -sS -X POST -H 'Content-Type: application/json' "$url/api/v1/namespaces/$1/pods" \
    --data "{\"metadata\":{\"name\":\"$2\"},\"spec\":{\"containers\":[{\"name\":\"main\",\"image\":\"cuda\",\"resources\":{\"limits\":$3}}]}}")
  python3 -c 'import json,sys; d=json.loads(sys.argv[1]); print("  created" if d.get("kind")=="Pod" else "  refused: "+d["message"])' "$out"
}
echo "\$ kubectl apply -k deploy/quota   # (preloaded into the API server stand-in: 5 namespaces, quotas, LimitRanges)"
echo "team-a: a pod with 8 whole GPUs, then one more:"
pod team-a train-8 '{"nvidia.com/gpu":"8"}'
pod team-a train-1 '{"nvidia.com/gpu":"1"}'
echo "team-c: two shares of 10000 MiB each (kgpu.io/gpu-memory: 20000 in total):"
pod team-c infer '{"kgpu.io/gpu":"2","kgpu.io/gpu-memory":"20000","kgpu.io/gpu-cores":"60"}'
echo; echo "\$ kgpu quota -n team-c"
"$bin/kgpu" quota --kubeconfig "$work/kc" -n team-c | sed 's/^/  /'
echo; echo "\$ kgpu quota plan --shares team-a=50,team-b=30,team-c=20 | grep -E 'namespace|requests'"
"$bin/kgpu" quota plan --kubeconfig "$work/kc" --shares team-a=50,team-b=30,team-c=20 | grep -E 'namespace:|requests' | sed 's/^/  /'
