// exporter_bench: figures of the GPU metrics exporter on the simulated 8x H100 node (dgx-h100)
// with time-slicing, 8 GPUs x 8 replicas = 64 device IDs held by 64 pods (one replica each, one
// process each, 8 processes per GPU with different memory and SM utilisation), pod attribution on
// (-k) and the default counters.
//
//   exporter_bench [--scrapes N] [--gzip-scrapes N] [--fresh-scrapes N] [--calls N]
//                  [--collections N] [--child-scrapes N] [--window-s S] [--keep]
//                  [--counters FILE] [--kgpu PATH]
//
//   --scrapes N        keep-alive GET /metrics over HTTP on the in-process exporter (default
//                      5000, after 100 warm-up GETs that are not counted)
//   --gzip-scrapes N   the same with "Accept-Encoding: gzip", as Prometheus sends it (default
//                      1000); also the count of keep-alive GET /health and of the reference
//                      server's runs
//   --fresh-scrapes N  GET /metrics on a new TCP connection each (default 1000): Prometheus
//                      scrapes every 15-60 s, longer than httplib's 5 s keep-alive, so it
//                      reconnects each time
//   --calls N          Exporter::Scrape() calls in process, no HTTP (default 20000)
//   --collections N    Exporter::CollectNow() calls (default 50)
//   --child-scrapes N  keep-alive GET /metrics on the `kgpu exporter` child (default 1000)
//   --window-s S       idle window over which the child's CPU time per collection is taken
//                      (default 10)
//   --keep             keep the temp dir (child logs, fake /proc, checkpoint) and print its path
//   --counters FILE    a counters CSV for the in-process exporter and the children (-f), e.g.
//                      tests/unit/testdata/dcgm-exporter/dcp-metrics-included.csv (the GPU Operator's
//                      extended field set); default: the built-in default counters
//   --kgpu PATH        the kgpu binary the children run (default: this build's): an older build,
//                      to put its figures beside this one's in one run
//
// Figures, one line each (details on the indented lines under them):
//   1. scrape latency over real HTTP (cpp-httplib client, TCP_NODELAY, keep-alive) on
//      127.0.0.1:<port> of the in-process Exporter: p50/p99/max, response size, series count;
//      also gzip and one-connection-per-scrape, GET /health for the cost of HTTP alone, p99 per
//      block of 1000 GETs (to tell a steady tail from a noisy neighbour), minor page faults per
//      GET, and, for comparison only, a cpp-httplib server in this driver with TCP_NODELAY set
//      serving the same Scrape() body (the product's server leaves Nagle on).
//   2. Exporter::Scrape() in process: p50/p99/max, minor page faults per call.
//   3. CPU time (getrusage(RUSAGE_THREAD), user+sys, which is tick-sampled; and
//      CLOCK_THREAD_CPUTIME_ID, ns) and wall time per CollectNow().
//   4. RSS (VmRSS/VmHWM, /proc/self/status) of this driver after setup and at the end. The driver
//      also holds the fake PodResources gRPC server and the HTTP client, so the same is measured on
//      a `kgpu exporter -k` child against the same fake data: its VmRSS/VmHWM after the child
//      scrapes, its CPU time per collection (utime+stime from /proc/<pid>/stat over an idle window,
//      divided by the growth of its kgpu_exporter_collections_total), its CPU time per scrape; and,
//      to see where the memory goes, /proc/<pid>/smaps grouped by mapping (executable, each
//      shared library family, heap, anonymous), for the child, for `kgpu exporter` without -k
//      (no gRPC runtime started), and for this binary idling (`--idle`: the libraries only); and
//      `kgpu exporter -k` with MALLOC_ARENA_MAX=1 (glibc's per-thread malloc arenas' share).
//
// Targets (from the issue), printed next to the figures: RSS <= 15 MB, scrape p99 <= 2 ms.
//
// Everything lives in its own dir (mkdtemp /tmp/exb-XXXXXX): the simulated node's state file, the
// fake /proc, the checkpoint, the PodResources socket and the child logs. Children get
// KGPU_SIM_NODE=dgx-h100, KGPU_SIM_STATE, KGPU_SIM_NODE_NAME and LD_LIBRARY_PATH=<dir of the
// simulated libnvidia-ml.so.1>, die with this process (PR_SET_PDEATHSIG) and are killed on every
// exit path.
//
// Exit status: 0 when every step worked (whatever the figures are); 1 when something failed;
// 2 on bad usage.

#include <algorithm>
#include <atomic>
#include <cerrno>
#include <chrono>
#include <cinttypes>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <map>
#include <memory>
#include <optional>
#include <sstream>
#include <string>
#include <thread>
#include <vector>

#include <arpa/inet.h>
#include <fcntl.h>
#include <httplib.h>
#include <netinet/in.h>
#include <nlohmann/json.hpp>
#include <signal.h>
#include <sys/prctl.h>
#include <sys/resource.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include "bench_util.h"
#include "common/log.h"
#include "common/strings.h"
#include "exporter/counters.h"
#include "exporter/exporter.h"
#include "gpu/inventory.h"
#include "kubelet/checksum.h"
#include "nvml/library.h"
#include "testing/fake_podresources.h"

#ifndef KGPU_BIN
#error "KGPU_BIN (path of the kgpu binary) must be defined by the build"
#endif
#ifndef KGPU_SIMCTL
#error "KGPU_SIMCTL (path of kgpu-simctl) must be defined by the build"
#endif
#ifndef KGPU_SIM_LIB
#error "KGPU_SIM_LIB (path of the simulated libnvidia-ml.so.1) must be defined by the build"
#endif
#ifndef KGPU_SIM_LIB_DIR
#error "KGPU_SIM_LIB_DIR (dir of the simulated libnvidia-ml.so.1) must be defined by the build"
#endif

extern char** environ;

