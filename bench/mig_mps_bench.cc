// mig_mps_bench: figures for MIG re-partitioning and MPS allocation, on the simulated nodes.
//
//   mig_mps_bench [--repartitions N] [--follow N] [--rescan-ms MS]
//
// Figures, one line each:
//   1. MigFingerprintNow on dgx-a100-mig (8 A100, 11 MIG devices): the device plugin's and the
//      exporter's periodic "did the layout change" check (N=2000 calls, in process).
//   2. One GPU re-partitioned in process: PlanMigChange + ApplyMigChange, GPU 1 alternating between
//      7x 1g.5gb and 3x 2g.10gb + 1g.5gb (--repartitions, default 200). This is the simulated
//      NVML's cost: on a real GPU creating instances takes seconds, the driver's work.
//   3. Re-partition -> kubelet: `kgpu device-plugin --mig-strategy mixed` as a child with
//      mig.rescanInterval = --rescan-ms (default 100) against the kubelet stand-in in this process;
//      from the end of ApplyMigChange until the stand-in's ListAndWatch streams show the new
//      device counts for every MIG resource (--follow samples, default 20, each started at a random
//      phase of the rescan timer, at most 1 s). NVML's MIG configuration-change event wakes the
//      plugin; the timer is the fallback. Expected: ~100 ms debounce + re-discovery + re-registration.
//   4. MPS Allocate (pure function, no gRPC) of 1 and of 3 replicas on dgx-h100, 4 replicas per
//      GPU, failRequestsGreaterThanOne false (N=20000 calls each).
//
// Exit status: 0 when every step worked, 1 when something failed, 2 on bad usage.

#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <map>
#include <memory>
#include <string>
#include <thread>
#include <vector>

#include <signal.h>
#include <unistd.h>

#include "bench_util.h"
#include "deviceplugin/allocator.h"
#include "deviceplugin/config.h"
#include "deviceplugin/plan.h"
#include "gpu/inventory.h"
#include "gpu/mig_layout.h"
#include "nvml/library.h"
#include "testing/fake_kubelet.h"

extern char** environ;  // NOLINT: POSIX

namespace {

using kgpu::bench::NowNs;
using kgpu::bench::Summarize;

void Print(const char* what, const std::vector<double>& us) {
  const auto s = Summarize(us);
  std::printf("%-52s n=%zu p50=%.1f us p90=%.1f us p99=%.1f us max=%.1f us\n", what, s.n, s.p50, s.p90, s.p99, s.max);
}

struct Node {
  explicit Node(const std::string& profile, const std::string& dir) {
    setenv("KGPU_SIM_NODE", profile.c_str(), 1);
    setenv("KGPU_SIM_STATE", (dir + "/" + profile + ".state").c_str(), 1);
    setenv("KGPU_SIM_NODE_NAME", "bench-node", 1);
    auto l = kgpu::nvml::Library::Open({KGPU_SIM_LIB});
    if (!l.ok()) {
      std::fprintf(stderr, "mig_mps_bench: %s\n", std::string(l.status().message()).c_str());
      std::exit(1);
    }
    lib = std::move(*l);
    Rediscover();
  }
  void Rediscover() {
    auto i = kgpu::gpu::Inventory::Discover(*lib, {});
    if (!i.ok()) {
      std::fprintf(stderr, "mig_mps_bench: %s\n", std::string(i.status().message()).c_str());
      std::exit(1);
    }
    inv = *i;
  }
  std::unique_ptr<kgpu::nvml::Library> lib;
  std::shared_ptr<const kgpu::gpu::Inventory> inv;
};

const kgpu::gpu::MigTarget kLayoutA{1, true, std::vector<std::string>(7, "1g.5gb")};
const kgpu::gpu::MigTarget kLayoutB{1, true, {"1g.5gb", "2g.10gb", "2g.10gb", "2g.10gb"}};

bool Repartition(Node& n, const kgpu::gpu::MigTarget& target) {
  auto change = kgpu::gpu::PlanMigChange(*n.lib, n.inv->gpus()[1], target);
  if (!change.ok()) {
    std::fprintf(stderr, "mig_mps_bench: plan: %s\n", std::string(change.status().message()).c_str());
    return false;
  }
  auto applied = kgpu::gpu::ApplyMigChange(*n.lib, n.inv->gpus()[1], *change);
  if (!applied.ok()) {
    std::fprintf(stderr, "mig_mps_bench: apply: %s\n", std::string(applied.status().message()).c_str());
    return false;
  }
  n.Rediscover();
  return true;
}

}  // namespace

