#include "deviceplugin/mps.h"

#include <algorithm>
#include <cerrno>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <map>
#include <thread>
#include <utility>

#include <fcntl.h>
#include <poll.h>
#include <signal.h>
#include <spawn.h>
#include <sys/stat.h>
#include <sys/statfs.h>
#include <sys/wait.h>
#include <unistd.h>

#include "common/log.h"
#include "common/strings.h"

extern char** environ;  // NOLINT: POSIX

namespace kgpu::deviceplugin {
namespace {

constexpr long kTmpfsMagic = 0x01021994;

struct Child {
  int exit_code = -1;
  std::string out, err;
};

// Runs argv with extra environment variables, feeding `input` on stdin, and collects its output
// until it exits (not until its pipes close: `-d` leaves a daemon behind that may keep them).
// Kills it after `timeout`.
absl::StatusOr<Child> Run(const std::vector<std::string>& argv, const std::map<std::string, std::string>& env,
                          const std::string& input, std::chrono::milliseconds timeout) {
  std::vector<std::string> env_strings;
  for (char** e = environ; e != nullptr && *e != nullptr; ++e) {
    const std::string_view kv(*e);
    if (env.count(std::string(kv.substr(0, kv.find('=')))) == 0) env_strings.emplace_back(kv);
  }
  for (const auto& [k, v] : env) env_strings.push_back(Cat(k, "=", v));
  std::vector<char*> envp, args;
  for (auto& s : env_strings) envp.push_back(s.data());
  envp.push_back(nullptr);
  std::vector<std::string> argv_copy = argv;
  for (auto& a : argv_copy) args.push_back(a.data());
  args.push_back(nullptr);

  int fds[3][2] = {{-1, -1}, {-1, -1}, {-1, -1}};  // stdin, stdout, stderr
  auto close_all = [&] {
    for (auto& p : fds) {
      for (int& fd : p) {
        if (fd >= 0) ::close(fd);
        fd = -1;
      }
    }
  };
  for (auto& p : fds) {
    if (pipe2(p, O_CLOEXEC) != 0) {
      const int err = errno;
      close_all();
      return absl::InternalError(Cat("pipe: ", std::strerror(err)));
    }
  }
  posix_spawn_file_actions_t fa;
  posix_spawn_file_actions_init(&fa);
  posix_spawn_file_actions_adddup2(&fa, fds[0][0], 0);
  posix_spawn_file_actions_adddup2(&fa, fds[1][1], 1);
  posix_spawn_file_actions_adddup2(&fa, fds[2][1], 2);
  posix_spawnattr_t attr;
  posix_spawnattr_init(&attr);
  sigset_t none, defaults;
  sigemptyset(&none);
  sigemptyset(&defaults);
  sigaddset(&defaults, SIGPIPE);             // the plugin ignores SIGPIPE; children get the default back
  posix_spawnattr_setsigmask(&attr, &none);  // the plugin blocks signals for sigwait(); children must not
  posix_spawnattr_setsigdefault(&attr, &defaults);
  posix_spawnattr_setflags(&attr, POSIX_SPAWN_SETSIGMASK | POSIX_SPAWN_SETSIGDEF);
  pid_t pid = 0;
  const int rc = posix_spawnp(&pid, args[0], &fa, &attr, args.data(), envp.data());
  posix_spawn_file_actions_destroy(&fa);
  posix_spawnattr_destroy(&attr);
  ::close(std::exchange(fds[0][0], -1));
  ::close(std::exchange(fds[1][1], -1));
  ::close(std::exchange(fds[2][1], -1));
  if (rc != 0) {
    close_all();
    return absl::NotFoundError(Cat("cannot run ", argv[0], ": ", std::strerror(rc),
                                   " (set --mps-control / MPS_CONTROL to the path of nvidia-cuda-mps-control)"));
  }
  if (!input.empty()) {
    // Commands are a few bytes, far below the pipe buffer: this cannot block. A client that
    // already exited gives EPIPE (SIGPIPE is ignored by the plugin), which is fine.
    [[maybe_unused]] const ssize_t n = ::write(fds[0][1], input.data(), input.size());
  }
  ::close(std::exchange(fds[0][1], -1));
  for (int i : {1, 2}) ::fcntl(fds[i][0], F_SETFL, O_NONBLOCK);
  Child child;
  auto drain = [&] {
    for (int i : {1, 2}) {
      char buf[4096];
      ssize_t n = 0;
      while (fds[i][0] >= 0 && (n = ::read(fds[i][0], buf, sizeof buf)) > 0) {
        (i == 1 ? child.out : child.err).append(buf, static_cast<size_t>(n));
      }
      if (n == 0) ::close(std::exchange(fds[i][0], -1));  // EOF
    }
  };
  const auto deadline = std::chrono::steady_clock::now() + timeout;
  int status = 0;
  bool exited = false;
  while (!exited) {
    struct pollfd pfds[2] = {{fds[1][0], POLLIN, 0}, {fds[2][0], POLLIN, 0}};
    ::poll(pfds, 2, 20);
    drain();
    exited = ::waitpid(pid, &status, WNOHANG) == pid;
    if (!exited && std::chrono::steady_clock::now() >= deadline) {
      ::kill(pid, SIGKILL);
      while (::waitpid(pid, &status, 0) < 0 && errno == EINTR) {
      }
      close_all();
      return absl::DeadlineExceededError(Cat(argv[0], " did not finish within ", timeout.count(), " ms"));
    }
  }
  drain();  // what it wrote just before exiting
  close_all();
  child.exit_code = WIFEXITED(status) ? WEXITSTATUS(status) : 128 + WTERMSIG(status);
  return child;
}

std::string Trim(std::string s) {
  while (!s.empty() && (s.back() == '\n' || s.back() == ' ' || s.back() == '\r')) s.pop_back();
  return s;
}

void Touch(const std::string& path) {
  std::ofstream(path).put('\n');
}

}  // namespace

absl::StatusOr<std::string> MpsCommand(const std::string& control, const std::string& pipe_dir,
                                       const std::string& command, std::chrono::milliseconds timeout) {
  auto child = Run({control}, {{"CUDA_MPS_PIPE_DIRECTORY", pipe_dir}}, command + "\n", timeout);
  const std::string what = Cat("MPS command '", command, "' through ", pipe_dir);
  if (!child.ok()) return absl::Status(child.status().code(), Cat(what, ": ", child.status().message()));
  if (child->exit_code != 0) {
    return absl::UnavailableError(
        Cat(what, " failed (exit ", child->exit_code, "): ", Trim(child->err.empty() ? child->out : child->err)));
  }
  return Trim(child->out);
}

MpsLimits DaemonLimits(const Plan& plan, const Resource& resource) {
  // Replicas per GPU, in the order the daemon sees the GPUs (CUDA_VISIBLE_DEVICES).
  std::vector<std::pair<unsigned, int>> per_gpu;
  for (const auto& d : resource.devices) {
    auto it = std::find_if(per_gpu.begin(), per_gpu.end(), [&](const auto& p) { return p.first == d.gpu; });
    if (it == per_gpu.end()) {
      per_gpu.emplace_back(d.gpu, 1);
    } else {
      ++it->second;
    }
  }
  MpsLimits limits;
  limits.thread_percentage = 100;
  for (unsigned i = 0; i < per_gpu.size(); ++i) {
    const auto [gpu, replicas] = per_gpu[i];
    const int most = resource.fail_requests_greater_than_one ? 1 : replicas;  // replicas one container can get
    const uint64_t total = plan.inventory->gpus()[gpu].memory_mib;
    limits.pinned_mib.emplace_back(i, total * static_cast<uint64_t>(most) / static_cast<uint64_t>(replicas));
    limits.thread_percentage = std::min(limits.thread_percentage, 100 * most / replicas);
  }
  return limits;
}

MpsDaemon::MpsDaemon(const nvml::Library& lib, std::shared_ptr<const Plan> plan, size_t resource_index,
                     std::shared_ptr<const Config> config)
    : lib_(lib), plan_(std::move(plan)), index_(resource_index), config_(std::move(config)) {}

MpsDaemon::~MpsDaemon() {
  Stop();
}

const std::string& MpsDaemon::resource_name() const {
  return plan_->resources[index_].name;
}

MpsClient MpsClientFor(const std::string& mps_root, const std::string& resource) {
  MpsClient c;
  c.pipe_dir = Cat("/mps/", resource, "/pipe");
  c.mounts.push_back({c.pipe_dir, Cat(mps_root, "/", resource, "/pipe"), false});
  c.mounts.push_back({"/dev/shm", Cat(mps_root, "/shm"), false});
  return c;
}

std::string MpsDaemon::dir() const {
  return Cat(config_->mps_root, "/", resource_name());
}

absl::Status MpsDaemon::Start() {
  auto log = Log("mps");
  const Resource& r = plan_->resources[index_];
  const std::string pipe = dir() + "/pipe", logdir = dir() + "/log", shm = config_->mps_root + "/shm";
  std::error_code ec;
  for (const auto& d : {pipe, logdir, shm}) {
    std::filesystem::create_directories(d, ec);
    if (ec) {
      return absl::PermissionDeniedError(Cat("MPS: cannot create ", d, ": ", ec.message(),
                                             " (mount the host's mpsRoot, ", config_->mps_root, ", into the plugin)"));
    }
  }
  struct statfs fs {};
  if (::statfs(shm.c_str(), &fs) == 0 && static_cast<long>(fs.f_type) != kTmpfsMagic) {
    log->warn("{} is not a tmpfs; MPS clients share memory through it (mount one: mount -t tmpfs -o size=50% tmpfs {})",
              shm, shm);
  }
  std::vector<std::string> uuids;
  for (const auto& d : r.devices) {
    const auto& g = plan_->inventory->gpus()[d.gpu];
    if (std::find(uuids.begin(), uuids.end(), g.uuid) != uuids.end()) continue;
    uuids.push_back(g.uuid);
    touched_ = true;  // from here on Stop() has something to undo
    if (auto st = lib_.SetComputeMode(g.handle, nvml::ComputeMode::kExclusiveProcess); !st.ok()) {
      return absl::Status(st.code(), Cat("MPS: setting GPU ", g.index, " to EXCLUSIVE_PROCESS: ", st.message()));
    }
  }
  const auto timeout = std::chrono::seconds(10);
  if (!MpsCommand(config_->mps_control, pipe, "get_server_list", std::chrono::seconds(2)).ok()) {
    KillStale(pipe);  // a daemon that does not answer any more would refuse the new one
    auto child = Run({config_->mps_control, "-d"},
                     {{"CUDA_MPS_PIPE_DIRECTORY", pipe},
                      {"CUDA_MPS_LOG_DIRECTORY", logdir},
                      {"CUDA_VISIBLE_DEVICES", Join(uuids, ",")}},
                     "", timeout);
    if (!child.ok())
      return absl::Status(child.status().code(), Cat("MPS daemon for ", r.name, ": ", child.status().message()));
    if (child->exit_code != 0) {
      return absl::UnavailableError(Cat("MPS daemon for ", r.name, ": ", config_->mps_control, " -d exited with ",
                                        child->exit_code, ": ", Trim(child->err + child->out), " (see ", logdir,
                                        "/control.log)"));
    }
  }
  const MpsLimits limits = DaemonLimits(*plan_, r);
  std::vector<std::string> commands;
  for (const auto& [ordinal, mib] : limits.pinned_mib) {
    commands.push_back(Cat("set_default_device_pinned_mem_limit ", ordinal, " ", mib, "M"));
  }
  commands.push_back(Cat("set_default_active_thread_percentage ", limits.thread_percentage));
  for (const auto& c : commands) {
    if (auto reply = MpsCommand(config_->mps_control, pipe, c, timeout); !reply.ok()) return reply.status();
  }
  Touch(dir() + "/.started");
  started_ = true;
  log->info("MPS daemon for {} on {} GPU(s): pipe {}, default limits {}% threads, {} MiB pinned per client", r.name,
            uuids.size(), pipe, limits.thread_percentage,
            limits.pinned_mib.empty() ? 0 : limits.pinned_mib.front().second);
  return absl::OkStatus();
}

absl::Status MpsDaemon::Probe() const {
  auto reply = MpsCommand(config_->mps_control, dir() + "/pipe", "get_default_active_thread_percentage",
                          std::chrono::seconds(3));
  if (!reply.ok()) return absl::UnavailableError(Cat("error waiting for MPS daemon: ", reply.status().message()));
  return absl::OkStatus();
}

void MpsDaemon::Stop() {
  if (!touched_) return;  // Start() changed nothing
  touched_ = started_ = false;
  auto log = Log("mps");
  if (auto st = MpsCommand(config_->mps_control, dir() + "/pipe", "quit", std::chrono::seconds(5)); !st.ok()) {
    log->warn("stopping the MPS daemon of {}: {}", resource_name(), std::string(st.status().message()));
    KillStale(dir() + "/pipe");
  }
  for (const auto& d : plan_->resources[index_].devices) {
    const auto& g = plan_->inventory->gpus()[d.gpu];
    (void)lib_.SetComputeMode(g.handle, nvml::ComputeMode::kDefault);
  }
  std::error_code ec;
  std::filesystem::remove(dir() + "/.started", ec);
}

void MpsDaemon::KillStale(const std::string& pipe) {
  // The control daemon writes its pid into the pipe directory (nvidia-cuda-mps-control.pid).
  std::ifstream in(pipe + "/nvidia-cuda-mps-control.pid");
  long pid = 0;
  if (!(in >> pid) || pid <= 1) return;
  if (::kill(static_cast<pid_t>(pid), 0) != 0) return;  // gone already
  // Only an MPS control daemon (comm is cut at 15 characters): never a process that reused the pid.
  std::string comm;
  std::getline(std::ifstream(Cat("/proc/", pid, "/comm")), comm);
  if (comm.rfind("nvidia-cuda-mps", 0) != 0) return;
  Log("mps")->warn("MPS daemon of {} (pid {}) does not answer: stopping it", resource_name(), pid);
  ::kill(static_cast<pid_t>(pid), SIGTERM);
  for (int i = 0; i < 20 && ::kill(static_cast<pid_t>(pid), 0) == 0; ++i) {
    std::this_thread::sleep_for(std::chrono::milliseconds(50));
  }
  if (::kill(static_cast<pid_t>(pid), 0) == 0) ::kill(static_cast<pid_t>(pid), SIGKILL);
}

void MarkMpsReady(const Config& config, bool ready) {
  const std::string path = config.mps_root + "/.ready";
  if (ready) {
    Touch(path);
  } else {
    std::error_code ec;
    std::filesystem::remove(path, ec);
  }
}

}  // namespace kgpu::deviceplugin
