// k8s_bench: plain driver. The API server stand-in runs in a forked child, preloaded with
// 5,000 Nodes and 100,000 Pods (50 namespaces); this process runs informers on both
// collections and reports the time to sync (list pages of 500) and this process's RSS before
// and after, then watch-event throughput: the child modifies N pods as fast as it can and we
// time until the informer's handler has seen every MODIFIED event.
//   k8s_bench [--nodes N] [--pods N] [--events N]
#include <atomic>
#include <chrono>
#include <cstdio>
#include <cstring>
#include <string>
#include <thread>

#include <signal.h>
#include <sys/wait.h>
#include <unistd.h>

#include "bench_util.h"
#include "k8s/client.h"
#include "k8s/informer.h"
#include "testing/fake_apiserver.h"

namespace {
using json = nlohmann::json;
using Clock = std::chrono::steady_clock;

json Node(int i) {
  const std::string name = "node-" + std::to_string(i);
  return {{"metadata",
           {{"name", name},
            {"labels",
             {{"kubernetes.io/hostname", name},
              {"nvidia.com/gpu.product", "NVIDIA-H100-80GB-HBM3"},
              {"nvidia.com/gpu.count", "8"}}}}},
          {"spec", {{"podCIDR", "10.0.0.0/24"}}},
          {"status",
           {{"capacity", {{"cpu", "64"}, {"memory", "512Gi"}, {"nvidia.com/gpu", "8"}, {"pods", "110"}}},
            {"conditions", {{{"type", "Ready"}, {"status", "True"}}}}}}};
}

json Pod(int i, int nodes) {
  return {
      {"metadata", {{"name", "pod-" + std::to_string(i)}, {"labels", {{"app", "train-" + std::to_string(i % 100)}}}}},
      {"spec",
       {{"nodeName", "node-" + std::to_string(i % nodes)},
        {"containers",
         {{{"name", "main"},
           {"image", "registry.example.com/train:1"},
           {"resources", {{"limits", {{"nvidia.com/gpu", "1"}}}}}}}}}}};
}

}  // namespace

