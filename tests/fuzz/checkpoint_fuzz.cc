// Fuzz target for kubelet's device-manager checkpoint parsers: the exporter's pod entries
// (src/exporter/attribution.cc) and the device plugin's registered resources and mounted host
// paths (src/kubelet/checkpoint.cc); and for the other node-local JSON the exporter reads,
// a kgpu.io/gpu container's CDI spec (ParseShareSpec). Properties: they never crash; every error
// starts with the origin; an accepted entry has a non-empty pod UID; stripping "::<n>" from any
// accepted device ID yields a prefix of it; an accepted spec names at least one GPU.
#include <cstddef>
#include <cstdint>
#include <cstdlib>
#include <string>
#include <string_view>

#include "exporter/attribution.h"
#include "kubelet/checkpoint.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  const std::string_view text(reinterpret_cast<const char*>(data), size);
  const auto registered = kgpu::kubelet::RegisteredResources(text, "fuzz.json");
  if (!registered.ok() && std::string(registered.status().message()).rfind("fuzz.json: ", 0) != 0) std::abort();
  // The mounts of the Allocate responses it keeps (the time-slicing accounting sweep's input).
  const auto mounts = kgpu::kubelet::CheckpointedMountSources(text, "fuzz.json");
  if (!mounts.ok() && std::string(mounts.status().message()).rfind("fuzz.json: ", 0) != 0) std::abort();
  const auto spec = kgpu::exporter::ParseShareSpec(text, "fuzz.json");
  if (spec.ok() ? spec->uuids.empty() : std::string(spec.status().message()).rfind("fuzz.json: ", 0) != 0) std::abort();
  const auto entries = kgpu::exporter::ParseCheckpoint(text, "fuzz.json");
  if (!entries.ok()) {
    if (std::string(entries.status().message()).rfind("fuzz.json: ", 0) != 0) std::abort();
    return 0;
  }
  for (const auto& e : *entries) {
    if (e.pod_uid.empty()) std::abort();
    for (const auto& id : e.device_ids) {
      const std::string_view stripped = kgpu::exporter::StripReplica(id);
      if (std::string_view(id).substr(0, stripped.size()) != stripped) std::abort();
    }
  }
  return 0;
}
