#pragma once
// The health the device plugin serves, as a file other node tools read: `kgpu doctor` and
// `kgpu health` show the same current health as ListAndWatch, with the cause, which the kubelet
// protocol does not carry (a Device has only ID and Healthy/Unhealthy).
//
// The running plugin (Manager) rewrites <kubelet dir>/.kgpu-health.json atomically (write a
// temporary file, rename) whenever a device's health changes, and removes it when it stops. A
// reader trusts it only while a plugin socket in the same directory answers ListAndWatch: a
// plugin that was killed leaves a stale file behind.
//
// Thread-safety: reentrant.

#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"

namespace kgpu::deviceplugin {

inline constexpr char kHealthFileName[] = ".kgpu-health.json";

struct ServedHealth {
  std::string id;    // GPU or MIG UUID
  int gpu = -1;      // NVML index of the GPU (the parent, for a MIG device); -1: unknown
  bool mig = false;  // a MIG device
  bool healthy = true;
  std::string reason;  // why unhealthy ("XID 48 (Double Bit ECC Error)", "GPU is lost", ...)
  bool operator==(const ServedHealth&) const = default;
};

std::string HealthFileJson(const std::vector<ServedHealth>& devices);
// Parses the file's content; errors name `source`.
absl::StatusOr<std::vector<ServedHealth>> ParseHealthFile(const std::string& text, const std::string& source);

// Writes <kubelet_dir>/.kgpu-health.json atomically.
absl::Status WriteHealthFile(const std::string& kubelet_dir, const std::vector<ServedHealth>& devices);
// Reads it; NotFound when there is none (no kgpu plugin, or health checks disabled).
absl::StatusOr<std::vector<ServedHealth>> ReadHealthFile(const std::string& kubelet_dir);
void RemoveHealthFile(const std::string& kubelet_dir);

}  // namespace kgpu::deviceplugin
