// event_latency: inject-to-wake latency of an NVML XID event across processes, on the simulated
// NVML.
//
//   event_latency [SAMPLES]      (default 2000)
//
// A forked child opens nvml::Library (the simulated libnvidia-ml.so.1 by its build path,
// KGPU_SIM_LIB), registers every GPU for XID events and blocks in EventSet::Wait. The parent opens
// the same simulated node directly (kgpu::sim::Node, as kgpu-simctl does) and, once per sample,
// reads CLOCK_MONOTONIC (t0), pushes an XID event on the next GPU and waits for the child's reply,
// which carries the CLOCK_MONOTONIC time at which its Wait returned the event (t1). Latency =
// t1 - t0: the injector's lock + ring write + futex wake, the waiter being scheduled, re-locking
// and scanning the ring, and the return through NVML and nvml::Library. The reply pipe is not in
// the figure. Samples are ~1 ms apart, so each one measures a blocked waiter being woken, not a
// queue being drained.
//
// Environment: KGPU_SIM_NODE picks the node (default dgx-a100-mig); the state file is always a
// private one under /tmp (removed at exit), so a running simulated node is never disturbed.
// Exit status: 0 when every event came back; 1 when an event was lost or mismatched, or the child
// failed or died; 2 on bad usage.

#include <algorithm>
#include <cerrno>
#include <cinttypes>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstring>
#include <iterator>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include <fcntl.h>
#include <poll.h>
#include <signal.h>
#include <stdlib.h>
#include <sys/prctl.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include "bench_util.h"
#include "node.h"
#include "nvml/library.h"

#ifndef KGPU_SIM_LIB
#error "KGPU_SIM_LIB (path of the simulated libnvidia-ml.so.1) must be defined by the build"
#endif

