#pragma once
// Small file helpers.
//
// Thread-safety: reentrant.

#include <fstream>
#include <optional>
#include <sstream>
#include <string>

namespace kgpu {

// The whole content of a file, or nullopt when it cannot be read.
inline std::optional<std::string> ReadFile(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  if (!in) return std::nullopt;
  std::stringstream buf;
  buf << in.rdbuf();
  return buf.str();
}

}  // namespace kgpu
