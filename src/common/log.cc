#include "common/log.h"

#include <cstdlib>
#include <ctime>
#include <memory>
#include <mutex>
#include <string_view>

#include <spdlog/pattern_formatter.h>
#include <spdlog/sinks/stdout_color_sinks.h>

namespace kgpu {
namespace {
std::mutex& Mu() {
  static std::mutex mu;
  return mu;
}
bool& Json() {
  static bool json = false;
  return json;
}

constexpr char kTextPattern[] = "%Y-%m-%dT%H:%M:%S.%e %^%L%$ [%n] %v";

// %* in the JSON pattern: the message as a JSON string body (quotes, backslashes and control
// characters escaped), so that any message keeps the line valid JSON.
class JsonMessage : public spdlog::custom_flag_formatter {
 public:
  void format(const spdlog::details::log_msg& msg, const std::tm&, spdlog::memory_buf_t& dest) override {
    static constexpr char kHex[] = "0123456789abcdef";
    for (const char c : msg.payload) {
      const auto u = static_cast<unsigned char>(c);
      if (c == '"' || c == '\\') {
        dest.push_back('\\');
        dest.push_back(c);
      } else if (u < 0x20) {
        const char esc[] = {'\\', 'u', '0', '0', kHex[u >> 4], kHex[u & 0xf]};
        dest.append(esc, esc + sizeof esc);
      } else {
        dest.push_back(c);
      }
    }
  }
  std::unique_ptr<custom_flag_formatter> clone() const override { return std::make_unique<JsonMessage>(); }
};

// %& in the JSON pattern: Go's slog level names (DEBUG, INFO, WARN, ERROR), as dcgm-exporter writes.
class SlogLevel : public spdlog::custom_flag_formatter {
 public:
  void format(const spdlog::details::log_msg& msg, const std::tm&, spdlog::memory_buf_t& dest) override {
    std::string_view name = "INFO";
    switch (msg.level) {
      case spdlog::level::trace:
      case spdlog::level::debug:
        name = "DEBUG";
        break;
      case spdlog::level::warn:
        name = "WARN";
        break;
      case spdlog::level::err:
      case spdlog::level::critical:
        name = "ERROR";
        break;
      default:
        break;
    }
    dest.append(name.data(), name.data() + name.size());
  }
  std::unique_ptr<custom_flag_formatter> clone() const override { return std::make_unique<SlogLevel>(); }
};

void ApplyFormat(spdlog::logger& logger) {
  if (!Json()) {
    logger.set_pattern(kTextPattern);
    return;
  }
  auto f = std::make_unique<spdlog::pattern_formatter>();
  f->add_flag<JsonMessage>('*').add_flag<SlogLevel>('&').set_pattern(
      R"({"time":"%Y-%m-%dT%H:%M:%S.%e%z","level":"%&","logger":"%n","msg":"%*"})");
  logger.set_formatter(std::move(f));
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
  ApplyFormat(*logger);
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

bool SetLogFormat(const std::string& format) {
  if (format != "text" && format != "json") return false;
  std::lock_guard<std::mutex> lock(Mu());
  Json() = format == "json";
  spdlog::apply_all([](const std::shared_ptr<spdlog::logger>& l) { ApplyFormat(*l); });
  return true;
}

}  // namespace kgpu
