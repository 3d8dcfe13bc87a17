// inventory_bench: how long gpu::Inventory::Discover takes against the simulated NVML.
//
//   BM_Discover/<node>   full discovery (GPUs, MIG devices and their profiles, NUMA nodes, topology
//                        of every GPU pair) through one nvml::Library that stays open
//   BM_ColdStart/<node>  Library::Open (dlopen, symbol resolution, nvmlInit) + Discover + close
//                        (nvmlShutdown, dlclose), as a one-shot CLI invocation pays it
//
// Nodes: dgx-a100-mig (8 x A100, GPU 0 with 4 and GPU 1 with 7 MIG devices) and dgx-h100 (8 x
// H100, no MIG). The simulated library is loaded from its build path (KGPU_SIM_LIB), never by
// soname, and its shared state lives in a private directory under /tmp that is removed at exit.
//
// Notes on what "cold" means here: the simulated library is linked with -z nodelete, so after the
// first load dlopen only bumps a reference count, and its node state stays mapped across
// nvmlShutdown/nvmlInit while the environment does not change. A cold start therefore measures
// kgpu's own per-start cost (dlopen call, _vN symbol probing, init/shutdown, discovery), not the
// first mmap of the node state.

#include <cstdio>
#include <cstring>
#include <memory>
#include <string>
#include <utility>

#include <benchmark/benchmark.h>
#include <dirent.h>
#include <stdlib.h>
#include <unistd.h>

#include "gpu/inventory.h"
#include "nvml/library.h"

#ifndef KGPU_SIM_LIB
#error "KGPU_SIM_LIB (path of the simulated libnvidia-ml.so.1) must be defined by the build"
#endif

