#!/bin/bash
# Run by isolation_test.sh inside a private mount namespace (unshare -Urm): builds what the device
# plugin's CDI edits give a share container -- the accounting directory (limits in `config`)
# mounted read-only at /run/kgpu-cuda with the region file mounted read-write over its own path,
# and for --cuda-interposer-load ld.so.preload a file naming the library at /etc/ld.so.preload --
# then checks that no process of the "container" leaves its accounting: not by rewriting its
# environment, not with a clean one, not by deleting the region or rewriting the limits.
#   fixed_config_ns.sh ISO_DRIVER INTERPOSER_LIB HOST_DIR GPU_UUID [CONTEXT_MIB]
# HOST_DIR/config limits the GPU to 512 MiB + 2 x CONTEXT_MIB (0 on the simulated driver; on a
# real one, what a process's context takes: each of the two processes below has one).
# Prints PASS/FAIL lines; exit 1 after any FAIL.
set -u
DRIVER=$1 LIB=$2 DIR=$3 U0=$4 CTX=${5:-0}
T=$((512 + 2 * CTX))  # the limit, reported as the total
failed=0
fail() { echo "FAIL: $*"; failed=1; }
pass() { echo "PASS: $*"; }
# What a clean environment keeps: only what selects the node's driver (the simulated node, or
# the real driver's directory on a GPU machine).
SIMENV=()
for v in KGPU_SIM_NODE KGPU_SIM_NODE_NAME KGPU_SIM_STATE LD_LIBRARY_PATH; do
  [ -n "${!v:-}" ] && SIMENV+=("$v=${!v}")
done

cache=$(mktemp)
cp /etc/ld.so.cache "$cache" 2>/dev/null
mount -t tmpfs tmpfs /run || { echo "FAIL: cannot mount a tmpfs on /run"; exit 1; }
mkdir /run/kgpu-cuda
mount --bind "$DIR" /run/kgpu-cuda && mount -o remount,bind,ro /run/kgpu-cuda &&
  mount --bind "$DIR/kgpu-cuda.region" /run/kgpu-cuda/kgpu-cuda.region || { echo "FAIL: mounts"; exit 1; }

# 1. The limit comes from the read-only file, whatever the environment says.
KGPU_CUDA_MEMORY_LIMIT="$U0=4096Mi" KGPU_CUDA_SHARED_DIR="$DIR/elsewhere" LD_PRELOAD=$LIB timeout 30 \
  "$DRIVER" direct init info $T $((512 + CTX)) alloc $((600 + CTX)) oom alloc 300 ok touch "$DIR.held" waitfile "$DIR.done" >"$DIR.log" 2>&1 &
A=$!
for _ in $(seq 1 1000); do [ -e "$DIR.held" ] && break; sleep 0.01; done
# 2. A process started with a clean environment (only the simulated node's selection, which on a
# real node is the hardware) joins the same accounting: 300 MiB are held, 212 are left.
if out=$(env -i "${SIMENV[@]}" LD_PRELOAD=$LIB timeout 30 "$DRIVER" direct init info $T 212 alloc 300 oom alloc 200 ok 2>&1); then
  pass "a process with a clean environment stays in the container's accounting"
else
  fail "a process with a clean environment"; echo "$out"
fi
# 3. It cannot leave by deleting or replacing the region, nor raise its limit.
if rm -f /run/kgpu-cuda/kgpu-cuda.region 2>/dev/null || mv /run/kgpu-cuda/kgpu-cuda.region /run/kgpu-cuda/x 2>/dev/null ||
   (echo "memory $U0 8589934592" >/run/kgpu-cuda/config) 2>/dev/null; then
  fail "the region or the limits could be changed from inside the container"
else
  pass "the region cannot be deleted or replaced, the limits cannot be rewritten"
fi
touch "$DIR.done"
if wait $A; then pass "the limit comes from /run/kgpu-cuda/config, not the environment"; else
  fail "the limit from /run/kgpu-cuda/config"; cat "$DIR.log" 2>/dev/null; fi

# 4. --cuda-interposer-load ld.so.preload: /etc/ld.so.preload names the library, so a process
# that has neither LD_PRELOAD nor any kgpu variable is held all the same.
mount -t tmpfs tmpfs /etc || { echo "FAIL: cannot mount a tmpfs on /etc"; exit 1; }
cp "$cache" /etc/ld.so.cache 2>/dev/null
echo "$LIB" >/etc/ld.so.preload
if out=$(env -i "${SIMENV[@]}" timeout 30 "$DRIVER" direct init info $T $((512 + CTX)) alloc $((600 + CTX)) oom alloc 500 ok 2>&1); then
  pass "ld.so.preload: a clean environment is held to the limit"
else
  fail "ld.so.preload with a clean environment"; echo "$out"
fi
rm -f "$cache"
exit $failed