int main(int argc, char** argv) {
  int nodes = 5000, pods = 100000, events = 20000;
  for (int i = 1; i + 1 < argc; i += 2) {
    if (!std::strcmp(argv[i], "--nodes")) nodes = std::atoi(argv[i + 1]);
    if (!std::strcmp(argv[i], "--pods")) pods = std::atoi(argv[i + 1]);
    if (!std::strcmp(argv[i], "--events")) events = std::atoi(argv[i + 1]);
  }
  int to_child[2], to_parent[2];
  if (pipe(to_child) != 0 || pipe(to_parent) != 0) return 1;
  const pid_t child = fork();
  if (child == 0) {
    kgpu::testing::FakeApiServerOptions o;
    o.history_window = static_cast<size_t>(events) + 1000;
    o.reap_terminating_pods = false;
    kgpu::testing::FakeApiServer server(o);
    const auto t0 = Clock::now();
    for (int i = 0; i < nodes; ++i) server.Create("nodes", "", Node(i));
    for (int n = 0; n < 50; ++n) server.Create("namespaces", "", {{"metadata", {{"name", "ns-" + std::to_string(n)}}}});
    for (int i = 0; i < pods; ++i) server.Create("pods", "ns-" + std::to_string(i % 50), Pod(i, nodes));
    std::fprintf(stderr, "stand-in: preloaded %d nodes and %d pods in %.1f s\n", nodes, pods,
                 std::chrono::duration<double>(Clock::now() - t0).count());
    if (!server.Start().ok()) _exit(1);
    const int port = server.port();
    if (write(to_parent[1], &port, sizeof port) != sizeof port) _exit(1);
    char cmd = 0;
    // 'm': modify `events` pods; 'q': quit.
    while (read(to_child[0], &cmd, 1) == 1 && cmd == 'm') {
      for (int i = 0; i < events; ++i) {
        const int p = i % pods;
        auto cur = server.Get("pods", "ns-" + std::to_string(p % 50), "pod-" + std::to_string(p)).body;
        cur["metadata"]["labels"]["round"] = std::to_string(i);
        server.Update("pods", "ns-" + std::to_string(p % 50), cur);
      }
    }
    server.Stop();
    _exit(0);
  }
  int port = 0;
  if (read(to_parent[0], &port, sizeof port) != sizeof port) {
    std::fprintf(stderr, "the stand-in did not start\n");
    return 1;
  }
  kgpu::k8s::Config c;
  c.server = "http://127.0.0.1:" + std::to_string(port);
  c.qps = 0;  // measure the decoder and store, not the limiter
  c.timeout = std::chrono::seconds(120);
  auto client = std::move(*kgpu::k8s::Client::Create(c));
  const auto before = kgpu::bench::ReadProcMem(getpid());

  auto sync = [&](const std::string& path, std::atomic<int64_t>& updates) {
    kgpu::k8s::InformerOptions io;
    io.path = path;
    io.page_size = 500;
    auto inf = std::make_unique<kgpu::k8s::Informer>(*client, io);
    inf->AddHandler({nullptr, [&updates](const json&, const json&) { ++updates; }, nullptr});
    inf->AddIndexer("node", [](const json& o) {
      return std::vector<std::string>{o.contains("spec") ? o["spec"].value("nodeName", "") : ""};
    });
    const auto t0 = Clock::now();
    inf->Start();
    inf->WaitForSync(std::chrono::minutes(10));
    const double s = std::chrono::duration<double>(Clock::now() - t0).count();
    return std::make_pair(std::move(inf), s);
  };
  std::atomic<int64_t> node_updates{0}, pod_updates{0};
  auto [node_inf, node_s] = sync("/api/v1/nodes", node_updates);
  const auto after_nodes = kgpu::bench::ReadProcMem(getpid());
  auto [pod_inf, pod_s] = sync("/api/v1/pods", pod_updates);
  const auto after_pods = kgpu::bench::ReadProcMem(getpid());
  std::printf("informer sync: %zu nodes in %.2f s, %zu pods in %.2f s (%.0f objects/s)\n", node_inf->store().Size(),
              node_s, pod_inf->store().Size(), pod_s, static_cast<double>(pod_inf->store().Size()) / pod_s);
  std::printf("RSS: %.1f MiB before, %.1f MiB with nodes, %.1f MiB with nodes and pods (+%.1f MiB, %.1f KiB/pod)\n",
              before.rss_mb, after_nodes.rss_mb, after_pods.rss_mb, after_pods.rss_mb - before.rss_mb,
              (after_pods.rss_mb - after_nodes.rss_mb) * 1024.0 / std::max(1, pods));
  std::printf("pods on node-0 by index: %zu\n", pod_inf->store().ByIndex("node", "node-0").size());

  // Watch throughput.
  const int64_t start = pod_updates;
  const auto t0 = Clock::now();
  if (write(to_child[1], "m", 1) != 1) return 1;
  while (pod_updates - start < events && Clock::now() - t0 < std::chrono::minutes(5)) {
    std::this_thread::sleep_for(std::chrono::milliseconds(1));
  }
  const double s = std::chrono::duration<double>(Clock::now() - t0).count();
  std::printf("watch: %lld MODIFIED events delivered in %.2f s (%.0f events/s), %llu watch requests, %llu relists\n",
              static_cast<long long>(pod_updates - start), s, static_cast<double>(pod_updates - start) / s,
              static_cast<unsigned long long>(pod_inf->stats().watches),
              static_cast<unsigned long long>(pod_inf->stats().lists));
  node_inf->Stop();
  pod_inf->Stop();
  if (write(to_child[1], "q", 1) != 1) kill(child, SIGTERM);
  waitpid(child, nullptr, 0);
  return 0;
}
