#!/usr/bin/env bash
# kgpu on a simulated GPU node: what the node has, the node checklist, and a fault injected into
# the simulated driver being seen by the health monitor. Ends by itself in well under a minute.
# Usage: scripts/demo.sh <build dir>
set -euo pipefail
build=${1:-build/dev}
bin=$build/bin
export LD_LIBRARY_PATH=$build/simnvml/lib   # the simulated libnvidia-ml.so.1, found by soname
work=$(mktemp -d /tmp/kgpu-demo-XXXXXX)
export KGPU_SIM_STATE=$work/node.state KGPU_SIM_NODE_NAME=demo-node
watcher=""
cleanup() { [ -n "$watcher" ] && kill "$watcher" 2>/dev/null; wait 2>/dev/null || true; rm -rf "$work"; }
trap cleanup EXIT

step() { printf '\n\033[1m== %s\033[0m\n' "$*"; }
wait_for() { for _ in $(seq 100); do grep -q -- "$2" "$1" && return 0; sleep 0.1; done; echo "(timed out waiting for: $2)"; return 1; }
# wait_count FILE PATTERN N: until PATTERN has matched N lines (up to 10 s)
wait_count() { for _ in $(seq 100); do [ "$(grep -c -- "$2" "$1")" -ge "$3" ] && return 0; sleep 0.1; done; echo "(timed out waiting for: $2)"; return 1; }

step "Simulated node profiles (KGPU_SIM_NODE selects one; a YAML file works too)"
"$bin/kgpu-simctl" profiles

export KGPU_SIM_NODE=dgx-h100
"$bin/kgpu-simctl" reset
"$bin/kgpu-simctl" sysfs "$work/sys"     # NUMA nodes of the simulated PCI devices
step "kgpu devices on an 8x H100 SXM node (NVLink through NVSwitches, two NUMA nodes)"
"$bin/kgpu" --sysfs-root "$work/sys" devices

step "kgpu doctor: the node checklist (a simulated node has no /dev/nvidia* device nodes)"
"$bin/kgpu" --sysfs-root "$work/sys" doctor || echo "(exit code $?: FAIL items above)"

step "kgpu health: watching NVML events, probes and hung calls; faults come from kgpu-simctl"
"$bin/kgpu" --log-level warn health --duration 40 --probe-interval 200ms --recover-after 0s >"$work/health.log" 2>&1 &
watcher=$!
wait_for "$work/health.log" "watching"
head -3 "$work/health.log"; echo "  ... (8 GPUs, all Healthy)"
# The UUIDs, read before any fault (a hung GPU would block this query too).
read -r u1 u3 u5 < <("$bin/kgpu" devices --json | python3 -c "import json,sys; g=json.load(sys.stdin)['gpus']; print(g[1]['uuid'], g[3]['uuid'], g[5]['uuid'])")

echo; echo "\$ kgpu-simctl xid 3 43      # XID 43: an application fault, not the GPU's"
"$bin/kgpu-simctl" xid 3 43
echo "\$ kgpu-simctl xid 3 48      # XID 48: double-bit ECC error, the GPU is unhealthy"
"$bin/kgpu-simctl" xid 3 48
wait_for "$work/health.log" "change: $u3 Unhealthy: XID 48" && grep "change:" "$work/health.log"

echo; echo "\$ kgpu-simctl lose 5        # GPU 5 falls off the bus (XID 79, then GPU_IS_LOST)"
"$bin/kgpu-simctl" lose 5
wait_for "$work/health.log" "change: $u5 Unhealthy: GPU is lost" && grep "change:" "$work/health.log" | tail -1
"$bin/kgpu" devices 2>/dev/null | grep -E "^(IDX|5 )"
echo "\$ kgpu-simctl restore 5"
"$bin/kgpu-simctl" restore 5
wait_for "$work/health.log" "change: $u5 Healthy" && grep "change:" "$work/health.log" | tail -1

echo; echo "\$ kgpu-simctl hang 1 2500   # every NVML call on GPU 1 blocks for 2.5 s"
"$bin/kgpu-simctl" hang 1 2500
wait_for "$work/health.log" "change: $u1 Unhealthy: NVML call" && grep "change:" "$work/health.log" | tail -1
wait_for "$work/health.log" "change: $u1 Healthy" && grep "change:" "$work/health.log" | tail -1
kill "$watcher" 2>/dev/null; wait "$watcher" 2>/dev/null || true; watcher=""

step "kgpu node on the 8x H100 node: the device plugin (time-slicing, 4 replicas per GPU) and the exporter in one process, against a kubelet stand-in"
kdir=$work/kubelet; mkdir -p "$kdir"
cat >"$work/plugin.yaml" <<'YAML'
version: v1                      # NVIDIA's config schema, unchanged
flags:
  plugin:
    passDeviceSpecs: true
    deviceListStrategy: volume-mounts
