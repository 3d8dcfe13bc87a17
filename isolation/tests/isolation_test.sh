#!/bin/bash
# End-to-end tests of libkgpu-cuda.so (the memory interposer) against the simulated CUDA driver,
# as processes of one "container" (one KGPU_CUDA_SHARED_DIR):
#   isolation_test.sh ISO_DRIVER INTERPOSER_LIB [KGPU_SIMCTL [NVML_PROBE [NVML_DIR]]]
# ISO_DRIVER is isolation/tests/iso_driver (linked against the simulated libcuda.so.1); with
# KGPU_SIMCTL the NVML side of the node state is checked too. NVML_DIR holds the (unsanitised)
# simulated libnvidia-ml.so.1 that the interposer dlopen()s for its reconciliation, as it finds
# the real one through the loader's cache on a GPU node. Each case prints PASS or FAIL.
set -u
DRIVER=$1
LIB=$2
SIMCTL=${3:-}
PROBE=${4:-}
[ -n "${5:-}" ] && export LD_LIBRARY_PATH=$5${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}

. "$(dirname "$0")/sim_env.sh" iso-test
# run NAME SHARED_DIR LIMIT STEPS...: the driver under the interposer in container SHARED_DIR
run() {
  local dir=$1 limit=$2
  shift 2
  KGPU_CUDA_SHARED_DIR=$dir KGPU_CUDA_MEMORY_LIMIT=$limit LD_PRELOAD=$LIB timeout 30 "$DRIVER" "$@"
}
# bgrun SHARED_DIR LIMIT STEPS...: the same in the background; $! is the driver's own pid
bgrun() {
  local dir=$1 limit=$2
  shift 2
  env KGPU_CUDA_SHARED_DIR="$dir" KGPU_CUDA_MEMORY_LIMIT="$limit" LD_PRELOAD="$LIB" "$DRIVER" "$@" >>"$WORK/bg.log" 2>&1 &
}
wait_file() { for _ in $(seq 1 1000); do [ -e "$1" ] && return 0; sleep 0.01; done; return 1; }

U0=$("$DRIVER" direct init 0 uuid | grep '^GPU-')
U1=$("$DRIVER" direct init 1 uuid | grep '^GPU-')
[ -n "$U0" ] && [ -n "$U1" ] || { echo "FAIL: no simulated GPU (is KGPU_SIM_NODE usable?)"; exit 1; }
L512="$U0=512Mi"

# 1. Every allocation path, reached every way, limit enforced and freed memory returned.
# ":internal": the driver's cuGetProcAddress hands out non-exported entry points (the hooks are
# then chosen by name and version, not by address).
for variant in direct dlsym procaddr cudart procaddr1 procaddr:internal cudart:internal procaddr1:internal; do
  mode=${variant%%:*}
  internal=0
  [ "$variant" != "$mode" ] && internal=1
  c=$WORK/c-${variant/:/-}
  if out=$(KGPU_SIM_CUDA_PROC_INTERNAL=$internal run "$c" "$L512" $mode init info 512 512 totalmem 512 \
      alloc 400 ok alloc 200 oom info 512 112 \
      pitch 1000 120000 oom pitch 1000 100000 ok info 512 14 \
      managed 100 oom array 4096 4096 oom array3d 256 256 256 oom async 100 oom pool 100 oom alloc1 100 oom \
      vmm 100 oom free free info 512 512 array3d 256 256 256 ok info 512 448 free \
      vmm 500 ok vmm 20 oom info 512 12 free \
      managed 100 ok async 100 ok array 4096 4096 ok alloc1 200 ok alloc 100 oom free pool 200 ok alloc 100 oom \
      freeall sync info 512 512 alloc 512 ok alloc 2 oom freeall \
      alloc 400 ok reset info 512 512 alloc 300 ok ctx alloc 100 ok vmm 50 ok ctxdestroy info 512 162 free \
      release init info 512 512 alloc 512 ok rtldnext 2>&1); then
    pass "allocation paths via $variant"
  else
    fail "allocation paths via $variant"; echo "$out"
  fi
done

