# The README's contract: `make demo` and `make test` on a fresh Debian 12 machine.
SHELL := /bin/bash
.DEFAULT_GOAL := build
PRESET ?= dev
JOBS ?= $(shell nproc)
# ccache (CMakeLists.txt uses it when installed) hits across checkouts: CI builds a fresh clone in
# another folder, so paths under the tree are hashed relative to it and the build directory is not
# hashed (debug info may then name the first checkout's paths; nothing reads them but debuggers).
export CCACHE_BASEDIR := $(CURDIR)
export CCACHE_NOHASHDIR := 1

.PHONY: deps build test test-quick demo bench bench-smoke fuzz package image format check-format clean

deps:
	@./scripts/install-deps.sh

build: deps
	cmake --preset $(PRESET) >/dev/null
	cmake --build --preset $(PRESET) -j $(JOBS)

# ASan + UBSan build, every test but those that need a real GPU (label gpu) or are slow.
test: deps
	cmake --preset asan >/dev/null
	cmake --build --preset asan -j $(JOBS)
	ctest --preset asan -j $(JOBS)

# The same without the tests labelled slow (minutes each: the Slurm bridge, the end-to-end cluster,
# the replay): a quick local loop. `make test` and CI run everything.
test-quick: deps
	cmake --preset asan >/dev/null
	cmake --build --preset asan -j $(JOBS)
	ctest --preset asan -j $(JOBS) -LE 'gpu|slow|package'

demo:
	@./scripts/install-deps.sh --demo
	cmake --preset dev >/dev/null
	cmake --build --preset dev -j $(JOBS) --target kgpu kgpu-simctl kgpu_simnvml kgpu-fake-kubelet kgpu-fake-apiserver \
	  kgpu-slurm-testcluster kgpu-demo-cluster kgpu-demo-dra kgpu_cuda_interposer kgpu_iso_driver kgpu_compute_driver kgpu_simnvml_plain
	./scripts/demo.sh build/dev

bench: deps
	cmake --preset release >/dev/null
	cmake --build --preset release -j $(JOBS) --target $(BENCH_TARGETS)
	build/release/bin/inventory_bench
	build/release/bin/event_latency
	build/release/bin/device_plugin_bench
	./bench/static_vs_shared.sh
	build/release/bin/exporter_bench
	build/release/bin/mig_mps_bench
	build/release/bin/k8s_bench
	build/release/bin/sched_bench
	build/release/bin/extender_bench 1000 5000
	build/release/bin/slurm_bridge_bench
	build/release/bin/dra_bench

# Every bench once at a tiny size (seconds): that each still runs to its end. CI runs it.
BENCH_TARGETS := inventory_bench event_latency device_plugin_bench exporter_bench mig_mps_bench k8s_bench sched_bench \
  extender_bench slurm_bridge_bench dra_bench
bench-smoke: deps
	cmake --preset release >/dev/null
	cmake --build --preset release -j $(JOBS) --target $(BENCH_TARGETS)
	./bench/smoke.sh build/release

# Debian packages kgpu and kgpu-sim (release preset, CPack DEB, Depends from dpkg-shlibdeps) in
# build/release/packages/.
package: deps
	cmake --preset release >/dev/null
	cmake --build --preset release -j $(JOBS) --target kgpu kgpu-simctl kgpu_simnvml kgpu_cuda_interposer
	rm -f build/release/packages/*.deb
	cd build/release && cpack -G DEB
	@ls -l build/release/packages/*.deb

# The OCI image that deploy/ runs, without a container engine (scripts/make-image.sh): Debian 12
# minbase with the kgpu package, as build/release/image/kgpu-<version>.oci.tar (skopeo copy,
# podman load, ctr import) and kgpu-<version>.docker.tar (docker load). The version is
# project(VERSION) in CMakeLists.txt. Needs root for debootstrap and chroot (sudo when not root),
# so git runs here: the commit's time (SOURCE_DATE_EPOCH) and hash go to the script. Passed on
# when set: KGPU_DEBIAN_SNAPSHOT (a snapshot.debian.org time stamp, for the same image later),
# KGPU_DEBIAN_MIRROR, KGPU_DEBIAN_SECURITY_MIRROR, KGPU_IMAGE_NAME (default localhost/kgpu).
VERSION := $(shell grep -m1 -oE '^project.kgpu VERSION [0-9.]+' CMakeLists.txt | cut -d' ' -f3)
SUDO := $(if $(filter 0,$(shell id -u)),,sudo)
IMAGE_VARS := KGPU_DEBIAN_SNAPSHOT KGPU_DEBIAN_MIRROR KGPU_DEBIAN_SECURITY_MIRROR KGPU_IMAGE_NAME
image: package
	$(SUDO) env SOURCE_DATE_EPOCH="$${SOURCE_DATE_EPOCH:-$$(git log -1 --format=%ct)}" \
	  KGPU_IMAGE_REVISION="$$(git rev-parse HEAD)$$([ -z "$$(git status --porcelain --untracked-files=no)" ] || echo -dirty)" \
	  $(foreach v,$(IMAGE_VARS),$(if $($(v)),$(v)='$($(v))')) \
	  ./scripts/make-image.sh . $(VERSION) build/release/image build/cache

# libFuzzer (clang): FUZZ_SECONDS per target, corpus grows in build/fuzz/corpus-*.
FUZZ_SECONDS ?= 60
# One list, the same as KGPU_FUZZ_TARGETS in tests/CMakeLists.txt.
FUZZ_TARGETS := profile config cgroup checkpoint counters mig_minors health_file kubeconfig watch_decoder extender_wire slurm_parse sched_csv quota_shares webhook_review csv web_config device_selector
fuzz: deps
	cmake --preset fuzz >/dev/null
	cmake --build --preset fuzz -j $(JOBS) --target $(addsuffix _fuzz,$(FUZZ_TARGETS))
	for t in $(FUZZ_TARGETS); do mkdir -p build/fuzz/corpus-$$t && \
	  build/fuzz/tests/$${t}_fuzz -max_total_time=$(FUZZ_SECONDS) build/fuzz/corpus-$$t tests/fuzz/corpus/$$t || exit 1; done

format:
	clang-format -i $$(git ls-files '*.cc' '*.h' '*.c')

check-format:
	./scripts/check-format.sh

clean:
	rm -rf build
