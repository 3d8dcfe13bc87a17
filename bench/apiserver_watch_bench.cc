// apiserver_watch_bench: plain driver. The API server stand-in in a forked child; this process
// opens N watches as kubectl and client-go do (Go's headers, Accept-Encoding: gzip), then:
//  1. /version and a pod list (new connection each, as a fresh kubectl) with no watch open,
//  2. the same with N watches open, and the time for one pod update to reach all N watchers,
//  3. the same right after the N clients vanished without a word (closed sockets, as ^C or a
//     killed process leaves them), and the time until the server has released all N watches.
// Reports p50/p99 per phase and the server's threads and RSS.
//   apiserver_watch_bench [--watches N] [--requests N]
#include <chrono>
#include <cstdio>
#include <cstring>
#include <memory>
#include <string>
#include <thread>
#include <vector>

#include <sys/resource.h>
#include <unistd.h>

#include "bench_util.h"
#include "testing/fake_apiserver.h"
#include "testing/raw_http.h"

namespace {
using json = nlohmann::json;
using Clock = std::chrono::steady_clock;
using kgpu::testing::RawHttp;
using namespace std::chrono_literals;

json Pod(int i) {
  return {{"metadata", {{"name", "pod-" + std::to_string(i)}, {"namespace", "default"}}},
          {"spec", {{"containers", {{{"name", "c"}, {"image", "busybox:1.36"}}}}}}};
}

// Latency in ms of `n` requests for `target`, each on a new connection; -1 for a failed one.
std::vector<double> Probe(int port, const std::string& target, const std::string& until, int n) {
  std::vector<double> ms;
  for (int i = 0; i < n; ++i) {
    const auto t0 = Clock::now();
    RawHttp c(port);
    if (!c.ok() || !c.Get(target)) return {-1};
    c.ReadFor(10s, until);
    if (c.received().find(until) == std::string::npos) return {-1};
    ms.push_back(std::chrono::duration<double, std::milli>(Clock::now() - t0).count());
  }
  return ms;
}

json Stats(int port) {
  RawHttp c(port);
  c.Get("/_fake/stats");
  c.ReadFor(5s, "}");
  const auto& r = c.received();
  const auto at = r.find("\r\n\r\n");
  json j = at == std::string::npos ? json() : json::parse(r.substr(at + 4), nullptr, false);
  return j.is_object() ? j : json::object();  // no answer, or a server without /_fake/stats
}

void Report(const char* phase, int port, int n) {
  const auto vs = Probe(port, "/version", "gitVersion", n);
  const auto ls = Probe(port, "/api/v1/namespaces/default/pods?limit=500", "\"items\"", n);
  if (vs == std::vector<double>{-1} || ls == std::vector<double>{-1}) {
    std::printf("%-34s /version or the list got no answer within 10 s\n", phase);
    return;
  }
  const auto v = kgpu::bench::Summarize(vs);
  const auto l = kgpu::bench::Summarize(ls);
  std::printf("%-34s /version p50 %6.2f ms p99 %6.2f ms | list of 100 pods p50 %6.2f ms p99 %6.2f ms\n", phase, v.p50,
              v.p99, l.p50, l.p99);
}

}  // namespace