int main(int argc, char** argv) {
  int repartitions = 200, follow = 20, rescan_ms = 100;
  for (int i = 1; i < argc; ++i) {
    const std::string a = argv[i];
    auto next = [&]() -> int {
      if (i + 1 >= argc) {
        std::fprintf(stderr, "mig_mps_bench: %s needs a value\n", a.c_str());
        std::exit(2);
      }
      return std::atoi(argv[++i]);
    };
    if (a == "--repartitions") {
      repartitions = next();
    } else if (a == "--follow") {
      follow = next();
    } else if (a == "--rescan-ms") {
      rescan_ms = next();
    } else {
      std::fprintf(stderr, "usage: mig_mps_bench [--repartitions N] [--follow N] [--rescan-ms MS]\n");
      return 2;
    }
  }
  kgpu::bench::InstallFatalSignalHandlers({SIGINT, SIGTERM});
  const std::string dir = kgpu::bench::MakeTempDir("/tmp/mmb-XXXXXX");
  int rc = 0;
  {
    Node n("dgx-a100-mig", dir);
    std::vector<double> us;
    for (int i = 0; i < 2000; ++i) {
      const int64_t t0 = NowNs();
      const std::string f = kgpu::gpu::MigFingerprintNow(*n.lib, *n.inv);
      us.push_back(static_cast<double>(NowNs() - t0) / 1e3);
      if (f.empty()) rc = 1;
    }
    Print("MigFingerprintNow (8 GPUs, 11 MIG devices)", us);
    us.clear();
    for (int i = 0; i < repartitions; ++i) {
      const int64_t t0 = NowNs();
      if (!Repartition(n, i % 2 == 0 ? kLayoutB : kLayoutA)) return 1;
      us.push_back(static_cast<double>(NowNs() - t0) / 1e3);
    }
    Print("re-partition 1 GPU in process (plan+apply+discover)", us);

    // 3. The plugin process follows; the kubelet stand-in sees the new lists.
    {
      std::ofstream(dir + "/plugin.yaml")
          << "version: v1\nflags:\n  migStrategy: mixed\nmig:\n  rescanInterval: " << rescan_ms << "ms\n";
      std::filesystem::create_directories(dir + "/kubelet");
      kgpu::testing::FakeKubelet kubelet(dir + "/kubelet");
      if (!kubelet.Start().ok()) return 1;
      setenv("LD_LIBRARY_PATH", std::filesystem::path(KGPU_SIM_LIB).parent_path().c_str(), 1);
      const pid_t plugin = kgpu::bench::Spawn({KGPU_BIN, "--log-level", "warn", "device-plugin", "--kubelet-dir",
                                               dir + "/kubelet", "--config-file", dir + "/plugin.yaml"},
                                              environ, dir + "/plugin.log");
      auto counts_are = [&](size_t small, size_t twog) {
        auto a = kubelet.Get("nvidia.com/mig-1g.5gb");
        auto b = kubelet.Get("nvidia.com/mig-2g.10gb");
        return a && b && a->devices.size() == small && b->devices.size() == twog;
      };
      // GPU 0 keeps 2x 1g.5gb + 2g.10gb; GPU 1 is in layout A (after an even number of repartitions).
      const int64_t deadline0 = NowNs() + 10'000'000'000LL;
      while (!counts_are(9, 1) && NowNs() < deadline0) std::this_thread::sleep_for(std::chrono::milliseconds(5));
      if (!counts_are(9, 1)) {
        std::fprintf(stderr, "mig_mps_bench: the plugin did not register (see %s/plugin.log)\n", dir.c_str());
        rc = 1;
      } else {
        us.clear();
        for (int i = 0; i < follow; ++i) {
          const bool to_b = i % 2 == 0;
          // At a random phase of the plugin's rescan timer.
          std::this_thread::sleep_for(std::chrono::microseconds(std::rand() % (std::min(rescan_ms, 1000) * 1000 + 1)));
          if (!Repartition(n, to_b ? kLayoutB : kLayoutA)) return 1;
          const int64_t t0 = NowNs();
          const int64_t deadline = t0 + 10'000'000'000LL;
          while (!(to_b ? counts_are(3, 4) : counts_are(9, 1)) && NowNs() < deadline) {
            std::this_thread::sleep_for(std::chrono::microseconds(200));
          }
          if (NowNs() >= deadline) {
            std::fprintf(stderr, "mig_mps_bench: the plugin did not follow within 10 s\n");
            rc = 1;
            break;
          }
          us.push_back(static_cast<double>(NowNs() - t0) / 1e3);
        }
        char what[96];
        std::snprintf(what, sizeof what, "re-partition -> kubelet lists (rescan %d ms)", rescan_ms);
        Print(what, us);
      }
      kill(plugin, SIGTERM);
      waitpid(plugin, nullptr, 0);
      kgpu::bench::UntrackChild(plugin);
      kubelet.Stop();
    }
  }
  {
    Node n("dgx-h100", dir);
    auto c = kgpu::deviceplugin::ParseConfig(
        "flags:\n  mpsRoot: /run/nvidia/mps\nsharing:\n  mps:\n    failRequestsGreaterThanOne: false\n"
        "    resources:\n    - {name: gpu, replicas: 4}\n",
        "bench");
    auto plan = kgpu::deviceplugin::BuildPlan(n.inv, *c);
    if (!plan.ok()) return 1;
    const auto& r = (*plan)->resources[0];
    for (size_t k : {1U, 3U}) {
      std::vector<std::string> ids;
      for (size_t i = 0; i < k; ++i) ids.push_back(r.devices[i].id);
      std::vector<double> us;
      for (int i = 0; i < 20000; ++i) {
        const int64_t t0 = NowNs();
        auto a = kgpu::deviceplugin::Allocate(**plan, r, *c, ids, "bench");
        us.push_back(static_cast<double>(NowNs() - t0) / 1e3);
        if (!a.ok()) rc = 1;
      }
      Print(k == 1 ? "MPS Allocate, 1 replica (in process)" : "MPS Allocate, 3 replicas (in process)", us);
    }
  }
  kgpu::bench::RemoveTree(dir);
  return rc;
}
