#!/usr/bin/env bash
# Kubernetes <-> Slurm in the demo: a real Slurm 22.05 (munged, slurmctld, two slurmd) and the API
# server stand-in; `kgpu slurm-bridge run` lends an idle Slurm node to an unschedulable GPU pod, then
# reclaims it for a Slurm job that needs every node, evicting the pod first. No Slurm job is killed.
#   scripts/demo-slurm.sh <build dir>
set -euo pipefail
build=${1:?usage: demo-slurm.sh <build dir>}
bin=$build/bin
work=$(mktemp -d /tmp/ks-XXXXXX)  # short: slurmd's unix socket paths live under it
api="" bridge=""
cleanup() {
  [ -n "$bridge" ] && kill "$bridge" 2>/dev/null && wait "$bridge" 2>/dev/null
  [ -n "$api" ] && kill "$api" 2>/dev/null && wait "$api" 2>/dev/null
  "$bin/kgpu-slurm-testcluster" down --base "$work/slurm" >/dev/null 2>&1 || true
  rm -rf "$work"
}
trap cleanup EXIT

since() { awk -v a="$1" -v b="$(date +%s.%N)" 'BEGIN { printf "%.1f", b - a }'; }

# wait_for SECONDS DESCRIPTION COMMAND...: poll until COMMAND succeeds.
wait_for() {
  local secs=$1 what=$2; shift 2
  for _ in $(seq $((secs * 5))); do "$@" >/dev/null 2>&1 && return 0; sleep 0.2; done
  echo "demo-slurm: timed out waiting for $what; bridge log:" >&2
  tail -20 "$work/bridge.log" >&2
  exit 1
}

set +e
conf=$("$bin/kgpu-slurm-testcluster" up --base "$work/slurm" --nodes node1,node2 --gpus 2 2>"$work/up.err")
rc=$?
set -e
if [ $rc -eq 77 ]; then
  echo "(Slurm part skipped: $(cat "$work/up.err"))"
  exit 0
elif [ $rc -ne 0 ]; then
  cat "$work/up.err" >&2
  exit 1
fi
export "${conf?}"  # SLURM_CONF=...
echo "\$ kgpu-slurm-testcluster up --nodes node1,node2   # munged, slurmctld and one slurmd per node"
sinfo -N -h -o '  %N %T %G'

cat >"$work/objects.yaml" <<'EOF'
apiVersion: v1
kind: Node
metadata: {name: node1, labels: {kgpu.io/pool: slurm}}
status: {allocatable: {nvidia.com/gpu: "2", cpu: "2"}}
---
apiVersion: v1
kind: Node
metadata: {name: node2, labels: {kgpu.io/pool: slurm}}
status: {allocatable: {nvidia.com/gpu: "2", cpu: "2"}}
---
apiVersion: v1
kind: Namespace
metadata: {name: infer}
EOF
"$bin/kgpu-fake-apiserver" --token demo-token --preload "$work/objects.yaml" --kubeconfig-out "$work/kubeconfig" \
  --port-file "$work/api.port" >"$work/api.log" 2>&1 &
api=$!
wait_for 20 "the API server stand-in" test -s "$work/api.port"
base="http://127.0.0.1:$(cat "$work/api.port")"
k() { curl -sS --fail-with-body -H "Authorization: Bearer demo-token" "$@"; }
json=(-H "Content-Type: application/json")
merge=(-H "Content-Type: application/merge-patch+json")

"$bin/kgpu" --log-level info slurm-bridge run --kubeconfig "$work/kubeconfig" --interval 300ms --lend-threshold 1s \
  --cooldown 0s --max-lent 1 --leader-elect-resource-namespace default >"$work/bridge.log" 2>&1 &
