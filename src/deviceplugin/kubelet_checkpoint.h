#pragma once
// The resource names kubelet's device-manager checkpoint (<kubelet dir>/device-plugins/
// kubelet_internal_checkpoint, JSON {"Data":{"PodDeviceEntries":[...],"RegisteredDevices":
// {"<resource>":["<id>",...]}},"Checksum":N}) says were registered — what kubelet keeps in the
// node's capacity across a plugin restart. The device plugin serves the ones it no longer has
// with zero devices, so they drop to 0 instead of lingering (NVIDIA issue #240).
//
// Thread-safety: a pure function.

#include <string>
#include <string_view>
#include <vector>

#include "absl/status/statusor.h"

namespace kgpu::deviceplugin {

// Errors start with "<origin>: " and say what is wrong where; a checksum that does not match the
// contents (common/kubelet_checksum.h) is one.
absl::StatusOr<std::vector<std::string>> RegisteredResources(std::string_view json, std::string_view origin);

}  // namespace kgpu::deviceplugin
