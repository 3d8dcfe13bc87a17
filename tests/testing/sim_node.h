#pragma once
// Test helper: selects a simulated NVML node for this process (KGPU_SIM_NODE, a private
// KGPU_SIM_STATE file, KGPU_SIM_NODE_NAME) and drives it with the kgpu-simctl binary, i.e. from
// another process, as an operator or a test script would.
//
// Thread-safety: construct before any thread opens NVML; Ctl() may be called from any thread.

#include <cstdio>
#include <cstdlib>
#include <string>

#include <unistd.h>

namespace kgpu::testing {

class SimNode {
 public:
  explicit SimNode(const std::string& profile, const std::string& node_name = "test-node") {
    char dir[] = "/tmp/kgpu-test-XXXXXX";
    dir_ = ::mkdtemp(dir) != nullptr ? dir : "/tmp";
    state_ = dir_ + "/sim.state";
    ::setenv("KGPU_SIM_NODE", profile.c_str(), 1);
    ::setenv("KGPU_SIM_STATE", state_.c_str(), 1);
    ::setenv("KGPU_SIM_NODE_NAME", node_name.c_str(), 1);
  }
  ~SimNode() {
    std::remove(state_.c_str());
    ::rmdir(dir_.c_str());
  }
  SimNode(const SimNode&) = delete;
  SimNode& operator=(const SimNode&) = delete;

  static std::string LibraryPath() { return KGPU_SIM_LIB; }
  const std::string& dir() const { return dir_; }
  // Runs `kgpu-simctl <args>` against this node; returns its exit status.
  int Ctl(const std::string& args) const {
    const std::string cmd = std::string(KGPU_SIMCTL) + " " + args + " >/dev/null";
    const int rc = std::system(cmd.c_str());  // NOLINT(concurrency-mt-unsafe): test helper
    return WIFEXITED(rc) ? WEXITSTATUS(rc) : -1;
  }

 private:
  std::string dir_;
  std::string state_;
};

}  // namespace kgpu::testing
