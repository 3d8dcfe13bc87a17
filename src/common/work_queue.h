#pragma once
// WorkQueue<T>: items handed, in order, to one worker thread of their own, so that whoever pushes
// (a request handler) never waits for the work (API writes, evictions). At most `capacity` items
// wait; Push refuses more, as client-go's event broadcaster drops when its queue is full.
//
// Thread-safety: Push from any thread; Start and Stop from the owner. Items still waiting at Stop
// are dropped.

#include <condition_variable>
#include <cstddef>
#include <deque>
#include <functional>
#include <limits>
#include <mutex>
#include <stop_token>
#include <thread>
#include <utility>

namespace kgpu {

template <typename T>
class WorkQueue {
 public:
  explicit WorkQueue(size_t capacity = std::numeric_limits<size_t>::max()) : capacity_(capacity) {}
  ~WorkQueue() { Stop(); }
  WorkQueue(const WorkQueue&) = delete;
  WorkQueue& operator=(const WorkQueue&) = delete;

  // Runs handle(item, stop) on the worker for each item pushed, until Stop().
  void Start(std::function<void(T&, std::stop_token)> handle) {
    worker_ = std::jthread([this, handle = std::move(handle)](std::stop_token stop) {
      while (true) {
        T item;
        {
          std::unique_lock lock(mu_);
          if (!cv_.wait(lock, stop, [&] { return !items_.empty(); })) return;
          item = std::move(items_.front());
          items_.pop_front();
        }
        if (stop.stop_requested()) return;
        handle(item, stop);
      }
    });
  }
  // False (and the item dropped) when `capacity` items already wait.
  bool Push(T item) {
    std::lock_guard lock(mu_);
    if (items_.size() >= capacity_) return false;
    items_.push_back(std::move(item));
    cv_.notify_one();
    return true;
  }
  void Stop() {
    if (worker_.joinable()) {
      worker_.request_stop();
      worker_.join();
    }
  }

 private:
  const size_t capacity_;
  std::mutex mu_;
  std::condition_variable_any cv_;
  std::deque<T> items_;
  std::jthread worker_;
};

}  // namespace kgpu
