#!/usr/bin/env bash
# kubectl (a real client, v1.32 on these machines) against kgpu-fake-apiserver over HTTPS with a
# bearer token. Where kubectl disagrees with the stand-in, the stand-in is wrong.
# Usage: kubectl_test.sh <dir with kgpu-fake-apiserver>. Exits 77 (skipped) without kubectl.
set -euo pipefail
BIN=$1
if ! command -v kubectl >/dev/null 2>&1; then
  echo "SKIP: kubectl is not installed (the kubectl test needs kubectl 1.32)"
  exit 77
fi
WORK=$(mktemp -d /tmp/kgpu-kubectl-XXXXXX)
PID=""
cleanup() {
  [ -n "$PID" ] && kill "$PID" 2>/dev/null && wait "$PID" 2>/dev/null || true
  rm -rf "$WORK"
}
trap cleanup EXIT
fail() { echo "FAIL: $*" >&2; echo "--- server log" >&2; cat "$WORK/server.log" >&2 || true; exit 1; }

cat > "$WORK/node.yaml" <<'YAML'
apiVersion: v1
kind: Node
metadata:
  name: gpu-node-1
  labels:
    kubernetes.io/hostname: gpu-node-1
    nvidia.com/gpu.product: NVIDIA-H100-80GB-HBM3
status:
  capacity:
    cpu: "64"
    memory: 512Gi
    nvidia.com/gpu: "8"
  conditions:
  - type: Ready
    status: "True"
    reason: KubeletReady
    message: kubelet is posting ready status
  nodeInfo:
    kubeletVersion: v1.32.4
YAML
"$BIN/kgpu-fake-apiserver" --tls --token kubectl-token=admin --preload "$WORK/node.yaml" \
  --kubeconfig-out "$WORK/kubeconfig" --port-file "$WORK/port" >"$WORK/server.log" 2>&1 &
PID=$!
for _ in $(seq 1 300); do [ -s "$WORK/port" ] && break; sleep 0.1; done
[ -s "$WORK/port" ] || fail "the stand-in did not start"
export KUBECONFIG="$WORK/kubeconfig"
export HOME="$WORK"  # kubectl's discovery cache under $WORK/.kube
K() { timeout 60 kubectl --request-timeout=20s "$@"; }
expect() {  # expect <pattern> <command...>
  local pat=$1; shift
  local out
  out=$("$@" 2>&1) || fail "'$*' failed: $out"
  grep -qE -- "$pat" <<<"$out" || fail "'$*' did not print /$pat/: $out"
  echo "ok: $* ~ /$pat/"
}

expect 'v1\.32' K version
expect 'poddisruptionbudgets +pdb +policy/v1' K api-resources
expect 'gpu-node-1 +Ready +<none> .*v1\.32\.4' K get nodes
expect 'nvidia.com/gpu: +8' K describe node gpu-node-1

# apply -f a manifest (client-side apply: create, then a patch on the second apply).
cat > "$WORK/pod.yaml" <<'YAML'
apiVersion: v1
kind: Pod
metadata:
  name: trainer
  labels: {app: trainer}
spec:
  containers:
  - name: main
    image: busybox:1
    resources:
      limits: {nvidia.com/gpu: "1"}
YAML
expect 'pod/trainer created' K apply -f "$WORK/pod.yaml"
sed -i 's/app: trainer/app: trainer, tier: gpu/' "$WORK/pod.yaml"
expect 'pod/trainer configured' K apply -f "$WORK/pod.yaml"
expect 'gpu' K get pod trainer -o 'jsonpath={.metadata.labels.tier}'
expect 'trainer +0/1 +Pending' K get pods
expect 'nvidia.com/gpu: +1' K describe pod trainer

