// device_plugin_bench: end-to-end figures of `kgpu device-plugin` as a real process, on the
// simulated 8x H100 node (dgx-h100), against the kubelet stand-in (FakeKubelet, the real Device
// Plugin v1beta1 gRPC protocol over unix sockets) running in this process.
//
//   device_plugin_bench [--kgpu PATH] [--runs N] [--calls N] [--xid-samples N] [--restarts N] [--keep]
//
//   --kgpu PATH       the kgpu binary to measure (default: this build's); bench/static_vs_shared.sh
//                     passes the one of a release build with shared absl/gRPC/protobuf
//
//   --runs N          start->registered repetitions (default 10; one cold run before them is
//                     reported on its own line, not in the figures)
//   --calls N         Allocate / GetPreferredAllocation calls per figure (default 5000, after 100
//                     warm-up calls that are not counted)
//   --xid-samples N   XID samples per injection method (default 30)
//   --restarts N      kubelet restarts for the re-registration figure (default 100)
//   --start-only      only figures 1, 2 and 6 (start, RSS, re-registration)
//   --steered-only    only the steered GetPreferredAllocation figure (4)
//   --keep            keep the temp dir (plugin logs) and print its path
//
// Figures, one line each:
//   1. start->registered: from just before fork() of `kgpu device-plugin --kubelet-dir D` until the
//      FakeKubelet's ListAndWatch thread has received the resource's first full device list (taken
//      in FakeKubelet::OnEvent). Between runs the plugin gets SIGTERM and is waited for. With it, to
//      see where the time goes: fork -> Register done, fork -> the plugin's "serving" log line, the
//      cost of a bare `kgpu` start (no arguments), and SIGTERM -> exit.
//   2. RSS of the plugin (VmRSS, VmHWM, the anon/file/shmem split, /proc/<pid>/status; PSS from
//      /proc/<pid>/smaps_rollup), idle after registration, after the RPC load and after the XID runs.
//   3. Allocate latency of 1 GPU (the ID cycles over the 8), around each FakeKubelet::Allocate call;
//      with it, for scale, the same round trip with an RPC that does nothing (GetDevicePluginOptions).
//   4. GetPreferredAllocation latency, 8 whole GPUs (size 4, size 2), and time-slicing replicas 4
//      (32 IDs, size 3). Then steered by allocation records (docs/sharing-model.md §5): the plugin
//      with --publish-labels, the API server stand-in holding 110 pods bound to the node (kubelet's
//      default maxPods) with records, 109 of them holding their GPUs in the PodResources stand-in
//      and one pending: each call lists the node's pods and PodResources, and answers with the
//      pending record's pair (checked); at most 400 calls, one every 25 ms (under the plugin's API
//      budget of 50 requests a second).
//   5. XID -> ListAndWatch: from just before the injection until the FakeKubelet's stream thread
//      has the list with that GPU Unhealthy. Injected (a) by fork/exec of `kgpu-simctl xid G 48`,
//      (b) in this process through kgpu::sim::Node::PushEvent. The plugin runs with
//      `health: {recoverAfter: 0s, probeInterval: 50ms}` so the GPU comes back Healthy; every
//      sample waits for all 8 to be Healthy, then a random 0-50 ms so the injections fall at any
//      phase of the probe loop. An XID that never shows as Unhealthy within 2 s (the next probe
//      cleared it before the plugin sent a list with it) is counted, left out of the figures and
//      replaced by another injection (at most 2N injections in all).
//   6. Re-registration after a kubelet restart (FakeKubelet::Restart: streams cancelled, every
//      socket in the dir deleted, a fresh kubelet.sock served), N times on one running plugin:
//      from the FakeKubelet's kRestarted event (sockets gone, kubelet.sock about to be served)
//      until it has the plugin's Register, and until the first list on the new stream. A random
//      0-20 ms between restarts so that they fall at any phase of the plugin's timers.
//
// Every run uses its own dir (mkdtemp /tmp/dpb-XXXXXX): the kubelet dir (sockets), the simulated
// node's state file and the plugin logs. The children get KGPU_SIM_NODE=dgx-h100, KGPU_SIM_STATE,
// KGPU_SIM_NODE_NAME and LD_LIBRARY_PATH=<dir of the simulated libnvidia-ml.so.1>. Children die
// with this process (PR_SET_PDEATHSIG) and are killed on every exit path (signals included; after
// SIGINT/SIGTERM the temp dir is left behind).
//
// Exit status: 0 when every step worked (whatever the figures are); 1 when something failed;
// 2 on bad usage.

#include <algorithm>
#include <atomic>
#include <cerrno>
#include <chrono>
#include <cmath>
#include <condition_variable>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <deque>
#include <filesystem>
#include <fstream>
#include <functional>
#include <map>
#include <memory>
#include <mutex>
#include <optional>
#include <random>
#include <sstream>
#include <string>
#include <thread>
#include <vector>

#include <fcntl.h>
#include <grpcpp/grpcpp.h>
#include <signal.h>
#include <sys/prctl.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include "api/record.h"
#include "bench_util.h"
#include "deviceplugin_v1beta1.grpc.pb.h"
#include "node.h"
#include "testing/fake_apiserver.h"
#include "testing/fake_kubelet.h"
#include "testing/fake_podresources.h"

#ifndef KGPU_BIN
#error "KGPU_BIN (path of the kgpu binary) must be defined by the build"
#endif
#ifndef KGPU_SIMCTL
#error "KGPU_SIMCTL (path of kgpu-simctl) must be defined by the build"
#endif
#ifndef KGPU_SIM_LIB_DIR
#error "KGPU_SIM_LIB_DIR (dir of the simulated libnvidia-ml.so.1) must be defined by the build"
#endif

extern char** environ;