namespace {

using kgpu::Cat;
using kgpu::bench::FileTail;
using kgpu::bench::InstallFatalSignalHandlers;
using kgpu::bench::KillAllChildren;
using kgpu::bench::MakeTempDir;
using kgpu::bench::NowNs;
using kgpu::bench::PrintSmaps;
using kgpu::bench::ProcCpuSeconds;
using kgpu::bench::ProcMem;
using kgpu::bench::ReadFile;
using kgpu::bench::ReadProcMem;
using kgpu::bench::RemoveTree;
using kgpu::bench::Spawn;
using kgpu::bench::UntrackChild;
using Summary = kgpu::bench::Stats;

constexpr char kProfile[] = "dgx-h100";
constexpr char kNodeName[] = "bench-node";
constexpr char kResource[] = "nvidia.com/gpu";
constexpr unsigned kGpus = 8;
constexpr unsigned kReplicas = 8;
constexpr unsigned kPods = kGpus * kReplicas;
constexpr unsigned kFirstPid = 20000;
constexpr int kWarmup = 100;

// Targets from the issue.
constexpr double kTargetRssMb = 15;
constexpr double kTargetScrapeP99Ms = 2;

double Ms(int64_t ns) {
  return static_cast<double>(ns) / 1e6;
}
double Us(int64_t ns) {
  return static_cast<double>(ns) / 1e3;
}

// Nearest-rank figures; all 0 when there are no values.
Summary Summarize(std::vector<double> v) {
  return kgpu::bench::Summarize(std::move(v), 0);
}

// ---------------------------------------------------------------- children and cleanup

// Our environment plus `extra`, as an envp (the strings live in *storage).
std::vector<char*> BuildEnv(const std::map<std::string, std::string>& extra, std::vector<std::string>* storage) {
  std::map<std::string, std::string> all;
  for (char** e = environ; *e != nullptr; ++e) {
    const std::string kv = *e;
    const auto eq = kv.find('=');
    if (eq != std::string::npos) all[kv.substr(0, eq)] = kv.substr(eq + 1);
  }
  for (const auto& [k, v] : extra) all[k] = v;
  storage->clear();
  for (const auto& [k, v] : all) storage->push_back(k + "=" + v);
  std::vector<char*> ptrs;
  for (auto& s : *storage) ptrs.push_back(s.data());
  ptrs.push_back(nullptr);
  return ptrs;
}

void KillChild(pid_t pid) {
  if (pid <= 0) return;
  kill(pid, SIGTERM);
  for (int i = 0; i < 3000; ++i) {  // 3 s, then SIGKILL
    if (waitpid(pid, nullptr, WNOHANG) == pid) {
      UntrackChild(pid);
      return;
    }
    usleep(1000);
  }
  kill(pid, SIGKILL);
  waitpid(pid, nullptr, 0);
  UntrackChild(pid);
}

bool Alive(pid_t pid) {
  return waitpid(pid, nullptr, WNOHANG) == 0;
}

// A free TCP port on 127.0.0.1 (bound and released; the child binds it right after).
int FreePort() {
  const int fd = socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
  if (fd < 0) return -1;
  sockaddr_in a{};
  a.sin_family = AF_INET;
  a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  a.sin_port = 0;
  socklen_t len = sizeof a;
  int port = -1;
  if (bind(fd, reinterpret_cast<sockaddr*>(&a), sizeof a) == 0 &&
      getsockname(fd, reinterpret_cast<sockaddr*>(&a), &len) == 0) {
    port = ntohs(a.sin_port);
  }
  ::close(fd);
  return port;
}

// ---------------------------------------------------------------- /proc readers

std::string DescribeMem(const ProcMem& m) {
  char buf[512];
  std::snprintf(buf, sizeof buf,
                "VmRSS %.1f MB, VmHWM %.1f MB (anon %.1f, file %.1f, shmem %.1f; Pss %.1f; "
                "Private_Dirty %.1f, "
                "Private_Clean %.1f, Shared_Clean %.1f, Shared_Dirty %.1f; %d threads)",
                m.rss_mb, m.hwm_mb, m.anon_mb, m.file_mb, m.shmem_mb, m.pss_mb, m.private_dirty_mb, m.private_clean_mb,
                m.shared_clean_mb, m.shared_dirty_mb, m.threads);
  return buf;
}

// On-CPU time of the live threads (sum of /proc/<pid>/task/*/schedstat), seconds, ns resolution.
double TasksSchedSeconds(pid_t pid) {
  double total = 0;
  std::error_code ec;
  for (const auto& e : std::filesystem::directory_iterator(Cat("/proc/", pid, "/task"), ec)) {
    std::ifstream in(e.path() / "schedstat");
    unsigned long long ns = 0;
    if (in >> ns) total += static_cast<double>(ns) / 1e9;
  }
  return total;
}

long MinorFaults() {  // this process, all threads
  rusage ru{};
  getrusage(RUSAGE_SELF, &ru);
  return ru.ru_minflt;
}

double ThreadClockSeconds() {  // CLOCK_THREAD_CPUTIME_ID: the scheduler's ns-resolution runtime
  timespec ts{};
  clock_gettime(CLOCK_THREAD_CPUTIME_ID, &ts);
  return static_cast<double>(ts.tv_sec) + static_cast<double>(ts.tv_nsec) / 1e9;
}

double ThreadCpuSeconds() {
  rusage ru{};
  getrusage(RUSAGE_THREAD, &ru);
  return static_cast<double>(ru.ru_utime.tv_sec + ru.ru_stime.tv_sec) +
         static_cast<double>(ru.ru_utime.tv_usec + ru.ru_stime.tv_usec) / 1e6;
}

// ---------------------------------------------------------------- metrics text

size_t CountSeries(const std::string& text, const std::string& must_contain = "") {
  size_t n = 0;
  std::istringstream in(text);
  for (std::string line; std::getline(in, line);) {
    if (line.empty() || line[0] == '#') continue;
    if (!must_contain.empty() && line.find(must_contain) == std::string::npos) continue;
    ++n;
  }
  return n;
}

std::optional<double> MetricValue(const std::string& text, const std::string& name) {
  const std::string key = "\n" + name + " ";
  const auto at = text.find(key);
  if (at == std::string::npos) return std::nullopt;
  return std::strtod(text.c_str() + at + key.size(), nullptr);
}

// ---------------------------------------------------------------- HTTP scrapes

struct ScrapeRun {
  std::vector<double> ms;
  size_t bytes = 0;
  std::string last_body;
  int connections = 0;
  int failures = 0;
  long minflt = 0;  // minor page faults of this process during the counted GETs (client + in-process server)
};

// `n` GETs of `path` after `warmup` uncounted ones. keep_alive: one client for all; otherwise a new
// client (a new TCP connection) per GET.
ScrapeRun HttpScrapes(int port, const std::string& path, int warmup, int n, bool keep_alive,
                      const httplib::Headers& headers) {
  ScrapeRun run;
  auto connections = std::make_shared<std::atomic<int>>(0);
  auto make = [&] {
    auto c = std::make_unique<httplib::Client>("127.0.0.1", port);
    c->set_keep_alive(keep_alive);
    c->set_tcp_nodelay(true);  // as Prometheus's Go client does
    c->set_decompress(false);  // measure the server: the gzip body is not inflated here
    c->set_socket_options([connections](int) { connections->fetch_add(1); });
    return c;
  };
  auto client = make();
  int base = 0;
  long faults0 = MinorFaults();
  for (int i = 0; i < warmup + n; ++i) {
    if (i == warmup) {
      base = connections->load();
      faults0 = MinorFaults();
    }
    if (!keep_alive) client = make();
    const int64_t t0 = NowNs();
    auto res = client->Get(path, headers);
    const int64_t t1 = NowNs();
    if (!res || res->status != 200) {
      run.failures++;
      continue;
    }
    if (i >= warmup) {
      run.ms.push_back(Ms(t1 - t0));
      run.bytes = res->body.size();
      if (i + 1 == warmup + n) run.last_body = std::move(res->body);
    }
  }
  run.connections = connections->load() - base;
  run.minflt = MinorFaults() - faults0;
  return run;
}

void PrintLatency(const char* label, const ScrapeRun& r) {
  const Summary s = Summarize(r.ms);
  std::printf(
      "     %-40s p50 %.3f ms, p99 %.3f ms, max %.3f ms, mean %.3f ms (n=%zu, %zu B body, %d new "
      "TCP connections, %d failed)\n",
      label, s.p50, s.p99, s.max, s.mean, s.n, r.bytes, r.connections, r.failures);
}

// ---------------------------------------------------------------- setup

struct PodSpec {
  unsigned gpu, replica, pid, mem_mib, util;
  std::string uid, ns, pod, container, device_id;
};

std::string PodUid(unsigned i) {
  char buf[48];
  std::snprintf(buf, sizeof buf, "%08x-%04x-4%03x-8%03x-%012x", 0x5eed0000U + i, i * 37U, i, i * 3U, i * 7919U);
  return buf;
}

struct Args {
  int scrapes = 5000, gzip_scrapes = 1000, fresh_scrapes = 1000, calls = 20000, collections = 50;
  int child_scrapes = 1000, window_s = 10;
  bool keep = false, idle = false;
  std::string counters;         // --counters: a counters CSV (-f) for the exporters; empty: the default
  std::string kgpu = KGPU_BIN;  // --kgpu: the binary of the `kgpu exporter` children (an older build, to compare)
};

bool ParseArgs(int argc, char** argv, Args* a) {
  for (int i = 1; i < argc; ++i) {
    const std::string k = argv[i];
    auto num = [&](int* v) {
      if (i + 1 >= argc) return false;
      *v = std::atoi(argv[++i]);
      return *v >= 0;
    };
    bool ok = true;
    if (k == "--scrapes")
      ok = num(&a->scrapes);
    else if (k == "--gzip-scrapes")
      ok = num(&a->gzip_scrapes);
    else if (k == "--fresh-scrapes")
      ok = num(&a->fresh_scrapes);
    else if (k == "--calls")
      ok = num(&a->calls);
    else if (k == "--collections")
      ok = num(&a->collections);
    else if (k == "--child-scrapes")
      ok = num(&a->child_scrapes);
    else if (k == "--window-s")
      ok = num(&a->window_s);
    else if (k == "--keep")
      a->keep = true;
    else if (k == "--counters" && i + 1 < argc)
      a->counters = argv[++i];
    else if (k == "--kgpu" && i + 1 < argc)
      a->kgpu = argv[++i];
    else if (k == "--idle")
      a->idle = true;
    else
      ok = false;
    if (!ok) {
      std::fprintf(stderr,
                   "usage: exporter_bench [--scrapes N] [--gzip-scrapes N] [--fresh-scrapes N] [--calls N]\n"
                   "                      [--collections N] [--child-scrapes N] [--window-s S] [--keep]\n"
                   "                      [--counters FILE] [--kgpu PATH]\n");
      return false;
    }
  }
  return true;
}

// A `kgpu exporter` child: started, waited for, scraped, measured.
struct ChildFigures {
  double start_ms = -1;
  ScrapeRun scrapes;
  double cpu_per_scrape_us = -1, sched_per_scrape_us = -1;
  ScrapeRun gzip_scrapes;
  double gzip_cpu_per_scrape_us = -1, gzip_sched_per_scrape_us = -1;
  ProcMem mem_after_scrapes, mem_after_window;
  double window_s = 0, cpu_s = -1, sched_s = -1, collections = 0, last_duration_ms = -1;
  size_t series = 0;
};

class Child {
 public:
  ~Child() { KillChild(pid_); }
  bool Start(const std::vector<std::string>& args, char** envp, const std::string& log, int port, double* start_ms) {
    log_ = log;
    const int64_t t0 = NowNs();
    pid_ = Spawn(args, envp, log);
    if (pid_ <= 0) return false;
    httplib::Client c("127.0.0.1", port);
    c.set_connection_timeout(0, 200000);
    for (;;) {
      if (!Alive(pid_)) {
        UntrackChild(pid_);
        pid_ = -1;
        return false;
      }
      if (auto r = c.Get("/health"); r && r->status == 200) break;
      if (NowNs() - t0 > 15'000'000'000LL) return false;
      usleep(2000);
    }
    *start_ms = Ms(NowNs() - t0);
    return true;
  }
  pid_t Pid() const { return pid_; }
  std::string LogTail() const { return FileTail(log_); }

 private:
  pid_t pid_ = -1;
  std::string log_;
};

}  // namespace

int main(int argc, char** argv) {
  Args args;
  if (!ParseArgs(argc, argv, &args)) return 2;
  if (args.idle) {  // the libraries only: a baseline for RSS
    pause();
    return 0;
  }
  InstallFatalSignalHandlers({SIGINT, SIGTERM, SIGHUP});
  kgpu::SetLogLevel("warn");

  const std::string dir = MakeTempDir("/tmp/exb-XXXXXX");
  if (dir.empty()) {
    std::perror("mkdtemp");
    return 1;
  }
  const std::string state = dir + "/sim.state";
  setenv("KGPU_SIM_NODE", kProfile, 1);        // NOLINT(concurrency-mt-unsafe): before any thread
  setenv("KGPU_SIM_STATE", state.c_str(), 1);  // NOLINT(concurrency-mt-unsafe): before any thread
  setenv("KGPU_SIM_NODE_NAME", kNodeName, 1);  // NOLINT(concurrency-mt-unsafe): before any thread
  int rc = 0;
  auto fail = [&](const std::string& what) {
    std::fprintf(stderr, "exporter_bench: %s\n", what.c_str());
    rc = 1;
  };

  std::printf(
      "exporter_bench: %s (%u GPUs), time-slicing %u replicas per GPU: %u device IDs held by %u "
      "pods,\n"
      "  one process each (%u per GPU); kubernetes=true, counters: %s; children run %s; %u CPUs\n",
      kProfile, kGpus, kReplicas, kPods, kPods, kReplicas, args.counters.empty() ? "default" : args.counters.c_str(),
      args.kgpu.c_str(), std::thread::hardware_concurrency());
  std::printf("load average at the start: %s", ReadFile("/proc/loadavg").c_str());
  std::fflush(stdout);

  do {
    // NVML and the inventory.
    auto lib = kgpu::nvml::Library::Open({KGPU_SIM_LIB});
    if (!lib.ok()) {
      fail(Cat("opening ", KGPU_SIM_LIB, ": ", lib.status().message()));
      break;
    }
    auto inv = kgpu::gpu::Inventory::Discover(**lib, {dir});
    if (!inv.ok() || (*inv)->gpus().size() != kGpus) {
      fail("inventory: " + (inv.ok() ? Cat((*inv)->gpus().size(), " GPUs") : std::string(inv.status().message())));
      break;
    }

    // 64 pods, one replica and one process each.
    static constexpr const char* kNamespaces[] = {"ml-train", "ml-infer", "research", "batch"};
    std::vector<PodSpec> pods;
    for (unsigned i = 0; i < kPods; ++i) {
      PodSpec p;
      p.gpu = i / kReplicas;
      p.replica = i % kReplicas;
      p.pid = kFirstPid + i;
      p.mem_mib = 512 + 1024 * p.replica + 64 * p.gpu + i;  // 0.5 .. 7.6 GiB, all different
      p.util = 1 + 2 * p.replica + p.gpu;                   // 1 .. 22 %
      p.uid = PodUid(i);
      p.ns = kNamespaces[i % 4];
      p.pod = Cat("job-", p.gpu, "-", p.replica, "-7d9f8c6b5-x", i);
      p.container = p.replica % 2 == 0 ? "worker" : "server";
      p.device_id = Cat((*inv)->gpus()[p.gpu].uuid, "::", p.replica);
      pods.push_back(p);
    }

    // Processes on the simulated GPUs (kgpu-simctl, another process, as an operator would).
    const int64_t t_simctl = NowNs();
    bool ok = true;
    for (const auto& p : pods) {
      const std::string cmd =
          Cat(KGPU_SIMCTL, " proc add ", p.gpu, " ", p.pid, " --mem ", p.mem_mib, " --util ", p.util, " >/dev/null");
      const int st = std::system(cmd.c_str());  // NOLINT(concurrency-mt-unsafe): single-threaded here
      if (!WIFEXITED(st) || WEXITSTATUS(st) != 0) {
        fail("failed: " + cmd);
        ok = false;
        break;
      }
    }
    if (!ok) break;
    const double simctl_ms = Ms(NowNs() - t_simctl);

    // The fake /proc: one cgroup file per process (systemd and cgroupfs drivers, half each).
    for (const auto& p : pods) {
      const std::string pdir = Cat(dir, "/proc/", p.pid);
      std::filesystem::create_directories(pdir);
      char cid[65];
      std::snprintf(cid, sizeof cid, "%016x%016x%016x%016x", p.pid, p.pid * 31, p.pid * 131, p.pid * 521);
      std::string underscored_uid = p.uid;
      std::replace(underscored_uid.begin(), underscored_uid.end(), '-', '_');
      std::ofstream out(pdir + "/cgroup");
      if (p.pid % 2 == 0) {
        out << "0::/kubepods.slice/kubepods-burstable.slice/kubepods-burstable-pod" << underscored_uid
            << ".slice/cri-containerd-" << cid << ".scope\n";
      } else {
        out << "12:pids:/kubepods/besteffort/pod" << p.uid << "/" << cid << "\n"
            << "11:memory:/kubepods/besteffort/pod" << p.uid << "/" << cid << "\n"
            << "1:name=systemd:/kubepods/besteffort/pod" << p.uid << "/" << cid << "\n";
      }
    }

    // The kubelet checkpoint (NUMA map form, with an AllocResp blob and the registered devices).
    {
      const std::string alloc_resp(160,
                                   'Q');  // base64 of an AllocateResponse, size of an envvar one
      std::string entries, registered;
      for (const auto& p : pods) {
        if (!entries.empty()) entries += ",";
        entries += Cat(R"({"PodUID":")", p.uid, R"(","ContainerName":")", p.container, R"(","ResourceName":")",
                       kResource, R"(","DeviceIDs":{"0":[")", p.device_id, R"("]},"AllocResp":")", alloc_resp, R"("})");
        if (!registered.empty()) registered += ",";
        registered += Cat("\"", p.device_id, "\"");
      }
      // With the checksum kubelet would write: the exporter verifies it and refuses a wrong one.
      const auto doc =
          nlohmann::json::parse(Cat(R"({"Data":{"PodDeviceEntries":[)", entries, R"(],"RegisteredDevices":{")",
                                    kResource, R"(":[)", registered, R"(]}},"Checksum":0})"));
      std::ofstream(dir + "/checkpoint") << kgpu::kubelet::WithKubeletChecksum(doc).dump();
    }

    // PodResources: 64 pods, one container, one replica each.
    v1::ListPodResourcesResponse list;
    for (const auto& p : pods) kgpu::testing::AddDevices(list, p.ns, p.pod, p.container, kResource, {p.device_id}, 0);
    kgpu::testing::FakePodResources server(dir + "/pr.sock");
    server.SetListResponse(list);
    if (auto st = server.Start(); !st.ok()) {
      fail(Cat("FakePodResources: ", st.message()));
      break;
    }

    // The exporter, in process.
    std::vector<std::string> skipped;
    auto counters = args.counters.empty() ? kgpu::exporter::ParseCounters(kgpu::exporter::DefaultCountersCsv(),
                                                                          "<default counters>", &skipped)
                                          : kgpu::exporter::LoadCountersFile(args.counters, &skipped);
    if (!counters.ok()) {
      fail(Cat("counters: ", counters.status().message()));
      break;
    }
    kgpu::exporter::ExporterOptions options;
    options.counters = *counters;
    options.address = "127.0.0.1:0";
    options.interval = std::chrono::hours(1);
    options.kubernetes = true;
    options.pod_resources_socket = dir + "/pr.sock";
    options.proc_root = dir + "/proc";
    options.checkpoint_path = dir + "/checkpoint";
    options.hostname = kNodeName;
    const size_t n_counters = options.counters.size();
    auto exporter = std::make_unique<kgpu::exporter::Exporter>(**lib, *inv, options);
    if (auto st = exporter->Start(); !st.ok()) {
      fail(Cat("Exporter::Start: ", st.message()));
      break;
    }
    exporter->CollectNow();
    const int port = exporter->port();
    const ProcMem self_setup = ReadProcMem(getpid());

    // Sanity: every pod has its own FB_USED and GPU_UTIL series with its own figures.
    {
      const std::string text = exporter->Scrape();
      size_t pod_fb = 0, right = 0;
      std::istringstream in(text);
      for (std::string line; std::getline(in, line);) {
        if (line.rfind("DCGM_FI_DEV_FB_USED{", 0) != 0 || line.find("pod=\"") == std::string::npos) continue;
        ++pod_fb;
        for (const auto& p : pods) {
          if (line.find("pod=\"" + p.pod + "\"") != std::string::npos && line.ends_with(Cat("} ", p.mem_mib))) ++right;
        }
      }
      if (pod_fb != kPods || right != kPods) {
        fail(Cat("expected ", kPods, " per-pod DCGM_FI_DEV_FB_USED series with each pod's memory, got ", pod_fb,
                 " series, ", right, " right; first 3000 chars:\n", text.substr(0, 3000)));
        break;
      }
    }
    std::printf(
        "setup: %u x `kgpu-simctl proc add` %.0f ms; in-process exporter on 127.0.0.1:%d, %zu "
        "counters, "
        "PodResources List calls so far %d\n\n",
        kPods, simctl_ms, port, n_counters, server.ListCalls());
    std::fflush(stdout);

    // ---- 1. HTTP scrapes.
    const httplib::Headers identity = {{"Accept-Encoding", "identity"}};
    const httplib::Headers gzip = {{"Accept-Encoding", "gzip"}};
    ScrapeRun http = HttpScrapes(port, "/metrics", kWarmup, args.scrapes, true, identity);
    if (http.failures > 0 || http.ms.empty()) {
      fail(Cat(http.failures, " failed GET /metrics"));
      break;
    }
    const Summary hs = Summarize(http.ms);
    const size_t series = CountSeries(http.last_body);
    const size_t pod_series = CountSeries(http.last_body, "pod=\"");
    std::printf(
        "1. scrape over HTTP (keep-alive, %zu GETs): p50 %.3f ms, p99 %.3f ms, max %.3f ms; %zu B, "
        "%zu series "
        "[target p99 <= %.0f ms: %s]\n",
        hs.n, hs.p50, hs.p99, hs.max, http.bytes, series, kTargetScrapeP99Ms,
        hs.p99 <= kTargetScrapeP99Ms ? "met" : "MISSED");
    std::printf(
        "     series: %zu with pod labels (%u per-pod FB_USED + %u per-pod GPU_UTIL), %zu "
        "device-level, "
        "%zu exporter's own\n",
        pod_series, kPods, kPods, series - pod_series - CountSeries(http.last_body, "kgpu_exporter_"),
        CountSeries(http.last_body, "kgpu_exporter_"));
    PrintLatency("keep-alive, identity:", http);
    {
      std::string blocks;
      for (size_t b = 0; b < http.ms.size(); b += 1000) {
        const std::vector<double> part(
            http.ms.begin() + static_cast<std::ptrdiff_t>(b),
            http.ms.begin() + static_cast<std::ptrdiff_t>(std::min(b + 1000, http.ms.size())));
        char buf[32];
        std::snprintf(buf, sizeof buf, "%s%.2f", blocks.empty() ? "" : " ", Summarize(part).p99);
        blocks += buf;
      }
      std::printf(
          "     p99 per block of 1000 GETs, ms: %s; %.1f minor page faults per GET in this process "
          "(client + server)\n",
          blocks.c_str(), static_cast<double>(http.minflt) / static_cast<double>(http.ms.size()));
    }
    ScrapeRun gz = HttpScrapes(port, "/metrics", 10, args.gzip_scrapes, true, gzip);
    PrintLatency("keep-alive, Accept-Encoding: gzip:", gz);
    ScrapeRun fresh = HttpScrapes(port, "/metrics", 10, args.fresh_scrapes, false, identity);
    PrintLatency("new connection per GET, identity:", fresh);
    ScrapeRun fresh_gz = HttpScrapes(port, "/metrics", 10, args.fresh_scrapes, false, gzip);
    PrintLatency("new connection per GET, gzip (Prometheus):", fresh_gz);
    ScrapeRun health = HttpScrapes(port, "/health", kWarmup, args.gzip_scrapes, true, identity);
    PrintLatency("GET /health (HTTP alone), keep-alive:", health);
    {
      // For comparison only (not the product): a cpp-httplib server in this driver with TCP_NODELAY
      // set, serving the same Exporter::Scrape() body. The product's server leaves Nagle on.
      httplib::Server ref;
      ref.set_tcp_nodelay(true);
      ref.Get("/metrics", [&](const httplib::Request&, httplib::Response& res) {
        res.set_content(exporter->Scrape(), "text/plain; version=0.0.4; charset=utf-8");
      });
      ref.Get("/health", [](const httplib::Request&, httplib::Response& res) { res.set_content("OK", "text/plain"); });
      const int ref_port = ref.bind_to_any_port("127.0.0.1");
      std::thread t([&] { ref.listen_after_bind(); });
      for (int i = 0; i < 2000 && !ref.is_running(); ++i) usleep(1000);
      PrintLatency("[ref. server +TCP_NODELAY] keep-alive, gzip:",
                   HttpScrapes(ref_port, "/metrics", 10, args.gzip_scrapes, true, gzip));
      PrintLatency("[ref. server +TCP_NODELAY] /health:",
                   HttpScrapes(ref_port, "/health", kWarmup, args.gzip_scrapes, true, identity));
      ref.stop();
      t.join();
    }
    std::fflush(stdout);

    // ---- 2. Scrape() in process.
    std::vector<double> scrape_us;
    scrape_us.reserve(static_cast<size_t>(args.calls));
    size_t sink = 0;
    long scrape_faults = 0;
    for (int i = 0; i < kWarmup + args.calls; ++i) {
      if (i == kWarmup) scrape_faults = MinorFaults();
      const int64_t t0 = NowNs();
      const std::string text = exporter->Scrape();
      const int64_t t1 = NowNs();
      sink += text.size();
      if (i >= kWarmup) scrape_us.push_back(Us(t1 - t0));
    }
    scrape_faults = MinorFaults() - scrape_faults;
    const Summary ss = Summarize(scrape_us);
    std::printf(
        "2. Scrape() in process (%zu calls): p50 %.1f us, p99 %.1f us, max %.1f us, mean %.1f us "
        "(%zu B each; "
        "%.1f minor page faults per call)\n",
        ss.n, ss.p50, ss.p99, ss.max, ss.mean, sink / static_cast<size_t>(kWarmup + args.calls),
        static_cast<double>(scrape_faults) / static_cast<double>(std::max(1, args.calls)));
    std::fflush(stdout);

    // ---- 3. CollectNow().
    std::vector<double> cpu_ms, clock_ms, wall_ms;
    double rusage_total = 0;
    for (int i = 0; i < args.collections + 2; ++i) {
      const double c0 = ThreadCpuSeconds(), k0 = ThreadClockSeconds();
      const int64_t t0 = NowNs();
      exporter->CollectNow();
      const int64_t t1 = NowNs();
      const double c1 = ThreadCpuSeconds(), k1 = ThreadClockSeconds();
      if (i < 2) continue;  // warm-up
      cpu_ms.push_back((c1 - c0) * 1e3);
      clock_ms.push_back((k1 - k0) * 1e3);
      wall_ms.push_back(Ms(t1 - t0));
      rusage_total += c1 - c0;
    }
    const Summary cs = Summarize(cpu_ms), ks3 = Summarize(clock_ms), ws = Summarize(wall_ms);
    std::printf(
        "3. per collection (CollectNow, %zu): CPU (getrusage RUSAGE_THREAD user+sys) mean %.3f ms; "
        "wall mean "
        "%.3f ms, p50 %.3f, p99 %.3f, max %.3f\n",
        cs.n, cs.mean, ws.mean, ws.p50, ws.p99, ws.max);
    std::printf(
        "     getrusage per call is tick-granular here (p50 %.3f, p99 %.3f, max %.3f ms; total "
        "%.1f ms over %zu);\n"
        "     CLOCK_THREAD_CPUTIME_ID (ns): mean %.3f ms, p50 %.3f, p99 %.3f, max %.3f\n",
        cs.p50, cs.p99, cs.max, rusage_total * 1e3, cs.n, ks3.mean, ks3.p50, ks3.p99, ks3.max);
    std::fflush(stdout);

    // ---- 4. RSS of the driver.
    const ProcMem self_end = ReadProcMem(getpid());
    std::printf(
        "4. RSS of this driver (exporter + fake PodResources gRPC server + HTTP client): after "
        "setup VmRSS "
        "%.1f MB / VmHWM %.1f MB; at the end VmRSS %.1f MB / VmHWM %.1f MB\n",
        self_setup.rss_mb, self_setup.hwm_mb, self_end.rss_mb, self_end.hwm_mb);
    std::printf("     driver at the end: %s\n", DescribeMem(self_end).c_str());
    std::fflush(stdout);
    exporter->Stop();
    exporter.reset();  // the children get the CPUs to themselves

    // ---- 4b. `kgpu exporter -k` as its own process against the same fake data.
    std::vector<std::string> env_storage;
    auto envp = BuildEnv({{"LD_LIBRARY_PATH", KGPU_SIM_LIB_DIR},
                          {"KGPU_SIM_NODE", kProfile},
                          {"KGPU_SIM_STATE", state},
                          {"KGPU_SIM_NODE_NAME", kNodeName},
                          {"NODE_NAME", kNodeName},
                          {"KGPU_LOG_LEVEL", "info"}},
                         &env_storage);
    // The command line of a `kgpu exporter` child on `listen_port`: with -k, against this run's fake
    // PodResources, /proc and checkpoint; with --counters, that file (-f).
    auto exporter_args = [&](int listen_port, bool k) {
      std::vector<std::string> a = {args.kgpu, "exporter", "-a", Cat("127.0.0.1:", listen_port), "-c", "1000"};
      if (k) {
        a.insert(a.end(), {"-k", "--pod-resources-kubelet-socket", dir + "/pr.sock", "--proc-root", dir + "/proc",
                           "--kubelet-checkpoint", dir + "/checkpoint"});
      }
      if (!args.counters.empty()) a.insert(a.end(), {"-f", args.counters});
      return a;
    };
    ChildFigures k;
    {
      const int child_port = FreePort();
      Child child;
      const std::vector<std::string> cargs = exporter_args(child_port, true);
      std::string cmdline;
      for (const auto& a : cargs) cmdline += (cmdline.empty() ? "" : " ") + a;
      if (!child.Start(cargs, envp.data(), dir + "/exporter-k.log", child_port, &k.start_ms)) {
        fail("kgpu exporter -k did not serve /health within 15 s: " + cmdline + "\n" + child.LogTail());
        break;
      }
      const double cpu0 = ProcCpuSeconds(child.Pid()), sched0 = TasksSchedSeconds(child.Pid());
      k.scrapes = HttpScrapes(child_port, "/metrics", 0, args.child_scrapes, true, identity);
      const double cpu1 = ProcCpuSeconds(child.Pid()), sched1 = TasksSchedSeconds(child.Pid());
      if (k.scrapes.failures > 0 || k.scrapes.ms.empty()) {
        fail(Cat(k.scrapes.failures, " failed GET /metrics on the child\n", child.LogTail()));
        break;
      }
      k.series = CountSeries(k.scrapes.last_body);
      k.cpu_per_scrape_us = (cpu1 - cpu0) * 1e6 / static_cast<double>(k.scrapes.ms.size());
      k.sched_per_scrape_us = (sched1 - sched0) * 1e6 / static_cast<double>(k.scrapes.ms.size());
      k.mem_after_scrapes = ReadProcMem(child.Pid());
      // gzip, as Prometheus asks for it, one connection per scrape (as at a 15-60 s scrape
      // interval).
      const double gcpu0 = ProcCpuSeconds(child.Pid()), gsched0 = TasksSchedSeconds(child.Pid());
      k.gzip_scrapes = HttpScrapes(child_port, "/metrics", 0, args.child_scrapes / 2, false, gzip);
      const double gcpu1 = ProcCpuSeconds(child.Pid()), gsched1 = TasksSchedSeconds(child.Pid());
      if (!k.gzip_scrapes.ms.empty()) {
        k.gzip_cpu_per_scrape_us = (gcpu1 - gcpu0) * 1e6 / static_cast<double>(k.gzip_scrapes.ms.size());
        k.gzip_sched_per_scrape_us = (gsched1 - gsched0) * 1e6 / static_cast<double>(k.gzip_scrapes.ms.size());
      }

      // Idle window: CPU per collection (everything the process does, amortised over collections).
      httplib::Client c("127.0.0.1", child_port);
      auto scrape = [&]() -> std::string {
        auto r = c.Get("/metrics", identity);
        return r && r->status == 200 ? r->body : std::string();
      };
      const auto coll0 = MetricValue(scrape(), "kgpu_exporter_collections_total");
      const double w_cpu0 = ProcCpuSeconds(child.Pid()), w_sched0 = TasksSchedSeconds(child.Pid());
      const int64_t w0 = NowNs();
      std::this_thread::sleep_for(std::chrono::seconds(args.window_s));
      const double w_cpu1 = ProcCpuSeconds(child.Pid()), w_sched1 = TasksSchedSeconds(child.Pid());
      const int64_t w1 = NowNs();
      const std::string last = scrape();
      const auto coll1 = MetricValue(last, "kgpu_exporter_collections_total");
      const auto dur = MetricValue(last, "kgpu_exporter_collection_duration_seconds");
      if (!coll0 || !coll1) {
        fail("no kgpu_exporter_collections_total on the child\n" + child.LogTail());
        break;
      }
      k.window_s = static_cast<double>(w1 - w0) / 1e9;
      k.cpu_s = w_cpu1 - w_cpu0;
      k.sched_s = w_sched1 - w_sched0;
      k.collections = *coll1 - *coll0;
      k.last_duration_ms = dur ? *dur * 1e3 : -1;
      k.mem_after_window = ReadProcMem(child.Pid());

      const Summary ks = Summarize(k.scrapes.ms);
      std::printf(
          "4. RSS of `kgpu exporter -k` (own process, same fake data): VmRSS %.1f MB, VmHWM %.1f "
          "MB after %zu "
          "scrapes [target <= %.0f MB: %s]\n",
          k.mem_after_scrapes.rss_mb, k.mem_after_scrapes.hwm_mb, ks.n, kTargetRssMb,
          k.mem_after_scrapes.rss_mb <= kTargetRssMb ? "met" : "MISSED");
      std::printf("     command: %s\n", cmdline.c_str());
      std::printf("     fork -> serving /health %.1f ms; %zu series, %zu B\n", k.start_ms, k.series, k.scrapes.bytes);
      std::printf("     after scrapes: %s\n", DescribeMem(k.mem_after_scrapes).c_str());
      std::printf("     after the %.0f s window: %s\n", k.window_s, DescribeMem(k.mem_after_window).c_str());
      PrintLatency("child scrapes, keep-alive, identity:", k.scrapes);
      std::printf("     child CPU per scrape: %.1f us (utime+stime), %.1f us (schedstat of live threads)\n",
                  k.cpu_per_scrape_us, k.sched_per_scrape_us);
      PrintLatency("child scrapes, new connection, gzip:", k.gzip_scrapes);
      std::printf(
          "     child CPU per gzip scrape: %.1f us (utime+stime), %.1f us (schedstat of live "
          "threads)\n",
          k.gzip_cpu_per_scrape_us, k.gzip_sched_per_scrape_us);
      const double per = k.collections > 0 ? k.cpu_s * 1e3 / k.collections : -1;
      const double per_sched = k.collections > 0 ? k.sched_s * 1e3 / k.collections : -1;
      std::printf(
          "4. CPU of `kgpu exporter -k` per collection: %.2f ms (utime+stime %.2f s over %.1f s "
          "idle window / "
          "%.0f collections at -c 1000); %.2f ms by schedstat; %.2f%% of one CPU; last collection "
          "took %.2f ms\n",
          per, k.cpu_s, k.window_s, k.collections, per_sched, 100.0 * k.sched_s / k.window_s, k.last_duration_ms);
      PrintSmaps("kgpu exporter -k", child.Pid());
      std::fflush(stdout);
    }

    // ---- Baselines: `kgpu exporter` without -k (no gRPC channel ever made) and this binary
    // idling.
    {
      const int child_port = FreePort();
      Child child;
      double start_ms = 0;
      const std::vector<std::string> cargs = exporter_args(child_port, false);
      if (!child.Start(cargs, envp.data(), dir + "/exporter-nok.log", child_port, &start_ms)) {
        fail("kgpu exporter (no -k) did not serve\n" + child.LogTail());
        break;
      }
      ScrapeRun r = HttpScrapes(child_port, "/metrics", 0, std::min(args.child_scrapes, 200), true, identity);
      const ProcMem m = ReadProcMem(child.Pid());
      std::printf(
          "baseline `kgpu exporter` without -k (no PodResources, no gRPC runtime), after %zu "
          "scrapes: %s\n",
          r.ms.size(), DescribeMem(m).c_str());
      PrintSmaps("kgpu exporter (no -k)", child.Pid());
    }
    {
      // The same `kgpu exporter -k` with glibc's malloc limited to one arena (environment only).
      std::vector<std::string> storage;
      auto env1 = BuildEnv({{"LD_LIBRARY_PATH", KGPU_SIM_LIB_DIR},
                            {"KGPU_SIM_NODE", kProfile},
                            {"KGPU_SIM_STATE", state},
                            {"KGPU_SIM_NODE_NAME", kNodeName},
                            {"NODE_NAME", kNodeName},
                            {"MALLOC_ARENA_MAX", "1"}},
                           &storage);
      const int child_port = FreePort();
      Child child;
      double start_ms = 0;
      const std::vector<std::string> cargs = exporter_args(child_port, true);
      if (!child.Start(cargs, env1.data(), dir + "/exporter-arena1.log", child_port, &start_ms)) {
        fail("kgpu exporter -k (MALLOC_ARENA_MAX=1) did not serve\n" + child.LogTail());
        break;
      }
      ScrapeRun r = HttpScrapes(child_port, "/metrics", 0, std::min(args.child_scrapes, 200), true, identity);
      std::this_thread::sleep_for(std::chrono::milliseconds(2500));  // a couple of collections
      const ProcMem m = ReadProcMem(child.Pid());
      std::printf("`kgpu exporter -k` with MALLOC_ARENA_MAX=1, after %zu scrapes and 2.5 s: %s\n", r.ms.size(),
                  DescribeMem(m).c_str());
    }
    {
      char self[4096] = {};
      const ssize_t n = readlink("/proc/self/exe", self, sizeof self - 1);
      if (n > 0) {
        const pid_t pid = Spawn({std::string(self, static_cast<size_t>(n)), "--idle"}, envp.data(), dir + "/idle.log");
        usleep(300000);
        if (pid > 0 && Alive(pid)) {
          const ProcMem m = ReadProcMem(pid);
          std::printf("baseline: this binary idling (same shared libraries, nothing running): %s\n",
                      DescribeMem(m).c_str());
          PrintSmaps("exporter_bench --idle", pid);
        }
        KillChild(pid);
      }
    }
    std::printf("\nload average at the end: %s", ReadFile("/proc/loadavg").c_str());
    const Summary gzs = Summarize(gz.ms), fgzs = Summarize(fresh_gz.ms);
    std::printf(
        "summary: HTTP scrape p99 %.3f ms identity keep-alive (target <= %.0f ms: %s); with "
        "Accept-Encoding: "
        "gzip as Prometheus sends it: p99 %.3f ms keep-alive (%s), %.3f ms new connection (%s)\n",
        hs.p99, kTargetScrapeP99Ms, hs.p99 <= kTargetScrapeP99Ms ? "met" : "MISSED", gzs.p99,
        gzs.p99 <= kTargetScrapeP99Ms ? "met" : "MISSED", fgzs.p99, fgzs.p99 <= kTargetScrapeP99Ms ? "met" : "MISSED");
    std::printf(
        "summary: `kgpu exporter -k` VmRSS %.1f MB (target <= %.0f MB: %s, %+.1f MB), VmHWM %.1f "
        "MB, "
        "Private_Dirty %.1f MB, Pss %.1f MB\n",
        k.mem_after_window.rss_mb, kTargetRssMb, k.mem_after_window.rss_mb <= kTargetRssMb ? "met" : "MISSED",
        k.mem_after_window.rss_mb - kTargetRssMb, k.mem_after_window.hwm_mb, k.mem_after_window.private_dirty_mb,
        k.mem_after_window.pss_mb);
    server.Stop();
  } while (false);

  KillAllChildren();
  if (args.keep) {
    std::printf("kept %s\n", dir.c_str());
  } else {
    RemoveTree(dir);
  }
  return rc;
}
