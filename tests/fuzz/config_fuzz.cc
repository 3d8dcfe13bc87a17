// Fuzz target for the device plugin's config parser (src/deviceplugin/config.cc). Properties: it
// never crashes; every error reads "fuzz.yaml:<line>:<column>: " and holds no raw control byte or
// broken UTF-8 (input is escaped); an accepted config has its replicas in range, and validating it
// and building its socket names never crashes either.
#include <cstddef>
#include <cstdint>
#include <cstdlib>
#include <string>

#include "common/strings.h"
#include "deviceplugin/config.h"

namespace {
// "fuzz.yaml:<digits>:<digits>: "
bool Positioned(const std::string& m) {
  size_t i = sizeof("fuzz.yaml:") - 1;
  if (m.compare(0, i, "fuzz.yaml:") != 0) return false;
  for (int part = 0; part < 2; ++part) {
    const size_t start = i;
    while (i < m.size() && m[i] >= '0' && m[i] <= '9') ++i;
    if (i == start || i >= m.size() || m[i] != ':') return false;
    ++i;
  }
  return i < m.size() && m[i] == ' ';
}
}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  const std::string text(reinterpret_cast<const char*>(data), size);
  auto c = kgpu::deviceplugin::ParseConfig(text, "fuzz.yaml");
  if (!c.ok()) {
    const std::string m(c.status().message());
    if (!Positioned(m) || kgpu::Printable(m) != m) std::abort();
    return 0;
  }
  if (const auto st = kgpu::deviceplugin::Validate(*c); !st.ok()) {
    const std::string m(st.message());
    if (kgpu::Printable(m) != m) std::abort();
  }
  for (const auto& r : c->sharing.resources) {
    if (r.replicas < 2 || r.replicas > kgpu::deviceplugin::kMaxReplicas ||
        kgpu::deviceplugin::SocketName(r.name).empty() || r.devices.size() != r.device_positions.size()) {
      std::abort();
    }
  }
  return 0;
}