namespace {

std::string g_kgpu = KGPU_BIN;  // --kgpu

using kgpu::bench::FileTail;
using kgpu::bench::InstallFatalSignalHandlers;
using kgpu::bench::KillAllChildren;
using kgpu::bench::MakeTempDir;
using kgpu::bench::NowNs;
using kgpu::bench::PrintSmaps;
using kgpu::bench::ProcMem;
using kgpu::bench::ReadProcMem;
using kgpu::bench::RemoveTree;
using kgpu::bench::Spawn;
using kgpu::bench::Stats;
using kgpu::bench::Summarize;
using kgpu::bench::UntrackChild;
using kgpu::testing::FakeKubelet;
using kgpu::testing::FakeKubeletEvent;

constexpr char kProfile[] = "dgx-h100";
constexpr char kNodeName[] = "bench-node";
constexpr char kResource[] = "nvidia.com/gpu";
constexpr unsigned kGpus = 8;
constexpr unsigned kWarmupCalls = 100;
constexpr uint64_t kXidCode = 48;    // double-bit ECC: fatal (not in the default ignore list)
constexpr uint64_t kEventXid = 0x8;  // nvmlEventTypeXidCriticalError

// Targets from the issue (2-core machine), printed next to the figures.
constexpr double kTargetStartMs = 15;
constexpr double kTargetRssMb = 12;
constexpr double kTargetReregisterP50Ms = 5;
constexpr double kTargetReregisterP99Ms = 40;
// The figures before issue 9 (dynamically linked release build, same node and driver), printed
// next to the new ones.
constexpr double kPreviousRssMb = 21.4;
constexpr double kPreviousReregisterMs = 33;
constexpr double kTargetAllocateP99Us = 300;
constexpr double kTargetPreferredP99Us = 1000;
// Steered by the records: two reads (the node's pods from the API, PodResources) on the admission
// of a whole-GPU container, whose start takes seconds; kubelet sets no deadline on the call.
constexpr double kTargetSteeredP99Us = 20000;
constexpr double kTargetXidMs = 50;

double RealtimeMs() {
  timespec ts{};
  clock_gettime(CLOCK_REALTIME, &ts);
  return static_cast<double>(ts.tv_sec) * 1e3 + static_cast<double>(ts.tv_nsec) / 1e6;
}

// The time of the plugin's first log line containing `what`, as CLOCK_REALTIME ms (spdlog writes
// local time "2026-01-02T03:04:05.678", milliseconds truncated); nullopt if there is none.
std::optional<double> LogLineTimeMs(const std::string& log, const std::string& what) {
  std::ifstream in(log);
  std::string line;
  while (std::getline(in, line)) {
    if (line.find(what) == std::string::npos || line.size() < 23) continue;
    tm t{};
    const char* rest = strptime(line.c_str(), "%Y-%m-%dT%H:%M:%S", &t);
    if (rest == nullptr || *rest != '.') return std::nullopt;
    t.tm_isdst = -1;
    const time_t secs = mktime(&t);
    return static_cast<double>(secs) * 1e3 + std::strtod(rest + 1, nullptr);
  }
  return std::nullopt;
}

void SleepMs(double ms) {
  std::this_thread::sleep_for(std::chrono::microseconds(static_cast<int64_t>(ms * 1000)));
}

// ---------------------------------------------------------------- children and cleanup

// The environment for the children: ours, with the simulated node's variables set.
class ChildEnv {
 public:
  void Set(const std::string& key, const std::string& value) { vars_[key] = value; }
  // Builds the envp (valid until the next Set / Build).
  char** Build(const std::map<std::string, std::string>& extra = {}) {
    strings_.clear();
    std::map<std::string, std::string> all;
    for (char** e = environ; *e != nullptr; ++e) {
      const std::string kv = *e;
      const auto eq = kv.find('=');
      if (eq != std::string::npos) all[kv.substr(0, eq)] = kv.substr(eq + 1);
    }
    for (const auto& [k, v] : vars_) all[k] = v;
    for (const auto& [k, v] : extra) all[k] = v;
    for (const auto& [k, v] : all) strings_.push_back(k + "=" + v);
    ptrs_.clear();
    for (auto& s : strings_) ptrs_.push_back(s.data());
    ptrs_.push_back(nullptr);
    return ptrs_.data();
  }

 private:
  std::map<std::string, std::string> vars_;
  std::vector<std::string> strings_;
  std::vector<char*> ptrs_;
};

// Waits up to timeout_ms; returns the wait status, or nullopt if still running.
std::optional<int> WaitExit(pid_t pid, int timeout_ms) {
  const int64_t deadline = NowNs() + int64_t{timeout_ms} * 1000000;
  for (;;) {
    int status = 0;
    const pid_t r = waitpid(pid, &status, WNOHANG);
    if (r == pid) {
      UntrackChild(pid);
      return status;
    }
    if (r < 0 && errno != EINTR) {
      UntrackChild(pid);
      return -1;
    }
    if (NowNs() > deadline) return std::nullopt;
    usleep(200);
  }
}

std::string DescribeStatus(int status) {
  if (status < 0) return "could not be reaped";
  if (WIFEXITED(status)) return "exited with status " + std::to_string(WEXITSTATUS(status));
  if (WIFSIGNALED(status)) return std::string("was killed by signal ") + strsignal(WTERMSIG(status));
  return "status " + std::to_string(status);
}

// A `kgpu device-plugin` child.
class Plugin {
 public:
  Plugin() = default;
  Plugin(const Plugin&) = delete;
  Plugin& operator=(const Plugin&) = delete;
  ~Plugin() { Kill(); }

  // t0 is taken just before fork().
  bool Start(const std::string& kubelet_dir, const std::vector<std::string>& extra, char** envp, const std::string& log,
             int64_t* t0) {
    std::vector<std::string> args = {g_kgpu, "device-plugin", "--kubelet-dir", kubelet_dir};
    args.insert(args.end(), extra.begin(), extra.end());
    log_ = log;
    fork_realtime_ms_ = RealtimeMs();
    *t0 = NowNs();
    pid_ = Spawn(args, envp, log);
    return pid_ > 0;
  }
  pid_t pid() const { return pid_; }
  const std::string& log() const { return log_; }
  double fork_realtime_ms() const { return fork_realtime_ms_; }
  bool running() const { return pid_ > 0; }