int main(int argc, char** argv) {
  std::setvbuf(stdout, nullptr, _IOLBF, 0);  // each line as it is measured
  int watches = 1000, requests = 200;
  for (int i = 1; i + 1 < argc; i += 2) {
    if (!std::strcmp(argv[i], "--watches")) watches = std::atoi(argv[i + 1]);
    if (!std::strcmp(argv[i], "--requests")) requests = std::atoi(argv[i + 1]);
  }
  // Two descriptors per watch across the two processes, and the probes'.
  rlimit nofile{};
  getrlimit(RLIMIT_NOFILE, &nofile);
  nofile.rlim_cur = nofile.rlim_max;
  setrlimit(RLIMIT_NOFILE, &nofile);
  if (nofile.rlim_cur < static_cast<rlim_t>(watches) + 200) {
    std::fprintf(stderr, "the descriptor limit (%llu) is below %d watches\n",
                 static_cast<unsigned long long>(nofile.rlim_cur), watches);
    return 1;
  }
  kgpu::bench::InstallFatalSignalHandlers({SIGINT, SIGTERM});
  int to_child[2], to_parent[2];
  if (pipe(to_child) != 0 || pipe(to_parent) != 0) return 1;
  const pid_t child = fork();
  if (child == 0) {
    kgpu::testing::FakeApiServer server;
    for (int i = 0; i < 100; ++i) server.Create("pods", "default", Pod(i));
    if (!server.Start().ok()) _exit(1);
    const int port = server.port();
    if (write(to_parent[1], &port, sizeof port) != sizeof port) _exit(1);
    char cmd = 0;
    while (read(to_child[0], &cmd, 1) == 1 && cmd == 'u') {  // 'u': update pod-0
      auto cur = server.Get("pods", "default", "pod-0").body;
      cur["metadata"]["labels"]["round"] = std::to_string(server.ResourceVersion());
      server.Update("pods", "default", cur);
      if (write(to_parent[1], "u", 1) != 1) break;
    }
    server.Stop();
    _exit(0);
  }
  kgpu::bench::TrackChild(child);
  int port = 0;
  if (read(to_parent[0], &port, sizeof port) != sizeof port) {
    std::fprintf(stderr, "the stand-in did not start\n");
    return 1;
  }
  auto server_threads = [child] {
    std::string status;
    std::FILE* f = std::fopen(("/proc/" + std::to_string(child) + "/status").c_str(), "r");
    char line[256];
    while (f && std::fgets(line, sizeof line, f)) {
      if (!std::strncmp(line, "Threads:", 8) || !std::strncmp(line, "VmRSS:", 6))
        status += std::string(line, std::strcspn(line, "\n")) + " ";
    }
    if (f) std::fclose(f);
    return status;
  };

  Report("no watch open:", port, requests);

  std::vector<std::unique_ptr<RawHttp>> open;
  const auto t_open = Clock::now();
  for (int i = 0; i < watches; ++i) {
    open.push_back(std::make_unique<RawHttp>(port));
    if (!open.back()->ok() || !open.back()->Get("/api/v1/namespaces/default/pods?watch=true&resourceVersion=1")) {
      std::fprintf(stderr, "watch %d: cannot connect\n", i);
      return 1;
    }
  }
  // A watch is open once its response head arrived (a server out of threads never answers).
  int answered = 0;
  while (Clock::now() - t_open < 20s) {
    answered = 0;
    for (auto& w : open) {
      w->ReadFor(0ms);
      if (w->received().find("\r\n\r\n") != std::string::npos) ++answered;
    }
    if (answered == watches) break;
    std::this_thread::sleep_for(10ms);
  }
  std::printf("%d of %d watches answered in %.0f ms; server %s\n", answered, watches,
              std::chrono::duration<double, std::milli>(Clock::now() - t_open).count(), server_threads().c_str());

  Report("with the watches open:", port, requests);

  // One update, fanned out to every watcher (only when every watch was answered).
  std::vector<double> fanout;
  for (int round = 0; round < (answered == watches ? 5 : 0); ++round) {
    std::vector<size_t> before;
    for (auto& w : open) before.push_back(w->received().size());
    const auto t0 = Clock::now();
    char ack = 0;
    if (write(to_child[1], "u", 1) != 1 || read(to_parent[0], &ack, 1) != 1) return 1;
    size_t reached = 0;
    std::vector<bool> got(open.size(), false);
    while (reached < open.size() && Clock::now() - t0 < 30s) {
      for (size_t i = 0; i < open.size(); ++i) {
        if (got[i]) continue;
        open[i]->ReadFor(0ms);
        if (open[i]->received().find("MODIFIED", before[i]) != std::string::npos) {
          got[i] = true;
          ++reached;
        }
      }
    }
    fanout.push_back(std::chrono::duration<double, std::milli>(Clock::now() - t0).count());
    if (reached < open.size())
      std::printf("round %d: only %zu of %zu watchers got the event\n", round, reached, open.size());
  }
  if (!fanout.empty()) {
    const auto f = kgpu::bench::Summarize(fanout);
    std::printf("one update reaches all %d watchers: median %.1f ms, worst %.1f ms (5 updates)\n", watches, f.p50,
                f.max);
  }

  const auto t_gone = Clock::now();
  open.clear();  // every client vanishes without a word
  Report("right after the clients vanished:", port, requests);
  int left = 0;
  while ((left = Stats(port).value("openWatches", -1)) > 0 && Clock::now() - t_gone < 60s)
    std::this_thread::sleep_for(10ms);
  if (left < 0) {
    std::printf("the server has no /_fake/stats: the release of abandoned watches is not measured; server %s\n",
                server_threads().c_str());
    left = 0;
  } else {
    std::printf("%d abandoned watches released %.0f ms after their clients left (%d left); server %s\n", watches,
                std::chrono::duration<double, std::milli>(Clock::now() - t_gone).count(), left,
                server_threads().c_str());
  }
  Report("after the release:", port, requests);

  if (write(to_child[1], "q", 1) != 1) return 1;
  int status = 0;
  waitpid(child, &status, 0);
  kgpu::bench::UntrackChild(child);
  return left == 0 ? 0 : 1;
}