namespace {

using kgpu::bench::MakeTempDir;
using kgpu::bench::NowNs;
using kgpu::bench::Percentile;
using kgpu::sim::Node;

constexpr unsigned kDefaultSamples = 2000;
constexpr unsigned kWarmup = 20;               // not counted in the figures (still checked)
constexpr int kReplyTimeoutMs = 2000;          // an event not back by then is lost
constexpr unsigned kWaitMs = 5000;             // the child's EventSet::Wait timeout
constexpr unsigned kChildIdleLimitMs = 60000;  // the child gives up after this long without events
constexpr uint64_t kSentinel = ~uint64_t{0};   // event data that tells the child to finish
// Real XID codes, cycled through; the sample id goes in the bits above them.
constexpr uint64_t kXids[] = {13, 31, 43, 45, 48, 63, 64, 74, 79, 92, 94, 95};

// Child -> parent messages (one write each, well under PIPE_BUF, so never interleaved or split).
enum class Kind : uint32_t { kReady = 1, kEvent = 2, kBye = 3, kError = 4 };
struct Msg {
  Kind kind;
  uint32_t gpu;     // kReady: GPU count; kEvent: GPU index of the event's device (~0U: unknown)
  uint64_t type;    // kEvent: event type
  uint64_t data;    // kEvent: event data
  int64_t wake_ns;  // kEvent: CLOCK_MONOTONIC when Wait returned it
  char text[200];   // kError: what failed
};

bool WriteMsg(int fd, const Msg& m) {
  for (;;) {
    const ssize_t n = write(fd, &m, sizeof m);
    if (n == static_cast<ssize_t>(sizeof m)) return true;
    if (n < 0 && errno == EINTR) continue;
    return false;
  }
}

void ChildFail(int fd, const std::string& what) {
  Msg m{};
  m.kind = Kind::kError;
  std::snprintf(m.text, sizeof m.text, "%s", what.c_str());
  WriteMsg(fd, m);
}

// The waiter. Returns the child's exit status.
int RunChild(int fd, pid_t parent) {
  prctl(PR_SET_PDEATHSIG, SIGKILL);
  if (getppid() != parent) return 3;  // the parent is already gone

  kgpu::nvml::LoadOptions options;
  options.path = KGPU_SIM_LIB;
  auto lib = kgpu::nvml::Library::Open(options);
  if (!lib.ok()) {
    ChildFail(fd, "Library::Open: " + std::string(lib.status().message()));
    return 1;
  }
  auto count = (*lib)->DeviceCount();
  if (!count.ok()) {
    ChildFail(fd, "DeviceCount: " + std::string(count.status().message()));
    return 1;
  }
  std::vector<kgpu::nvml::Device> devices;
  for (unsigned i = 0; i < *count; ++i) {
    auto d = (*lib)->DeviceByIndex(i);
    if (!d.ok()) {
      ChildFail(fd, "DeviceByIndex(" + std::to_string(i) + "): " + std::string(d.status().message()));
      return 1;
    }
    devices.push_back(*d);
  }
  auto set = (*lib)->CreateEventSet();
  if (!set.ok()) {
    ChildFail(fd, "CreateEventSet: " + std::string(set.status().message()));
    return 1;
  }
  for (unsigned i = 0; i < devices.size(); ++i) {
    if (auto st = (*set)->Register(devices[i], kgpu::nvml::kEventXid); !st.ok()) {
      ChildFail(fd, "Register(GPU " + std::to_string(i) + ", XID): " + std::string(st.message()));
      return 1;
    }
  }
  Msg ready{};
  ready.kind = Kind::kReady;
  ready.gpu = *count;
  if (!WriteMsg(fd, ready)) return 1;

  int64_t idle_since = NowNs();
  for (;;) {
    auto ev = (*set)->Wait(kWaitMs);
    const int64_t woke = NowNs();
    if (!ev.ok()) {
      ChildFail(fd, "EventSet::Wait: " + std::string(ev.status().message()));
      return 1;
    }
    if (!ev->has_value()) {
      if (getppid() != parent) return 3;
      if (woke - idle_since > int64_t{kChildIdleLimitMs} * 1000000) {
        ChildFail(fd, "no event for " + std::to_string(kChildIdleLimitMs / 1000) + " s");
        return 1;
      }
      continue;
    }
    idle_since = woke;
    const kgpu::nvml::Event& e = **ev;
    if (e.data == kSentinel) break;
    Msg m{};
    m.kind = Kind::kEvent;
    m.gpu = ~0U;
    for (unsigned i = 0; i < devices.size(); ++i) {
      if (devices[i] == e.device) m.gpu = i;
    }
    m.type = e.type;
    m.data = e.data;
    m.wake_ns = woke;
    if (!WriteMsg(fd, m)) return 1;
  }
  set->reset();  // nvmlEventSetFree, then nvmlShutdown + dlclose
  lib->reset();
  Msg bye{};
  bye.kind = Kind::kBye;
  return WriteMsg(fd, bye) ? 0 : 1;
}

// Reads one message, waiting up to timeout_ms. nullopt: timed out (*eof false) or the child closed
// the pipe (*eof true).
std::optional<Msg> ReadMsg(int fd, int timeout_ms, bool* eof) {
  *eof = false;
  Msg m{};
  size_t got = 0;
  const int64_t deadline = NowNs() + int64_t{timeout_ms} * 1000000;
  auto* bytes = reinterpret_cast<char*>(&m);
  while (got < sizeof m) {
    const int64_t left_ms = (deadline - NowNs()) / 1000000;
    if (left_ms < 0) return std::nullopt;
    pollfd p{fd, POLLIN, 0};
    const int r = poll(&p, 1, static_cast<int>(left_ms) + 1);
    if (r < 0 && errno == EINTR) continue;
    if (r <= 0) {
      if (r == 0) continue;  // re-checks the deadline
      return std::nullopt;
    }
    const ssize_t n = read(fd, bytes + got, sizeof m - got);
    if (n < 0 && errno == EINTR) continue;
    if (n <= 0) {
      *eof = true;
      return std::nullopt;
    }
    got += static_cast<size_t>(n);
  }
  return m;
}

std::string DescribeStatus(int status) {
  if (WIFEXITED(status)) return "exited with status " + std::to_string(WEXITSTATUS(status));
  if (WIFSIGNALED(status)) {
    return std::string("was killed by signal ") + std::to_string(WTERMSIG(status)) + " (" +
           strsignal(WTERMSIG(status)) + ")";
  }
  return "status " + std::to_string(status);
}

// Waits for the child up to timeout_ms; then SIGTERM, then SIGKILL. Returns its wait status.
int Reap(pid_t child, int timeout_ms) {
  int status = 0;
  const int64_t deadline = NowNs() + int64_t{timeout_ms} * 1000000;
  for (int phase = 0;; ++phase) {
    for (;;) {
      const pid_t r = waitpid(child, &status, WNOHANG);
      if (r == child) return status;
      if (r < 0 && errno != EINTR) return -1;
      if (NowNs() > deadline + int64_t{phase} * 1000000000) break;
      usleep(1000);
    }
    if (phase == 0) {
      std::fprintf(stderr, "event_latency: child %d did not exit; sending SIGTERM\n", child);
      kill(child, SIGTERM);
    } else {
      std::fprintf(stderr, "event_latency: child %d ignored SIGTERM; sending SIGKILL\n", child);
      kill(child, SIGKILL);
      waitpid(child, &status, 0);
      return status;
    }
  }
}

void Sleep1ms() {
  timespec ts{0, 1000000};
  while (nanosleep(&ts, &ts) != 0 && errno == EINTR) {
  }
}

}  // namespace