# label, annotate, patch (strategic, merge, json), cordon/uncordon.
expect 'node/gpu-node-1 labeled' K label node gpu-node-1 pool=lent
expect 'lent' K get node gpu-node-1 -o 'jsonpath={.metadata.labels.pool}'
expect 'node/gpu-node-1 annotated' K annotate node gpu-node-1 example.com/lease=op42
expect 'node/gpu-node-1 patched' K patch node gpu-node-1 -p '{"spec":{"taints":[{"key":"gpu.example/owner","value":"slurm","effect":"NoSchedule"}]}}'
expect 'node/gpu-node-1 patched' K patch node gpu-node-1 --type=merge -p '{"metadata":{"labels":{"merged":"yes"}}}'
expect 'node/gpu-node-1 patched' K patch node gpu-node-1 --type=json -p '[{"op":"add","path":"/metadata/labels/jsonpatched","value":"yes"}]'
expect 'gpu.example/owner=slurm:NoSchedule' K describe node gpu-node-1
expect 'node/gpu-node-1 cordoned' K cordon gpu-node-1
expect 'Ready,SchedulingDisabled' K get node gpu-node-1
expect 'node/gpu-node-1 uncordoned' K uncordon gpu-node-1
expect 'gpu-node-1 +Ready +<none>' K get node gpu-node-1

# get pods -w sees a change made while it watches.
( timeout 20 kubectl get pods -w --request-timeout=0 >"$WORK/watch.out" 2>&1 || true ) &
WPID=$!
for _ in $(seq 1 100); do grep -q trainer "$WORK/watch.out" 2>/dev/null && break; sleep 0.1; done
K label pod trainer watched=yes >/dev/null
cat > "$WORK/pod2.yaml" <<'YAML'
apiVersion: v1
kind: Pod
metadata: {name: second}
spec:
  containers: [{name: main, image: busybox:1}]
YAML
K apply -f "$WORK/pod2.yaml" >/dev/null
for _ in $(seq 1 150); do grep -q second "$WORK/watch.out" 2>/dev/null && break; sleep 0.1; done
kill "$WPID" 2>/dev/null || true
wait "$WPID" 2>/dev/null || true
grep -q second "$WORK/watch.out" || fail "get pods -w did not show the new pod: $(cat "$WORK/watch.out")"
echo "ok: get pods -w saw the new pod"

# delete (kubectl waits for the pod to be gone: an unscheduled pod goes at once).
expect 'pod "second" deleted' K delete pod second
if K get pod second >/dev/null 2>&1; then fail "pod second still exists"; fi
expect 'NotFound|not found' bash -c "timeout 60 kubectl get pod second 2>&1 || true"

# create quota (kubectl sends protobuf), and a pod refused by quota with the apiserver's message.
expect 'namespace/team-a created' K create namespace team-a
expect 'resourcequota/gpu-quota created' K create quota gpu-quota -n team-a --hard=requests.nvidia.com/gpu=1,pods=5
expect 'requests.nvidia.com/gpu +0 +1' K describe quota gpu-quota -n team-a
sed -e 's/name: trainer/name: first/' "$WORK/pod.yaml" > "$WORK/first.yaml"
expect 'pod/first created' K apply -n team-a -f "$WORK/first.yaml"
expect 'requests.nvidia.com/gpu +1 +1' K describe quota gpu-quota -n team-a
sed -e 's/name: trainer/name: refused/' "$WORK/pod.yaml" > "$WORK/refused.yaml"
out=$(K apply -n team-a -f "$WORK/refused.yaml" 2>&1) && fail "a pod over quota was admitted: $out"
grep -q 'pods "refused" is forbidden: exceeded quota: gpu-quota, requested: requests.nvidia.com/gpu=1, used: requests.nvidia.com/gpu=1, limited: requests.nvidia.com/gpu=1' <<<"$out" \
  || fail "quota refusal message: $out"
