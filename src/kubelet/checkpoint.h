#pragma once
// The resource names kubelet's device-manager checkpoint (<kubelet dir>/device-plugins/
// kubelet_internal_checkpoint, JSON {"Data":{"PodDeviceEntries":[...],"RegisteredDevices":
// {"<resource>":["<id>",...]}},"Checksum":N}) says were registered — what kubelet keeps in the
// node's capacity across a plugin restart. The device plugin serves the ones it no longer has
// with zero devices, so they drop to 0 instead of lingering (NVIDIA issue #240).
//
// Also the host paths its containers mount, from the Allocate responses it keeps (below).
//
// Thread-safety: pure functions.

#include <set>
#include <string>
#include <string_view>
#include <vector>

#include "absl/status/statusor.h"

namespace kgpu::kubelet {

// Errors start with "<origin>: " and say what is wrong where; a checksum that does not match the
// contents (kubelet/checksum.h) is one.
absl::StatusOr<std::vector<std::string>> RegisteredResources(std::string_view json, std::string_view origin);

// Every Mounts[].HostPath of every Data.PodDeviceEntries[].AllocResp: the ContainerAllocateResponse
// a device plugin returned for a container (base64 in the JSON), which kubelet keeps while the
// pod is active and replays when the container restarts. Errors as RegisteredResources' (and an
// AllocResp that is not base64 of a ContainerAllocateResponse is one): a caller that removes what
// no container mounts must then remove nothing.
absl::StatusOr<std::set<std::string>> CheckpointedMountSources(std::string_view json, std::string_view origin);

}  // namespace kgpu::kubelet
