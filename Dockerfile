# The kgpu image with a container engine. `make image` (scripts/make-image.sh) builds the same
# image without one, reproducibly, as archives to push or import (README.md, "Install"); this file is
# for those who build with docker or podman:
#
#   docker build -t localhost/kgpu:0.1.0 --build-arg KGPU_GIT_COMMIT=$(git rev-parse --short=12 HEAD) .
#
# (the version being project(VERSION) in CMakeLists.txt; deploy/kustomization.yaml's `images:`
# sets which image the manifests run). Stage 1 builds the Debian packages on Debian 12 (`make
# package`'s steps: release preset, CPack DEB, Depends from dpkg-shlibdeps). Stage 2 is
# debian:12-slim with the kgpu package installed by apt, which pulls exactly those Depends. The
# default user is the unprivileged kgpu (uid 65532): `kgpu devices` / `kgpu doctor` need no more.
# The entrypoint is kgpu, so a manifest's `args:` are kgpu's arguments. The device plugin, the
# exporter and `kgpu node` need root for the kubelet's sockets, so their DaemonSets set
# runAsUser: 0 (and drop every capability). tests/package/package_test.sh checks what stage 2
# holds (no Docker engine needed): the same packages installed with apt into a debootstrap'ed
# Debian 12 root, run in a chroot; tests/package/image_test.sh checks `make image`'s image.

FROM debian:12 AS build
ARG KGPU_GIT_COMMIT=
WORKDIR /src
COPY scripts/install-deps.sh scripts/install-deps.sh
RUN ./scripts/install-deps.sh --build
COPY . .
RUN cmake --preset release -DKGPU_BUILD_TESTS=OFF -DKGPU_BUILD_BENCH=OFF -DKGPU_GIT_COMMIT="${KGPU_GIT_COMMIT}" \
 && cmake --build --preset release --target kgpu kgpu-simctl kgpu_simnvml kgpu_cuda_interposer \
 && cd build/release && cpack -G DEB

FROM debian:12-slim
COPY --from=build /src/build/release/packages/kgpu_*.deb /tmp/
RUN apt-get update \
 && DEBIAN_FRONTEND=noninteractive apt-get install -y --no-install-recommends /tmp/kgpu_*.deb \
 && rm -rf /var/lib/apt/lists/* /tmp/kgpu_*.deb \
 && groupadd --gid 65532 kgpu \
 && useradd --uid 65532 --gid kgpu --no-create-home --home-dir /nonexistent --shell /usr/sbin/nologin kgpu \
 && kgpu --version
USER 65532:65532
ENTRYPOINT ["kgpu"]
CMD ["--help"]