  // SIGTERM, then wait (SIGKILL after timeout_ms). Returns the wait status; *took_ms: until exit.
  int Terminate(int timeout_ms, double* took_ms) {
    if (pid_ <= 0) return -1;
    const int64_t t0 = NowNs();
    kill(pid_, SIGTERM);
    auto st = WaitExit(pid_, timeout_ms);
    if (took_ms != nullptr) *took_ms = static_cast<double>(NowNs() - t0) / 1e6;
    if (!st) {
      std::fprintf(stderr, "device_plugin_bench: plugin %d ignored SIGTERM for %d ms; SIGKILL\n", pid_, timeout_ms);
      Kill();
      return -1;
    }
    pid_ = -1;
    return *st;
  }
  void Kill() {
    if (pid_ <= 0) return;
    kill(pid_, SIGKILL);
    waitpid(pid_, nullptr, 0);
    UntrackChild(pid_);
    pid_ = -1;
  }
  // Exited on its own? (reaps it)
  std::optional<int> Exited() {
    if (pid_ <= 0) return -1;
    auto st = WaitExit(pid_, 0);
    if (st) pid_ = -1;
    return st;
  }
  std::string LogTail(size_t max = 3000) const { return FileTail(log_, max); }

 private:
  pid_t pid_ = -1;
  std::string log_;
  double fork_realtime_ms_ = 0;
};

// ---------------------------------------------------------------- what the FakeKubelet saw

struct Record {
  int64_t t_ns;
  FakeKubeletEvent::Kind kind;
  std::string resource;
  int registrations;
  int updates;
  bool connected;
  std::map<std::string, bool> healthy;  // id -> Healthy (kUpdate: the list just received)
  size_t devices;
};

// Every FakeKubelet event, time-stamped in the callback (on the gRPC / stream thread that saw it).
class Recorder {
 public:
  void Add(const FakeKubeletEvent& e) {
    Record r{NowNs(),
             e.kind,
             e.resource,
             e.state.registrations,
             e.state.updates,
             e.state.connected,
             {},
             e.state.devices.size()};
    for (const auto& d : e.state.devices) r.healthy[d.id] = d.health == kgpu::testing::kHealthy;
    {
      std::lock_guard<std::mutex> lock(mu_);
      records_.push_back(std::move(r));
    }
    cv_.notify_all();
  }
  size_t Cursor() const {
    std::lock_guard<std::mutex> lock(mu_);
    return records_.size();
  }
  // The first record at or after *cursor that satisfies pred, within timeout_ms; advances *cursor
  // past it.
  std::optional<Record> WaitFor(size_t* cursor, const std::function<bool(const Record&)>& pred, int timeout_ms) {
    std::unique_lock<std::mutex> lock(mu_);
    const auto deadline = std::chrono::steady_clock::now() + std::chrono::milliseconds(timeout_ms);
    for (;;) {
      while (*cursor < records_.size()) {
        const Record& r = records_[(*cursor)++];
        if (pred(r)) return r;
      }
      if (cv_.wait_until(lock, deadline) == std::cv_status::timeout && *cursor >= records_.size()) {
        return std::nullopt;
      }
    }
  }

 private:
  mutable std::mutex mu_;
  std::condition_variable cv_;
  std::deque<Record> records_;
};

// ---------------------------------------------------------------- statistics

// "OK (target <= 300 us)" or "MISSES the target (<= 300 us) by 120 us (1.40x)".
std::string Verdict(double value, double target, const char* unit) {
  char buf[160];
  if (std::isnan(value)) {
    std::snprintf(buf, sizeof buf, "NO VALUE (target <= %g %s)", target, unit);
  } else if (value <= target) {
    std::snprintf(buf, sizeof buf, "OK (target <= %g %s)", target, unit);
  } else {
    std::snprintf(buf, sizeof buf, "MISSES the target (<= %g %s) by %.3g %s (%.2fx)", target, unit, value - target,
                  unit, value / target);
  }
  return buf;
}

// ---------------------------------------------------------------- the bench

struct Options {
  int runs = 10;
  int calls = 5000;
  int xid_samples = 30;
  int restarts = 100;
  bool start_only = false;
  bool steered_only = false;
  bool keep = false;
};

class Bench {
 public:
  explicit Bench(Options o) : opt_(o) {}
  ~Bench() { Cleanup(); }

  int Run();

 private:
  bool Setup();
  void Cleanup();
  bool Fail(const std::string& what) {
    std::fprintf(stderr, "device_plugin_bench: %s\n", what.c_str());
    failed_ = true;
    return false;
  }
  std::string WriteFile(const std::string& name, const std::string& text) {
    const std::string path = dir_ + "/" + name;
    std::ofstream(path) << text;
    return path;
  }
  // Starts a plugin and waits until the FakeKubelet has the first list of `devices` devices after
  // a new registration. *took_ns: t0 (before fork) -> that list; *reg_ns: t0 -> Register done.
  bool StartPlugin(Plugin* p, const std::vector<std::string>& args, const std::string& log, size_t devices,
                   int64_t* took_ns, int64_t* reg_ns, const std::map<std::string, std::string>& extra_env = {});
  bool StopPlugin(Plugin* p, double* took_ms);
  std::vector<std::string> Ids() const;
  void PrintRss(const char* when, pid_t pid);

  bool StartToRegistered();
  bool AllocateLatency();
  bool NoopRpcLatency();
  bool PreferredLatency(const std::string& what, size_t count, int size, double* p99_out,
                        const std::vector<std::string>& expect = {}, int calls = 0,
                        std::chrono::milliseconds pause = std::chrono::milliseconds(0),
                        double target_us = kTargetPreferredP99Us);
  bool SteeredPreferredLatency();
  bool XidLatency(bool direct);
  bool RestartLatency();

