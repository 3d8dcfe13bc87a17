#!/usr/bin/env bash
# The plugin's start and memory figures (device_plugin_bench --start-only: start->registered, RSS
# after registration, re-registration after kubelet restarts) side by side for
#   build/release/bin/kgpu         the release preset: absl, gRPC (grpc++_unsecure) and protobuf
#                                  linked statically (KGPU_STATIC_DEPS, cmake/static_deps.cmake)
#   build/release-shared/bin/kgpu  the same sources and flags with those libraries shared
# Both load libcurl and libcpp-httplib only on first use (src/cli/lazy_lib.h).
#
#   bench/static_vs_shared.sh      (`make bench` runs it; RESTARTS=N, default 100)
set -euo pipefail
cd "$(dirname "$0")/.."
jobs=${JOBS:-$(nproc)}
cmake --preset release >/dev/null
cmake --build --preset release -j "$jobs" --target kgpu device_plugin_bench
cmake --preset release -B build/release-shared -DKGPU_STATIC_DEPS=OFF -DKGPU_BUILD_TESTS=OFF \
  -DKGPU_BUILD_BENCH=OFF >/dev/null
cmake --build build/release-shared -j "$jobs" --target kgpu
for bin in build/release/bin/kgpu build/release-shared/bin/kgpu; do
  printf '\n== %s: %s DT_NEEDED, %s shared objects at start-up\n' "$bin" \
    "$(readelf -d "$bin" | grep -c '(NEEDED)')" "$(ldd "$bin" | grep -c '=>')"
  build/release/bin/device_plugin_bench --kgpu "$bin" --start-only --restarts "${RESTARTS:-100}"
done