sharing:
  timeSlicing:
    resources:
    - name: nvidia.com/gpu
      replicas: 4
health:                          # kgpu: XID policy and recovery (NVIDIA never recovers)
  recoverAfter: 3s
  probeInterval: 200ms
YAML
sed 's/^/    /' "$work/plugin.yaml"
"$bin/kgpu-simctl" reset
"$bin/kgpu-fake-kubelet" serve --dir "$kdir" --duration 40 >"$work/kubelet.log" 2>&1 &
kubelet=$!
mport=$(python3 -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1", 0)); print(s.getsockname()[1])')
"$bin/kgpu" --log-level warn node --kubelet-dir "$kdir" --config-file "$work/plugin.yaml" -a "127.0.0.1:$mport" -c 200 \
  >"$work/plugin.log" 2>&1 &
plugin=$!
# GPU 3's health as the exporter serves it, from the same monitor kubelet is served from.
gpu3_up() { curl -sf "http://127.0.0.1:$mport/metrics" | grep -E '^kgpu_gpu_(up|unhealthy_reason)\{gpu="3"' |
  sed 's/,UUID=[^}]*Hostname="[^"]*"//; s/,DCGM_FI_DRIVER_VERSION="[^"]*"//; s/^/  /'; }
wait_for "$work/kubelet.log" "ListAndWatch nvidia.com/gpu: 32 devices, 32 healthy" && cat "$work/kubelet.log"
echo; echo "\$ ls $kdir"; ls "$kdir"
echo; echo "One allocation, as kubelet asks for it (GetPreferredAllocation, then Allocate):"
"$bin/kgpu-fake-kubelet" allocate --dir "$kdir" --endpoint nvidia-gpu.sock --count 2 | sed 's/^/  /'
echo; echo "\$ kgpu-simctl xid 3 48      # every replica of GPU 3 turns Unhealthy in one update"
"$bin/kgpu-simctl" xid 3 48
wait_for "$work/kubelet.log" "28 healthy" && grep "28 healthy" "$work/kubelet.log" | head -1
until_up3() { for _ in $(seq 50); do gpu3_up | grep -q "^  kgpu_gpu_up.* $1\$" && return 0; sleep 0.1; done; }
until_up3 0 || true
echo "\$ curl :$mport/metrics | grep 'gpu=\"3\"'   # the exporter agrees with kubelet: up 0, reason xid"
gpu3_up || true
echo "(recovery after 3 s without a new fault, checked by a probe)"
wait_count "$work/kubelet.log" "32 healthy" 2 && tail -1 "$work/kubelet.log"
until_up3 1 || true
gpu3_up || true
kill -TERM "$plugin"; wait "$plugin" 2>/dev/null || true
echo "\$ kill -TERM <plugin>; ls $kdir   # nvidia-gpu.sock is gone, kubelet's own socket stays"
ls "$kdir" | sed 's/^/  /'
kill -TERM "$kubelet" 2>/dev/null; wait "$kubelet" 2>/dev/null || true

step "kgpu exporter in place of dcgm-exporter: the GPU Operator's counters file and environment unchanged, basic auth, tensor activity from GPM, XIDs counted in a window"
"$(dirname "$0")/demo-exporter-dropin.sh" "$build"

export KGPU_SIM_NODE=dgx-a100-mig
step "An 8x A100 node with MIG on GPUs 0 and 1; an XID on one MIG instance"
"$bin/kgpu-simctl" reset
"$bin/kgpu" devices | sed -n '4,17p'
"$bin/kgpu" --log-level warn health --duration 20 --probe-interval 200ms >"$work/mig.log" 2>&1 &
watcher=$!
wait_for "$work/mig.log" "watching"
echo "\$ kgpu-simctl xid 0 94 --gi 3 --ci 0   # contained ECC error on MIG instance GI 3"
"$bin/kgpu-simctl" xid 0 94 --gi 3 --ci 0
wait_for "$work/mig.log" "Unhealthy: XID 94" && grep "change:" "$work/mig.log"
echo "(only that MIG device changed; GPU 0 and its other instances stay Healthy)"
kill "$watcher" 2>/dev/null; wait "$watcher" 2>/dev/null || true; watcher=""

step "MIG re-partitioning: kgpu mig apply, and the running plugin follows (no restart, no stale resources)"
"$bin/kgpu-simctl" reset
cat >"$work/mig.yaml" <<'YAML'
version: v1
flags:
  migStrategy: mixed             # one resource per MIG profile
mig:                             # kgpu: declared layouts (mig-parted's schema), per node
  rescanInterval: 200ms
  layouts:
    two-halves:
      - devices: [0]
        mig-devices: {"3g.20gb": 2}
  nodes:
    "*": two-halves
YAML
sed 's/^/    /' "$work/mig.yaml"
: >"$work/kubelet.log"
"$bin/kgpu-fake-kubelet" serve --dir "$kdir" --duration 20 >"$work/kubelet.log" 2>&1 &
kubelet=$!
"$bin/kgpu" --log-level warn device-plugin --kubelet-dir "$kdir" --config-file "$work/mig.yaml" >"$work/plugin.log" 2>&1 &
plugin=$!
wait_count "$work/kubelet.log" "ListAndWatch nvidia.com/mig" 3 && grep "ListAndWatch" "$work/kubelet.log"
echo; echo "\$ kgpu mig apply --config-file mig.yaml --kubelet-dir <dir> --no-kubelet-check   # (no kubelet PodResources here)"
"$bin/kgpu" mig apply --config-file "$work/mig.yaml" --kubelet-dir "$kdir" --no-kubelet-check | sed 's/^/  /'
wait_for "$work/kubelet.log" "nvidia.com/mig-2g.10gb: 0 devices" && grep "ListAndWatch" "$work/kubelet.log" | tail -n 4
echo "(GPU 0 is now two 3g.20gb instances; nvidia.com/mig-2g.10gb stays registered with 0 devices, so"
echo " the node's capacity for it drops to 0 instead of lingering; a busy GPU would have been refused)"
kill -TERM "$plugin"; wait "$plugin" 2>/dev/null || true
kill -TERM "$kubelet" 2>/dev/null; wait "$kubelet" 2>/dev/null || true
step "The node as the Kubernetes API sees it: API server stand-in, kubelet stand-in, and the plugin labelling its own Node"
export KGPU_SIM_NODE=dgx-h100
"$bin/kgpu-simctl" reset
rm -rf "$kdir"; mkdir -p "$kdir"
"$bin/kgpu-fake-apiserver" --tls --token demo-token --kubeconfig-out "$work/kubeconfig" --port-file "$work/api.port" \
  >"$work/api.log" 2>&1 &
api=$!
for _ in $(seq 100); do [ -s "$work/api.port" ] && break; sleep 0.1; done
echo "\$ kgpu-fake-apiserver --tls --token demo-token --kubeconfig-out kubeconfig   # $(cat "$work/api.log")"
: >"$work/kubelet.log"
"$bin/kgpu-fake-kubelet" serve --dir "$kdir" --duration 30 --kubeconfig "$work/kubeconfig" --node-name demo-node \
  >"$work/kubelet.log" 2>&1 &
kubelet=$!
echo "\$ kgpu device-plugin --publish-labels --kubeconfig kubeconfig --node-name demo-node   # serves kubelet and labels its Node"
"$bin/kgpu" --log-level warn device-plugin --kubelet-dir "$kdir" --publish-labels --kubeconfig "$work/kubeconfig" \
  --node-name demo-node >"$work/plugin.log" 2>&1 &
plugin=$!
wait_for "$work/kubelet.log" "ListAndWatch nvidia.com/gpu: 8 devices, 8 healthy" >/dev/null
# The plugin's first label pass: GFD labels and the kgpu.io/gpu-inventory annotation on the Node.
for _ in $(seq 100); do
  curl -sfk -H "Authorization: Bearer demo-token" "https://127.0.0.1:$(cat "$work/api.port")/api/v1/nodes/demo-node" \
    | grep -q '"nvidia.com/gpu.count"' && break
  sleep 0.1
done
sleep 0.5   # the kubelet stand-in patches the Node's status within 200 ms
if command -v kubectl >/dev/null 2>&1; then
  echo; echo "\$ kubectl describe node demo-node"
  HOME=$work timeout 60 kubectl --kubeconfig "$work/kubeconfig" describe node demo-node \
    | sed -n '/^Labels:/,/^Taints:/p;/^Lease:/,/^  RenewTime:/p;/^Capacity:/,/^System Info:/p' \
    | grep -v '^System Info:' | cut -c1-150 | sed 's/^/  /; s/\(.\{150\}\)$/\1 .../'
else
  echo "(kubectl is not installed: the Node as kgpu doctor reads it)"
fi
echo; echo "\$ kgpu doctor --kubeconfig kubeconfig --node-name demo-node   # the cluster checks"
echo "  (only the cluster checks are shown; the verdict line still counts the node checks' FAIL for the"
echo "   missing /dev/nvidia* device nodes, which a simulated node has not got, as in the first step)"
"$bin/kgpu" doctor --kubelet-dir "$kdir" --kubeconfig "$work/kubeconfig" --node-name demo-node \
  | sed -n '/Node object/,$p' | sed 's/^/  /' || true
kill -TERM "$plugin"; wait "$plugin" 2>/dev/null || true
echo; echo "\$ kill -TERM <plugin>   # kubelet keeps capacity 8 and sets allocatable 0: no pod can get a GPU here"
for _ in $(seq 100); do
  curl -sfk -H "Authorization: Bearer demo-token" "https://127.0.0.1:$(cat "$work/api.port")/api/v1/nodes/demo-node" \
    | grep -q '"allocatable":{[^}]*"nvidia.com/gpu":"0"' && break
  sleep 0.1
done
echo "\$ kgpu doctor --kubeconfig kubeconfig --node-name demo-node   # now a FAIL, with the fix"
"$bin/kgpu" doctor --kubelet-dir "$kdir" --kubeconfig "$work/kubeconfig" --node-name demo-node \
  | grep -A1 'Node allocatable' | sed 's/^/  /' || true
kill -TERM "$kubelet" 2>/dev/null; wait "$kubelet" 2>/dev/null || true
kill -TERM "$api" 2>/dev/null; wait "$api" 2>/dev/null || true

step "The simulated driver procfs of a MIG node: capability minors for the MIG device nodes"
"$(dirname "$0")/demo-node-small.sh" "$build"
step "A small cluster: API stand-in, three node agents, kgpu extender and a kube-scheduler stand-in schedule whole, MIG and shared GPUs under a namespace quota"
echo "What you see: two extender replicas (leader election) serving HTTPS to kube-scheduler's client certificate only"
echo "(a bind from anyone else: 403),"
echo "each pod as the scheduler stand-in placed it through kgpu extender (filter, prioritize, bind),"
echo "the quota refusing team-a's third share, a share no GPU can hold left pending with the extender's reason"
echo "(one line per cause, as kube-scheduler counts them) and its Event naming the nearest node's figures,"
echo "and per pod its allocation record next to what kubelet's Allocate gave the container (for shares the"
echo "node turns the record into the container's GPUs and limits; for whole and MIG devices the plugin steers"
echo "kubelet to the record's choice and, where kubelet picks otherwise, rewrites the record: the two columns agree)."
echo "team-b/server has three GPU containers: one row each for the server and its sidecar, each with a share of its"
echo "own; its warm-up init container has no row: it runs on the server's share, which kubelet hands on to the server."
echo "The sharing node runs its plugin with --cuda-interposer, so shares there get hard memory limits: the"
echo "container preloads libkgpu-cuda.so, which holds it to KGPU_CUDA_MEMORY_LIMIT (docs/isolation.md)."
echo "Last, preemption for GPU memory: kube-scheduler does not count it, so its own preemption finds no victim;"
echo "the extender evicts the lower-priority share itself (Eviction API), holds the GPU, and the pod binds there."
echo "Then the leading replica is killed: the standby filters at once from its own informers, and binds (only ever the"
echo "leader's; a standby passes them on) resume once it holds the Lease, about the lease duration later."
echo "\$ kgpu-demo-cluster"
"$bin/kgpu-demo-cluster" | sed 's/^/  /'
step "GPUs through DRA (Kubernetes 1.34+): kgpu dra on an H100 node (two GPUs offered as shares) and an A100 MIG node (--dynamic-mig)"
echo "What you see: the ResourceSlices kgpu dra publishes (NVIDIA's driver, class and attribute names), claims allocated by"
echo "kube-scheduler's allocator (stood in) and prepared by kubelet (stood in) through kgpu dra: a whole H100, a 1g.10gb MIG"
echo "instance carved when its pod starts and destroyed when it goes, two shares of one H100 (20Gi/30% and 40Gi/60%) each"
echo "held to its consumed capacity by the CUDA interposer (the CDI spec's limits), a third share that no longer fits there,"
echo "then an XID that taints the GPU's device (the next claim avoids it) and reaches the pod's status through kubelet."
"$bin/kgpu-demo-dra" | sed 's/^/  /'
step "Isolation on a share's GPU: a memory limit every process of the container is held to, and compute shares of 30 % and 70 %"
"$(dirname "$0")/demo-isolation.sh" "$build"
step "GPU quota: a pod over quota refused by the apiserver, shares charged exactly, kgpu quota and kgpu quota plan"
"$(dirname "$0")/demo-quota.sh" "$build"

step "Kubernetes <-> Slurm: an idle Slurm node lent to a GPU pod, then reclaimed for a job (none killed)"
"$(dirname "$0")/demo-slurm.sh" "$build"
step "A failing GPU never goes silent: a lost GPU keeps kgpu_gpu_up 0 and its XID 79; a hung GPU is a doctor FAIL in 2 s"; "$(dirname "$0")/demo-node-silent.sh" "$build"
step "Admission: kgpu webhook turns a HAMi pod into kgpu shares and refuses a share no GPU can hold"
"$(dirname "$0")/demo-webhook.sh" "$build"
step "kgpu sim: the Alibaba GPU trace replayed with bestfit, FGD and ours; the table and the allocation curve of each policy (SVG)"
"$(dirname "$0")/demo-sim.sh" "$build"
step "done"
