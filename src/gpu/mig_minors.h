#pragma once
// The driver's MIG capability minors (/proc/driver/nvidia-caps/mig-minors): which
// /dev/nvidia-caps/nvidia-cap<N> node grants access to a GPU instance ("gpu0/gi1/access 12") or
// a compute instance ("gpu0/gi1/ci0/access 13"). A container given a MIG device needs both.
//
// Thread-safety: pure functions and plain values.

#include <map>
#include <string>
#include <string_view>
#include <vector>

#include "absl/status/statusor.h"

namespace kgpu::gpu {

// Key: "gpu<g>/gi<i>/access" or "gpu<g>/gi<i>/ci<c>/access"; value: the cap minor.
using MigMinors = std::map<std::string, unsigned>;

// Parses the file's text; errors read "<origin>:<line>: ...".
absl::StatusOr<MigMinors> ParseMigMinors(std::string_view text, std::string_view origin);

// /dev/nvidia-caps/nvidia-cap<N> paths of the GI and CI access capabilities of one MIG device;
// empty when the minors are not known.
std::vector<std::string> MigCapNodes(const MigMinors& minors, unsigned gpu, unsigned gi, unsigned ci);

}  // namespace kgpu::gpu
