#pragma once
// Checkpoints as kubelet writes them, for tests that hand one to the exporter or the plugin:
// the given JSON with "Checksum" set to the checksum kubelet computes (kubelet/checksum.h).
#include <string>

#include <nlohmann/json.hpp>

#include "kubelet/checksum.h"

namespace kgpu::testing {

inline std::string SignedCheckpoint(const std::string& json) {
  return kubelet::WithKubeletChecksum(nlohmann::json::parse(json)).dump();
}

}  // namespace kgpu::testing