bridge=$!
# q PYTHON-EXPR: evaluates EXPR over `kgpu slurm-bridge status --json`'s nodes (n), prints it, fails on a false value.
q() {
  "$bin/kgpu" slurm-bridge status --json --kubeconfig "$work/kubeconfig" |
    python3 -c "import json,sys; n=json.load(sys.stdin)['nodes']; v=$1; print(v or ''); sys.exit(0 if v else 1)"
}
fenced() { q "len(n) == 2 and all(x['k8sFenced'] for x in n)"; }
wait_for 60 "the bridge to fence both nodes for Slurm" fenced
echo; echo "\$ kgpu slurm-bridge run --max-lent 1 &   # both nodes start Slurm's: Kubernetes is fenced (taint + cordon)"

echo; echo "# a GPU pod that no Kubernetes node can take (PodScheduled=False, Unschedulable)"
k "${json[@]}" -X POST "$base/api/v1/namespaces/infer/pods" -d '{"apiVersion":"v1","kind":"Pod","metadata":{"name":"burst"},
  "spec":{"terminationGracePeriodSeconds":1,"containers":[{"name":"s","image":"infer:1",
  "resources":{"limits":{"nvidia.com/gpu":"1"}}}]}}' >/dev/null
now=$(date -u +%Y-%m-%dT%H:%M:%SZ)
k "${merge[@]}" -X PATCH "$base/api/v1/namespaces/infer/pods/burst/status" \
  -d "{\"status\":{\"phase\":\"Pending\",\"conditions\":[{\"type\":\"PodScheduled\",\"status\":\"False\",
  \"reason\":\"Unschedulable\",\"message\":\"0/2 nodes are available: 2 Insufficient nvidia.com/gpu.\",
  \"lastTransitionTime\":\"$now\"}]}}" >/dev/null
lent() { q "next((x['node'] for x in n if x['phase'] == 'LENT'), '')"; }
t0=$(date +%s.%N)
wait_for 60 "a node to be lent" lent
printf '# lent in %.1f s:\n' "$(since "$t0")"
"$bin/kgpu" slurm-bridge status --kubeconfig "$work/kubeconfig" | sed 's/^/  /'
sinfo -N -h -o '  %N %T %E'
lent_node=$(lent)
# kube-scheduler's part: bind the pod to the lent node, and the kubelet's: it runs.
k "${json[@]}" -X POST "$base/api/v1/namespaces/infer/pods/burst/binding" \
  -d "{\"apiVersion\":\"v1\",\"kind\":\"Binding\",\"metadata\":{\"name\":\"burst\"},\"target\":{\"kind\":\"Node\",\"name\":\"$lent_node\"}}" >/dev/null
k "${merge[@]}" -X PATCH "$base/api/v1/namespaces/infer/pods/burst/status" \
  -d '{"status":{"phase":"Running","conditions":[{"type":"PodScheduled","status":"True"}]}}' >/dev/null
echo "# pod burst bound to $lent_node and Running"

echo; echo "\$ sbatch -N 2 --wrap 'sleep 2'   # a Slurm job that needs every node: the bridge reclaims $lent_node"
job=$(sbatch --parsable -o /dev/null -e /dev/null -N 2 --wrap 'sleep 2')
t0=$(date +%s.%N)
job_state() { squeue -h -t all -j "$job" -o %T; }
running() { case "$(job_state)" in RUNNING | COMPLETING | COMPLETED) return 0 ;; *) return 1 ;; esac; }
wait_for 90 "job $job to run" running
printf '# job %s %s %.1f s after submission; pod burst: %s\n' "$job" "$(job_state)" \
  "$(since "$t0")" \
  "$(k "$base/api/v1/namespaces/infer/pods/burst" >/dev/null 2>&1 && echo still there || echo evicted)"
done_() { [ "$(job_state)" = COMPLETED ]; }
wait_for 60 "job $job to complete" done_
echo "# job $job $(job_state) (never killed: $(scontrol -o show job "$job" | grep -o 'Restarts=[0-9]*'))"
"$bin/kgpu" slurm-bridge status --kubeconfig "$work/kubeconfig" | sed 's/^/  /'