  Options opt_;
  bool failed_ = false;
  std::string dir_;
  ChildEnv env_;
  std::unique_ptr<kgpu::sim::Node> node_;
  std::unique_ptr<FakeKubelet> kubelet_;
  Recorder rec_;
  Plugin plugin_;
  int registrations_ = 0;  // of kResource, as the FakeKubelet counted them
  std::mt19937 rng_{12345};
};

bool Bench::Setup() {
  dir_ = MakeTempDir("/tmp/dpb-XXXXXX");
  if (dir_.empty()) return Fail(std::string("mkdtemp /tmp/dpb-XXXXXX: ") + std::strerror(errno));
  const std::string state = dir_ + "/sim.state";
  // For kgpu::sim::Node in this process (read by ReadEnvironment) and for the children. Set before
  // any thread starts.
  setenv("KGPU_SIM_NODE", kProfile, 1);
  setenv("KGPU_SIM_STATE", state.c_str(), 1);
  setenv("KGPU_SIM_NODE_NAME", kNodeName, 1);
  env_.Set("KGPU_SIM_NODE", kProfile);
  env_.Set("KGPU_SIM_STATE", state);
  env_.Set("KGPU_SIM_NODE_NAME", kNodeName);
  env_.Set("LD_LIBRARY_PATH", KGPU_SIM_LIB_DIR);

  auto node = kgpu::sim::Node::Open(kgpu::sim::ReadEnvironment());
  if (!node.ok()) return Fail("kgpu::sim::Node::Open: " + std::string(node.status().message()));
  node_ = std::move(*node);
  if (node_->gpu_count() != kGpus) {
    return Fail("profile " + std::string(kProfile) + " has " + std::to_string(node_->gpu_count()) + " GPUs, expected " +
                std::to_string(kGpus));
  }

  kubelet_ = std::make_unique<FakeKubelet>(dir_);
  kubelet_->OnEvent([this](const FakeKubeletEvent& e) { rec_.Add(e); });
  kubelet_->SetCallTimeout(std::chrono::milliseconds(10000));
  if (auto st = kubelet_->Start(); !st.ok()) return Fail("FakeKubelet::Start: " + std::string(st.message()));
  return true;
}

void Bench::Cleanup() {
  plugin_.Kill();
  KillAllChildren();
  if (kubelet_) kubelet_->Stop();
  kubelet_.reset();
  node_.reset();
  if (!dir_.empty() && !opt_.keep) RemoveTree(dir_);
  dir_.clear();
}

bool Bench::StartPlugin(Plugin* p, const std::vector<std::string>& args, const std::string& log, size_t devices,
                        int64_t* took_ns, int64_t* reg_ns, const std::map<std::string, std::string>& extra_env) {
  size_t cursor = rec_.Cursor();
  const int prev = registrations_;
  char** envp = env_.Build(extra_env);
  int64_t t0 = 0;
  if (!p->Start(dir_, args, envp, log, &t0)) return Fail("cannot start " + g_kgpu);
  auto reg = rec_.WaitFor(
      &cursor,
      [&](const Record& r) {
        return r.kind == FakeKubeletEvent::Kind::kRegistered && r.resource == kResource && r.registrations > prev;
      },
      15000);
  std::optional<Record> list;
  if (reg) {
    list = rec_.WaitFor(
        &cursor,
        [&](const Record& r) {
          return r.kind == FakeKubeletEvent::Kind::kUpdate && r.resource == kResource && r.connected;
        },
        15000);
  }
  if (!reg || !list) {
    auto exited = p->Exited();
    return Fail(std::string("the plugin did not register ") + kResource + " with its first list within 15 s" +
                (exited ? " (it " + DescribeStatus(*exited) + ")" : "") + "; its log:\n" + p->LogTail());
  }
  registrations_ = reg->registrations;
  if (list->devices != devices) {
    return Fail("first list has " + std::to_string(list->devices) + " devices, expected " + std::to_string(devices));
  }
  *took_ns = list->t_ns - t0;
  if (reg_ns != nullptr) *reg_ns = reg->t_ns - t0;
  return true;
}

bool Bench::StopPlugin(Plugin* p, double* took_ms) {
  size_t cursor = rec_.Cursor();
  const int st = p->Terminate(5000, took_ms);
  if (st < 0 || !WIFEXITED(st) || WEXITSTATUS(st) != 0) {
    return Fail("plugin on SIGTERM " + DescribeStatus(st) + "; its log:\n" + p->LogTail());
  }
  // Its stream must have ended (kubelet marks the resource disconnected) before the next start.
  auto gone = rec_.WaitFor(
      &cursor,
      [](const Record& r) { return r.kind == FakeKubeletEvent::Kind::kDisconnected && r.resource == kResource; }, 5000);
  if (!gone && kubelet_->Get(kResource)->connected) return Fail("the FakeKubelet still sees the plugin connected");
  return true;
}

std::vector<std::string> Bench::Ids() const {
  std::vector<std::string> ids;
  if (auto s = kubelet_->Get(kResource)) {
    for (const auto& d : s->devices) ids.push_back(d.id);
  }
  return ids;
}

void Bench::PrintRss(const char* when, pid_t pid) {
  const ProcMem s = ReadProcMem(pid);
  std::printf(
      "plugin RSS %s: VmRSS %.2f MB (before issue 9: %.1f MB), VmHWM %.2f MB (anon %.2f + file %.2f + "
      "shmem %.2f MB; PSS %.2f MB; VmSize %.0f MB, %d threads) -- VmRSS %s\n",
      when, s.rss_mb, kPreviousRssMb, s.hwm_mb, s.anon_mb, s.file_mb, s.shmem_mb, s.pss_mb, s.vsz_mb, s.threads,
      Verdict(s.rss_mb, kTargetRssMb, "MB").c_str());
}

// 1 and 2.
bool Bench::StartToRegistered() {
  std::vector<double> start_ms, reg_ms, stop_ms, serving_ms;
  double cold_ms = 0, cold_reg_ms = 0;
  for (int i = 0; i <= opt_.runs; ++i) {
    int64_t took = 0, reg = 0;
    Plugin p;
    if (!StartPlugin(&p, {}, dir_ + "/start-" + std::to_string(i) + ".log", kGpus, &took, &reg, {})) return false;
    if (i > 0) {
      if (auto t = LogLineTimeMs(p.log(), "] serving ")) serving_ms.push_back(*t - p.fork_realtime_ms());
    }
    if (i == 0) {
      cold_ms = static_cast<double>(took) / 1e6;
      cold_reg_ms = static_cast<double>(reg) / 1e6;
    } else {
      start_ms.push_back(static_cast<double>(took) / 1e6);
      reg_ms.push_back(static_cast<double>(reg) / 1e6);
    }
    if (i == opt_.runs) {
      SleepMs(300);  // let it settle (threads parked, first probes done)
      PrintRss("after registration (idle, 300 ms after its first list)", p.pid());
      // Where it goes: with the release preset's static absl/yaml-cpp, the abseil and yaml-cpp
      // groups are the simulated libnvidia-ml's own (shared) dependencies.
      PrintSmaps("plugin after registration", p.pid());
    }
    double stop = 0;
    if (!StopPlugin(&p, &stop)) return false;
    stop_ms.push_back(stop);
  }
  // What a bare start costs: `kgpu` without arguments (exec, dynamic linking, static initialisers,
  // building the CLI, "A subcommand is required", exit; its exit status is not checked).
  std::vector<double> bare_ms;
  for (int i = 0; i < std::max(opt_.runs, 5); ++i) {
    char** envp = env_.Build();
    const int64_t t0 = NowNs();
    const pid_t pid = Spawn({g_kgpu}, envp, "");
    if (pid < 0) return Fail("cannot start " + g_kgpu);
    auto st = WaitExit(pid, 5000);
    if (!st) {
      kill(pid, SIGKILL);
      WaitExit(pid, 1000);
      return Fail(g_kgpu + " without arguments hung");
    }
    bare_ms.push_back(static_cast<double>(NowNs() - t0) / 1e6);
  }
  const Stats s = Summarize(start_ms), r = Summarize(reg_ms), t = Summarize(stop_ms), sv = Summarize(serving_ms),
              h = Summarize(bare_ms);
  std::printf(
      "start->registered (fork/exec -> first ListAndWatch list at the FakeKubelet), %zu runs: "
      "median %.2f ms, max %.2f ms (min %.2f ms) -- %s\n",
      s.n, s.p50, s.max, s.min, Verdict(s.p50, kTargetStartMs, "ms").c_str());
  std::printf(
      "  of which fork/exec -> Register done (kubelet dialled back, GetDevicePluginOptions): "
      "median %.2f ms, max %.2f ms; first (cold) run, not counted: %.2f ms to the list, %.2f ms "
      "to Register\n",
      r.p50, r.max, cold_ms, cold_reg_ms);
  std::printf(
      "  of which fork/exec -> the plugin's 'serving' log line (exec, dynamic linking, NVML, discovery, "
      "health monitor, gRPC server up; log has 1 ms resolution): median %.1f ms, max %.1f ms\n",
      sv.p50, sv.max);
  std::printf(
      "  for scale: fork/exec -> exit of `kgpu` without arguments (exec, dynamic linking, static "
      "initialisers, CLI set-up, usage error, exit), %zu runs: median %.2f ms, max %.2f ms\n",
      h.n, h.p50, h.max);
  std::printf("  SIGTERM -> plugin exited (status 0), %zu runs: median %.1f ms, max %.1f ms\n", t.n, t.p50, t.max);
  return true;
}

// 3.
bool Bench::AllocateLatency() {
  const auto ids = Ids();
  if (ids.size() != kGpus) return Fail("expected 8 IDs, got " + std::to_string(ids.size()));
  std::vector<double> us;
  us.reserve(static_cast<size_t>(opt_.calls));
  const int total = static_cast<int>(kWarmupCalls) + opt_.calls;
  for (int i = 0; i < total; ++i) {
    const std::string& id = ids[static_cast<size_t>(i) % ids.size()];
    const int64_t t0 = NowNs();
    auto r = kubelet_->Allocate(kResource, {id});
    const int64_t t1 = NowNs();
    if (!r.ok()) return Fail("Allocate(" + id + "): " + std::string(r.status().message()));
    if (i == 0) {
      const auto& envs = r->container_responses(0).envs();
      const auto it = envs.find("NVIDIA_VISIBLE_DEVICES");
      if (it == envs.end() || it->second != id) return Fail("Allocate(" + id + "): unexpected NVIDIA_VISIBLE_DEVICES");
    }
    if (i >= static_cast<int>(kWarmupCalls)) us.push_back(static_cast<double>(t1 - t0) / 1e3);
  }
  const Stats s = Summarize(us);
  std::printf(
      "Allocate (1 GPU, ID cycling over 8), %zu calls over the socket: p50 %.0f us, p90 %.0f us, "
      "p99 %.0f us, max %.0f us (mean %.0f, min %.0f) -- p99 %s\n",
      s.n, s.p50, s.p90, s.p99, s.max, s.mean, s.min, Verdict(s.p99, kTargetAllocateP99Us, "us").c_str());
  return true;
}

// For scale: the same round trip with an RPC that does nothing in the plugin (GetDevicePluginOptions),
// on a connection of our own made as kubelet makes it.
bool Bench::NoopRpcLatency() {
  grpc::ChannelArguments args;
  args.SetInt(GRPC_ARG_USE_LOCAL_SUBCHANNEL_POOL, 1);
  args.SetString(GRPC_ARG_DEFAULT_AUTHORITY, "localhost");
  auto channel =
      grpc::CreateCustomChannel("unix:" + dir_ + "/nvidia-gpu.sock", grpc::InsecureChannelCredentials(), args);
  if (!channel->WaitForConnected(std::chrono::system_clock::now() + std::chrono::seconds(5))) {
    return Fail("cannot connect to " + dir_ + "/nvidia-gpu.sock");
  }
  auto stub = v1beta1::DevicePlugin::NewStub(channel);
  std::vector<double> us;
  us.reserve(static_cast<size_t>(opt_.calls));
  const int total = static_cast<int>(kWarmupCalls) + opt_.calls;
  for (int i = 0; i < total; ++i) {
    grpc::ClientContext ctx;
    v1beta1::DevicePluginOptions out;
    const int64_t t0 = NowNs();
    const grpc::Status st = stub->GetDevicePluginOptions(&ctx, v1beta1::Empty(), &out);
    const int64_t t1 = NowNs();
    if (!st.ok()) return Fail("GetDevicePluginOptions: " + st.error_message());
    if (i >= static_cast<int>(kWarmupCalls)) us.push_back(static_cast<double>(t1 - t0) / 1e3);
  }
  const Stats s = Summarize(us);
  std::printf(
      "  for scale: GetDevicePluginOptions (no work in the plugin: the gRPC round trip alone), %zu calls: "
      "p50 %.0f us, p90 %.0f us, p99 %.0f us, max %.0f us (mean %.0f)\n",
      s.n, s.p50, s.p90, s.p99, s.max, s.mean);
  return true;
}

// 4.
bool Bench::PreferredLatency(const std::string& what, size_t count, int size, double* p99_out,
                             const std::vector<std::string>& expect, int calls, std::chrono::milliseconds pause,
                             double target_us) {
  const auto ids = Ids();
  if (ids.size() != count) return Fail("expected " + std::to_string(count) + " IDs, got " + std::to_string(ids.size()));
  std::vector<double> us;
  if (calls <= 0) calls = opt_.calls;
  us.reserve(static_cast<size_t>(calls));
  const int total = static_cast<int>(kWarmupCalls) + calls;
  for (int i = 0; i < total; ++i) {
    if (pause.count() > 0) std::this_thread::sleep_for(pause);
    const int64_t t0 = NowNs();
    auto r = kubelet_->GetPreferredAllocation(kResource, ids, {}, size);
    const int64_t t1 = NowNs();
    if (!r.ok()) return Fail("GetPreferredAllocation(" + what + "): " + std::string(r.status().message()));
    if (r->size() != static_cast<size_t>(size)) {
      return Fail("GetPreferredAllocation(" + what + ") returned " + std::to_string(r->size()) + " IDs");
    }
    if (!expect.empty() && *r != expect)
      return Fail("GetPreferredAllocation(" + what + ") was not steered to the record");
    if (i >= static_cast<int>(kWarmupCalls)) us.push_back(static_cast<double>(t1 - t0) / 1e3);
  }
  const Stats s = Summarize(us);
  std::printf(
      "GetPreferredAllocation %s, %zu calls: p50 %.0f us, p90 %.0f us, p99 %.0f us, max %.0f us "
      "(mean %.0f) -- p99 %s\n",
      what.c_str(), s.n, s.p50, s.p90, s.p99, s.max, s.mean, Verdict(s.p99, target_us, "us").c_str());
  if (p99_out != nullptr) *p99_out = s.p99;
  return true;
}

// 4, steered by allocation records.
bool Bench::SteeredPreferredLatency() {
  kgpu::testing::FakeApiServer api;
  if (auto st = api.Start(); !st.ok()) return Fail("FakeApiServer::Start: " + std::string(st.message()));
  kgpu::testing::FakePodResources pr(dir_ + "/pod-resources.sock");
  if (auto st = pr.Start(); !st.ok()) return Fail("FakePodResources::Start: " + std::string(st.message()));
  const std::string kubeconfig = WriteFile("kubeconfig", api.Kubeconfig());
  api.Create("namespaces", "", {{"metadata", {{"name", "ns"}}}});
  api.Create("nodes", "", {{"metadata", {{"name", kNodeName}}}});
  int64_t took = 0;
  if (!StartPlugin(&plugin_,
                   {"--publish-labels", "--kubeconfig", kubeconfig, "--node-name", kNodeName, "--pod-resources-socket",
                    pr.SocketPath()},
                   dir_ + "/steered.log", kGpus, &took, nullptr)) {
    return false;
  }
  const auto ids = Ids();  // the GPUs, in the order the plugin lists them
  v1::ListPodResourcesResponse view;
  constexpr int kPods = 110;
  for (int i = 0; i < kPods; ++i) {
    const std::string name = "p" + std::to_string(i);
    kgpu::api::AllocationRecord r{kNodeName, {{"main", kResource, "", {}}}};
    const bool pending = i == kPods - 1;
    // Pending: GPUs 5 and 2 (not the plugin's own pick); the others nominally on GPU i % 8.
    for (size_t g : pending ? std::vector<size_t>{5, 2} : std::vector<size_t>{static_cast<size_t>(i) % kGpus}) {
      r.containers[0].gpus.push_back({ids[g], "", "", 0, 0});
    }
    nlohmann::json pod = {
        {"metadata",
         {{"name", name}, {"namespace", "ns"}, {"annotations", {{"kgpu.io/allocation", kgpu::api::EncodeRecord(r)}}}}},
        {"spec",
         {{"nodeName", kNodeName}, {"containers", nlohmann::json::array({{{"name", "main"}, {"image", "cuda"}}})}}}};
    if (api.Create("pods", "ns", pod).code != 201) return Fail("cannot create pod " + name);
    if (!pending) kgpu::testing::AddDevices(view, "ns", name, "main", kResource, {ids[static_cast<size_t>(i) % kGpus]});
  }
  pr.SetListResponse(view);
  // One call every 25 ms: the plugin's API budget is 50 requests a second (burst 100), and each
  // call makes one; admissions come one pod at a time, not back to back.
  const bool ok =
      PreferredLatency("8 whole GPUs, size 2, steered by 110 pods' records (a call every 25 ms)", kGpus, 2, nullptr,
                       {ids[5], ids[2]}, std::min(opt_.calls, 400), std::chrono::milliseconds(25), kTargetSteeredP99Us);
  StopPlugin(&plugin_, nullptr);
  pr.Stop();
  return ok;
}

// 5.
bool Bench::XidLatency(bool direct) {
  std::vector<double> ms, spawn_exit_ms;
  int missed = 0;
  std::uniform_real_distribution<double> jitter(0.0, 50.0);
  auto all_healthy = [](const Record& r) {
    if (r.kind != FakeKubeletEvent::Kind::kUpdate || r.resource != kResource || r.devices != kGpus) return false;
    for (const auto& [id, ok] : r.healthy) {
      if (!ok) return false;
    }
    return true;
  };
  // Until xid_samples were seen (a miss, see below, is retried), at most twice as many injections.
  int injected = 0;
  for (int i = 0; static_cast<int>(ms.size()) < opt_.xid_samples && i < 2 * opt_.xid_samples; ++i) {
    ++injected;
    // Everything Healthy (the last list), then a random pause.
    if (kubelet_->Get(kResource)->Healthy() != static_cast<int>(kGpus) &&
        !kubelet_->WaitFor(
            kResource, [](const auto& s) { return s.connected && s.Healthy() == static_cast<int>(kGpus); },
            std::chrono::seconds(5))) {
      return Fail("the GPUs did not come back Healthy within 5 s; plugin log:\n" + plugin_.LogTail());
    }
    SleepMs(jitter(rng_));
    const unsigned gpu = static_cast<unsigned>(i) % kGpus;
    const std::string uuid = node_->uuid(gpu);
    size_t cursor = rec_.Cursor();
    int64_t t0 = 0;
    pid_t ctl = -1;
    if (direct) {
      t0 = NowNs();
      kgpu::sim::Node::Locked lock(*node_);
      node_->PushEvent(lock, gpu, kEventXid, kXidCode, kgpu::sim::kNoId, kgpu::sim::kNoId);
    } else {
      char** envp = env_.Build();
      t0 = NowNs();
      ctl = Spawn({KGPU_SIMCTL, "xid", std::to_string(gpu), std::to_string(kXidCode)}, envp, dir_ + "/simctl.log");
      if (ctl < 0) return Fail("cannot start " KGPU_SIMCTL);
    }
    auto bad = rec_.WaitFor(
        &cursor,
        [&](const Record& r) {
          if (r.kind != FakeKubeletEvent::Kind::kUpdate || r.resource != kResource) return false;
          const auto it = r.healthy.find(uuid);
          return it != r.healthy.end() && !it->second;
        },
        2000);
    if (ctl > 0) {
      auto st = WaitExit(ctl, 5000);
      if (!st || !WIFEXITED(*st) || WEXITSTATUS(*st) != 0) {
        if (!st) {
          kill(ctl, SIGKILL);
          WaitExit(ctl, 1000);
        }
        return Fail("kgpu-simctl xid " + (st ? DescribeStatus(*st) : std::string("hung")));
      }
    }
    if (!bad) {
      // Not seen: with recoverAfter 0s the next probe (<= 50 ms) may clear the fault before the plugin
      // publishes it or before its ListAndWatch thread sends the list; the list is a level, not an
      // edge, so the kubelet then gets no change at all. Counted, not in the figures; the next sample
      // starts by checking that the kubelet sees every GPU Healthy.
      ++missed;
      continue;
    }
    ms.push_back(static_cast<double>(bad->t_ns - t0) / 1e6);
    if (!rec_.WaitFor(&cursor, all_healthy, 5000)) {
      return Fail("GPU " + std::to_string(gpu) + " did not come back Healthy within 5 s; plugin log:\n" +
                  plugin_.LogTail());
    }
  }
  const Stats s = Summarize(ms);
  std::printf(
      "XID %llu -> ListAndWatch Unhealthy at the FakeKubelet, injected %s, %zu samples%s: "
      "p50 %.2f ms, p99 %.2f ms, max %.2f ms (min %.2f ms) -- p99 %s\n",
      static_cast<unsigned long long>(kXidCode),
      direct ? "in-process via kgpu::sim::Node::PushEvent (no fork/exec)"
             : "by fork/exec of `kgpu-simctl xid G 48` (includes its start-up)",
      s.n,
      missed > 0 ? (" (" + std::to_string(missed) + " more injected, never seen Unhealthy, excluded)").c_str() : "",
      s.p50, s.p99, s.max, s.min, Verdict(s.p99, kTargetXidMs, "ms").c_str());
  if (missed > 0) {
    std::printf(
        "  note: %d of %d injected XIDs never reached the FakeKubelet as Unhealthy (waited 2 s each; "
        "excluded, and replaced by further injections): with recoverAfter 0s the next 50 ms probe cleared "
        "the fault before the plugin sent a list with it (ListAndWatch carries a level, not an edge)\n",
        missed, injected);
  }
  if (static_cast<int>(ms.size()) < opt_.xid_samples) {
    return Fail("only " + std::to_string(ms.size()) + " of " + std::to_string(injected) + " XIDs were seen");
  }
  return true;
}

// 6.
bool Bench::RestartLatency() {
  std::vector<double> reg_ms, list_ms;
  std::uniform_int_distribution<int> pause_us(0, 20000);
  for (int i = 0; i < opt_.restarts; ++i) {
    size_t cursor = rec_.Cursor();
    const int prev = registrations_;
    if (auto st = kubelet_->Restart(); !st.ok()) return Fail("FakeKubelet::Restart: " + std::string(st.message()));
    auto restarted = rec_.WaitFor(
        &cursor, [](const Record& r) { return r.kind == FakeKubeletEvent::Kind::kRestarted; }, 5000);
    auto reg = rec_.WaitFor(
        &cursor,
        [&](const Record& r) {
          return r.kind == FakeKubeletEvent::Kind::kRegistered && r.resource == kResource && r.registrations > prev;
        },
        15000);
    std::optional<Record> list;
    if (reg) {
      list = rec_.WaitFor(
          &cursor,
          [&](const Record& r) {
            return r.kind == FakeKubeletEvent::Kind::kUpdate && r.resource == kResource && r.connected;
          },
          15000);
    }
    if (!restarted || !reg || !list) {
      return Fail("kubelet restart " + std::to_string(i + 1) + ": the plugin did not register " + kResource +
                  " again with a list within 15 s; its log:\n" + plugin_.LogTail());
    }
    registrations_ = reg->registrations;
    reg_ms.push_back(static_cast<double>(reg->t_ns - restarted->t_ns) / 1e6);
    list_ms.push_back(static_cast<double>(list->t_ns - restarted->t_ns) / 1e6);
    std::this_thread::sleep_for(std::chrono::microseconds(pause_us(rng_)));
  }
  const Stats r = Summarize(reg_ms), l = Summarize(list_ms);
  std::printf(
      "re-registration after a kubelet restart (sockets deleted, kubelet.sock re-created -> Register at "
      "the FakeKubelet), %zu restarts: p50 %.2f ms, p99 %.2f ms, max %.2f ms (min %.2f ms; before issue "
      "9: %.0f ms at p50 and p99) -- p50 %s, p99 %s\n",
      r.n, r.p50, r.p99, r.max, r.min, kPreviousReregisterMs, Verdict(r.p50, kTargetReregisterP50Ms, "ms").c_str(),
      Verdict(r.p99, kTargetReregisterP99Ms, "ms").c_str());
  std::printf("  to the first list on the new stream: p50 %.2f ms, p99 %.2f ms, max %.2f ms\n", l.p50, l.p99, l.max);
  return true;
}

int Bench::Run() {
  if (!Setup()) return 1;
  long cpus = sysconf(_SC_NPROCESSORS_ONLN);
  std::printf(
      "device_plugin_bench: node %s (%u x %s), %ld CPUs online, plugin %s, kubelet stand-in in-process, "
      "dir %s\n",
      kProfile, node_->gpu_count(), node_->profile().gpus.empty() ? "?" : node_->profile().gpus[0].model->key.c_str(),
      cpus, g_kgpu.c_str(), dir_.c_str());
  std::fflush(stdout);

  if (opt_.steered_only) return SteeredPreferredLatency() ? 0 : 1;
  // 1, 2.
  if (!StartToRegistered()) return 1;
  std::fflush(stdout);
  if (opt_.start_only) {
    int64_t took = 0;
    if (!StartPlugin(&plugin_, {}, dir_ + "/restarts.log", kGpus, &took, nullptr)) return 1;
    if (!RestartLatency()) return 1;
    std::fflush(stdout);
    return StopPlugin(&plugin_, nullptr) ? 0 : 1;
  }

  // 3, 4 (whole GPUs) on one plugin with the default configuration.
  int64_t took = 0;
  if (!StartPlugin(&plugin_, {}, dir_ + "/whole.log", kGpus, &took, nullptr)) return 1;
  if (!AllocateLatency()) return 1;
  if (!NoopRpcLatency()) return 1;
  if (!PreferredLatency("8 whole GPUs, size 4", kGpus, 4, nullptr)) return 1;
  if (!PreferredLatency("8 whole GPUs, size 2", kGpus, 2, nullptr)) return 1;
  PrintRss("after the Allocate/GetPreferredAllocation load", plugin_.pid());
  std::fflush(stdout);
  // 6.
  if (!RestartLatency()) return 1;
  std::fflush(stdout);
  if (!StopPlugin(&plugin_, nullptr)) return 1;

  // 4, time-slicing.
  const std::string ts = WriteFile("timeslicing.yaml",
                                   "version: v1\nsharing:\n  timeSlicing:\n    resources:\n"
                                   "    - {name: nvidia.com/gpu, replicas: 4}\n");
  if (!StartPlugin(&plugin_, {"--config-file", ts}, dir_ + "/timeslicing.log", 4 * kGpus, &took, nullptr)) return 1;
  if (!PreferredLatency("time-slicing replicas 4 (32 IDs), size 3", 4 * kGpus, 3, nullptr)) return 1;
  std::fflush(stdout);
  if (!StopPlugin(&plugin_, nullptr)) return 1;
  if (!SteeredPreferredLatency()) return 1;
  std::fflush(stdout);

  // 5.
  const std::string health = WriteFile("health.yaml", "version: v1\nhealth: {recoverAfter: 0s, probeInterval: 50ms}\n");
  if (!StartPlugin(&plugin_, {"--config-file", health}, dir_ + "/health.log", kGpus, &took, nullptr)) return 1;
  if (!XidLatency(false)) return 1;
  std::fflush(stdout);
  if (!XidLatency(true)) return 1;
  PrintRss("after the XID runs (health config, probe every 50 ms)", plugin_.pid());
  if (!StopPlugin(&plugin_, nullptr)) return 1;

  if (opt_.keep) std::printf("logs kept in %s\n", dir_.c_str());
  return failed_ ? 1 : 0;
}

int ParsePositive(const char* flag, const char* v, int max) {
  char* end = nullptr;
  errno = 0;
  const long n = std::strtol(v, &end, 10);
  if (errno != 0 || end == v || *end != '\0' || n < 1 || n > max) {
    std::fprintf(stderr, "device_plugin_bench: %s must be a number from 1 to %d, not '%s'\n", flag, max, v);
    std::exit(2);
  }
  return static_cast<int>(n);
}

}  // namespace

