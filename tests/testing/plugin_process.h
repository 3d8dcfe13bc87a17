#pragma once
// Test helper: `kgpu <subcommand>` (device-plugin by default) as a child process with
// --kubelet-dir, the simulated NVML on LD_LIBRARY_PATH, extra environment, and stdout/stderr in
// <dir>/plugin.log. Killed with the test (PR_SET_PDEATHSIG) and in the destructor. The including
// target defines KGPU_BIN (the kgpu binary).
//
// Thread-safety: test-thread only.

#include <fcntl.h>
#include <signal.h>
#include <sys/prctl.h>
#include <sys/wait.h>
#include <unistd.h>

#include <chrono>
#include <filesystem>
#include <fstream>
#include <sstream>
#include <string>
#include <thread>
#include <vector>

#include "testing/sim_node.h"

namespace kgpu::testing {

inline std::string LibDir() { return std::filesystem::path(SimNode::LibraryPath()).parent_path(); }

// A `kgpu device-plugin` child process; its stderr goes to a log file.
class Plugin {
 public:
  Plugin(const std::string& dir, std::vector<std::string> args, std::vector<std::string> env = {},
         const std::string& subcommand = "device-plugin")
      : log_(dir + "/plugin.log") {
    pid_ = fork();
    if (pid_ == 0) {
      prctl(PR_SET_PDEATHSIG, SIGKILL);  // never outlive a crashed test
      const int fd = ::open(log_.c_str(), O_WRONLY | O_CREAT | O_TRUNC, 0644);
      dup2(fd, 2);
      dup2(fd, 1);
      setenv("LD_LIBRARY_PATH", LibDir().c_str(), 1);
      for (const auto& e : env) putenv(const_cast<char*>(e.c_str()));
      std::vector<std::string> all = {KGPU_BIN, subcommand, "--kubelet-dir", dir};
      all.insert(all.end(), args.begin(), args.end());
      std::vector<char*> argv;
      for (auto& a : all) argv.push_back(a.data());
      argv.push_back(nullptr);
      execv(KGPU_BIN, argv.data());
      _exit(127);
    }
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
