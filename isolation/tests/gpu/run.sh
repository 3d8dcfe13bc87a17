#!/bin/bash
# The interposer against the real CUDA driver (ctest label gpu; exit 77 = skipped without one):
#   run.sh ISO_DRIVER INTERPOSER_LIB [ISO_BENCH]
# ISO_DRIVER (isolation/tests/iso_driver) is linked against the simulated libcuda.so.1 by
# RUNPATH; LD_LIBRARY_PATH, which the loader searches first, points it at the real driver here.
# With nvcc on the PATH, cudart_probe.cu is built and run too (cudart resolves the driver through
# cuGetProcAddress, as real applications do). Prints PASS/FAIL per case and the figures.
set -u
DRIVER=$1
LIB=$2
BENCH=${3:-}
[ -e /dev/nvidiactl ] || { echo "SKIP: no NVIDIA device"; exit 77; }
REAL=$(ldconfig -p | awk '/libcuda\.so\.1 .*x86-64/ {print $NF; exit}')
[ -n "$REAL" ] || { echo "SKIP: no libcuda.so.1 in the loader cache"; exit 77; }
export LD_LIBRARY_PATH=$(dirname "$REAL")
WORK=$(mktemp -d /tmp/kgpu-iso-gpu.XXXXXX)
trap 'kill -9 $(jobs -p) 2>/dev/null; rm -rf "$WORK"' EXIT
unset CUDA_VISIBLE_DEVICES KGPU_CUDA_TESTHOOK_HOLD_LOCK_MS LD_PRELOAD
failed=0
fail() { echo "FAIL: $*"; failed=1; }
pass() { echo "PASS: $*"; }
run() { local dir=$1 limit=$2; shift 2; KGPU_CUDA_SHARED_DIR=$dir KGPU_CUDA_MEMORY_LIMIT=$limit LD_PRELOAD=$LIB timeout 60 "$DRIVER" "$@"; }
wait_file() { for _ in $(seq 1 3000); do [ -e "$1" ] && return 0; sleep 0.01; done; return 1; }

U0=$("$DRIVER" direct init 0 uuid | grep '^GPU-')
[ -n "$U0" ] || { echo "FAIL: the real driver gives no device 0"; exit 1; }
echo "driver: $REAL, GPU 0: $U0"
# The driver's own memory for a process (its context) counts against the limit: measure it under
# a large limit, then give each process LIM = that + 512 MiB, so that 512 MiB are left for the
# allocations below and every "free" figure reads as it would with no context. Totals are LIM.
CTX=$(run "$WORK/c-ctx" "$U0=65536Mi" direct init alloc 2 ok info 65536 - 2>&1 | awk '/cuMemGetInfo free/ {print 65536 - 2 - $(NF-1)}')
[ -n "$CTX" ] || { echo "FAIL: cannot measure the context's memory"; exit 1; }
LIM=$((CTX + 512))
echo "context memory of iso_driver: $CTX MiB (counted against the limit); limit used: $LIM MiB"
L512="$U0=${LIM}Mi"

# Every allocation path reached every way (the legacy 32-bit cuMemAlloc is left out: a 64-bit
# driver need not serve it). The real pitch is used for the charge, so no free figure is
# asserted after the pitched allocation. A second context (step ctx) is left out: its memory
# shows at the next reconciliation, not at once (the simulated test covers it).
for mode in direct dlsym procaddr cudart procaddr1; do
  if out=$(run "$WORK/c-$mode" "$L512" $mode init info $LIM 512 totalmem $LIM \
      alloc 400 ok alloc 200 oom info $LIM 112 pitch 1000 120000 oom pitch 1000 100000 ok info $LIM - \
      managed 100 oom array 4096 4096 oom array3d 256 256 256 oom async 100 oom vmm 100 oom free free info $LIM 512 \
      vmm 500 ok vmm 20 oom free \
      managed 100 ok async 100 ok array 4096 4096 ok array3d 256 256 256 ok alloc 200 oom \
      freeall sync info $LIM 512 alloc 512 ok alloc 2 oom freeall \
      mipmap 8192 8192 0 14 ok info $LIM 170 free \
      alloc 400 ok reset info $LIM 512 alloc 300 ok free \
      release init info $LIM 512 alloc 512 ok rtldnext 2>&1); then
    pass "allocation paths via $mode"
  else
    fail "allocation paths via $mode"; echo "$out"
  fi
done

