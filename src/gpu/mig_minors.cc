#include "gpu/mig_minors.h"

#include <cctype>
#include <sstream>
#include <vector>

#include "common/strings.h"

namespace kgpu::gpu {

absl::StatusOr<MigMinors> ParseMigMinors(std::string_view text, std::string_view origin) {
  MigMinors out;
  std::istringstream in{std::string(text)};
  int line_no = 0;
  for (std::string line; std::getline(in, line);) {
    ++line_no;
    if (line.find_first_not_of(" \t\r") == std::string::npos) continue;
    std::istringstream fields(line);
    std::string key, minor_text, extra;
    fields >> key >> minor_text;
    if (key.empty() || minor_text.empty() || (fields >> extra)) {
      return absl::InvalidArgumentError(
          Cat(origin, ":", line_no, ": expected '<capability> <minor>', got '", line, "'"));
    }
    unsigned minor = 0;
    for (char c : minor_text) {
      if (!std::isdigit(static_cast<unsigned char>(c)) || minor > 100000000U) {
        return absl::InvalidArgumentError(Cat(origin, ":", line_no, ": minor '", minor_text, "' is not a number"));
      }
      minor = minor * 10 + static_cast<unsigned>(c - '0');
    }
    out[key] = minor;
  }
  return out;
}

std::vector<std::string> MigCapNodes(const MigMinors& minors, unsigned gpu, unsigned gi, unsigned ci) {
  const auto g = minors.find(Cat("gpu", gpu, "/gi", gi, "/access"));
  const auto c = minors.find(Cat("gpu", gpu, "/gi", gi, "/ci", ci, "/access"));
  if (g == minors.end() || c == minors.end()) return {};
  return {Cat("/dev/nvidia-caps/nvidia-cap", g->second), Cat("/dev/nvidia-caps/nvidia-cap", c->second)};
}

}  // namespace kgpu::gpu