# 1b. The legacy 32-bit pitch and array calls and mipmapped arrays (every level charged: 14
# levels of 8192x8192 floats are 342 MiB, not the 256 of the first), reached every way.
for variant in direct dlsym procaddr cudart procaddr1 procaddr:internal; do
  mode=${variant%%:*}
  internal=0
  [ "$variant" != "$mode" ] && internal=1
  c=$WORK/c1b-${variant/:/-}
  if out=$(KGPU_SIM_CUDA_PROC_INTERNAL=$internal run "$c" "$L512" $mode init \
      alloc 460 ok array1 4096 4096 oom array3d1 256 256 256 oom mipmap 4096 4096 0 1 oom free \
      array1 4096 4096 ok array3d1 256 256 256 ok info 512 384 freeall \
      alloc 400 ok pitch1 1000 120000 oom pitch1 1000 100000 ok info 512 14 freeall \
      mipmap 8192 8192 0 14 ok info 512 170 mipmap 8192 8192 0 14 oom free info 512 512 2>&1); then
    pass "legacy and mipmapped allocations via $variant"
  else
    fail "legacy and mipmapped allocations via $variant"; echo "$out"
  fi
done

# 2. A GPU that the limit does not name is not limited; a malformed limit refuses everything.
if run "$WORK/c-other" "$L512" direct init 1 alloc 4096 ok info 81559 - >/dev/null; then pass "unlimited GPU"; else fail "unlimited GPU"; fi
if run "$WORK/c-bad" "$U0=12Qi" direct init 1 alloc 2 oom >/dev/null 2>&1; then pass "malformed limit fails closed"; else fail "malformed limit fails closed"; fi

# 3. Two processes share one limit.
c=$WORK/c-two
bgrun "$c" "$L512" direct init alloc 300 ok touch "$c.a1" waitfile "$c.b1" info 512 12 freeall touch "$c.a2"
A=$!
if run "$c" "$L512" direct waitfile "$c.a1" init alloc 300 oom alloc 200 ok info 512 12 touch "$c.b1" waitfile "$c.a2" \
    alloc 300 ok info 512 12 >"$WORK/b.log" 2>&1 && wait $A; then
  pass "two processes share one limit"
else
  fail "two processes share one limit"; cat "$WORK/bg.log" "$WORK/b.log"
fi

# 3b. Racing processes: 12 start at once, each allocating 100 MiB 3 times against 512 MiB; the
# container never holds more than its limit, so exactly 5 allocations succeed.
c=$WORK/c-race
: >"$WORK/bg.log"
pids=()
for n in $(seq 1 12); do
  bgrun "$c" "$L512" direct init waitfile "$c.go" alloc 100 any alloc 100 any alloc 100 any touch "$c.done$n" pause
  pids+=($!)
done
sleep 0.2; touch "$c.go"
for n in $(seq 1 12); do wait_file "$c.done$n"; done
got=$(grep -c 'alloc 100: allocated' "$WORK/bg.log")
kill -9 "${pids[@]}"; wait "${pids[@]}" 2>/dev/null
if [ "$got" = 5 ]; then pass "12 racing processes: 5 x 100 MiB fit in 512 MiB"; else fail "racing processes: $got allocations succeeded, want 5"; fi

# 4. NVML's view (when kgpu-simctl is given): the process and its memory are listed.
if [ -n "$SIMCTL" ]; then
  c=$WORK/c-nvml
  bgrun "$c" "$L512" direct init alloc 400 ok touch "$c.held" pause
  A=$!
  wait_file "$c.held"
  if "$SIMCTL" show | tr -d ' \n' | grep -q "\"memMiB\":400,[^}]*\"pid\":$A"; then pass "NVML lists the pid with its memory"; else
    fail "NVML lists the pid with its memory"; "$SIMCTL" show | grep -A3 '"processes"'; fi
  kill -9 $A; wait $A 2>/dev/null
fi

