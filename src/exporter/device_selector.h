#pragma once
// dcgm-exporter's device selector grammar (-d/--devices; -s and -p, which kgpu accepts only as f),
// apart from the command that reads the flags, so that its fuzz target
// (tests/fuzz/device_selector_fuzz.cc) links the exporter's library alone.
//
// Thread-safety: pure.

#include <string_view>

#include "absl/status/statusor.h"
#include "exporter/exporter.h"

namespace kgpu::exporter {

// f | g[:ids] | i[:ids] | g[:ids]+i[:ids], ids a comma list of numbers and ranges (0,2-4), at most
// 1024 indices per letter. Errors start with `flag` and the value quoted ("-d 'x': ..."; the value
// alone when `flag` is empty) and show the syntax.
absl::StatusOr<DeviceSelector> ParseDeviceSelector(std::string_view flag, std::string_view value);

}  // namespace kgpu::exporter