echo "ok: quota refusal: $out"
expect 'configmap/cm created' K create configmap cm -n team-a --from-literal=a=b
expect '^b$' K get configmap cm -n team-a -o 'jsonpath={.data.a}'
expect 'poddisruptionbudget.policy/pdb created' K create pdb pdb -n team-a --selector=app=trainer --min-available=1
# The protobuf bodies were decoded field by field: the selector and minAvailable arrived.
expect '^trainer 1$' K get pdb pdb -n team-a -o 'jsonpath={.spec.selector.matchLabels.app} {.spec.minAvailable}'
expect '^1 5$' K get quota gpu-quota -n team-a -o 'jsonpath={.spec.hard.requests\.nvidia\.com/gpu} {.spec.hard.pods}'
expect 'pdb +1 +N/A' K get pdb -n team-a
# The disruption controller's status: the pending pod "first" is expected, not healthy.
expect '^1 0 1 0$' K get pdb pdb -n team-a -o 'jsonpath={.status.expectedPods} {.status.currentHealthy} {.status.desiredHealthy} {.status.disruptionsAllowed}'

# Issue 32: kubectl against what kube-apiserver does on the paths it uses.
# Watches with structured output while writes happen (kubectl sends Accept-Encoding: gzip; a watch
# is never compressed, so each event arrives when it happens).
for fmt in json name; do
  ( timeout 20 kubectl get pods -w -o "$fmt" --request-timeout=0 >"$WORK/watch-$fmt.out" 2>&1 || true ) &
  WPID=$!
  sleep 1
  for i in 1 2 3; do K label pod trainer --overwrite "round-$fmt=$i" >/dev/null; done
  for _ in $(seq 1 100); do
    if [ "$fmt" = json ]; then grep -q "\"round-json\": \"3\"" "$WORK/watch-$fmt.out" 2>/dev/null && break
    else [ "$(grep -c '^pod/trainer$' "$WORK/watch-$fmt.out" 2>/dev/null)" -ge 4 ] && break; fi
    sleep 0.1
  done
  kill "$WPID" 2>/dev/null || true
  wait "$WPID" 2>/dev/null || true
  if [ "$fmt" = json ]; then
    grep -q '"round-json": "3"' "$WORK/watch-$fmt.out" || fail "get pods -w -o json missed the writes: $(head -c 600 "$WORK/watch-$fmt.out")"
  else
    [ "$(grep -c '^pod/trainer$' "$WORK/watch-$fmt.out")" -ge 4 ] || fail "get pods -w -o name missed the writes: $(cat "$WORK/watch-$fmt.out")"
  fi
  echo "ok: get pods -w -o $fmt saw every write"
done

# 422 with its causes: kubectl prints the field and the reason.
out=$(K patch pod trainer -p '{"spec":{"containers":[{"name":"main","env":[{"name":"K","value":"1"}]}]}}' 2>&1) \
  && fail "a pod spec change was accepted: $out"
grep -q 'The Pod "trainer" is invalid: spec: Forbidden: pod updates may not change fields other than `spec.containers\[\*\].image`' <<<"$out" \
  || fail "422 message: $out"
echo "ok: 422 names its cause"

# Field selectors: an unknown label is a 400; the selectable values match kube-apiserver's.
out=$(K get pods --field-selector spec.bogus=x 2>&1) && fail "an unknown field selector was accepted: $out"
grep -q 'Error from server (BadRequest): .*field label not supported: spec.bogus' <<<"$out" || fail "field selector error: $out"
echo "ok: unknown field selector refused: $out"
expect '^trainer$' K get pods --field-selector spec.hostNetwork=false -o 'jsonpath={.items[*].metadata.name}'

# Events and pods as kubectl's tables (server-side columns).
cat > "$WORK/event.yaml" <<'YAML'
apiVersion: v1
kind: Event
metadata: {name: gpu-node-1.xid}
involvedObject: {kind: Node, name: gpu-node-1}
reason: XidError
message: "GPU 2: XID 79 (fallen off the bus)"
type: Warning
source: {component: kgpu-device-plugin, host: gpu-node-1}
count: 2
YAML
K create -f "$WORK/event.yaml" >/dev/null
expect 'LAST SEEN +TYPE +REASON +OBJECT +MESSAGE' K get events
expect 'Warning +XidError +node/gpu-node-1 +GPU 2: XID 79' K get events
expect 'NOMINATED NODE +READINESS GATES' K get pods -o wide