int main(int argc, char** argv) {
  Options opt;
  for (int i = 1; i < argc; ++i) {
    const std::string a = argv[i];
    auto next = [&]() -> const char* {
      if (i + 1 >= argc) {
        std::fprintf(stderr, "device_plugin_bench: %s needs a value\n", a.c_str());
        std::exit(2);
      }
      return argv[++i];
    };
    if (a == "--runs") {
      opt.runs = ParsePositive("--runs", next(), 1000);
    } else if (a == "--calls") {
      opt.calls = ParsePositive("--calls", next(), 10000000);
    } else if (a == "--xid-samples") {
      opt.xid_samples = ParsePositive("--xid-samples", next(), 100000);
    } else if (a == "--restarts") {
      opt.restarts = ParsePositive("--restarts", next(), 100000);
    } else if (a == "--kgpu") {
      g_kgpu = next();
      if (access(g_kgpu.c_str(), X_OK) != 0) {
        std::fprintf(stderr, "device_plugin_bench: --kgpu %s: %s\n", g_kgpu.c_str(), std::strerror(errno));
        return 2;
      }
    } else if (a == "--start-only") {
      opt.start_only = true;
    } else if (a == "--steered-only") {
      opt.steered_only = true;
    } else if (a == "--keep") {
      opt.keep = true;
    } else {
      std::fprintf(stderr,
                   "usage: %s [--kgpu PATH] [--runs N] [--calls N] [--xid-samples N] [--restarts N] [--start-only] "
                   "[--steered-only] [--keep]\n",
                   argv[0]);
      return a == "-h" || a == "--help" ? 0 : 2;
    }
  }
  InstallFatalSignalHandlers({SIGINT, SIGTERM, SIGHUP, SIGQUIT, SIGSEGV, SIGABRT, SIGBUS, SIGFPE, SIGILL});
  int rc = 0;
  {
    Bench bench(opt);
    rc = bench.Run();
  }
  KillAllChildren();
  std::fflush(stdout);
  return rc;
}
