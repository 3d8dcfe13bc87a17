// Fuzz target for the exporter's counters CSV parser (src/exporter/counters.cc). Properties: no
// crash; errors read "fuzz.csv:<line>:<column>: " with no raw control byte; an accepted file has
// at least one metric family, and every counter a DCGM name (or a 1.x lowercase one) and a known type.
#include <cstddef>
#include <cstdint>
#include <cstdlib>
#include <string>
#include <vector>

#include "common/strings.h"
#include "exporter/counters.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  const std::string text(reinterpret_cast<const char*>(data), size);
  std::vector<std::string> skipped;
  auto c = kgpu::exporter::ParseCounters(text, "fuzz.csv", &skipped);
  if (!c.ok()) {
    const std::string m(c.status().message());
    size_t i = sizeof("fuzz.csv:") - 1;
    if (m.compare(0, i, "fuzz.csv:") != 0 || kgpu::Printable(m) != m) std::abort();
    for (int part = 0; part < 2; ++part) {
      const size_t start = i;
      while (i < m.size() && m[i] >= '0' && m[i] <= '9') ++i;
      if (i == start || i >= m.size() || m[i] != ':') std::abort();
      ++i;
    }
    return 0;
  }
  bool family = false;
  for (const auto& counter : *c) {
    // DCGM names, or the 1.x lowercase ones (dcgm_gpu_temp) of 1.x-compatibility-metrics.csv.
    if ((counter.name.rfind("DCGM_", 0) != 0 && counter.name.rfind("dcgm_", 0) != 0) || counter.type.empty()) {
      std::abort();
    }
    family = family || counter.type != "label";
  }
  if (!family) std::abort();
  return 0;
}
