#include "common/log.h"

#include <cstdlib>
#include <mutex>

#include <spdlog/sinks/stdout_color_sinks.h>

namespace kgpu {
namespace {
std::mutex& Mu() {
  static std::mutex mu;
  return mu;
}
spdlog::level::level_enum& Level() {
  static spdlog::level::level_enum level = [] {
    const char* env = std::getenv("KGPU_LOG_LEVEL");  // NOLINT(concurrency-mt-unsafe)
    return env != nullptr ? spdlog::level::from_str(env) : spdlog::level::info;
  }();
  return level;
}
}  // namespace

std::shared_ptr<spdlog::logger> Log(const std::string& subsystem) {
  std::lock_guard<std::mutex> lock(Mu());
  if (auto existing = spdlog::get(subsystem)) return existing;
  auto logger = spdlog::stderr_color_mt(subsystem);
  logger->set_level(Level());
  logger->set_pattern("%Y-%m-%dT%H:%M:%S.%e %^%L%$ [%n] %v");
  return logger;
}

bool SetLogLevel(const std::string& level) {
  const auto parsed = spdlog::level::from_str(level);
  if (parsed == spdlog::level::off && level != "off") return false;
  std::lock_guard<std::mutex> lock(Mu());
  Level() = parsed;
  spdlog::apply_all([&](const std::shared_ptr<spdlog::logger>& l) { l->set_level(parsed); });
  return true;
}

}  // namespace kgpu
