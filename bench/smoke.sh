#!/usr/bin/env bash
# Every benchmark once, at a tiny size (seconds each, not minutes), so none can rot unseen: a bench
# that stops with an error fails this script, and so CI (.ci/run runs it after the release build).
# The figures printed here mean nothing; `make bench` measures.
#
#   bench/smoke.sh [BUILD_DIR]    (default build/release; the bench targets must be built)
set -euo pipefail
cd "$(dirname "$0")/.."
bin=${1:-build/release}/bin
failed=()
run() {  # run NAME ARGS...: one bench, its output kept on failure
  local name=$1
  shift
  local log
  log=$(mktemp /tmp/kgpu-bench-smoke-XXXXXX)
  local t0=$SECONDS
  if timeout 300 "$bin/$name" "$@" >"$log" 2>&1; then
    echo "ok - $name ($((SECONDS - t0)) s)"
  else
    echo "not ok - $name (exit $?, $((SECONDS - t0)) s): $bin/$name $*"
    tail -n 40 "$log" | sed 's/^/    /'
    failed+=("$name")
  fi
  rm -f "$log"
}
run inventory_bench --benchmark_min_time=0.001
run event_latency 20
run device_plugin_bench --runs 1 --calls 50 --xid-samples 2 --restarts 1
run exporter_bench --scrapes 20 --gzip-scrapes 5 --fresh-scrapes 5 --calls 20 --collections 2 --child-scrapes 5 \
  --window-s 1
run mig_mps_bench --repartitions 4 --follow 2
run k8s_bench --nodes 50 --pods 500 --events 200
run apiserver_watch_bench --watches 50 --requests 10
run sched_bench --smoke
run extender_bench 50
run slurm_bridge_bench --nodes 10 --rounds 2
run dra_bench --claims 20 --builds 5
echo "${#failed[@]} failed: ${failed[*]:-none}"
[ ${#failed[@]} -eq 0 ]
