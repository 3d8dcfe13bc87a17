#!/usr/bin/env bash
# Fences GPU nodes for Slurm in Kubernetes (the separated pools of docs/slurm.md): the same fence
# `kgpu slurm-bridge` applies and adopts (src/slurm/bridge.cc, ApplyK8sFence):
#   label      kgpu.io/pool=slurm
#   taint      kgpu.io/owner=slurm:NoSchedule
#   cordon     spec.unschedulable=true
#   annotation cluster-autoscaler.kubernetes.io/scale-down-disabled=true, karpenter.sh/do-not-disrupt=true
# Running pods are not evicted (NoSchedule, not NoExecute): drain them yourself first if the node
# already ran Kubernetes work (kubectl drain NODE --ignore-daemonsets).
#
#   fence-slurm-nodes.sh NODE...      (kubectl's current context; set KUBECONFIG to choose another)
set -euo pipefail
if [ "$#" -eq 0 ]; then
  echo "usage: fence-slurm-nodes.sh NODE... (Kubernetes node names, equal to the Slurm NodeNames)" >&2
  exit 2
fi
for node in "$@"; do
  kubectl label node "$node" --overwrite kgpu.io/pool=slurm
  kubectl taint node "$node" --overwrite kgpu.io/owner=slurm:NoSchedule
  kubectl cordon "$node"
  kubectl annotate node "$node" --overwrite \
    cluster-autoscaler.kubernetes.io/scale-down-disabled=true karpenter.sh/do-not-disrupt=true
done
