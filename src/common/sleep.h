#pragma once
// Interruptible sleep for std::jthread loops.
//
// Thread-safety: reentrant.

#include <chrono>
#include <condition_variable>
#include <mutex>
#include <stop_token>

namespace kgpu {

// Sleeps for `d` or until stop is requested. Returns false when stopped.
inline bool SleepFor(std::stop_token stop, std::chrono::milliseconds d) {
  std::mutex mu;
  std::condition_variable_any cv;
  std::unique_lock<std::mutex> lock(mu);
  return !cv.wait_for(lock, stop, d, [] { return false; }) && !stop.stop_requested();
}

}  // namespace kgpu
