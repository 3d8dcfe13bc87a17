#pragma once
// Test helper: `kgpu <subcommand>` (device-plugin by default) as a child process with
// --kubelet-dir, the simulated NVML on LD_LIBRARY_PATH, extra environment, and stdout/stderr in
// <dir>/plugin.log. Killed with the test (PR_SET_PDEATHSIG) and in the destructor. The including
// target defines KGPU_BIN (the kgpu binary).
//
// Thread-safety: test-thread only.

#include <chrono>
#include <filesystem>
#include <fstream>
#include <sstream>
#include <string>
#include <thread>
#include <vector>

#include <fcntl.h>
#include <signal.h>
#include <sys/prctl.h>
#include <sys/wait.h>
#include <unistd.h>

#include "testing/sim_node.h"
#include "testing/spawn.h"

namespace kgpu::testing {

inline std::string LibDir() {
  return std::filesystem::path(SimNode::LibraryPath()).parent_path();
}

// A `kgpu device-plugin` child process; its stderr goes to a log file.
class Plugin {
 public:
  Plugin(const std::string& dir, std::vector<std::string> args, std::vector<std::string> env = {},
         const std::string& subcommand = "device-plugin")
      : log_(dir + "/plugin.log") {
    // The kubelet directory for the commands that serve kubelet (node-labels has no such flag).
    std::vector<std::string> all = {KGPU_BIN, subcommand};
    if (subcommand != "node-labels") all.insert(all.end(), {"--kubelet-dir", dir});
    all.insert(all.end(), args.begin(), args.end());
    SpawnOptions o;
    o.log = log_;
    o.env = {"LD_LIBRARY_PATH=" + LibDir()};
    o.env.insert(o.env.end(), env.begin(), env.end());
    pid_ = Spawn(all, o);
  }
  ~Plugin() {
    if (pid_ > 0 && !exited_) {
      kill(pid_, SIGKILL);
      waitpid(pid_, nullptr, 0);
    }
  }
  void Signal(int sig) const { kill(pid_, sig); }
  // Exit status, or -1 if it is still running after `timeout`.
  int Wait(std::chrono::milliseconds timeout) {
    const auto deadline = std::chrono::steady_clock::now() + timeout;
    while (std::chrono::steady_clock::now() < deadline) {
      int status = 0;
      if (waitpid(pid_, &status, WNOHANG) == pid_) {
        exited_ = true;
        return WIFEXITED(status) ? WEXITSTATUS(status) : 128 + WTERMSIG(status);
      }
      std::this_thread::sleep_for(std::chrono::milliseconds(10));
    }
    return -1;
  }
  std::string Log() const {
    std::ifstream in(log_);
    std::stringstream s;
    s << in.rdbuf();
    return s.str();
  }

 private:
  std::string log_;
  pid_t pid_ = -1;
  bool exited_ = false;
};

}  // namespace kgpu::testing