# 4b. NVML inside the container (what nvidia-smi shows): the limit as the GPU's memory and the
# container's allocations as used, whether the client is linked with NVML or dlopen()s it; a GPU
# the limit does not name keeps NVML's own figures.
if [ -n "$PROBE" ]; then
  c=$WORK/c-smi
  bgrun "$c" "$L512" direct init alloc 300 ok touch "$c.held" pause
  A=$!
  wait_file "$c.held"
  for mode in direct dlopen; do
    out=$(KGPU_CUDA_SHARED_DIR=$c KGPU_CUDA_MEMORY_LIMIT=$L512 LD_PRELOAD=$LIB timeout 30 "$PROBE" $mode 0 2>&1)
    if grep -qx "v1 total=512 used=300 free=212" <<<"$out" && grep -qx "v2 total=512 used=300 free=212" <<<"$out"; then
      pass "NVML in the container ($mode): total = the limit, used = the container's"
    else
      fail "NVML in the container ($mode)"; echo "$out"
    fi
  done
  out=$(KGPU_CUDA_SHARED_DIR=$c KGPU_CUDA_MEMORY_LIMIT=$L512 LD_PRELOAD=$LIB timeout 30 "$PROBE" direct 1 2>&1)
  plain=$(timeout 30 "$PROBE" direct 1 2>&1)
  if [ "$out" = "$plain" ] && grep -q "^v1 total=81559 " <<<"$out"; then pass "NVML of an unlimited GPU unchanged"; else
    fail "NVML of an unlimited GPU unchanged"; echo "$out"; echo "$plain"; fi
  kill -9 $A; wait $A 2>/dev/null
fi

# 5. kill -9 while holding memory: the next allocation that needs it reclaims it.
c=$WORK/c-kill
bgrun "$c" "$L512" direct init alloc 400 ok touch "$c.held" pause
A=$!
wait_file "$c.held"
kill -9 $A; wait $A 2>/dev/null
if out=$(run "$c" "$L512" direct init alloc 500 ok info 512 12 2>&1); then pass "kill -9 holding memory: reclaimed"; else
  fail "kill -9 holding memory: reclaimed"; echo "$out"; fi

# 6. kill -9 while holding the accounting lock (test hook: every lock is held 1 s): the others
# are not blocked (timeout 30 would fail them) and the dead process's 400 MiB come back.
c=$WORK/c-lock
KGPU_CUDA_TESTHOOK_HOLD_LOCK_MS=1000 bgrun "$c" "$L512" direct init alloc 400 ok touch "$c.held" info - -
A=$!
wait_file "$c.held"
sleep 0.3   # now inside cuMemGetInfo's locked section
kill -9 $A; wait $A 2>/dev/null
start=$(date +%s%N)
if out=$(run "$c" "$L512" direct init alloc 500 ok info 512 12 2>&1); then
  pass "kill -9 holding the lock: no deadlock, memory reclaimed ($(( ($(date +%s%N) - start) / 1000000 )) ms)"
else
  fail "kill -9 holding the lock"; echo "$out"
fi

# 6b. kill -9 in the middle of an allocation (every lock held 1 s: the kill lands inside the
# allocation's first locked section): the next process is not blocked and gets the whole limit.
c=$WORK/c-midalloc
KGPU_CUDA_TESTHOOK_HOLD_LOCK_MS=1000 bgrun "$c" "$L512" direct init touch "$c.start" alloc 400 ok
A=$!
wait_file "$c.start"
sleep 0.3
kill -9 $A; wait $A 2>/dev/null
if out=$(run "$c" "$L512" direct init alloc 500 ok info 512 12 2>&1); then pass "kill -9 during an allocation: no deadlock, nothing left charged"; else
  fail "kill -9 during an allocation"; echo "$out"; fi

# 7. A limit smaller than what is already used.
#  a) by other processes on the GPU (outside the container): free = what the GPU has left.
c=$WORK/c-full
"$DRIVER" direct init alloc 80800 ok touch "$c.outsider" pause >/dev/null 2>&1 &
O=$!
wait_file "$c.outsider"
if out=$(run "$c" "$L512" direct init info 512 229 alloc 300 oom alloc 200 ok 2>&1); then pass "GPU fuller than the limit: device OOM passed through"; else
  fail "GPU fuller than the limit"; echo "$out"; fi
kill -9 $O; wait $O 2>/dev/null
#  b) by the container itself, seen by a process whose own limit is smaller: free is 0, never
#  negative, and the region's first limit caps a larger one.
c=$WORK/c-small
bgrun "$c" "$L512" direct init alloc 400 ok touch "$c.held" pause
A=$!
wait_file "$c.held"
if run "$c" "$U0=256Mi" direct init info 256 0 alloc 2 oom >/dev/null 2>&1 &&
   run "$c" "$U0=1024Mi" direct init info 512 112 alloc 200 oom alloc 100 ok >/dev/null 2>&1; then
  pass "limit below the container's usage: free 0, nothing allocated"
else
  fail "limit below the container's usage"
fi
kill -9 $A; wait $A 2>/dev/null

