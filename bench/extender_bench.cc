// extender_bench: plain driver. `kgpu extender` as a child process against the API server
// stand-in (in this process) holding N GPU nodes (8 GPUs each: half serve shares, a quarter whole
// GPUs, a quarter MIG 7x1g.10gb) and 2 bound pods with allocation records per node:
//   1. time to ready (both informers synced, every record booked) and the extender's RSS;
//   2. filter and prioritize latency over HTTP keep-alive, with the headers kube-scheduler's Go
//      client sends (Accept-Encoding: gzip), p50/p99 (a gzipped answer is marked [gzip]), for a share pod, a whole-GPU
//      pod and a MIG pod: with every node in NodeNames (percentageOfNodesToScore: 100, the worst
//      case), and with kube-scheduler's default sample of the nodes that pass its in-tree filters
//      (what it sends by default: 500 of 5,000 nodes); then where a filter's time goes in process;
//   3. pods scheduled per second through the kube-scheduler stand-in (scheduling cycles one at a
//      time with its default node sample, then bind: one pods/binding carrying the record), with 1
//      and 4 threads (4: binding cycles overlap the next scheduling cycles, as in kube-scheduler).
// Usage: extender_bench [nodes...]   (default: 1000 5000)
//        extender_bench --in-process ROUNDS [nodes]   (the in-process breakdown only, for a profiler)
//        extender_bench --throughput-only [nodes]     (start-up and pods per second only)
#include <algorithm>
#include <atomic>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <fstream>
#include <string>
#include <thread>
#include <vector>

#include <httplib.h>

#include "api/record.h"
#include "bench_util.h"
#include "extender/state.h"
#include "extender/wire.h"
#include "k8s/client.h"
#include "testing/fake_apiserver.h"
#include "testing/fake_scheduler.h"
#include "testing/gpu_nodes.h"

