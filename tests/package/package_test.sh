#!/usr/bin/env bash
# What the image would hold, without a Docker engine: build the Debian packages (`make package`),
# install them with apt into a fresh Debian 12 root (debootstrap --variant=minbase bookworm, as
# debian:12-slim), and run kgpu inside it (chroot) on the simulated node:
# `kgpu --version`, `kgpu devices`, `kgpu doctor`. Registered in tests/CMakeLists.txt as
# package.deb_in_debian12 (label package, run by .ci/run, not by `make test`). The image itself
# (`make image`) is tests/package/image_test.sh's, from the packages this test builds.
#
#   package_test.sh REPO_ROOT VERSION CACHE_DIR
#
# CACHE_DIR keeps the debootstrap root as a tarball between runs (debootstrap takes minutes; the
# tarball is unpacked fresh for every run). Needs root (chroot, mount), debootstrap and the
# Debian mirror that apt uses. The packages come from REPO_ROOT/build/release/packages.
set -euo pipefail
root=$(cd "$1" && pwd) version=$2 cache=$3
step() { printf '\n== %s\n' "$*"; }
fail() { echo "package_test: FAIL: $*" >&2; exit 1; }
# shellcheck source=scripts/bookworm-root.sh
. "$root/scripts/bookworm-root.sh"
[ "$(id -u)" -eq 0 ] || fail "needs root (debootstrap, chroot)"
command -v debootstrap >/dev/null || fail "debootstrap not found: run scripts/install-deps.sh"

work=$(mktemp -d "${TMPDIR:-/tmp}/kgpu-package.XXXXXX")
cleanup() {
  # Only what this script mounted; the mounts live in its own mount namespace anyway.
  rm -rf --one-file-system "$work"
}
trap cleanup EXIT

step "the Dockerfile builds on Debian 12 and installs this package on debian:12-slim, as make image's image"
df="$root/Dockerfile"
[ -f "$df" ] || fail "no Dockerfile"
grep -Eq '^FROM debian:12 AS build$' "$df" || fail "Dockerfile: the build stage is not FROM debian:12"
[ "$(grep -E '^FROM ' "$df" | tail -1)" = "FROM debian:12-slim" ] || fail "Dockerfile: the last stage is not FROM debian:12-slim"
grep -Eq 'apt-get install .*/tmp/kgpu_\*\.deb' "$df" || fail "Dockerfile: the runtime stage does not apt-get install the kgpu package"
grep -Eq '^USER 65532:65532$' "$df" || fail "Dockerfile: the USER is not kgpu's 65532:65532 (as make image's)"
grep -qx 'ENTRYPOINT \["kgpu"\]' "$df" || fail "Dockerfile: the ENTRYPOINT is not [\"kgpu\"] (as make image's; manifests give only args)"
grep -q "docker build -t localhost/kgpu:$version " "$df" ||
  fail "Dockerfile: its build command does not tag localhost/kgpu:$version, the image deploy/ runs"
echo "OK"

