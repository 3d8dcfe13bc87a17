// Fuzz target for the device plugin's health file parser (src/deviceplugin/health_file.cc): no
// crash, errors name the input, and what parses writes back to the same devices.
#include <cstddef>
#include <cstdint>
#include <cstdlib>
#include <string>

#include "deviceplugin/health_file.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  const std::string text(reinterpret_cast<const char*>(data), size);
  auto devices = kgpu::deviceplugin::ParseHealthFile(text, "fuzz");
  if (!devices.ok()) {
    if (std::string(devices.status().message()).rfind("fuzz:", 0) != 0) std::abort();
    return 0;
  }
  auto again = kgpu::deviceplugin::ParseHealthFile(kgpu::deviceplugin::HealthFileJson(*devices), "fuzz");
  if (!again.ok() || *again != *devices) std::abort();
  return 0;
}
