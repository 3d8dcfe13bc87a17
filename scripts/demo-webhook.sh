#!/usr/bin/env bash
# The admission webhook in the demo: `kgpu webhook` over HTTPS (a throwaway self-signed
# certificate) turns a HAMi pod (nvidia.com/gpu: 2, nvidia.com/gpumem: 10240) into kgpu shares and
# refuses a share larger than any GPU, naming the field.
#   scripts/demo-webhook.sh <build dir>
set -euo pipefail
build=${1:?usage: demo-webhook.sh <build dir>}
bin=$build/bin
work=$(mktemp -d /tmp/kgpu-webhook-demo-XXXXXX)
hook=""
cleanup() {
  [ -n "$hook" ] && kill "$hook" 2>/dev/null && wait "$hook" 2>/dev/null
  rm -rf "$work"
}
trap cleanup EXIT
openssl req -x509 -newkey rsa:2048 -nodes -days 1 -keyout "$work/tls.key" -out "$work/tls.crt" \
  -subj /CN=kgpu-webhook -addext subjectAltName=IP:127.0.0.1 >/dev/null 2>&1
"$bin/kgpu" webhook --address 127.0.0.1:0 --tls-cert-file "$work/tls.crt" --tls-key-file "$work/tls.key" \
  --scheduler-name kgpu-scheduler --smallest-gpu-memory-mib 40960 --largest-gpu-memory-mib 81920 \
  >"$work/log" 2>&1 &
hook=$!
port=""
for _ in $(seq 150); do
  port=$(sed -n 's/.*listening on port \([0-9]*\).*/\1/p' "$work/log" | head -1)
  [ -n "$port" ] && break
  sleep 0.2
done
[ -n "$port" ] || { echo "demo-webhook: the webhook did not start:" >&2; cat "$work/log" >&2; exit 1; }
review() {  # review UID POD-JSON
  printf '{"apiVersion":"admission.k8s.io/v1","kind":"AdmissionReview","request":{"uid":"%s","kind":{"group":"","version":"v1","kind":"Pod"},"operation":"CREATE","object":%s}}' "$1" "$2"
}
post() { curl -sS --cacert "$work/tls.crt" -H 'Content-Type: application/json' -d @- "https://127.0.0.1:$port$1"; }
hami='{"metadata":{"name":"train","annotations":{"nvidia.com/use-gputype":"A100"}},"spec":{"containers":[{"name":"main","resources":{"limits":{"nvidia.com/gpu":"2","nvidia.com/gpumem":"10240"}}}]}}'
echo "  HAMi pod: limits {nvidia.com/gpu: 2, nvidia.com/gpumem: 10240}, annotation nvidia.com/use-gputype: A100"
echo "  /mutate answers with this JSONPatch (decoded from the response's base64 patch):"
review demo-1 "$hami" | post /mutate | python3 -c '
import base64, json, sys
r = json.load(sys.stdin)["response"]
for op in json.loads(base64.b64decode(r["patch"])):
    print("    " + json.dumps(op))'
big='{"metadata":{"name":"big"},"spec":{"containers":[{"name":"main","resources":{"limits":{"kgpu.io/gpu":"1","kgpu.io/gpu-memory":"100000"}}}]}}'
echo "  /validate on a 100000 MiB share:"
review demo-2 "$big" | post /validate | python3 -c '
import json, sys
r = json.load(sys.stdin)["response"]
print("    allowed:", r["allowed"], "-", r["status"]["message"])'
