#pragma once
// kubelet's device-manager checkpoint checksum (pkg/kubelet/checkpointmanager/checksum): FNV-32a
// of the checkpoint's Data as Go's go-spew prints it with "%#v" (hashutil.DeepHashObject:
// SortKeys, DisableMethods), i.e. of the text
//   (checkpoint.checkpointData){PodDeviceEntries:([]checkpoint.PodDevicesEntry)[{PodUID:(string)…
//    ContainerName:(string)… ResourceName:(string)… DeviceIDs:(checkpoint.DevicesPerNUMA)map[0:[GPU-a
//    GPU-b]] AllocResp:([]uint8)[10 66 …]}] RegisteredDevices:(map[string][]string)map[nvidia.com/gpu:[…]]}
// (types only at the top level and on struct fields; slices and maps print their elements bare;
// nil as <nil>; map keys sorted, numerically for the NUMA node). Checked against checkpoints
// written by real kubelets (tests/unit/attribution_test.cc).
//
// Only the current layout (Kubernetes >= 1.20: DeviceIDs a map of NUMA node to IDs) is hashed;
// the older one (DeviceIDs a list) is not verified.
//
// Thread-safety: pure functions.

#include <cstdint>
#include <optional>
#include <string>
#include <string_view>

#include <nlohmann/json.hpp>

#include "absl/status/status.h"

namespace kgpu::kubelet {

// The checksum kubelet would write for `data` (the checkpoint's "Data" object); nullopt when it
// is not the current layout or holds a value kubelet could not have written (AllocResp not
// base64, a NUMA key that is not an integer, a non-string ID).
std::optional<uint32_t> KubeletCheckpointChecksum(const nlohmann::json& data);

// OK when `doc` (the whole checkpoint) carries the checksum of its Data, has none, or is of the
// older layout.
// Otherwise FailedPrecondition: "<origin>: checksum <file's> does not match its contents (<computed>):
// …". A corrupt checkpoint is one kubelet itself discards.
absl::Status VerifyKubeletCheckpoint(const nlohmann::json& doc, std::string_view origin);

// `doc` with its "Checksum" set to what kubelet would write (for tests and stand-ins that write
// checkpoints as kubelet does).
nlohmann::json WithKubeletChecksum(nlohmann::json doc);

}  // namespace kgpu::kubelet
