// sched_bench: the placement engine's cost for one pod (filter + score over every node, the
// choice of node and GPUs: sched::Engine::Choose), the issue-10 target being <= 2 ms p99 on one
// core at 5,000 nodes / 40,000 GPUs, and its memory against cluster size.
//
// Cluster: N nodes of 8 GPUs each in the mix of the default trace's 8-GPU nodes (549 G2 with
// 96 cores / 384 GiB, 39 G3 with 128 cores / 768 GiB, 21 V100M32 with 96 cores / 768 GiB), filled
// by policy `ours` with pods drawn uniformly from the default trace
// (data/alibaba-gpu-v2023/openb_pod_list_default.csv) until kFill of the GPU milli is allocated
// (a pod that does not fit is dropped, as in the replay). The same placements are bound into a
// second engine with policy `fgd` (the trace's typical pods, as `kgpu sim` gives it).
//
//   BM_Choose/<policy>/<pod>/<nodes>   one timed Engine::Choose per iteration, each iteration's time
//                                      recorded (manual time); counters p50_us, p99_us, max_us are
//                                      nearest-rank over the iterations. Between timed calls (not
//                                      timed) the cluster churns: the oldest background pod leaves
//                                      and new trace pods arrive until the fill is back, so each
//                                      Choose sees a few nodes changed since the last one, as a
//                                      scheduler does. `ours` also learns from every arrival,
//                                      including the timed pod, and refreshes its learned
//                                      distribution every 256 arrivals (a full re-evaluation of
//                                      every node); those iterations are in the percentiles.
//   pods: share (1 GPU x 500 milli, 4 cores, 16 GiB), gpu1 (1 whole GPU, 8 cores, 32 GiB),
//         gpu4 (4 whole GPUs, 32 cores, 128 GiB).
//
// Memory: before the benchmarks the clusters of 1,250, 2,500 and 5,000 nodes are built in that
// order and all kept; the VmRSS growth over each build (both engines, their pods and caches) is
// printed per node. Linear in cluster size means about the same bytes per node at every size.

#include <cstdio>
#include <deque>
#include <map>
#include <memory>
#include <string>
#include <vector>

#include <benchmark/benchmark.h>
#include <unistd.h>

#include "bench_util.h"
#include "common/files.h"
#include "sched/engine.h"
#include "sched/frag.h"
#include "sched/policy.h"
#include "sched/rng.h"
#include "sched/trace.h"

#ifndef KGPU_SOURCE_DIR
#error "KGPU_SOURCE_DIR (the source tree, for the default trace) must be defined by the build"
#endif

namespace {

using namespace kgpu::sched;  // NOLINT(google-build-using-namespace): a benchmark driver

constexpr double kFill = 0.80;     // GPU milli allocated before timing
constexpr int kIterations = 2000;  // timed Choose calls per case
constexpr int kSizes[] = {1250, 2500, 5000};

std::vector<PodRequest>& TracePods() {
  static std::vector<PodRequest> pods;
  return pods;
}

std::vector<NodeSpec> MakeNodes(int count) {
  struct Kind {
    const char* model;
    int64_t cpu, memory;
    int weight;
  };
  static const Kind kinds[] = {{"G2", 96000, 393216, 549}, {"G3", 128000, 786432, 39}, {"V100M32", 96000, 786432, 21}};
  int total = 0;
  for (const auto& k : kinds) total += k.weight;
  Rng rng(7);
  std::vector<NodeSpec> out;
  out.reserve(static_cast<size_t>(count));
  for (int i = 0; i < count; ++i) {
    auto pick = static_cast<int>(rng.Below(static_cast<uint64_t>(total)));
    const Kind* kind = &kinds[0];
    for (const auto& k : kinds) {
      if (pick < k.weight) {
        kind = &k;
        break;
      }
      pick -= k.weight;
    }
    NodeSpec n;
    n.name = "node-" + std::to_string(i);
    n.cpu_milli = kind->cpu;
    n.memory_mib = kind->memory;
    for (int g = 0; g < 8; ++g) {
      GpuSpec gs;
      gs.model = kind->model;
      gs.memory_mib = KnownGpuMemoryMib(kind->model);
      n.gpus.push_back(gs);
    }
    out.push_back(std::move(n));
  }
  return out;
}

// One policy's engine and the background pods it holds, oldest first.
struct Side {
  std::unique_ptr<Engine> engine;
  std::deque<std::string> background;
  Rng rng{11};
  uint64_t next_name = 0;