# 8. Another UID joins the region (random-UID containers), whatever the umask. The other UID must
# reach the driver and the library: not so when the checkout lies under a 0700 directory (e.g. a
# clone into `mktemp -d`), which says nothing about the interposer.
as_other() { setpriv --reuid 54321 --regid 54321 --clear-groups "$@"; }
if [ "$(id -u)" = 0 ] && command -v setpriv >/dev/null && ! as_other test -x "$DRIVER" -a -r "$LIB"; then
  echo "SKIP: random UID (uid 54321 cannot reach $DRIVER or $LIB: a parent directory is not searchable)"
elif [ "$(id -u)" = 0 ] && command -v setpriv >/dev/null; then
  c=$WORK/c-uid
  umask 077
  bgrun "$c" "$L512" direct init alloc 100 ok touch "$c.held" pause
  A=$!
  umask 022
  wait_file "$c.held"
  chmod 666 "$KGPU_SIM_STATE" "$KGPU_SIM_STATE.cuda-pids"
  mode=$(stat -c %a "$c/kgpu-cuda.region")
  if [ "$mode" = 666 ] && KGPU_CUDA_SHARED_DIR=$c KGPU_CUDA_MEMORY_LIMIT=$L512 LD_PRELOAD=$LIB \
      as_other timeout 30 "$DRIVER" direct init alloc 420 oom alloc 400 ok >/dev/null 2>&1; then
    pass "a random UID shares the region (mode $mode)"
  else
    fail "a random UID shares the region (mode $mode)"
  fi
  kill -9 $A; wait $A 2>/dev/null
else
  echo "SKIP: random UID (needs root and setpriv)"
fi

# 10. The driver's own memory for a process (here each context takes 300 MiB, as a real
# driver's context takes a few hundred) counts against the limit: NVML's figure for the process
# beyond its allocations becomes its extra. A second context is seen within the reconciliation
# period (200 ms); a destroyed or released one is given back at once.
c=$WORK/c-context
if out=$(KGPU_SIM_CUDA_CONTEXT_MIB=300 run "$c" "$L512" direct init info 512 212 alloc 300 oom alloc 200 ok \
    info 512 12 ctx sleep 250 alloc 2 oom info 512 0 ctxdestroy info 512 12 free release init info 512 212 2>&1); then
  pass "context memory counts against the limit"
else
  fail "context memory counts against the limit"; echo "$out"
fi
if [ -n "$PROBE" ]; then
  KGPU_SIM_CUDA_CONTEXT_MIB=300 bgrun "$c-smi" "$L512" direct init alloc 100 ok touch "$c.held" pause
  A=$!
  wait_file "$c.held"
  # what nvidia-smi in the container shows: the other process's context and allocation
  out=$(KGPU_CUDA_SHARED_DIR=$c-smi KGPU_CUDA_MEMORY_LIMIT=$L512 LD_PRELOAD=$LIB timeout 30 "$PROBE" direct 0 2>&1)
  kill -9 $A; wait $A 2>/dev/null
  if grep -qx "v1 total=512 used=400 free=112" <<<"$out"; then pass "NVML in the container: used includes a process's context"; else
    fail "NVML in the container with context memory"; echo "$out"; fi
fi

# 11. Every process of the container is held, whatever its environment: a process without
# KGPU_CUDA_MEMORY_LIMIT that joins a region with a limit is bound by it.
c=$WORK/c-noenv
bgrun "$c" "$L512" direct init alloc 300 ok touch "$c.held" pause
A=$!
wait_file "$c.held"
if out=$(KGPU_CUDA_SHARED_DIR=$c LD_PRELOAD=$LIB timeout 30 "$DRIVER" direct init alloc 300 oom alloc 200 ok info 512 12 2>&1); then
  pass "a process without the limit variable is held to the container's limit"
else
  fail "a process without the limit variable"; echo "$out"
fi
kill -9 $A; wait $A 2>/dev/null

# 12. The limit and the region at the fixed path the device plugin mounts (read-only directory,
# read-write region file): neither the environment nor a clean one nor deleting the region
# escapes, and with ld.so.preload neither does a process without LD_PRELOAD. Needs a private
# mount namespace (unshare -Urm).
c=$WORK/c-fixed
mkdir -p "$c"
printf '# test\nmemory %s %d\n' "$U0" $((512 << 20)) >"$c/config"
: >"$c/kgpu-cuda.region"
chmod 444 "$c/config"; chmod 666 "$c/kgpu-cuda.region"
if unshare -Urm true 2>/dev/null; then
  out=$(unshare -Urm bash "$(dirname "$0")/fixed_config_ns.sh" "$DRIVER" "$LIB" "$c" "$U0" 2>&1)
  echo "$out"
  grep -q '^FAIL' <<<"$out" && failed=1
