// Fuzz target for the MIG capability minors parser (src/gpu/mig_minors.cc): no crash,
// errors name the input and line, and looking up capabilities never crashes.
#include <cstddef>
#include <cstdint>
#include <cstdlib>
#include <string>

#include "gpu/mig_minors.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  const std::string text(reinterpret_cast<const char*>(data), size);
  auto m = kgpu::gpu::ParseMigMinors(text, "fuzz");
  if (!m.ok()) {
    if (std::string(m.status().message()).rfind("fuzz:", 0) != 0) std::abort();
    return 0;
  }
  (void)kgpu::gpu::MigCapNodes(*m, 0, 1, 0);
  return 0;
}
