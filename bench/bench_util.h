#pragma once
// Helpers shared by the plain benchmark drivers (device_plugin_bench, exporter_bench,
// event_latency): a monotonic clock in ns, nearest-rank percentiles and a summary of a sample, the
// registry of live child processes (killed on every exit path, signals included), fork/exec of a
// child with its output to a log, the memory figures of a process from /proc, file reading and
// temp dirs. Header-only; nothing here is part of the product.
//
// Thread-safety: the child registry (TrackChild / UntrackChild / KillAllChildren) is a fixed array
// of atomics, safe from any thread, and OnFatalSignal only reads it (async-signal-safe).
// InstallFatalSignalHandlers calls signal(), so it belongs at the start of main(), before any
// thread. Spawn forks: call it while no other thread holds a lock the child could need (after
// fork() the child makes only async-signal-safe calls). Everything else is a pure function or
// reads /proc and files, safe from any thread.

#include <algorithm>
#include <atomic>
#include <cmath>
#include <cstddef>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <initializer_list>
#include <map>
#include <sstream>
#include <string>
#include <system_error>
#include <vector>

#include <fcntl.h>
#include <signal.h>
#include <stdlib.h>
#include <sys/prctl.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

namespace kgpu::bench {

// CLOCK_MONOTONIC in ns.
inline int64_t NowNs() {
  timespec ts{};
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return static_cast<int64_t>(ts.tv_sec) * 1000000000LL + ts.tv_nsec;
}

// ---------------------------------------------------------------- statistics

// Nearest-rank percentile (p in 0..100) of sorted values; NAN when there are none.
inline double Percentile(const std::vector<double>& sorted, double p) {
  const auto n = sorted.size();
  if (n == 0) return NAN;
  auto rank = static_cast<size_t>(std::ceil(p / 100.0 * static_cast<double>(n)));
  rank = std::clamp<size_t>(rank, 1, n);
  return sorted[rank - 1];
}

struct Stats {
  size_t n = 0;
  double min = NAN, p50 = NAN, p90 = NAN, p99 = NAN, max = NAN, mean = NAN;
};

// Nearest-rank figures of v (in any order). With no values every figure is `if_empty`.
inline Stats Summarize(std::vector<double> v, double if_empty = NAN) {
  Stats s;
  s.n = v.size();
  if (v.empty()) {
    s.min = s.p50 = s.p90 = s.p99 = s.max = s.mean = if_empty;
    return s;
  }
  std::sort(v.begin(), v.end());
  double sum = 0;
  for (double x : v) sum += x;
  s.min = v.front();
  s.max = v.back();
  s.p50 = Percentile(v, 50);
  s.p90 = Percentile(v, 90);
  s.p99 = Percentile(v, 99);
  s.mean = sum / static_cast<double>(v.size());
  return s;
}

// ---------------------------------------------------------------- children and cleanup

// Live child pids, for the signal handler: a fixed array of atomics (async-signal-safe to read).
// A child beyond kMaxChildren at once is not tracked (it still dies with us: PR_SET_PDEATHSIG).
inline constexpr int kMaxChildren = 16;
inline std::atomic<pid_t> g_children[kMaxChildren];

inline void TrackChild(pid_t pid) {
  for (auto& slot : g_children) {
    pid_t empty = 0;
    if (slot.compare_exchange_strong(empty, pid)) return;
  }
}
inline void UntrackChild(pid_t pid) {
  for (auto& slot : g_children) {
    pid_t p = pid;
    if (slot.compare_exchange_strong(p, 0)) return;
  }
}
// SIGKILL and reap every tracked child.
inline void KillAllChildren() {
  for (auto& slot : g_children) {
    const pid_t p = slot.exchange(0);
    if (p > 0) {
      kill(p, SIGKILL);
      waitpid(p, nullptr, 0);
    }
  }
}

// Signal handler: SIGKILL the tracked children, then die of `sig` as if unhandled.
inline void OnFatalSignal(int sig) {
  for (auto& slot : g_children) {
    const pid_t p = slot.load();
    if (p > 0) kill(p, SIGKILL);
  }
  signal(sig, SIG_DFL);
  raise(sig);
}

// OnFatalSignal for each of `sigs`; SIGPIPE ignored.
inline void InstallFatalSignalHandlers(std::initializer_list<int> sigs) {
  for (int sig : sigs) signal(sig, OnFatalSignal);
  signal(SIGPIPE, SIG_IGN);
}

// fork + execve of args (args[0]: the path) with stdout/stderr appended to `log` (empty: /dev/null);
// the child dies with this process (PR_SET_PDEATHSIG) and is tracked. Returns its pid, or -1.
// Everything the child touches is prepared before fork(): after it, only async-signal-safe calls.
inline pid_t Spawn(const std::vector<std::string>& args, char** envp, const std::string& log) {
  std::vector<std::string> copy = args;
  std::vector<char*> argv;
  for (auto& a : copy) argv.push_back(a.data());
  argv.push_back(nullptr);
  const int fd = ::open(log.empty() ? "/dev/null" : log.c_str(), O_WRONLY | O_CREAT | O_APPEND | O_CLOEXEC, 0644);
  if (fd < 0) return -1;
  const pid_t parent = getpid();
  const pid_t pid = fork();
  if (pid == 0) {
    prctl(PR_SET_PDEATHSIG, SIGKILL);
    if (getppid() != parent) _exit(126);
    dup2(fd, 1);
    dup2(fd, 2);
    execve(argv[0], argv.data(), envp);
    _exit(127);
  }
  ::close(fd);
  if (pid > 0) TrackChild(pid);
  return pid;
}

// ---------------------------------------------------------------- /proc and files

// Memory figures of a process, in MB (-1: not read): /proc/<pid>/status and smaps_rollup.
struct ProcMem {
  double rss_mb = -1, hwm_mb = -1, anon_mb = -1, file_mb = -1, shmem_mb = -1, vsz_mb = -1;
  double pss_mb = -1, private_dirty_mb = -1, private_clean_mb = -1, shared_clean_mb = -1, shared_dirty_mb = -1;
  int threads = -1;
};

inline ProcMem ReadProcMem(pid_t pid) {
  ProcMem out;
  std::string line;
  auto kb = [&](const char* key, double* mb) {
    const size_t n = std::strlen(key);
    if (line.compare(0, n, key) == 0) *mb = std::strtod(line.c_str() + n, nullptr) / 1024.0;
  };
  std::ifstream in("/proc/" + std::to_string(pid) + "/status");
  while (std::getline(in, line)) {
    kb("VmRSS:", &out.rss_mb);
    kb("VmHWM:", &out.hwm_mb);
    kb("RssAnon:", &out.anon_mb);
    kb("RssFile:", &out.file_mb);
    kb("RssShmem:", &out.shmem_mb);
    kb("VmSize:", &out.vsz_mb);
    if (line.rfind("Threads:", 0) == 0) out.threads = std::atoi(line.c_str() + 8);
  }
  std::ifstream rollup("/proc/" + std::to_string(pid) + "/smaps_rollup");
  while (std::getline(rollup, line)) {
    kb("Pss:", &out.pss_mb);
    kb("Private_Dirty:", &out.private_dirty_mb);
    kb("Private_Clean:", &out.private_clean_mb);
    kb("Shared_Clean:", &out.shared_clean_mb);
    kb("Shared_Dirty:", &out.shared_dirty_mb);
  }
  return out;
}

// The whole file ("" if it cannot be read).
inline std::string ReadFile(const std::string& path) {
  std::ifstream in(path);
  std::stringstream s;
  s << in.rdbuf();
  return s.str();
}

// The last `max` bytes of a file (a log), "..." in front when cut.
inline std::string FileTail(const std::string& path, size_t max = 3000) {
  std::string text = ReadFile(path);
  if (text.size() > max) text = "..." + text.substr(text.size() - max);
  return text;
}

// mkdtemp(tmpl), tmpl ending in XXXXXX: the new dir, or "" (errno set) on failure.
inline std::string MakeTempDir(std::string tmpl) {
  if (mkdtemp(tmpl.data()) == nullptr) return "";
  return tmpl;
}

// Removes dir and everything under it; errors ignored.
inline void RemoveTree(const std::string& dir) {
  std::error_code ec;
  std::filesystem::remove_all(dir, ec);
}

// /proc/<pid>/smaps grouped by what is mapped (the executable, each library family, the heap,
// anonymous mappings): which group a mapping belongs to, the sums, and a print-out.
inline std::string MappingGroup(const std::string& path, const std::string& exe) {
  if (path.empty()) return "anon mmap (malloc arenas, thread stacks)";
  if (path == "[heap]") return "[heap] (main malloc arena)";
  if (path == "[stack]") return "[stack] (main thread)";
  if (path[0] == '[') return "vdso/vvar/other";
  if (path == exe) return "executable";
  if (path.find("sim.state") != std::string::npos) return "simulated node state (shared file)";
  const std::string base = std::filesystem::path(path).filename().string();
  auto starts = [&](const char* p) { return base.rfind(p, 0) == 0; };
  if (starts("libgrpc") || starts("libgpr") || starts("libupb") || starts("libaddress_sorting") || starts("libcares") ||
      starts("libre2")) {
    return "gRPC (+upb, c-ares, re2)";
  }
  if (starts("libprotobuf")) return "protobuf";
  if (starts("libabsl_")) return "abseil";
  if (starts("libspdlog") || starts("libfmt")) return "spdlog+fmt";
  if (starts("libssl") || starts("libcrypto")) return "OpenSSL (via cpp-httplib)";
  if (starts("libcpp-httplib") || starts("libz.") || starts("libbrotli")) return "cpp-httplib+zlib+brotli";
  if (starts("libyaml-cpp")) return "yaml-cpp";
  if (starts("libstdc++") || starts("libc.") || starts("libm.") || starts("libgcc_s") || starts("ld-linux")) {
    return "libc+libm+libstdc+++libgcc";
  }
  if (starts("libnvidia-ml")) return "simulated libnvidia-ml";
  return "other files (" + base + ")";
}

struct GroupMem {
  double rss_kb = 0, pss_kb = 0, private_dirty_kb = 0;
};

inline std::map<std::string, GroupMem> SmapsByGroup(pid_t pid) {
  std::map<std::string, GroupMem> out;
  std::error_code ec;
  const std::string exe = std::filesystem::read_symlink("/proc/" + std::to_string(pid) + "/exe", ec).string();
  std::ifstream in("/proc/" + std::to_string(pid) + "/smaps");
  std::string line, group;
  while (std::getline(in, line)) {
    if (line.empty()) continue;
    // A mapping header: "start-end perms offset dev inode [path]"; field lines are "Key: value".
    const auto colon = line.find(':');
    const auto space = line.find(' ');
    const bool header = colon == std::string::npos || (space != std::string::npos && space < colon);
    if (header) {
      std::istringstream s(line);
      std::string range, perms, offset, dev, inode, path;
      s >> range >> perms >> offset >> dev >> inode;
      std::getline(s, path);
      path.erase(0, path.find_first_not_of(' '));
      if (path.ends_with(" (deleted)")) path.resize(path.size() - 10);
      group = MappingGroup(path, exe);
      continue;
    }
    auto kb = [&](const char* key, double* v) {
      const size_t n = std::strlen(key);
      if (line.compare(0, n, key) == 0) *v += std::strtod(line.c_str() + n, nullptr);
    };
    GroupMem& g = out[group];
    kb("Rss:", &g.rss_kb);
    kb("Pss:", &g.pss_kb);
    kb("Private_Dirty:", &g.private_dirty_kb);
  }
  return out;
}

inline void PrintSmaps(const std::string& title, pid_t pid) {
  auto groups = SmapsByGroup(pid);
  std::vector<std::pair<std::string, GroupMem>> v(groups.begin(), groups.end());
  std::sort(v.begin(), v.end(), [](const auto& a, const auto& b) { return a.second.rss_kb > b.second.rss_kb; });
  GroupMem total;
  for (const auto& [name, g] : v) {
    total.rss_kb += g.rss_kb;
    total.pss_kb += g.pss_kb;
    total.private_dirty_kb += g.private_dirty_kb;
  }
  std::printf(
      "     %s: /proc/<pid>/smaps by mapping, MB (Rss / Pss / Private_Dirty), total %.1f / %.1f / "
      "%.1f\n",
      title.c_str(), total.rss_kb / 1024, total.pss_kb / 1024, total.private_dirty_kb / 1024);
  for (const auto& [name, g] : v) {
    if (g.rss_kb < 64) continue;
    std::printf("       %-44s %6.2f / %6.2f / %6.2f\n", name.c_str(), g.rss_kb / 1024, g.pss_kb / 1024,
                g.private_dirty_kb / 1024);
  }
}

// utime+stime of a process (live and exited threads), seconds (clock-tick resolution).
inline double ProcCpuSeconds(pid_t pid) {
  const std::string stat = ReadFile("/proc/" + std::to_string(pid) + "/stat");
  const auto rp = stat.rfind(')');
  if (rp == std::string::npos || rp + 2 > stat.size()) return -1;
  std::istringstream s(stat.substr(rp + 2));
  // Fields from 3 (state) on; utime is field 14, stime 15.
  std::string f;
  unsigned long long utime = 0, stime = 0;
  for (int field = 3; field <= 15 && (s >> f); ++field) {
    if (field == 14) utime = std::strtoull(f.c_str(), nullptr, 10);
    if (field == 15) stime = std::strtoull(f.c_str(), nullptr, 10);
  }
  return static_cast<double>(utime + stime) / static_cast<double>(sysconf(_SC_CLK_TCK));
}

}  // namespace kgpu::bench
