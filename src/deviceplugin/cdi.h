#pragma once
// The CDI spec file for the cdi-annotations / cdi-cri device-list strategies: one CDI device per
// GPU and MIG device (by UUID and by index), vendor k8s.device-plugin.nvidia.com, class gpu,
// written atomically into the CDI spec directory (default /var/run/cdi).
//
// Thread-safety: pure apart from the file write.

#include <string>

#include <nlohmann/json.hpp>

#include "absl/status/status.h"
#include "deviceplugin/allocator.h"
#include "deviceplugin/config.h"
#include "deviceplugin/plan.h"

namespace kgpu::deviceplugin {

std::string CdiSpecJson(const Plan& plan, const Config& config);
// Writes the spec when a CDI strategy is configured; returns the path written ("" when none).
absl::StatusOr<std::string> WriteCdiSpec(const Plan& plan, const Config& config);

// CDI containerEdits.mounts for bind mounts: never setuid or device files through them (the
// share handoff's and the DRA driver's specs).
nlohmann::json CdiMounts(const std::vector<MountSpec>& mounts);

}  // namespace kgpu::deviceplugin