# Two processes share the limit; NVML (nvidia-smi) lists the holder.
c=$WORK/c-two
# (each process's context counts: the limit is 2 contexts + 512 MiB)
LIM2=$((2 * CTX + 512))
env KGPU_CUDA_SHARED_DIR=$c KGPU_CUDA_MEMORY_LIMIT=$U0=${LIM2}Mi LD_PRELOAD=$LIB "$DRIVER" direct init alloc 300 ok touch "$c.a1" pause >/dev/null 2>&1 &
A=$!
wait_file "$c.a1"
if run "$c" "$U0=${LIM2}Mi" direct init alloc 300 oom alloc 200 ok info $LIM2 12 >/dev/null 2>&1; then pass "two processes share one limit"; else fail "two processes share one limit"; fi
if command -v nvidia-smi >/dev/null; then
  if nvidia-smi --query-compute-apps=pid,used_memory --format=csv,noheader | grep -q "^$A,"; then pass "nvidia-smi lists the process"; else
    fail "nvidia-smi lists the process"; nvidia-smi --query-compute-apps=pid,used_memory --format=csv; fi
fi
kill -9 $A; wait $A 2>/dev/null
if run "$c" "$U0=${LIM2}Mi" direct init alloc 500 ok >/dev/null 2>&1; then pass "kill -9 holding memory: reclaimed"; else fail "kill -9 holding memory: reclaimed"; fi

c=$WORK/c-lock
env KGPU_CUDA_TESTHOOK_HOLD_LOCK_MS=1000 KGPU_CUDA_SHARED_DIR=$c KGPU_CUDA_MEMORY_LIMIT=$L512 LD_PRELOAD=$LIB "$DRIVER" direct init alloc 400 ok touch "$c.held" info - - >/dev/null 2>&1 &
A=$!
wait_file "$c.held"; sleep 0.3
kill -9 $A; wait $A 2>/dev/null
if run "$c" "$L512" direct init alloc 500 ok >/dev/null 2>&1; then pass "kill -9 holding the lock"; else fail "kill -9 holding the lock"; fi

# Every process of the container is held, whatever its environment: one without the limit
# variable joins the region and is bound by the limit recorded there.
c=$WORK/c-noenv
env KGPU_CUDA_SHARED_DIR=$c KGPU_CUDA_MEMORY_LIMIT=$U0=${LIM2}Mi LD_PRELOAD=$LIB "$DRIVER" direct init alloc 300 ok touch "$c.a1" pause >/dev/null 2>&1 &
A=$!
wait_file "$c.a1"
if out=$(KGPU_CUDA_SHARED_DIR=$c LD_PRELOAD=$LIB timeout 60 "$DRIVER" direct init alloc 300 oom alloc 200 ok 2>&1); then
  pass "a process without the limit variable is held to the container's limit"; else
  fail "a process without the limit variable"; echo "$out"; fi
kill -9 $A; wait $A 2>/dev/null

# The limits at the fixed path the device plugin mounts (/run/kgpu-cuda, read-only, the region
# read-write over its own path) in a private mount namespace: the environment, a clean one,
# deleting the region and ld.so.preload with no LD_PRELOAD.
c=$WORK/c-fixed
mkdir -p "$c"
printf 'memory %s %d\n' "$U0" $(((512 + 2 * CTX) << 20)) >"$c/config"
: >"$c/kgpu-cuda.region"
chmod 444 "$c/config"; chmod 666 "$c/kgpu-cuda.region"
if unshare -Urm true 2>/dev/null; then
  out=$(unshare -Urm bash "$(dirname "$0")/../fixed_config_ns.sh" "$DRIVER" "$LIB" "$c" "$U0" "$CTX" 2>&1)
  echo "$out"
  grep -q '^FAIL' <<<"$out" && failed=1
else
  echo "SKIP: the fixed configuration path (unshare -Urm is not permitted here)"
fi

