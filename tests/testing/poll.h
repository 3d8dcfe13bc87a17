#pragma once
// Test helpers for programs that drive processes: wait for a condition with a deadline, read a
// whole file (a log, a spec). Thread-safety: reentrant.

#include <chrono>
#include <fstream>
#include <functional>
#include <sstream>
#include <string>
#include <thread>

namespace kgpu::testing {

// Polls `pred` every `every` until it holds or `timeout` passes; its last answer. The one wait of
// the tests: a test waits for an event or a counter through it, never sleeps a fixed time.
inline bool WaitFor(const std::function<bool()>& pred, std::chrono::milliseconds timeout = std::chrono::seconds(60),
                    std::chrono::milliseconds every = std::chrono::milliseconds(10)) {
  const auto deadline = std::chrono::steady_clock::now() + timeout;
  while (std::chrono::steady_clock::now() < deadline) {
    if (pred()) return true;
    std::this_thread::sleep_for(every);
  }
  return pred();
}

// The file's content; empty when it cannot be read.
inline std::string ReadFile(const std::string& path) {
  std::ifstream in(path);
  std::stringstream s;
  s << in.rdbuf();
  return s.str();
}

}  // namespace kgpu::testing
