#pragma once
// Test helper: Prometheus' own linter on a /metrics page. `promtool check metrics` (Debian's
// prometheus package, installed by scripts/install-deps.sh) reads the page on stdin and prints one
// line per finding: missing HELP, bad names, malformed lines.
//
// Thread-safety: any thread; each call is its own process and temporary file.

#include <cstdio>
#include <cstdlib>
#include <fstream>
#include <string>

#include <unistd.h>

#include "testing/shell.h"

namespace kgpu::testing {

// What promtool finds in `page` ("" when it is clean), or a line starting "promtool missing"
// when the tool is not installed.
inline std::string PromtoolFindings(const std::string& page) {
  if (Shell("command -v promtool").code != 0) return "promtool missing: run scripts/install-deps.sh";
  char path[] = "/tmp/kgpu-metrics-XXXXXX";
  const int fd = ::mkstemp(path);
  if (fd < 0) return "cannot create a temporary file";
  ::close(fd);
  std::ofstream(path, std::ios::binary) << page;
  const CommandResult r = Shell(std::string("promtool check metrics < ") + path);
  std::remove(path);
  return r.out;
}

}  // namespace kgpu::testing
