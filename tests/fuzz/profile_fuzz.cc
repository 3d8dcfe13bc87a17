// Fuzz target for the node-profile parser (simnvml/profile.cc). Properties: never crashes, errors
// always carry "<origin>:<line>:<col>: ", and an accepted profile parses again to the same node.
#include <cstddef>
#include <cstdint>
#include <cstdlib>
#include <string>

#include "profile.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  const std::string yaml(reinterpret_cast<const char*>(data), size);
  auto p = kgpu::sim::ParseProfile(yaml, "fuzz.yaml");
  if (!p.ok()) {
    if (std::string(p.status().message()).rfind("fuzz.yaml:", 0) != 0) std::abort();
    return 0;
  }
  auto again = kgpu::sim::ParseProfile(p->source, "again.yaml");
  if (!again.ok() || again->gpus.size() != p->gpus.size() || again->name != p->name) std::abort();
  for (size_t i = 0; i < p->gpus.size(); ++i) {
    if (again->gpus[i].bus != p->gpus[i].bus || again->gpus[i].mig.size() != p->gpus[i].mig.size()) {
      std::abort();
    }
  }
  return 0;
}