  double Fill() const {
    const auto& c = engine->cluster();
    return static_cast<double>(c.AllocatedGpuMilli()) / static_cast<double>(c.TotalGpuMilli());
  }
  // Schedules trace pods until the fill is reached (at most `max_tries` tries).
  void Top(int max_tries) {
    const auto& trace = TracePods();
    for (int t = 0; t < max_tries && Fill() < kFill; ++t) {
      PodRequest p = trace[static_cast<size_t>(rng.Below(trace.size()))];
      p.name = "bg-" + std::to_string(next_name++);
      if (engine->Schedule(p).ok()) background.push_back(p.name);
    }
  }
  // One churn step: the oldest background pod leaves, new ones come until the fill is back.
  void Churn() {
    if (!background.empty()) {
      (void)engine->Release(background.front());
      background.pop_front();
    }
    Top(8);
  }
};

struct State {
  int nodes = 0;
  Side ours, fgd;
  double rss_growth_mb = 0;
  double build_s = 0;
};

std::map<int, std::unique_ptr<State>>& States() {
  static std::map<int, std::unique_ptr<State>> states;
  return states;
}

double RssMb() {
  return kgpu::bench::ReadProcMem(getpid()).rss_mb;
}

std::unique_ptr<State> Build(int count) {
  auto st = std::make_unique<State>();
  st->nodes = count;
  const auto nodes = MakeNodes(count);
  PolicyOptions po;
  st->ours.engine = std::make_unique<Engine>(*MakePolicy("ours", po), 42);
  for (const auto& n : nodes) (void)*st->ours.engine->AddNode(n);
  // fgd: the trace's typical pods, compiled against this cluster's models.
  std::vector<Request> compiled;
  for (const auto& p : TracePods()) compiled.push_back(*st->ours.engine->cluster().Compile(p));
  po.shapes = TypicalShapes(compiled);
  st->fgd.engine = std::make_unique<Engine>(*MakePolicy("fgd", po), 42);
  for (const auto& n : nodes) (void)*st->fgd.engine->AddNode(n);

  // Fill by ours; the same placements bound into fgd's cluster.
  Side& o = st->ours;
  const auto& trace = TracePods();
  int misses = 0;
  while (o.Fill() < kFill && misses < 2000) {
    PodRequest p = trace[static_cast<size_t>(o.rng.Below(trace.size()))];
    p.name = "bg-" + std::to_string(o.next_name++);
    auto placed = o.engine->Schedule(p);
    if (!placed.ok()) {
      ++misses;
      continue;
    }
    o.background.push_back(p.name);
    auto bound = st->fgd.engine->Bind(p, *placed);
    if (!bound.ok()) {
      std::fprintf(stderr, "sched_bench: binding %s into the fgd cluster: %s\n", p.name.c_str(),
                   std::string(bound.message()).c_str());
      std::exit(1);
    }
    st->fgd.background.push_back(p.name);
  }
  st->fgd.next_name = o.next_name;
  return st;
}

PodRequest TimedPod(const std::string& kind) {
  PodRequest p;
  p.name = "timed-" + kind;
  if (kind == "share") {
    p.cpu_milli = 4000, p.memory_mib = 16384, p.num_gpus = 1, p.gpu_milli = 500;
  } else if (kind == "gpu1") {
    p.cpu_milli = 8000, p.memory_mib = 32768, p.num_gpus = 1, p.gpu_milli = 1000;
  } else {
    p.cpu_milli = 32000, p.memory_mib = 131072, p.num_gpus = 4, p.gpu_milli = 1000;
  }
  return p;
}

void BM_Choose(benchmark::State& state, std::string policy, std::string kind) {
  const int nodes = static_cast<int>(state.range(0));
  State& st = *States().at(nodes);
  Side& side = policy == "fgd" ? st.fgd : st.ours;
  const PodRequest pod = TimedPod(kind);
  std::vector<double> us;
  us.reserve(static_cast<size_t>(state.max_iterations));
  int64_t fitted = 0;
  for (auto _ : state) {
    side.Churn();
    const int64_t t0 = kgpu::bench::NowNs();
    auto placed = side.engine->Choose(pod);
    const int64_t t1 = kgpu::bench::NowNs();
    benchmark::DoNotOptimize(placed);
    if (placed.ok()) ++fitted;
    const double s = static_cast<double>(t1 - t0) * 1e-9;
    state.SetIterationTime(s);
    us.push_back(s * 1e6);
  }
  const auto sum = kgpu::bench::Summarize(us);
  state.counters["p50_us"] = sum.p50;
  state.counters["p99_us"] = sum.p99;
  state.counters["max_us"] = sum.max;
  state.counters["fit_%"] = 100.0 * static_cast<double>(fitted) / static_cast<double>(us.size());
  state.counters["gpu_fill_%"] = 100.0 * side.Fill();
  std::printf(
      "%-6s %-5s %5d nodes (%5d GPUs, %.1f %% GPU milli allocated): p50 %.0f us, p99 %.0f us, max %.0f us "
      "over %zu pods -- p99 %s the 2 ms target\n",
      policy.c_str(), kind.c_str(), nodes, nodes * 8, 100.0 * side.Fill(), sum.p50, sum.p99, sum.max, us.size(),
      sum.p99 <= 2000 ? "within" : "ABOVE");
}

}  // namespace

