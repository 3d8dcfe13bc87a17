#!/bin/bash
# Compute shares (KGPU_CUDA_CORE_LIMIT) against the real CUDA driver and NVML (ctest label gpu;
# exit 77 = skipped without a GPU): the cases of isolation/tests/compute_share_test.sh on GPU 0,
# with spin.ptx's kernel (each block spins 200 us on the GPU's timer):
#   compute_share.sh COMPUTE_DRIVER INTERPOSER_LIB
# The kernel's GPU time is calibrated first: a run without a limit takes the whole GPU, so its
# kernels' time is its window over its kernel count. Prints each case's share and the precision
# (measured - asked, in points of the GPU); FAIL beyond TOL points. About 40 s.
set -u
DRIVER=$1
LIB=$2
[ -e /dev/nvidiactl ] || { echo "SKIP: no NVIDIA device"; exit 77; }
REAL=$(ldconfig -p | awk '/libcuda\.so\.1 .*x86-64/ {print $NF; exit}')
[ -n "$REAL" ] || { echo "SKIP: no libcuda.so.1 in the loader cache"; exit 77; }
ldconfig -p | grep -q 'libnvidia-ml\.so\.1 .*x86-64' || { echo "SKIP: no libnvidia-ml.so.1 (compute shares are measured through NVML)"; exit 77; }
export LD_LIBRARY_PATH=$(dirname "$REAL")
export COMPUTE_DRIVER_IMAGE=$(dirname "$0")/spin.ptx
WORK=$(mktemp -d /tmp/kgpu-compute-gpu.XXXXXX)
trap 'kill -9 $(jobs -p) 2>/dev/null; rm -rf "$WORK"' EXIT
unset CUDA_VISIBLE_DEVICES KGPU_CUDA_CORE_LIMIT KGPU_CUDA_MEMORY_LIMIT LD_PRELOAD KGPU_CUDA_COMPUTE_LOG
failed=0
fail() { echo "FAIL: $*"; failed=1; }
pass() { echo "PASS: $*"; }
TOL=5 RUN_S=6 WARM_S=2 SYNC=8

U0=$("$DRIVER" uuid 0 | grep '^GPU-')
[ -n "$U0" ] || { echo "FAIL: the real driver gives no device 0"; exit 1; }
# Calibration: no limit, the interposer loaded (as a share container's unlimited neighbour).
out=$(COMPUTE_DRIVER_KERNEL_NS=1000000 KGPU_CUDA_SHARED_DIR=$WORK/cal LD_PRELOAD=$LIB timeout 60 "$DRIVER" run 4 1 $SYNC 0 2>&1)
s=$(sed -n 's/.*\<share=\([0-9.]*\).*/\1/p' <<<"$out")
[ -n "$s" ] || { echo "FAIL: calibration: $out"; exit 1; }
K=$(awk -v s="$s" 'BEGIN { printf "%d", 1000000 * 100 / s }')
echo "kernel time (1024 x 1024 threads of spin.ptx): $((K / 1000)) us"
export COMPUTE_DRIVER_KERNEL_NS=$K

start() {
  local name=$1 dir=$2 limit=$3
  KGPU_CUDA_SHARED_DIR=$dir KGPU_CUDA_CORE_LIMIT=$limit LD_PRELOAD=$LIB timeout 60 \
    "$DRIVER" run $RUN_S $WARM_S $SYNC 0 >"$WORK/$name.out" 2>"$WORK/$name.err" &
}
field() { sed -n "s/.*\\<$2=\\([0-9.]*\\).*/\\1/p" "$WORK/$1.out"; }
# check WHAT VALUE WANT: within TOL points; prints the precision
check() {
  local d
  d=$(awk -v v="$2" -v w="$3" 'BEGIN { if (v == "") print "?"; else printf "%+.2f", v - w }')
  if awk -v v="$2" -v w="$3" -v t=$TOL 'BEGIN { d = v - w; exit !(v != "" && d <= t && d >= -t) }'; then
    pass "$1: $2 % (asked $3, precision $d points)"
  else
    fail "$1: ${2:-?} % (asked $3, $d points; tolerance $TOL)"; cat "$WORK"/*.err | tail -5
  fi
}

start a "$WORK/c-a" "$U0=30"; wait
check "a 30 % share alone" "$(field a share)" 30
m=$(field a max1s)
if awk -v v="$m" -v t=$TOL 'BEGIN { exit !(v != "" && v <= 30 + t) }'; then pass "a 30 % share alone never exceeds 30 + $TOL over a second (max $m %)"; else
  fail "a 30 % share alone exceeds 30 + $TOL over a second (max ${m:-?} %)"; fi
start b30 "$WORK/c-b30" "$U0=30"; start b70 "$WORK/c-b70" "$U0=70"; wait
check "30 % beside 70 %" "$(field b30 share)" 30
check "70 % beside 30 %" "$(field b70 share)" 70
start d1 "$WORK/c-d" "$U0=50"; start d2 "$WORK/c-d" "$U0=50"; wait
check "two processes of one 50 % container" "$(awk -v a="$(field d1 share)" -v b="$(field d2 share)" 'BEGIN { if (a != "" && b != "") printf "%.2f", a + b }')" 50
exit $failed
