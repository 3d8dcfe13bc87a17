// Fuzz target for dcgm-exporter's device selector (-d/--devices; src/exporter/device_selector.cc).
// Properties: it never crashes; an error starts with the flag and the value quoted, as the unit
// tests expect of every refusal; an accepted selector is flex alone or selects GPUs and/or GPU
// instances with at most 1024 indices each, and written back in the grammar (g:ids+i:ids) it
// parses to the same selection.
#include <cstddef>
#include <cstdint>
#include <cstdlib>
#include <string>
#include <vector>

#include "exporter/device_selector.h"

namespace {
void Expect(bool ok) {
  if (!ok) std::abort();
}

std::string Letter(const char* letter, const std::vector<unsigned>& ids) {
  std::string out = letter;
  for (size_t i = 0; i < ids.size(); ++i) out += (i == 0 ? ":" : ",") + std::to_string(ids[i]);
  return out;
}
}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  using kgpu::exporter::ParseDeviceSelector;
  const std::string value(reinterpret_cast<const char*>(data), size);
  auto s = ParseDeviceSelector("-d", value);
  if (!s.ok()) {
    Expect(std::string(s.status().message()).rfind("-d '" + value + "': ", 0) == 0);
    return 0;
  }
  Expect(s->gpu_ids.size() <= 1024 && s->instance_ids.size() <= 1024);
  if (s->flex) {
    Expect(!s->gpus && !s->instances && s->gpu_ids.empty() && s->instance_ids.empty());
    return 0;
  }
  Expect(s->gpus || s->instances);
  Expect((s->gpus || s->gpu_ids.empty()) && (s->instances || s->instance_ids.empty()));
  std::string again;
  if (s->gpus) again = Letter("g", s->gpu_ids);
  if (s->instances) again += (again.empty() ? "" : "+") + Letter("i", s->instance_ids);
  auto t = ParseDeviceSelector("-d", again);
  Expect(t.ok() && !t->flex && t->gpus == s->gpus && t->instances == s->instances && t->gpu_ids == s->gpu_ids &&
         t->instance_ids == s->instance_ids);
  return 0;
}