else
  echo "SKIP: the fixed configuration path (unshare -Urm is not permitted here)"
fi

# 13. What real workloads hold is charged before it is granted, reached every way.
L1="$U1=512Mi"
for mode in direct dlsym procaddr cudart procaddr1; do
  c=$WORK/c13-$mode
  #  a) VMM memory still mapped after cuMemRelease stays charged until its last unmap.
  if out=$(run "$c-vmm" "$L512" $mode init vmmmap 200 ok vmmmap 200 ok vmmmap 200 oom alloc 200 oom info 512 112 \
      freeall info 512 512 2>&1); then pass "VMM mapped after release stays charged ($mode)"; else
    fail "VMM mapped after release ($mode)"; echo "$out"; fi
  #  b) What a pool keeps after a free (release threshold UINT64_MAX) stays charged; reused, it
  #  costs nothing more; trimmed or released at a synchronisation, it comes back.
  if out=$(run "$c-pool" "$L512" $mode init poolnew max poolalloc 200 ok free sync poolnew max poolalloc 200 ok free sync \
      info 512 112 poolalloc 200 ok info 512 112 alloc 200 oom poolalloc 200 oom free sync trim info 512 312 \
      poolnew 0 poolalloc 200 ok free sync info 512 312 2>&1); then pass "what pools keep is charged ($mode)"; else
    fail "what pools keep ($mode)"; echo "$out"; fi
  #  c) A pool's and a stream's allocations are charged to the pool's / stream's GPU, not the
  #  current context's (only GPU 1 is limited here).
  if out=$(run "$c-gpu" "$L1" $mode init 0 poolnew max 1 poolalloc 600 oom poolalloc 400 ok init 1 info 512 112 \
      init 1 stream init 0 async 200 oom async 100 ok 2>&1); then pass "pool and stream allocations charged to their GPU ($mode)"; else
    fail "pool and stream allocations charged to their GPU ($mode)"; echo "$out"; fi
  #  d) Graph memory: a captured cudaMallocAsync is charged once however often the graph runs,
  #  kept by the graph pool until cuDeviceGraphMemTrim; a graph whose memory does not fit is not
  #  launched; cuCtxSetLimit's heap and stack are charged.
  if out=$(run "$c-graph" "$L512" $mode init capture 200 launch ok launch ok launch ok info 512 312 \
      graphnode 600 launch oom graphtrim info 512 512 graphnode 300 launch ok info 512 212 graphtrim info 512 512 \
      setlimit heap 400 ok alloc 200 oom setlimit heap 8 ok alloc 200 ok free \
      setlimit stack 2048 ok alloc 300 oom setlimit stack 1024 ok alloc 300 ok 2>&1); then
    pass "graph memory and context limits charged ($mode)"
  else
    fail "graph memory and context limits ($mode)"; echo "$out"
  fi
  #  e) Small allocations at the driver's granularity: 1000 x 64 KiB fit in 512 MiB (the unused
  #  part of their shared pages is reconciled, and gone at the reconciliation after the frees).
  if out=$(run "$c-small" "$L512" $mode init small 1000 64 ok info 512 - freeall sleep 250 info 512 512 2>&1); then
    pass "1000 x 64 KiB charged at the driver's granularity ($mode)"
  else
    fail "small allocations ($mode)"; echo "$out"
  fi
done

# 14. A device whose UUID cannot be read in a limited container reports no memory (fail closed).
if out=$(KGPU_SIM_CUDA_FAIL_UUID=1 run "$WORK/c-nouuid" "$L512" direct init totalmem 0 alloc 2 oom 2>&1); then
  pass "unreadable UUID: no memory, nothing allocated"
else
  fail "unreadable UUID"; echo "$out"
fi

# 9. Without the interposer nothing is limited (the simulated driver alone).
if "$DRIVER" direct init alloc 4096 ok >/dev/null; then pass "no interposer, no limit"; else fail "no interposer, no limit"; fi

exit $failed
