#!/usr/bin/env bash
# Installs every build and test dependency of kgpu from Debian 12 packages.
# Idempotent: when everything is already installed it only runs dpkg-query and exits.
set -euo pipefail

# What `make package` (and the Dockerfile's build stage) needs: compilers, CMake, the libraries,
# dpkg-shlibdeps (dpkg-dev), file (CPack DEB) and lld (the release link, cmake/static_deps.cmake).
BUILD_PACKAGES=(
  build-essential cmake ninja-build ccache pkg-config git dpkg-dev file lld
  libyaml-cpp-dev nlohmann-json3-dev libspdlog-dev libfmt-dev libcli11-dev
  libabsl-dev libgrpc++-dev libprotobuf-dev protobuf-compiler protobuf-compiler-grpc
  libcurl4-openssl-dev libcpp-httplib-dev libsimdjson-dev
)
# And for the tests, the fuzz preset and the benchmarks: debootstrap for the package test,
# umoci and skopeo for `make image` and its test (an OCI image without a container engine),
# nodejs/npm for the manifest schema test (kubernetes-models).
PACKAGES=(
  "${BUILD_PACKAGES[@]}"
  clang libclang-rt-14-dev clang-format
  libgtest-dev libgmock-dev libbenchmark-dev
  python3 python3-yaml procps curl
  librsvg2-2
  prometheus
  debootstrap umoci skopeo nodejs slurmctld slurmd slurm-client munge
)
# What `make demo` needs beyond the build: GoogleTest and Google Benchmark to configure the dev
# tree (the demo's stand-ins, kgpu-fake-apiserver and the rest, live beside the tests), the tools
# its steps call (curl, python3, openssl for the webhook's throwaway certificate) and a real Slurm
# 22.05 for the Kubernetes <-> Slurm step. None of the other test-only packages (prometheus,
# debootstrap, umoci, skopeo, nodejs, clang).
DEMO_PACKAGES=(
  "${BUILD_PACKAGES[@]}"
  libgtest-dev libgmock-dev libbenchmark-dev
  python3 procps curl openssl
  slurmctld slurmd slurm-client munge
)
why="build and test kgpu (make test)"
# --build: only what building the packages needs (the Dockerfile's build stage).
# --demo: only what `make demo` needs.
if [ "${1:-}" = "--build" ]; then
  PACKAGES=("${BUILD_PACKAGES[@]}")
  why="build kgpu"
elif [ "${1:-}" = "--demo" ]; then
  PACKAGES=("${DEMO_PACKAGES[@]}")
  why="build kgpu and run make demo (Slurm: its Kubernetes <-> Slurm step runs a real slurmctld and slurmd)"
elif [ -n "${1:-}" ]; then
  echo "usage: install-deps.sh [--build|--demo]" >&2
  exit 2
else
  # npm: Debian's package, unless an npm already comes with the installed nodejs (NodeSource's
  # nodejs bundles it and conflicts with Debian's npm).
  command -v npm >/dev/null 2>&1 || PACKAGES+=(npm)
fi

missing=()
for p in "${PACKAGES[@]}"; do
  if ! dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed"; then
    missing+=("$p")
  fi
done

if [ ${#missing[@]} -eq 0 ]; then
  exit 0
fi

echo "install-deps: to $why, installing these Debian packages: ${missing[*]}"
SUDO=""
if [ "$(id -u)" -ne 0 ]; then
  if command -v sudo >/dev/null 2>&1; then SUDO="sudo"; else
    echo "install-deps: need root (or sudo) to install: ${missing[*]}" >&2; exit 1
  fi
fi
export DEBIAN_FRONTEND=noninteractive
# Refresh the package index only when it is missing or older than a day.
if [ -z "$(find /var/lib/apt/lists -maxdepth 1 -name '*Packages*' -mtime -1 2>/dev/null | head -1)" ]; then
  $SUDO apt-get update -qq
fi
$SUDO apt-get install -y -qq --no-install-recommends "${missing[@]}" >/dev/null
echo "install-deps: done"
