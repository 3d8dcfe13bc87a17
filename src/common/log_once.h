#pragma once
// ConditionLog: logs a condition that persists (a missing socket, a failing call retried on a
// timer) once, then again only when it changes, and once more when it clears; the repeats it did
// not log are counted, for a metric. One ConditionLog per condition source (e.g. "PodResources").
//
//   ConditionLog pods("exporter");
//   if (!st.ok()) pods.Report(spdlog::level::warn, Cat("PodResources: ", st.message()));
//   else pods.Clear("PodResources: answering again");
//
// Thread-safety: every method may be called from any thread.

#include <atomic>
#include <cstdint>
#include <mutex>
#include <optional>
#include <string>

#include <spdlog/spdlog.h>

#include "common/log.h"

namespace kgpu {

class ConditionLog {
 public:
  explicit ConditionLog(std::string subsystem) : subsystem_(std::move(subsystem)) {}

  // The condition `message` holds now. Logged at `level` when it is not the condition last
  // reported (the first one, or a changed one); otherwise counted as suppressed. Returns whether
  // it was logged.
  bool Report(spdlog::level::level_enum level, const std::string& message) {
    {
      std::lock_guard<std::mutex> lock(mu_);
      if (current_ == message) {
        suppressed_++;
        return false;
      }
      current_ = message;
    }
    Log(subsystem_)->log(level, "{}", message);
    return true;
  }

  // The condition is over. Logs `message` at info once when a condition was active; returns whether
  // it logged. The next Report() logs again.
  bool Clear(const std::string& message) {
    {
      std::lock_guard<std::mutex> lock(mu_);
      if (!current_) return false;
      current_.reset();
    }
    Log(subsystem_)->info("{}", message);
    return true;
  }

  bool active() const {
    std::lock_guard<std::mutex> lock(mu_);
    return current_.has_value();
  }
  // Reports not logged because they repeated the active condition.
  uint64_t suppressed() const { return suppressed_.load(); }

 private:
  const std::string subsystem_;
  mutable std::mutex mu_;
  std::optional<std::string> current_;
  std::atomic<uint64_t> suppressed_{0};
};

}  // namespace kgpu
