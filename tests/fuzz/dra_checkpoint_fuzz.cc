// Fuzz target for the DRA driver's checkpoint reader (src/dra/prepare.cc ParseCheckpoint): no
// crash, errors name the input, and what it accepts is read back the same way, with every field
// prepare and unprepare use of the type they read it as.
#include <cstddef>
#include <cstdint>
#include <cstdlib>
#include <string>

#include "dra/prepare.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  const std::string text(reinterpret_cast<const char*>(data), size);
  auto cp = kgpu::dra::ParseCheckpoint(text, "fuzz");
  if (!cp.ok()) {
    if (std::string(cp.status().message()).rfind("fuzz:", 0) != 0) std::abort();
    return 0;
  }
  // What Prepare's cache and Unprepare read from an accepted checkpoint must not throw.
  for (const auto& [uid, c] : (*cp)["claims"].items()) {
    for (const auto& d : c.value("devices", nlohmann::json::array())) {
      (void)d.value("requests", std::vector<std::string>{});
      (void)d.value("cdi_ids", std::vector<std::string>{});
      (void)d.value("pool", std::string());
      (void)d.value("device", std::string());
      (void)d.value("share_id", std::string());
    }
    for (const auto& r : c.value("regions", nlohmann::json::array())) (void)r.get<std::string>();
    for (const auto& m : c.value("carved", nlohmann::json::array())) {
      (void)m.value("gpu", std::string());
      (void)m.value("gi", 0U);
    }
    (void)c.value("spec", std::string());
  }
  auto again = kgpu::dra::ParseCheckpoint(cp->dump(), "fuzz");
  if (!again.ok() || *again != *cp) std::abort();
  return 0;
}
