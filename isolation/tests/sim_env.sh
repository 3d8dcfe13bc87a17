# Sourced by the interposer's shell tests: a private work dir (removed at exit, background jobs
# killed), the simulated 8 x H100 node in it named $1, no interposer settings inherited, and the
# PASS/FAIL helpers ($failed is 1 after any FAIL).
WORK=$(mktemp -d "/tmp/kgpu-$1.XXXXXX")
chmod 755 "$WORK"
trap 'kill -9 $(jobs -p) 2>/dev/null; wait 2>/dev/null; rm -rf "$WORK"' EXIT
export KGPU_SIM_NODE=dgx-h100 KGPU_SIM_NODE_NAME=$1 KGPU_SIM_STATE=$WORK/node.state
unset CUDA_VISIBLE_DEVICES KGPU_CUDA_MEMORY_LIMIT KGPU_CUDA_SHARED_DIR KGPU_CUDA_TESTHOOK_HOLD_LOCK_MS LD_PRELOAD
failed=0
fail() { echo "FAIL: $*"; failed=1; }
pass() { echo "PASS: $*"; }
