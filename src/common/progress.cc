#include "common/progress.h"

#include <algorithm>

#include <unistd.h>

#include "common/strings.h"

namespace kgpu {
namespace {

std::string Seconds(int64_t s) {
  if (s < 60) return Cat(s, " s");
  if (s < 3600) return Cat(s / 60, " m ", s % 60, " s");
  return Cat(s / 3600, " h ", (s % 3600) / 60, " m");
}

}  // namespace

std::string ProgressLine(std::string_view what, size_t done, size_t total, std::string_view unit,
                         std::chrono::steady_clock::duration elapsed) {
  const int64_t secs = std::chrono::duration_cast<std::chrono::seconds>(elapsed).count();
  if (total == 0) return Cat(what, ": ", done, " ", unit, ", ", Seconds(secs), " elapsed");  // total unknown
  std::string line = Cat(what, ": ", done, "/", total, " ", unit, ", ", Seconds(secs), " elapsed");
  if (done > 0 && done < total) {
    const double per = std::chrono::duration<double>(elapsed).count() / static_cast<double>(done);
    line += Cat(", about ", Seconds(static_cast<int64_t>(per * static_cast<double>(total - done) + 0.5)), " left");
  }
  return line;
}

bool ProgressWanted(int fd, bool quiet) {
  return !quiet && ::isatty(fd) == 1;
}

Progress::Progress(std::ostream& out, bool enabled, std::string what, size_t total, std::string unit,
                   std::chrono::milliseconds period)
    : out_(out), enabled_(enabled), what_(std::move(what)), unit_(std::move(unit)), total_(total), period_(period) {
  if (!enabled_) return;
  {
    // Drawn once before anything else can happen: work that ends at once still showed its line.
    std::lock_guard lock(mu_);
    Draw();
  }
  thread_ = std::thread([this] {
    std::unique_lock lock(mu_);
    while (!cv_.wait_for(lock, period_, [this] { return stop_; })) Draw();
  });
}

Progress::~Progress() {
  if (!enabled_) return;
  {
    std::lock_guard lock(mu_);
    stop_ = true;
  }
  cv_.notify_all();
  thread_.join();
  // Clear the line: the command's own output follows on a clean terminal.
  Clear();
}

void Progress::Advance(size_t n) {
  done_.fetch_add(n, std::memory_order_relaxed);
}

void Progress::Print(std::ostream& os, std::string_view text) {
  if (!enabled_) {
    os << text << std::flush;
    return;
  }
  std::lock_guard lock(mu_);
  Clear();
  os << text << std::flush;
  if (!stop_) Draw();
}

void Progress::Clear() {
  if (drawn_width_ == 0) return;
  out_ << '\r' << std::string(drawn_width_, ' ') << '\r' << std::flush;
  drawn_width_ = 0;
}

void Progress::Draw() {
  const std::string line = ProgressLine(what_, done_.load(std::memory_order_relaxed), total_, unit_,
                                        std::chrono::steady_clock::now() - start_);
  out_ << '\r' << line;
  if (line.size() < drawn_width_) out_ << std::string(drawn_width_ - line.size(), ' ');
  out_ << std::flush;
  drawn_width_ = std::max(drawn_width_, line.size());
}

}  // namespace kgpu