namespace {

using kgpu::gpu::Inventory;
using kgpu::nvml::Library;

constexpr unsigned kWantGpus = 8;
constexpr const char* kMigNode = "dgx-a100-mig";
constexpr const char* kPlainNode = "dgx-h100";

std::string& StateDir() {
  static std::string dir;
  return dir;
}

std::string StatePath(const std::string& profile) {
  return StateDir() + "/" + profile + ".state";
}

// Points the simulated NVML at `profile`, with a state file private to this process. The library
// reads the environment on an nvmlInit that finds no other open client.
void SelectNode(const std::string& profile) {
  setenv("KGPU_SIM_NODE", profile.c_str(), 1);
  setenv("KGPU_SIM_STATE", StatePath(profile).c_str(), 1);
}

// The library held open across the iterations of a warm benchmark (one per process at a time:
// switching nodes needs every client of the simulated library closed).
struct Held {
  std::string profile;
  std::unique_ptr<Library> lib;
};
Held& held() {
  static Held h;
  return h;
}

void ReleaseHeld() {
  held().lib.reset();
  held().profile.clear();
}

absl::StatusOr<std::unique_ptr<Library>> OpenSim() {
  kgpu::nvml::LoadOptions options;
  options.path = KGPU_SIM_LIB;
  return Library::Open(options);
}

const Library* Acquire(benchmark::State& state, const std::string& profile) {
  Held& h = held();
  if (h.lib != nullptr && h.profile == profile) return h.lib.get();
  ReleaseHeld();
  SelectNode(profile);
  auto lib = OpenSim();
  if (!lib.ok()) {
    state.SkipWithError(("Library::Open: " + std::string(lib.status().message())).c_str());
    return nullptr;
  }
  h.lib = std::move(*lib);
  h.profile = profile;
  return h.lib.get();
}

size_t MigCount(const Inventory& inv) {
  size_t n = 0;
  for (const auto& g : inv.gpus()) n += g.migs.size();
  return n;
}

// Cheap per-iteration check: discovery succeeded and found the node's 8 GPUs.
bool Usable(benchmark::State& state, const absl::StatusOr<std::shared_ptr<const Inventory>>& inv) {
  if (!inv.ok()) {
    state.SkipWithError(("Inventory::Discover: " + std::string(inv.status().message())).c_str());
    return false;
  }
  if ((*inv)->gpus().size() != kWantGpus) {
    state.SkipWithError(("Inventory::Discover found " + std::to_string((*inv)->gpus().size()) + " GPUs, want " +
                         std::to_string(kWantGpus))
                            .c_str());
    return false;
  }
  return true;
}

// Full check, once per benchmark: no GPU failed to read and the MIG layout is the profile's.
bool Complete(benchmark::State& state, const Inventory& inv, size_t want_migs) {
  for (const auto& g : inv.gpus()) {
    if (!g.error.empty() || g.lost) {
      state.SkipWithError(("GPU " + std::to_string(g.index) + " not read: " + g.error).c_str());
      return false;
    }
  }
  if (MigCount(inv) != want_migs) {
    state.SkipWithError(("Inventory::Discover found " + std::to_string(MigCount(inv)) + " MIG devices, want " +
                         std::to_string(want_migs))
                            .c_str());
    return false;
  }
  return true;
}

void Report(benchmark::State& state, const Inventory& inv) {
  const auto gpus = static_cast<double>(inv.gpus().size());
  state.counters["gpus"] = gpus;
  state.counters["migs"] = static_cast<double>(MigCount(inv));
  state.counters["pairs"] = gpus * gpus;
}

void BM_Discover(benchmark::State& state, const char* profile, size_t want_migs) {
  const Library* lib = Acquire(state, profile);
  if (lib == nullptr) return;
  const kgpu::gpu::DiscoverOptions options;
  {
    auto first = Inventory::Discover(*lib, options);
    if (!Usable(state, first) || !Complete(state, **first, want_migs)) return;
    Report(state, **first);
  }
  for (auto _ : state) {
    auto inv = Inventory::Discover(*lib, options);
    benchmark::DoNotOptimize(inv);
    if (!Usable(state, inv)) break;
  }
}

void BM_ColdStart(benchmark::State& state, const char* profile, size_t want_migs) {
  // Every client closed, so each iteration's Open/close is a real nvmlInit/nvmlShutdown.
  ReleaseHeld();
  SelectNode(profile);
  const kgpu::gpu::DiscoverOptions options;
  {
    // Warm-up outside the timing: lets the simulated library re-read the environment (node switch).
    auto lib = OpenSim();
    if (!lib.ok()) {
      state.SkipWithError(("Library::Open: " + std::string(lib.status().message())).c_str());
      return;
    }
    auto first = Inventory::Discover(**lib, options);
    if (!Usable(state, first) || !Complete(state, **first, want_migs)) return;
    Report(state, **first);
  }
  for (auto _ : state) {
    auto lib = OpenSim();
    if (!lib.ok()) {
      state.SkipWithError(("Library::Open: " + std::string(lib.status().message())).c_str());
      break;
    }
    auto inv = Inventory::Discover(**lib, options);
    benchmark::DoNotOptimize(inv);
    if (!Usable(state, inv)) break;
    // Leaving scope: the inventory first, then the library (nvmlShutdown + dlclose).
  }
}

BENCHMARK_CAPTURE(BM_Discover, dgx_a100_mig, kMigNode, size_t{11})->Unit(benchmark::kMicrosecond);
BENCHMARK_CAPTURE(BM_Discover, dgx_h100, kPlainNode, size_t{0})->Unit(benchmark::kMicrosecond);
BENCHMARK_CAPTURE(BM_ColdStart, dgx_a100_mig, kMigNode, size_t{11})->Unit(benchmark::kMicrosecond);
BENCHMARK_CAPTURE(BM_ColdStart, dgx_h100, kPlainNode, size_t{0})->Unit(benchmark::kMicrosecond);

void RemoveStateDir() {
  const std::string& dir = StateDir();
  if (dir.empty()) return;
  if (DIR* d = opendir(dir.c_str())) {
    while (const dirent* e = readdir(d)) {
      if (std::strcmp(e->d_name, ".") != 0 && std::strcmp(e->d_name, "..") != 0) {
        unlink((dir + "/" + e->d_name).c_str());
      }
    }
    closedir(d);
  }
  rmdir(dir.c_str());
}

}  // namespace

int main(int argc, char** argv) {
  // Before anything opens NVML: a private state directory and the MIG node.
  char tmpl[] = "/tmp/kgpu-inventory-bench.XXXXXX";
  if (mkdtemp(tmpl) == nullptr) {
    std::perror("inventory_bench: mkdtemp /tmp/kgpu-inventory-bench.XXXXXX");
    return 1;
  }
  StateDir() = tmpl;
  SelectNode(kMigNode);

  benchmark::Initialize(&argc, argv);
  if (benchmark::ReportUnrecognizedArguments(argc, argv)) {
    RemoveStateDir();
    return 1;
  }
  benchmark::RunSpecifiedBenchmarks();
  benchmark::Shutdown();
  ReleaseHeld();
  RemoveStateDir();
  return 0;
}
