#pragma once
// Test helper: runs a shell command line (as an operator would type it) and returns its exit code
// and everything it wrote to stdout and stderr.
//
// Thread-safety: any thread; each call is its own process.

#include <array>
#include <cstdio>
#include <string>

#include <sys/wait.h>

namespace kgpu::testing {

struct CommandResult {
  int code = -1;    // exit status; -1 when it did not exit normally
  std::string out;  // stdout and stderr, interleaved
};

inline CommandResult Shell(const std::string& cmd) {
  CommandResult r;
  FILE* p = ::popen((cmd + " 2>&1").c_str(), "r");
  if (p == nullptr) return r;
  std::array<char, 4096> buf{};
  size_t n = 0;
  while ((n = std::fread(buf.data(), 1, buf.size(), p)) > 0) r.out.append(buf.data(), n);
  const int status = ::pclose(p);
  r.code = WIFEXITED(status) ? WEXITSTATUS(status) : -1;
  return r;
}

// `s` quoted for the shell.
inline std::string Quote(const std::string& s) {
  std::string out = "'";
  for (char c : s) {
    if (c == '\'') {
      out += "'\\''";
    } else {
      out += c;
    }
  }
  return out + "'";
}

}  // namespace kgpu::testing