int main(int argc, char** argv) {
  const std::string trace_path = std::string(KGPU_SOURCE_DIR) + "/data/alibaba-gpu-v2023/openb_pod_list_default.csv";
  auto text = kgpu::ReadInputFile(trace_path, "pod list", "run from a full source tree");
  if (!text.ok()) {
    std::fprintf(stderr, "sched_bench: %s\n", std::string(text.status().message()).c_str());
    return 1;
  }
  auto pods = ParsePodsCsv(*text, trace_path);
  if (!pods.ok()) {
    std::fprintf(stderr, "sched_bench: %s\n", std::string(pods.status().message()).c_str());
    return 1;
  }
  for (const auto& t : *pods) TracePods().push_back(t.request);

  benchmark::Initialize(&argc, argv);
  // --smoke (after Google Benchmark's own flags are taken out): one small cluster and few calls, so
  // a CI step can see the bench run to its end in seconds (bench/smoke.sh). No figure to keep.
  std::vector<int> sizes(std::begin(kSizes), std::end(kSizes));
  int iterations = kIterations;
  for (int i = 1; i < argc; ++i) {
    if (std::string(argv[i]) == "--smoke") {
      sizes = {100};
      iterations = 20;
    } else {
      std::fprintf(stderr, "sched_bench: unknown argument %s (Google Benchmark's --benchmark_* flags, or --smoke)\n",
                   argv[i]);
      return 2;
    }
  }
  std::printf("sched_bench: clusters of 8-GPU nodes filled to %.0f %% GPU milli by `ours` with pods drawn from %s\n",
              kFill * 100, trace_path.c_str());
  std::printf("memory (VmRSS growth while building each cluster: both engines, %zu trace pods' shapes, bound pods):\n",
              TracePods().size());
  for (int n : sizes) {
    const double before = RssMb();
    const int64_t t0 = kgpu::bench::NowNs();
    auto st = Build(n);
    st->build_s = static_cast<double>(kgpu::bench::NowNs() - t0) * 1e-9;
    st->rss_growth_mb = RssMb() - before;
    std::printf(
        "  %5d nodes / %5d GPUs: +%.2f MB (%.0f bytes per node), %zu pods bound per engine, %.2f %% GPU "
        "milli allocated, built in %.1f s\n",
        n, n * 8, st->rss_growth_mb, st->rss_growth_mb * 1048576.0 / n, st->ours.background.size(),
        100.0 * st->ours.Fill(), st->build_s);
    std::fflush(stdout);
    States()[n] = std::move(st);
  }
  for (const char* policy : {"ours", "fgd"}) {
    for (const char* kind : {"share", "gpu1", "gpu4"}) {
      auto* b = benchmark::RegisterBenchmark((std::string("BM_Choose/") + policy + "/" + kind).c_str(), BM_Choose,
                                             std::string(policy), std::string(kind));
      for (int n : sizes) b->Arg(n);
      b->Iterations(iterations)->UseManualTime()->Unit(benchmark::kMicrosecond);
    }
  }
  benchmark::RunSpecifiedBenchmarks();
  benchmark::Shutdown();
  return 0;
}
