#pragma once
// One named spdlog logger per subsystem ("nvml", "gpu", "health", "cli", ...), all writing to
// stderr. The level comes from SetLogLevel() (flag --log-level) or KGPU_LOG_LEVEL.
//
// Thread-safety: Log() and SetLogLevel() may be called from any thread.

#include <memory>
#include <string>

#include <spdlog/spdlog.h>

namespace kgpu {

std::shared_ptr<spdlog::logger> Log(const std::string& subsystem);
// "trace", "debug", "info", "warn", "error", "off". Returns false for an unknown level.
bool SetLogLevel(const std::string& level);
// "text" (the default: `2024-05-01T10:00:00.000 I [exporter] message`) or "json": one JSON object
// per line, {"time":"...","level":"INFO","logger":"exporter","msg":"..."}, with the level names of
// Go's log/slog, as dcgm-exporter's --log-format json writes them. Returns false for another format.
bool SetLogFormat(const std::string& format);

}  // namespace kgpu
