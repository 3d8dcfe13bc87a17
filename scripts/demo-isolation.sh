#!/usr/bin/env bash
# Isolation in the demo: libkgpu-cuda.so preloaded into two "containers" on one simulated GPU.
# Memory: a container's second process, started without the limit variable, is held to the limit
# the container's region records. Compute: shares of 30 % and 70 % paced from NVML's per-process
# utilisation (docs/isolation.md).
#   scripts/demo-isolation.sh <build dir>
set -euo pipefail
build=${1:?usage: demo-isolation.sh <build dir>}
iso=$build/isolation
lib=$(cd "$iso/lib" && pwd)/libkgpu-cuda.so
work=$(mktemp -d /tmp/kgpu-isolation-demo-XXXXXX)
trap 'kill $(jobs -p) 2>/dev/null || true; wait 2>/dev/null || true; rm -rf "$work"' EXIT
export KGPU_SIM_NODE=dgx-h100 KGPU_SIM_NODE_NAME=isolation-demo KGPU_SIM_STATE=$work/node.state
export LD_LIBRARY_PATH=$build/simcuda/nvml${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}
unset KGPU_CUDA_MEMORY_LIMIT KGPU_CUDA_CORE_LIMIT KGPU_CUDA_SHARED_DIR LD_PRELOAD
gpu=$("$iso/kgpu_iso_driver" direct init 0 uuid | grep '^GPU-')

echo "What you see: a container limited to 512 MiB of $gpu; its first process holds 300 MiB, and a second one,"
echo "started WITHOUT KGPU_CUDA_MEMORY_LIMIT, is still refused 300 MiB and granted 200 (the region's limit binds it)."
KGPU_CUDA_SHARED_DIR=$work/c1 KGPU_CUDA_MEMORY_LIMIT=$gpu=512Mi LD_PRELOAD=$lib \
  "$iso/kgpu_iso_driver" direct init alloc 300 ok touch "$work/held" pause >/dev/null 2>&1 &
holder=$!
for _ in $(seq 300); do [ -e "$work/held" ] && break; sleep 0.01; done
echo "\$ env -u KGPU_CUDA_MEMORY_LIMIT LD_PRELOAD=libkgpu-cuda.so <second process>"
KGPU_CUDA_SHARED_DIR=$work/c1 LD_PRELOAD=$lib "$iso/kgpu_iso_driver" direct init alloc 300 oom alloc 200 ok info 512 12 |
  grep -E 'alloc|free' | sed 's/^ok: */  /'
kill "$holder"; wait "$holder" 2>/dev/null || true

echo
echo "Compute shares: two containers on one GPU, KGPU_CUDA_CORE_LIMIT 30 % and 70 %, each launching kernels as fast"
echo "as it can for 4 s. What you see: the part of the GPU each one's kernels took (asked 30 and 70)."
for share in 30 70; do
  KGPU_CUDA_SHARED_DIR=$work/s$share KGPU_CUDA_CORE_LIMIT=$gpu=$share LD_PRELOAD=$lib \
    "$iso/kgpu_compute_driver" run 4 1.5 8 0 >"$work/share$share" 2>/dev/null &
done
wait
for share in 30 70; do
  echo "  container with a $share % share: $(sed -n 's/.*share=\([0-9.]*\).*/\1/p' "$work/share$share") % of the GPU"
done
