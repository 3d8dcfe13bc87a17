#pragma once
// Checkpoints as kubelet writes them, for tests that hand one to the exporter or the plugin:
// the given JSON with "Checksum" set to the checksum kubelet computes (common/kubelet_checksum.h).
#include <nlohmann/json.hpp>

#include <string>

#include "common/kubelet_checksum.h"

namespace kgpu::testing {

inline std::string SignedCheckpoint(const std::string& json) {
  return WithKubeletChecksum(nlohmann::json::parse(json)).dump();
}

}  // namespace kgpu::testing
