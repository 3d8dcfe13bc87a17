# The README's contract: `make demo` and `make test` on a fresh Debian 12 machine.
SHELL := /bin/bash
.DEFAULT_GOAL := build
PRESET ?= dev
JOBS ?= $(shell nproc)

.PHONY: deps build test demo bench fuzz package format clean

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

demo: deps
	cmake --preset dev >/dev/null
	cmake --build --preset dev -j $(JOBS) --target kgpu kgpu-simctl kgpu_simnvml kgpu-fake-kubelet kgpu-fake-apiserver \
	  kgpu-slurm-testcluster kgpu-demo-cluster
	./scripts/demo.sh build/dev

bench: deps
	cmake --preset release >/dev/null
	cmake --build --preset release -j $(JOBS) --target inventory_bench event_latency device_plugin_bench exporter_bench mig_mps_bench k8s_bench sched_bench extender_bench
	build/release/bin/inventory_bench
	build/release/bin/event_latency
	build/release/bin/device_plugin_bench
	./bench/static_vs_shared.sh
	build/release/bin/exporter_bench
	build/release/bin/mig_mps_bench
	build/release/bin/k8s_bench
	build/release/bin/sched_bench
	build/release/bin/extender_bench 1000 5000

# Debian packages kgpu and kgpu-sim (release preset, CPack DEB, Depends from dpkg-shlibdeps) in
# build/release/packages/.
package: deps
	cmake --preset release >/dev/null
	cmake --build --preset release -j $(JOBS) --target kgpu kgpu-simctl kgpu_simnvml kgpu_cuda_interposer
	rm -f build/release/packages/*.deb
	cd build/release && cpack -G DEB
	@ls -l build/release/packages/*.deb

# libFuzzer (clang): FUZZ_SECONDS per target, corpus grows in build/fuzz/corpus-*.
FUZZ_SECONDS ?= 60
# One list, the same as KGPU_FUZZ_TARGETS in tests/CMakeLists.txt.
FUZZ_TARGETS := profile config cgroup checkpoint counters mig_minors health_file kubeconfig watch_decoder extender_wire slurm_parse sched_csv quota_shares webhook_review
fuzz: deps
	cmake --preset fuzz >/dev/null
	cmake --build --preset fuzz -j $(JOBS) --target $(addsuffix _fuzz,$(FUZZ_TARGETS))
	for t in $(FUZZ_TARGETS); do mkdir -p build/fuzz/corpus-$$t && \
	  build/fuzz/tests/$${t}_fuzz -max_total_time=$(FUZZ_SECONDS) build/fuzz/corpus-$$t tests/fuzz/corpus/$$t || exit 1; done

format:
	clang-format -i $$(git ls-files '*.cc' '*.h' '*.c')

clean:
	rm -rf build
