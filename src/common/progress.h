#pragma once
// Progress of long work on a terminal: "kgpu sim: 3/20 runs, 12 s elapsed, about 1 m 8 s left",
// redrawn in place (\r) at most every `period` from a thread of its own, and cleared at the end,
// so what the command prints on stdout is untouched. Enabled only where a person watches: the
// stream is a terminal (isatty) and the command was not given --quiet (ProgressWanted).
//
// Thread-safety: Advance() may be called from any thread; construct and destroy on one.

#include <atomic>
#include <chrono>
#include <condition_variable>
#include <cstddef>
#include <mutex>
#include <ostream>
#include <string>
#include <string_view>
#include <thread>

namespace kgpu {

// The line for `done` of `total` `unit`s after `elapsed`: the estimate from the mean so far,
// none before the first is done; `total` 0 (unknown): `done` alone, no estimate. Exposed for tests.
std::string ProgressLine(std::string_view what, size_t done, size_t total, std::string_view unit,
                         std::chrono::steady_clock::duration elapsed);

// Whether to show progress on `fd` (2 for stderr): a terminal, and not --quiet.
bool ProgressWanted(int fd, bool quiet);

class Progress {
 public:
  // Disabled (enabled false): every call does nothing and nothing is written.
  Progress(std::ostream& out, bool enabled, std::string what, size_t total, std::string unit,
           std::chrono::milliseconds period = std::chrono::milliseconds(500));
  ~Progress();  // clears the line
  Progress(const Progress&) = delete;
  Progress& operator=(const Progress&) = delete;

  void Advance(size_t n = 1);
  // Writes `text` (whole lines) to `os` (stdout, say, on the same terminal) without mixing it into
  // the progress line: the line is cleared first and drawn again after.
  void Print(std::ostream& os, std::string_view text);

 private:
  void Draw();   // with mu_ held
  void Clear();  // with mu_ held

  std::ostream& out_;
  const bool enabled_;
  const std::string what_, unit_;
  const size_t total_;
  const std::chrono::milliseconds period_;
  const std::chrono::steady_clock::time_point start_ = std::chrono::steady_clock::now();
  std::atomic<size_t> done_{0};
  std::mutex mu_;
  std::condition_variable cv_;
  bool stop_ = false;
  size_t drawn_width_ = 0;
  std::thread thread_;
};

}  // namespace kgpu
