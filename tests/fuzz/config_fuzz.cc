// Fuzz target for the device plugin's config parser (src/deviceplugin/config.cc). Properties: it
// never crashes, every error names the input with a position, and validating an accepted config
// and building its socket names never crashes either.
#include <cstddef>
#include <cstdint>
#include <cstdlib>
#include <string>

#include "deviceplugin/config.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  const std::string text(reinterpret_cast<const char*>(data), size);
  auto c = kgpu::deviceplugin::ParseConfig(text, "fuzz.yaml");
  if (!c.ok()) {
    if (std::string(c.status().message()).rfind("fuzz.yaml:", 0) != 0) std::abort();
    return 0;
  }
  (void)kgpu::deviceplugin::Validate(*c);
  for (const auto& r : c->sharing.resources) {
    if (r.replicas < 2 || kgpu::deviceplugin::SocketName(r.name).empty()) std::abort();
  }
  return 0;
}