namespace {
using json = nlohmann::json;
using namespace kgpu;

std::vector<testing::TestGpu> GpusFor(int i) {
  std::vector<testing::TestGpu> g;
  for (int k = 0; k < 8; ++k) {
    if (i % 4 < 2) {
      g.push_back(testing::ShareGpu(81920));
    } else if (i % 4 == 2) {
      g.push_back(testing::WholeGpu());
    } else {
      g.push_back(testing::MigGpu({"1g.10gb", "1g.10gb", "1g.10gb", "1g.10gb", "1g.10gb", "1g.10gb", "1g.10gb"}));
    }
  }
  return g;
}

std::string NodeName(int i) {
  return "gpu-node-" + std::to_string(i);
}

json BoundPod(int node, int k) {
  const std::string n = NodeName(node);
  json pod;
  api::AllocationRecord r;
  r.node = n;
  if (node % 4 < 2) {
    pod =
        testing::TestPod("bench", n + "-" + std::to_string(k), {{"kgpu.io/gpu", "1"}, {"kgpu.io/gpu-memory", "20000"}});
    r.containers.push_back(
        {"main", "kgpu.io/gpu", "hard", {{testing::TestGpuUuid(n, static_cast<size_t>(k)), "", "", 20000, 0}}});
  } else if (node % 4 == 2) {
    pod = testing::TestPod("bench", n + "-" + std::to_string(k), {{"nvidia.com/gpu", "2"}});
    r.containers.push_back({"main",
                            "nvidia.com/gpu",
                            "",
                            {{testing::TestGpuUuid(n, static_cast<size_t>(2 * k)), "", "", 0, 0},
                             {testing::TestGpuUuid(n, static_cast<size_t>(2 * k + 1)), "", "", 0, 0}}});
  } else {
    pod = testing::TestPod("bench", n + "-" + std::to_string(k), {{"nvidia.com/mig-1g.10gb", "1"}});
    r.containers.push_back(
        {"main",
         "nvidia.com/mig-1g.10gb",
         "",
         {{testing::TestGpuUuid(n, 0), "MIG-" + n + "-0-" + std::to_string(k), "1g.10gb", 9984, 0}}});
  }
  pod["spec"]["nodeName"] = n;
  pod["metadata"]["annotations"]["kgpu.io/allocation"] = api::EncodeRecord(r);
  pod["status"]["phase"] = "Running";
  return pod;
}

bool g_skip_latency = false;  // --throughput-only

void Print(const char* what, const bench::Stats& s);

// The pods whose filter and prioritize latency is measured.
std::vector<std::pair<const char*, json>> ProbeShapes() {
  return {
      {"share 1 x 8000 MiB",
       testing::TestPod("bench", "probe-share", {{"kgpu.io/gpu", "1"}, {"kgpu.io/gpu-memory", "8000"}})},
      {"share 2 x 10000 MiB 30%",
       testing::TestPod("bench", "probe-share2",
                        {{"kgpu.io/gpu", "2"}, {"kgpu.io/gpu-memory", "20000"}, {"kgpu.io/gpu-cores", "60"}})},
      {"whole 4 GPUs", testing::TestPod("bench", "probe-whole", {{"nvidia.com/gpu", "4"}})},
      {"MIG 1g.10gb", testing::TestPod("bench", "probe-mig", {{"nvidia.com/mig-1g.10gb", "1"}})},
      // Three GPU containers: two placed on trial per node, the init container on its target's.
      {"shares 8000 + sidecar 2000 + init",
       testing::WithContainer(
           testing::WithContainer(
               testing::TestPod("bench", "probe-multi", {{"kgpu.io/gpu", "1"}, {"kgpu.io/gpu-memory", "8000"}}),
               "initContainers", "metrics", {{"kgpu.io/gpu", "1"}, {"kgpu.io/gpu-memory", "2000"}}, true),
           "initContainers", "warmup", {{"kgpu.io/gpu", "1"}, {"kgpu.io/gpu-memory", "4000"}})},
  };
}

// Where a filter's time goes, in process (no HTTP, one thread): decoding the request, the
// device-level decision, encoding the reply.
void Breakdown(int nodes, const std::vector<std::pair<const char*, json>>& shapes,
               const std::vector<std::string>& names) {
  extender::State st;
  if (!st.Init().ok()) return;
  for (int i = 0; i < nodes; ++i) st.UpsertNode(testing::TestNode(NodeName(i), GpusFor(i)));
  for (int i = 0; i < nodes; ++i) {
    for (int k = 0; k < 2; ++k) st.UpsertPod(BoundPod(i, k));
  }
  for (const auto& [what, pod] : shapes) {
    const std::string body = extender::EncodeExtenderArgs(pod, names);
    std::vector<double> parse, decide, encode, prio;
    for (int i = 0; i < 60; ++i) {
      const int64_t a = bench::NowNs();
      auto args = extender::ParseExtenderArgs(body);
      const int64_t b = bench::NowNs();
      const auto out = st.Filter(args->pod, *args->node_names);
      const int64_t c = bench::NowNs();
      extender::FilterResult r;
      r.node_names = out.passed;
      r.failed_nodes = out.failed;
      r.failed_and_unresolvable = out.unresolvable;
      const std::string reply = extender::EncodeFilterResult(r);
      const int64_t d = bench::NowNs();
      const auto pr = st.Prioritize(args->pod, *args->node_names);
      const int64_t e = bench::NowNs();
      if (i < 10) continue;
      parse.push_back(static_cast<double>(b - a) / 1e6);
      decide.push_back(static_cast<double>(c - b) / 1e6);
      encode.push_back(static_cast<double>(d - c) / 1e6);
      prio.push_back(static_cast<double>(e - d) / 1e6);
    }
    if (nodes > 0 && st.Filter(pod, names).passed.empty()) {  // a probe must measure placing, not a refusal
      std::printf("  in process, %s: fits no node: the probe is wrong\n", what);
    }
    std::printf("  in process, %s: decode %.3f ms, filter %.3f ms, encode %.3f ms, prioritize %.3f ms (p50)\n", what,
                bench::Summarize(parse).p50, bench::Summarize(decide).p50, bench::Summarize(encode).p50,
                bench::Summarize(prio).p50);
  }
}

void Print(const char* what, const bench::Stats& s) {
  std::printf("  %-46s n=%-5zu p50 %8.3f ms  p99 %8.3f ms  max %8.3f ms\n", what, s.n, s.p50, s.p99, s.max);
}

int Run(int nodes) {
  std::printf("== %d nodes, %d GPUs, %d bound pods\n", nodes, nodes * 8, nodes * 2);
  testing::FakeApiServerOptions ao;
  ao.history_window = 1000000;
  testing::FakeApiServer api(ao);
  if (!api.Start().ok()) return 1;
  api.Create("namespaces", "", {{"metadata", {{"name", "bench"}}}});
  for (int i = 0; i < nodes; ++i) api.Create("nodes", "", testing::TestNode(NodeName(i), GpusFor(i)));
  for (int i = 0; i < nodes; ++i) {
    for (int k = 0; k < 2; ++k) api.Create("pods", "bench", BoundPod(i, k));
  }
  char dir[] = "/tmp/kgpu-extender-bench-XXXXXX";
  if (mkdtemp(dir) == nullptr) return 1;
  const std::string kubeconfig = std::string(dir) + "/kubeconfig";
  std::ofstream(kubeconfig) << api.Kubeconfig();
  const int64_t t0 = bench::NowNs();
  const std::string log = std::string(dir) + "/extender.log";
  // The client-side rate limit raised as an operator who wants throughput raises it (the default
  // 50 QPS, kube-scheduler's, caps binds at 50/s).
  // Plain HTTP, so that the figures stay comparable with earlier runs (deploy/extender serves
  // HTTPS with client certificates: over kept-alive connections that adds the symmetric cipher
  // per request, not a handshake).
  const pid_t pid =
      bench::Spawn({KGPU_BIN, "--log-level", "info", "extender", "--insecure-http", "--kubeconfig", kubeconfig,
                    "--address", "127.0.0.1:0", "--kube-api-qps", "100000", "--kube-api-burst", "100000"},
                   environ, log);
  // Port 0: the extender logs the port it bound ("listening on port N").
  int port = 0;
  while (port == 0 && bench::NowNs() - t0 < 300'000'000'000LL) {
    const std::string text = bench::ReadFile(log);
    if (const size_t at = text.find("listening on port "); at != std::string::npos) {
      port = std::atoi(text.c_str() + at + std::strlen("listening on port "));
    } else {
      std::this_thread::sleep_for(std::chrono::milliseconds(20));
    }
  }
  if (port == 0) {
    std::printf("  the extender did not start: %s\n", bench::ReadFile(log).c_str());
    return 1;
  }
  httplib::Client http("127.0.0.1", port);
  http.set_keep_alive(true);
  http.set_tcp_nodelay(true);  // as kube-scheduler's Go client
  bool ready = false;
  while (bench::NowNs() - t0 < 300'000'000'000LL) {
    auto r = http.Get("/readyz");
    if (r && r->status == 200) {
      ready = true;
      break;
    }
    std::this_thread::sleep_for(std::chrono::milliseconds(20));
  }
  if (!ready) {
    std::printf("  the extender did not get ready: %s\n", bench::ReadFile(std::string(dir) + "/extender.log").c_str());
    return 1;
  }
  auto m = http.Get("/metrics");
  const bool all_booked =
      m && m->body.find("kgpu_extender_pods_booked " + std::to_string(nodes * 2)) != std::string::npos;
  const auto mem = bench::ReadProcMem(pid);
  std::printf("  ready after %.2f s (records booked: %s), RSS %.1f MB (HWM %.1f MB)\n",
              static_cast<double>(bench::NowNs() - t0) / 1e9, all_booked ? "all" : "NOT ALL", mem.rss_mb, mem.hwm_mb);

  std::vector<std::string> names;
  for (int i = 0; i < nodes; ++i) names.push_back(NodeName(i));
  const auto shapes = ProbeShapes();
  if (!g_skip_latency) Breakdown(nodes, shapes, names);
  // kube-scheduler's default sample (percentageOfNodesToScore 0: 50 % - 1 % per 125 nodes, at
  // least 5 %, at least 100 nodes) of the nodes that pass its in-tree filters (those with the
  // shape's resource in allocatable): what it really sends to the extender.
  const int64_t pct = std::max<int64_t>(5, 50 - nodes / 125);
  const size_t sample =
      nodes < 100 ? static_cast<size_t>(nodes) : std::max<size_t>(100, static_cast<size_t>(nodes * pct / 100));
  // i % 4 of the nodes that serve each shape of ProbeShapes() (0 and 1 serve shares).
  const std::vector<int> kind_of_shape = {0, 0, 2, 3, 0};
  if (kind_of_shape.size() != shapes.size()) {
    std::printf("  kind_of_shape does not cover every probe shape\n");
    return 1;
  }
  for (size_t k = 0; k < (g_skip_latency ? 0 : shapes.size()); ++k) {
    const auto& [what, pod] = shapes[k];
    std::vector<std::string> some;
    for (int i = 0; i < nodes && some.size() < sample; ++i) {
      const int kind = i % 4 < 2 ? 0 : i % 4;
      if (kind == kind_of_shape[k]) some.push_back(NodeName(i));
    }
    for (const auto* list : {&names, &some}) {
      const std::string body = extender::EncodeExtenderArgs(pod, *list);
      for (const char* verb : {"filter", "prioritize"}) {
        // The headers kube-scheduler's extender client sends (Go's net/http transport: it asks
        // for gzip unless compression is disabled, and decompresses transparently); for the
        // first shape, also without compression, to show what a gzipped answer would cost.
        for (const bool go : {true, false}) {
          if (!go && k != 0) continue;
          const httplib::Headers headers = {{"User-Agent", "Go-http-client/1.1"},
                                            {"Accept-Encoding", go ? "gzip" : "identity"}};
          std::vector<double> ms;
          std::string encoding;
          for (int i = 0; i < 200; ++i) {
            const int64_t s = bench::NowNs();
            auto r = http.Post(std::string("/gpu/") + verb, headers, body, "application/json");
            const int64_t e = bench::NowNs();
            if (!r || r->status != 200) {
              std::printf("  %s failed\n", verb);
              return 1;
            }
            encoding = r->get_header_value("Content-Encoding");
            if (i >= 10) ms.push_back(static_cast<double>(e - s) / 1e6);
          }
          Print((std::string(verb) + " " + what + (list == &names ? " (all " : " (sample ") +
                 std::to_string(list->size()) + (go ? ")" : ", identity asked)") +
                 (encoding.empty() ? "" : " [" + encoding + "]"))
                    .c_str(),
                bench::Summarize(ms));
        }
      }
    }
  }

  // Pods per second through the kube-scheduler stand-in.
  k8s::Config kc;
  kc.server = api.url();
  kc.qps = 0;
  auto client = std::move(*k8s::Client::Create(kc));
  // kube-scheduler's default node sample, then percentageOfNodesToScore: 100 as deploy/extender
  // sets it on the kgpu-scheduler profile (every node reaches the extender).
  int run = 0;
  for (const int percentage : {0, 100}) {
    testing::FakeSchedulerOptions so;
    so.url_prefix = "http://127.0.0.1:" + std::to_string(port) + "/gpu";
    so.percentage_of_nodes_to_score = percentage;
    testing::FakeScheduler sched(*client, so);
    if (!sched.WaitForSync(std::chrono::seconds(60))) {
      std::printf("  the scheduler stand-in's informers did not sync\n");
      return 1;
    }
    for (int threads : {1, 4}) {
      const int count = 1000;
      ++run;
      std::vector<json> pods;
      for (int i = 0; i < count; ++i) {
        auto r = api.Create(
            "pods", "bench",
            testing::TestPod("bench", "s" + std::to_string(run) + "-" + std::to_string(i),
                             {{"kgpu.io/gpu", "1"}, {"kgpu.io/gpu-memory", "4000"}, {"kgpu.io/gpu-cores", "5"}}));
        pods.push_back(r.body);
      }
      std::atomic<int> next{0}, bound{0};
      std::vector<double> decide_ms, cycle_ms, extender_ms, share_pct, bind_ms;
      std::mutex mu;
      const double cpu0 = bench::ProcCpuSeconds(pid);
      const int64_t s = bench::NowNs();
      std::vector<std::thread> ts;
      for (int t = 0; t < threads; ++t) {
        ts.emplace_back([&] {
          for (int i = next++; i < count; i = next++) {
            const int64_t a = bench::NowNs();
            auto out = sched.ScheduleOne(pods[static_cast<size_t>(i)]);
            const int64_t b = bench::NowNs();
            if (out.ok() && out->bound) ++bound;
            std::lock_guard lock(mu);
            decide_ms.push_back(static_cast<double>(b - a) / 1e6);
            if (!out.ok()) continue;
            const double cyc = std::chrono::duration<double, std::milli>(out->cycle).count();
            const double ext = std::chrono::duration<double, std::milli>(out->extender).count();
            cycle_ms.push_back(cyc);
            extender_ms.push_back(ext);
            if (cyc > 0) share_pct.push_back(100.0 * ext / cyc);
            bind_ms.push_back(std::chrono::duration<double, std::milli>(out->bind).count());
          }
        });
      }
      for (auto& t : ts) t.join();
      const double secs = static_cast<double>(bench::NowNs() - s) / 1e9;
      const double cpu = bench::ProcCpuSeconds(pid) - cpu0;
      std::printf(
          "  scheduler stand-in (percentageOfNodesToScore %s), %d thread(s): %d/%d pods bound in %.2f s = "
          "%.0f pods/s\n",
          percentage == 0 ? "default" : "100", threads, bound.load(), count, secs, bound.load() / secs);
      // The stand-in, the API server and the extender share this machine's cores: the extender's
      // own CPU per pod says how many pods per second one core of extender serves.
      std::printf("    extender CPU %.2f s = %.2f ms per pod (%.0f pods/s per core of extender)\n", cpu,
                  1e3 * cpu / std::max(1, bound.load()), cpu > 0 ? bound.load() / cpu : 0.0);
      Print("  per pod (stand-in + extender + API)", bench::Summarize(decide_ms));
      // The extender's share of each scheduling cycle, as kube-scheduler would see it: the time
      // its filter and prioritize calls took, over the cycle's time (the stand-in's in-tree
      // filters and scores are the rest).
      Print("  scheduling cycle", bench::Summarize(cycle_ms));
      Print("    of which extender calls", bench::Summarize(extender_ms));
      const auto share = bench::Summarize(share_pct);
      std::printf("    extender's share of a cycle: p50 %.0f %%, p99 %.0f %%\n", share.p50, share.p99);
      Print("  bind call (binding cycle)", bench::Summarize(bind_ms));
    }
  }
  const auto after = bench::ReadProcMem(pid);
  std::printf("  extender RSS after scheduling %.1f MB (HWM %.1f MB)\n", after.rss_mb, after.hwm_mb);
  const int64_t term = bench::NowNs();
  kill(pid, SIGTERM);
  int status = 0;
  waitpid(pid, &status, 0);
  std::printf("  SIGTERM -> exit %.0f ms (status %d)\n", static_cast<double>(bench::NowNs() - term) / 1e6,
              WIFEXITED(status) ? WEXITSTATUS(status) : -WTERMSIG(status));
  bench::UntrackChild(pid);
  std::filesystem::remove_all(dir);
  return 0;
}

}  // namespace

int main(int argc, char** argv) {
  bench::InstallFatalSignalHandlers({SIGINT, SIGTERM, SIGSEGV, SIGABRT});
  std::vector<int> sizes;
  int in_process_rounds = 0;  // --in-process N: only the in-process breakdown, N times (for a profiler)
  for (int i = 1; i < argc; ++i) {
    if (std::strcmp(argv[i], "--throughput-only") == 0) {
      g_skip_latency = true;
    } else if (std::strcmp(argv[i], "--in-process") == 0 && i + 1 < argc) {
      in_process_rounds = std::atoi(argv[++i]);
    } else {
      sizes.push_back(std::atoi(argv[i]));
    }
  }
  if (in_process_rounds > 0) {
    for (int n : sizes.empty() ? std::vector<int>{5000} : sizes) {
      std::vector<std::string> names;
      for (int i = 0; i < n; ++i) names.push_back(NodeName(i));
      for (int r = 0; r < in_process_rounds; ++r) Breakdown(n, ProbeShapes(), names);
    }
    return 0;
  }
  if (sizes.empty()) sizes = {1000, 5000};
  for (int n : sizes) {
    if (int rc = Run(n); rc != 0) return rc;
  }
  return 0;
}
