#pragma once
// Durations as Go's time.ParseDuration writes them, the form kube-scheduler's, kubelet's and
// dcgm-exporter's flags take: a sequence of decimal numbers, each with a unit (ns, us, µs, ms, s,
// m, h), e.g. "300ms", "1.5h", "2h45m"; "0" alone; an optional sign. kgpu's duration flags read
// them through this one function.
//
// Thread-safety: pure functions.

#include <chrono>
#include <string>
#include <string_view>

#include "absl/status/statusor.h"

namespace kgpu {

// InvalidArgument naming `what` (when not empty) and the value, with an example, when `text` is not
// a duration.
absl::StatusOr<std::chrono::nanoseconds> ParseGoDuration(std::string_view what, std::string_view text);

// The duration in Go's form ("1m30s", "250ms", "0s").
std::string FormatGoDuration(std::chrono::nanoseconds d);

}  // namespace kgpu