step "make package"
rm -f "$root"/build/release/packages/*.deb
make -C "$root" package JOBS="${JOBS:-2}"
shopt -s nullglob
debs=("$root"/build/release/packages/*.deb)
[ ${#debs[@]} -eq 2 ] || fail "expected 2 packages in build/release/packages, found ${#debs[@]}: ${debs[*]}"
kgpu_deb=$(ls "$root"/build/release/packages/kgpu_*.deb) || fail "no kgpu_*.deb"
sim_deb=$(ls "$root"/build/release/packages/kgpu-sim_*.deb) || fail "no kgpu-sim_*.deb"

step "package metadata"
for deb in "$kgpu_deb" "$sim_deb"; do
  echo "$(basename "$deb"): $(dpkg-deb -f "$deb" Package) $(dpkg-deb -f "$deb" Version), Depends: $(dpkg-deb -f "$deb" Depends)"
  [ "$(dpkg-deb -f "$deb" Version)" = "$version" ] || fail "$deb: Version is not project(VERSION) $version"
  # dpkg-shlibdeps computed them: every binary needs at least libc6 (versioned) and libstdc++6.
  depends=$(dpkg-deb -f "$deb" Depends)
  grep -Eq '(^|, )libc6 \(>= [0-9.]+\)' <<<"$depends" || fail "$deb: Depends has no computed libc6 (>= ...)"
  grep -Eq '(^|, )libstdc\+\+6 \(>= [0-9.]+\)' <<<"$depends" || fail "$deb: Depends has no computed libstdc++6"
done
# What kgpu loads with dlopen (src/cli/lazy_lib.h), from those packages' shlibs files.
kgpu_depends=$(dpkg-deb -f "$kgpu_deb" Depends)
for dep in libcurl4 libcpp-httplib0.11; do
  grep -Eq "(^|, )$dep \(>= [^)]+\)" <<<"$kgpu_depends" || fail "kgpu: Depends has no $dep (>= ...), which it dlopens"
done
[ "$(dpkg-deb -f "$kgpu_deb" Suggests)" = "librsvg2-2" ] || fail "kgpu: Suggests is not librsvg2-2 (kgpu sim --plot FILE.png)"
# The listings in variables: `dpkg-deb -c | grep -q` would die of SIGPIPE under pipefail.
kgpu_files=$(dpkg-deb -c "$kgpu_deb") sim_files=$(dpkg-deb -c "$sim_deb")
grep -q ' ./usr/bin/kgpu$' <<<"$kgpu_files" || fail "kgpu package has no /usr/bin/kgpu"
grep -q ' ./usr/bin/kgpu-simctl$' <<<"$sim_files" || fail "kgpu-sim package has no /usr/bin/kgpu-simctl"
grep -q ' ./usr/lib/kgpu/sim/libnvidia-ml.so.1$' <<<"$sim_files" ||
  fail "kgpu-sim package has no /usr/lib/kgpu/sim/libnvidia-ml.so.1"
if grep -q 'libnvidia-ml' <<<"$kgpu_files"; then fail "the kgpu package must not ship an NVML library"; fi
grep -q " ./usr/lib/kgpu/$version/libkgpu-cuda.so$" <<<"$kgpu_files" ||
  fail "kgpu package has no /usr/lib/kgpu/$version/libkgpu-cuda.so (the CUDA interposer, deploy/shares copies it)"

step "Debian 12 root (debootstrap --variant=minbase bookworm)"
tarball="$cache/bookworm-minbase.tar"
mkdir -p "$cache"
cached_bookworm_root "$tarball" "$work"
sysroot="$work/root"
mkdir -p "$sysroot"
tar -C "$sysroot" -xf "$tarball"
cp /etc/resolv.conf "$sysroot/etc/resolv.conf"
mkdir -p "$sysroot/tmp/debs"
cp "$kgpu_deb" "$sim_deb" "$sysroot/tmp/debs/"

# Everything in the chroot runs in a private mount namespace with its own /proc, so nothing is
# left mounted on the host whatever happens.
cat >"$sysroot/tmp/inside.sh" <<'INSIDE'
#!/bin/bash
set -euo pipefail
fail() { echo "package_test (in the Debian 12 root): FAIL: $*" >&2; exit 1; }
export DEBIAN_FRONTEND=noninteractive PATH=/usr/sbin:/usr/bin:/sbin:/bin LC_ALL=C
echo "== apt-get install ./kgpu_*.deb ./kgpu-sim_*.deb"
apt-get update -qq
apt-get install -y -qq --no-install-recommends /tmp/debs/kgpu_*.deb /tmp/debs/kgpu-sim_*.deb >/tmp/apt.log 2>&1 ||
  { tail -30 /tmp/apt.log; fail "apt-get install failed"; }
dpkg -s kgpu kgpu-sim | grep -E '^(Package|Status|Version):'
echo "== kgpu --version"
kgpu --version | tee /tmp/version.txt
grep -Eq "^kgpu $KGPU_EXPECT_VERSION \(commit ([0-9a-f]{12}(-dirty)?|unknown)\)$" /tmp/version.txt || fail "kgpu --version"
echo "== the CUDA interposer loads into a process (LD_PRELOAD, as in a hard share container)"
LD_PRELOAD=/usr/lib/kgpu/$KGPU_EXPECT_VERSION/libkgpu-cuda.so kgpu --version >/tmp/preload.txt 2>&1 ||
  { cat /tmp/preload.txt; fail "kgpu --version under LD_PRELOAD of the interposer"; }
if grep -q 'ERROR\|cannot' /tmp/preload.txt; then cat /tmp/preload.txt; fail "the preloaded interposer complained"; fi
# The simulated node, as a demo or CI would use it: the library from kgpu-sim, a fixed profile.
export KGPU_NVML_LIBRARY=/usr/lib/kgpu/sim/libnvidia-ml.so.1 KGPU_SIM_NODE=dgx-h100 KGPU_SIM_STATE=/tmp/sim.state
echo "== kgpu devices"
kgpu devices | tee /tmp/devices.txt
[ "$(grep -c 'H100' /tmp/devices.txt)" -ge 8 ] || fail "kgpu devices does not list the 8 simulated H100s"
kgpu devices --json >/tmp/devices.json
[ "$(grep -c '"uuid": "GPU-' /tmp/devices.json)" -eq 8 ] || fail "kgpu devices --json does not have 8 GPU UUIDs"
echo "== kgpu-simctl lose 3 (the package's simctl changes the node the library simulates)"
kgpu-simctl lose 3
echo "== kgpu doctor"
# The device nodes the simulated GPUs would have (the node has none): NVIDIA's majors and minors.
mkdir -p /tmp/dev
mknod /tmp/dev/nvidiactl c 195 255 && mknod /tmp/dev/nvidia-uvm c 235 0
for i in 0 1 2 3 4 5 6 7; do mknod /tmp/dev/nvidia$i c 195 $i; done
rc=0
kgpu doctor --dev-root /tmp >/tmp/doctor.txt 2>&1 || rc=$?
cat /tmp/doctor.txt
grep -q '\[PASS\] NVML library' /tmp/doctor.txt || fail "doctor does not find the NVML library"
grep -q '\[PASS\] .*8 GPU' /tmp/doctor.txt || fail "doctor does not enumerate 8 GPUs"
grep -q '\[FAIL\].*GPU 3' /tmp/doctor.txt || fail "doctor does not FAIL on the lost GPU 3"
[ "$rc" -eq 1 ] || fail "doctor exited $rc with a FAIL, not 1"
kgpu-simctl reset
echo "== kgpu starts without the HTTP libraries and loads them for the exporter"
if ldd /usr/bin/kgpu | grep -E 'libcurl|libcpp-httplib|libssl|libcrypto'; then
  fail "kgpu links the libraries above at start-up"
fi
kgpu exporter --address 127.0.0.1:19400 --collect-interval 100 >/tmp/exporter.log 2>&1 &
exporter=$!
metrics=""
for _ in $(seq 100); do
  if { exec 3<>/dev/tcp/127.0.0.1/19400; } 2>/dev/null; then
    printf 'GET /metrics HTTP/1.0\r\nHost: localhost\r\n\r\n' >&3
    metrics=$(cat <&3)
    exec 3<&-
    grep -q '^DCGM_FI_DEV_GPU_TEMP{' <<<"$metrics" && break
  fi
  sleep 0.1
done
kill "$exporter"
wait "$exporter" || true
grep -q '^DCGM_FI_DEV_GPU_TEMP{' <<<"$metrics" || { cat /tmp/exporter.log; fail "kgpu exporter served no GPU temperatures on /metrics"; }
echo "/metrics: $(grep -c '^DCGM_FI_DEV_GPU_TEMP{' <<<"$metrics") GPU temperatures"
echo "inside: PASS"
INSIDE
chmod +x "$sysroot/tmp/inside.sh"

step "in the Debian 12 root (chroot)"
t0=$SECONDS
unshare --mount --propagation private bash -c '
  set -e
  mount -t proc proc "$1/proc"
  mount -t tmpfs tmpfs "$1/dev/shm" 2>/dev/null || true
  exec chroot "$1" env -i KGPU_EXPECT_VERSION="$2" /tmp/inside.sh
' _ "$sysroot" "$version"
echo "chroot part took $((SECONDS - t0)) s"
printf '\npackage.deb_in_debian12: PASS\n'