# Discovery lists the Binding resource.
expect '^bindings +v1 +true +Binding' K api-resources

# A `kind: List` applies (kubectl validates it on the client through /openapi/v2).
expect 'node/gpu-node-1 (configured|unchanged)' bash -c "timeout 60 kubectl get nodes -o json | timeout 60 kubectl apply -f -"

# What kube-apiserver adds and clients read back: pod defaults and admission, managedFields, the
# not-ready taint of a new node, the node's Lease in kube-node-lease for describe.
expect '^Always ClusterFirst default-scheduler 30 true 0 BestEffort IfNotPresent /dev/termination-log File$' \
  K get pod trainer -o 'jsonpath={.spec.restartPolicy} {.spec.dnsPolicy} {.spec.schedulerName} {.spec.terminationGracePeriodSeconds} {.spec.enableServiceLinks} {.spec.priority} {.status.qosClass} {.spec.containers[0].imagePullPolicy} {.spec.containers[0].terminationMessagePath} {.spec.containers[0].terminationMessagePolicy}'
expect 'node.kubernetes.io/not-ready .*node.kubernetes.io/unreachable' K get pod trainer -o 'jsonpath={.spec.tolerations[*].key}'
expect '"manager": "kubectl-client-side-apply"' K get pod trainer -o json --show-managed-fields
expect '"manager": "kubectl-label"' K get pod trainer -o json --show-managed-fields
cat > "$WORK/node2.yaml" <<'YAML'
apiVersion: v1
kind: Node
metadata: {name: gpu-node-2}
YAML
K create -f "$WORK/node2.yaml" >/dev/null
expect 'Taints: +node.kubernetes.io/not-ready:NoSchedule' K describe node gpu-node-2
expect 'node/gpu-node-2 patched' K patch node gpu-node-2 --subresource=status --type=merge \
  -p '{"status":{"conditions":[{"type":"Ready","status":"True","reason":"KubeletReady"}]}}'
expect 'Taints: +<none>' K describe node gpu-node-2
cat > "$WORK/lease.yaml" <<'YAML'
apiVersion: coordination.k8s.io/v1
kind: Lease
metadata: {name: gpu-node-1, namespace: kube-node-lease}
spec: {holderIdentity: gpu-node-1, leaseDurationSeconds: 40, renewTime: "2026-12-07T01:00:00.000000Z"}
YAML
K create -f "$WORK/lease.yaml" >/dev/null
expect 'HolderIdentity: +gpu-node-1' K describe node gpu-node-1
# LimitRanger's note of what it set.
expect 'limitrange/defaults created' K create -n team-a -f - <<'YAML'
apiVersion: v1
kind: LimitRange
metadata: {name: defaults}
spec:
  limits:
  - type: Container
    default: {cpu: 500m, memory: 256Mi}
    defaultRequest: {cpu: 100m}
YAML
cat > "$WORK/lr-pod.yaml" <<'YAML'
apiVersion: v1
kind: Pod
metadata: {name: limited}
spec:
  containers: [{name: main, image: busybox:1}]
YAML
K apply -n team-a -f "$WORK/lr-pod.yaml" >/dev/null
# (SetDefaults_LimitRangeItem: defaultRequest.memory comes from default.memory)
expect 'LimitRanger plugin set: cpu, memory request for container main; cpu, memory limit for container main' \
  K get pod limited -n team-a -o 'jsonpath={.metadata.annotations.kubernetes\.io/limit-ranger}'

# A wrong token: 401.
sed -i 's/token: kubectl-token/token: wrong/' "$KUBECONFIG"
out=$(timeout 60 kubectl get nodes 2>&1) && fail "a wrong token was accepted"
grep -qE 'Unauthorized|provide credentials' <<<"$out" || fail "401 wording: $out"
echo "ok: wrong token refused: $out"
echo "PASS"
