#!/bin/bash
# Time-slicing with memoryIsolation hard, end to end on the simulated node: `kgpu device-plugin`
# serves 4 replicas per GPU, the kubelet stand-in allocates one replica for each of two
# containers, and each container (iso_driver run with exactly the environment and, in place of
# the bind mounts, the host paths the plugin's Allocate response gives) is held to a quarter of
# the GPU's memory, each in its own accounting region, both on the same GPU.
#   timeslicing_hard_test.sh KGPU FAKE_KUBELET ISO_DRIVER INTERPOSER_LIB SIMNVML_DIR PLAIN_NVML_DIR
# SIMNVML_DIR: the simulated libnvidia-ml.so.1 that kgpu loads; PLAIN_NVML_DIR: the unsanitised one
# the interposer (inside the "container") loads. Prints PASS or FAIL per case.
set -u
KGPU=$1 KUBELET=$2 DRIVER=$3 LIB=$4 SIMNVML=$5 PLAIN_NVML=$6
. "$(dirname "$0")/sim_env.sh" ts-hard

mkdir -p "$WORK/kubelet" "$WORK/cuda"
cat >"$WORK/config.yaml" <<'YAML'
version: v1
sharing:
  timeSlicing:
    memoryIsolation: hard
    resources:
      - name: nvidia.com/gpu
        replicas: 4
YAML
LD_LIBRARY_PATH=$SIMNVML "$KGPU" device-plugin --config-file "$WORK/config.yaml" --kubelet-dir "$WORK/kubelet" \
  --kubelet-socket - --cuda-interposer "$LIB" --cuda-shared-root "$WORK/cuda" >"$WORK/plugin.log" 2>&1 &
for _ in $(seq 200); do [ -S "$WORK/kubelet/nvidia-gpu.sock" ] && break; sleep 0.05; done
[ -S "$WORK/kubelet/nvidia-gpu.sock" ] || { cat "$WORK/plugin.log"; echo "FAIL: the plugin did not serve"; exit 1; }

# allocate N ID: one replica (ID) for container N; its response in $WORK/resp.N
allocate() {
  "$KUBELET" allocate --dir "$WORK/kubelet" --endpoint nvidia-gpu.sock --count 1 --available "$2" >"$WORK/resp.$1" 2>&1
}
env_of() { sed -n "s/^    $2=//p" "$WORK/resp.$1"; }
mount_of() { sed -n "s|^    \(.*\) -> $2 (r[ow])$|\1|p" "$WORK/resp.$1"; }
# run N STEPS...: iso_driver as container N sees it: its environment, the mounts' host paths
run() {
  local n=$1
  shift
  env LD_LIBRARY_PATH="$PLAIN_NVML" CUDA_VISIBLE_DEVICES="$(env_of "$n" NVIDIA_VISIBLE_DEVICES)" \
    KGPU_CUDA_MEMORY_LIMIT="$(env_of "$n" KGPU_CUDA_MEMORY_LIMIT)" \
    KGPU_CUDA_SHARED_DIR="$(mount_of "$n" "$(env_of "$n" KGPU_CUDA_SHARED_DIR)")" \
    LD_PRELOAD="$(mount_of "$n" "$(env_of "$n" LD_PRELOAD)")" timeout 30 "$DRIVER" direct "$@"
}

U0=$(env -u LD_PRELOAD "$DRIVER" direct init 0 uuid | grep '^GPU-')
TOTAL=81559                # the simulated H100's memory, MiB
QUARTER=$((TOTAL / 4))     # 20389
allocate 1 "$U0::0" && allocate 2 "$U0::1" || { cat "$WORK"/resp.*; fail "Allocate"; exit 1; }
if [ "$(env_of 1 KGPU_CUDA_MEMORY_LIMIT)" = "$U0=${QUARTER}Mi" ] && [ "$(env_of 1 LD_PRELOAD)" = /usr/lib/kgpu/libkgpu-cuda.so ] &&
   [ "$(mount_of 1 /usr/lib/kgpu/libkgpu-cuda.so)" = "$LIB" ] && [ -d "$(mount_of 1 /run/kgpu-cuda)" ] &&
   [ "$(mount_of 1 /run/kgpu-cuda)" != "$(mount_of 2 /run/kgpu-cuda)" ]; then
  pass "Allocate: a quarter of the GPU, the interposer, an accounting directory per container"
else
  fail "Allocate response"; cat "$WORK/resp.1" "$WORK/resp.2"
fi
# Container 1 holds most of its quarter while container 2 allocates its own on the same GPU.
touch "$WORK/go"
run 1 init info $QUARTER $QUARTER alloc 20000 ok alloc 400 oom touch "$WORK/held1" waitfile "$WORK/done2" >"$WORK/c1.log" 2>&1 &
C1=$!
for _ in $(seq 300); do [ -e "$WORK/held1" ] && break; sleep 0.05; done
if run 2 init info $QUARTER $QUARTER alloc 20000 ok alloc 400 oom free alloc 389 ok >"$WORK/c2.log" 2>&1; then
  pass "container 2: its own quarter ($QUARTER MiB) while container 1 holds 20000 MiB of its own"
else
  fail "container 2"; cat "$WORK/c2.log"
fi
touch "$WORK/done2"
if wait $C1; then pass "container 1: held to its quarter"; else fail "container 1"; cat "$WORK/c1.log"; fi
exit $failed
