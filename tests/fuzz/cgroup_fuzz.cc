// Fuzz target for the /proc/<pid>/cgroup parser (src/exporter/attribution.cc). Properties: it
// never crashes; a pod UID it returns is 32 hex digits with only '-' besides, never starting or
// ending with '-'; a container ID is hex only; and the same text parses the same way again.
#include <cstddef>
#include <cstdint>
#include <cstdlib>
#include <string>
#include <string_view>

#include "exporter/attribution.h"

namespace {
bool IsHex(char c) {
  return (c >= '0' && c <= '9') || (c >= 'a' && c <= 'f') || (c >= 'A' && c <= 'F');
}
}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  const std::string_view text(reinterpret_cast<const char*>(data), size);
  const auto info = kgpu::exporter::ParseCgroup(text);
  if (!info) return 0;
  int hex = 0;
  for (char c : info->pod_uid) {
    if (IsHex(c)) {
      ++hex;
    } else if (c != '-') {
      std::abort();
    }
  }
  if (hex != 32 || info->pod_uid.front() == '-' || info->pod_uid.back() == '-') std::abort();
  for (char c : info->container_id) {
    if (!IsHex(c)) std::abort();
  }
  const auto again = kgpu::exporter::ParseCgroup(text);
  if (!again || again->pod_uid != info->pod_uid || again->container_id != info->container_id) {
    std::abort();
  }
  return 0;
}