# What real workloads hold, reached every way (the cases of the simulated test's 13; the free
# figures a real driver's pools and graph pools reserve are printed, not asserted).
for mode in direct dlsym procaddr cudart procaddr1; do
  c=$WORK/c13-$mode
  if out=$(run "$c-vmm" "$L512" $mode init vmmmap 200 ok vmmmap 200 ok vmmmap 200 oom alloc 200 oom info $LIM 112 \
      freeall info $LIM 512 2>&1); then pass "VMM mapped after release stays charged ($mode)"; else
    fail "VMM mapped after release ($mode)"; echo "$out"; fi
  if out=$(run "$c-pool" "$L512" $mode init poolnew max poolalloc 200 ok free sync poolnew max poolalloc 200 ok free sync \
      info $LIM - poolalloc 200 ok alloc 200 oom free sync trim info $LIM - 2>&1); then
    pass "what pools keep is charged ($mode)"; else fail "what pools keep ($mode)"; fi
  echo "$out" | grep 'cuMemGetInfo'
  if out=$(run "$c-graph" "$L512" $mode init capture 200 launch ok launch ok launch ok info $LIM - \
      graphnode 600 launch oom graphtrim graphnode 300 launch ok graphtrim info $LIM - \
      setlimit heap 400 ok alloc 200 oom setlimit heap 8 ok alloc 200 ok free 2>&1); then
    pass "graph memory and the malloc heap charged ($mode)"; else fail "graph memory and the malloc heap ($mode)"; fi
  echo "$out" | grep 'cuMemGetInfo'
  if out=$(run "$c-small" "$L512" $mode init small 1000 64 ok info $LIM - freeall 2>&1); then
    pass "1000 x 64 KiB fit in 512 MiB ($mode)"; else fail "small allocations ($mode)"; echo "$out"; fi
done
if [ "$(nvidia-smi -L 2>/dev/null | grep -c '^GPU')" -gt 1 ]; then
  U1=$("$DRIVER" direct init 1 uuid | grep '^GPU-')
  if out=$(run "$WORK/c-gpu1" "$U1=$((CTX + 512))Mi" direct init 0 poolnew max 1 poolalloc 600 oom poolalloc 400 ok \
      init 1 stream init 0 async 200 oom async 50 ok 2>&1); then pass "pool and stream allocations charged to their GPU"; else
    fail "pool and stream allocations charged to their GPU"; echo "$out"; fi
else
  echo "SKIP: pool and stream allocations on another GPU (one GPU here)"
fi

# The driver's granularity for small allocations: what NVML shows for a process holding 1000
# allocations of N KiB, less a process holding none, per allocation (the interposer charges
# requests up to 1 MiB at 512-byte granularity and reconciles the rest).
if command -v nvidia-smi >/dev/null; then
  used() { nvidia-smi --query-compute-apps=pid,used_memory --format=csv,noheader,nounits | awk -F', ' -v p="$1" '$1 == p {print $2}'; }
  "$DRIVER" direct init touch "$WORK/g0" pause >/dev/null 2>&1 &
  B=$!
  wait_file "$WORK/g0"; sleep 0.5; base=$(used $B); kill -9 $B; wait $B 2>/dev/null
  for kib in 4 64 512 1024; do
    rm -f "$WORK/g1"
    "$DRIVER" direct init small 1000 $kib ok touch "$WORK/g1" pause >/dev/null 2>&1 &
    B=$!
    wait_file "$WORK/g1"; sleep 0.5; u=$(used $B); kill -9 $B; wait $B 2>/dev/null
    echo "granularity: 1000 x $kib KiB hold $((u - base)) MiB beyond the context: $(( (u - base) * 1024 / 1000 )) KiB each (asked $kib)"
  done
fi

if command -v nvcc >/dev/null; then
  if nvcc -O2 -o "$WORK/cudart_probe" "$(dirname "$0")/cudart_probe.cu" >"$WORK/nvcc.log" 2>&1; then
    PCTX=$(KGPU_CUDA_SHARED_DIR=$WORK/c-cudart0 KGPU_CUDA_MEMORY_LIMIT=$U0=65536Mi LD_PRELOAD=$LIB timeout 60 "$WORK/cudart_probe" measure 2>&1 | awk '/^context/ {print $2}')
    echo "context memory of the cudart program: ${PCTX:-?} MiB"
    if out=$(KGPU_PROBE_TOTAL_MIB=$((${PCTX:-0} + 512)) KGPU_CUDA_SHARED_DIR=$WORK/c-cudart KGPU_CUDA_MEMORY_LIMIT=$U0=$((${PCTX:-0} + 512))Mi LD_PRELOAD=$LIB timeout 60 "$WORK/cudart_probe" 2>&1); then
      pass "cudart program"; else fail "cudart program"; fi
    echo "$out"
  else
    fail "nvcc"; cat "$WORK/nvcc.log"
  fi
else
  echo "SKIP: cudart program (no nvcc)"
fi

if [ -n "$BENCH" ]; then
  "$BENCH" 20000
  KGPU_CUDA_SHARED_DIR=$WORK/c-bench KGPU_CUDA_MEMORY_LIMIT="$U0=4096Mi" LD_PRELOAD=$LIB "$BENCH" 20000 1024
fi
exit $failed