int main(int argc, char** argv) {
  unsigned samples = kDefaultSamples;
  if (argc > 2 || (argc == 2 && (std::strcmp(argv[1], "-h") == 0 || std::strcmp(argv[1], "--help") == 0))) {
    std::fprintf(stderr, "usage: %s [SAMPLES]   (default %u)\n", argv[0], kDefaultSamples);
    return 2;
  }
  if (argc == 2) {
    char* end = nullptr;
    errno = 0;
    const unsigned long v = std::strtoul(argv[1], &end, 10);
    if (errno != 0 || end == argv[1] || *end != '\0' || v == 0 || v > 10000000) {
      std::fprintf(stderr, "event_latency: SAMPLES must be a number from 1 to 10000000, not '%s'\n", argv[1]);
      return 2;
    }
    samples = static_cast<unsigned>(v);
  }

  // The node (KGPU_SIM_NODE if set) and a state file private to this run; the child inherits both.
  setenv("KGPU_SIM_NODE", "dgx-a100-mig", 0);
  const std::string dir = MakeTempDir("/tmp/kgpu-event-latency.XXXXXX");
  if (dir.empty()) {
    std::perror("event_latency: mkdtemp /tmp/kgpu-event-latency.XXXXXX");
    return 1;
  }
  const std::string state_path = dir + "/node.state";
  setenv("KGPU_SIM_STATE", state_path.c_str(), 1);
  auto cleanup_files = [&] {
    unlink(state_path.c_str());
    rmdir(dir.c_str());
  };

  // Open (and so create) the node's state before the child maps it.
  auto node_or = Node::Open(kgpu::sim::ReadEnvironment());
  if (!node_or.ok()) {
    std::fprintf(stderr, "event_latency: Node::Open: %s\n", std::string(node_or.status().message()).c_str());
    cleanup_files();
    return 1;
  }
  const Node& node = **node_or;
  const unsigned gpus = node.gpu_count();
  const std::string node_name = node.profile().name;

  int fds[2];
  if (pipe2(fds, O_CLOEXEC) != 0) {
    std::perror("event_latency: pipe2");
    cleanup_files();
    return 1;
  }
  std::fflush(nullptr);
  const pid_t parent = getpid();
  const pid_t child = fork();
  if (child < 0) {
    std::perror("event_latency: fork");
    cleanup_files();
    return 1;
  }
  if (child == 0) {
    close(fds[0]);
    _exit(RunChild(fds[1], parent));  // no atexit handlers or static destructors of the parent's
  }
  close(fds[1]);
  const int rfd = fds[0];
  signal(SIGPIPE, SIG_IGN);

  bool failed = false;
  auto fail = [&](const std::string& what) {
    std::fprintf(stderr, "event_latency: %s\n", what.c_str());
    failed = true;
  };

  bool eof = false;
  auto ready = ReadMsg(rfd, 30000, &eof);
  if (!ready || ready->kind != Kind::kReady) {
    if (ready && ready->kind == Kind::kError) {
      fail(std::string("child: ") + ready->text);
    } else {
      fail(eof ? "the child died before it was ready" : "the child was not ready within 30 s");
    }
  } else if (ready->gpu != gpus) {
    fail("the child sees " + std::to_string(ready->gpu) + " GPUs, the node has " + std::to_string(gpus));
  }

  std::vector<double> lat_us;
  lat_us.reserve(samples);
  unsigned sent = 0;
  const unsigned total = kWarmup + samples;
  for (unsigned i = 0; i < total && !failed; ++i) {
    const unsigned gpu = i % gpus;
    const uint64_t data = (uint64_t{i + 1} << 16) | kXids[i % std::size(kXids)];
    const int64_t t0 = NowNs();
    {
      Node::Locked lock(node);
      node.PushEvent(lock, gpu, kgpu::nvml::kEventXid, data, kgpu::sim::kNoId, kgpu::sim::kNoId);
    }
    ++sent;
    auto reply = ReadMsg(rfd, kReplyTimeoutMs, &eof);
    if (!reply) {
      fail(eof ? "the child died (pipe closed) while event " + std::to_string(i) + " was in flight"
               : "event " + std::to_string(i) + " (GPU " + std::to_string(gpu) + ") lost: no wake-up within " +
                     std::to_string(kReplyTimeoutMs) + " ms");
      break;
    }
    if (reply->kind == Kind::kError) {
      fail(std::string("child: ") + reply->text);
      break;
    }
    if (reply->kind != Kind::kEvent || reply->data != data || reply->gpu != gpu ||
        reply->type != kgpu::nvml::kEventXid) {
      char buf[200];
      std::snprintf(buf, sizeof buf,
                    "event %u mismatched: sent GPU %u data 0x%" PRIx64 ", got GPU %u type 0x%" PRIx64
                    " data 0x%" PRIx64,
                    i, gpu, data, reply->gpu, reply->type, reply->data);
      fail(buf);
      break;
    }
    if (i >= kWarmup) lat_us.push_back(static_cast<double>(reply->wake_ns - t0) / 1000.0);
    Sleep1ms();
  }

  // Finish the child: a sentinel event, then its goodbye, then waitpid (SIGTERM/SIGKILL on a hang).
  {
    Node::Locked lock(node);
    node.PushEvent(lock, 0, kgpu::nvml::kEventXid, kSentinel, kgpu::sim::kNoId, kgpu::sim::kNoId);
  }
  bool said_bye = false;
  for (;;) {
    auto m = ReadMsg(rfd, 5000, &eof);
    if (!m) break;
    if (m->kind == Kind::kBye) {
      said_bye = true;
      break;
    }
    if (m->kind == Kind::kError) fail(std::string("child: ") + m->text);
  }
  close(rfd);
  const int status = Reap(child, 5000);
  if (status < 0 || !WIFEXITED(status) || WEXITSTATUS(status) != 0) {
    fail("the child " + (status < 0 ? std::string("could not be reaped") : DescribeStatus(status)));
  } else if (!said_bye) {
    fail("the child exited without finishing cleanly");
  }
  node_or->reset();
  cleanup_files();

  if (lat_us.size() != samples) {
    std::fprintf(stderr, "event_latency: FAILED after %u of %u events (%u warm-up)\n", sent, total, kWarmup);
    return 1;
  }
  std::vector<double> sorted = lat_us;
  std::sort(sorted.begin(), sorted.end());
  double sum = 0;
  for (const double v : sorted) sum += v;
  std::printf(
      "event_latency: node %s (%u GPUs), child pid %d, %u samples 1 ms apart after %u "
      "warm-up, XID events round-robin over the GPUs\n",
      node_name.c_str(), gpus, child, samples, kWarmup);
  std::printf(
      "inject->wake latency over %u events (cross-process): p50 %.1f us, p90 %.1f us, "
      "p99 %.1f us, max %.1f us, mean %.1f us (min %.1f us)\n",
      samples, Percentile(sorted, 50), Percentile(sorted, 90), Percentile(sorted, 99), sorted.back(),
      sum / static_cast<double>(sorted.size()), sorted.front());
  if (failed) return 1;
  return 0;
}
