#pragma once
// BoundedThread: a std::jthread that its owner can stop and wait for a bounded time. A thread
// stuck in a call nothing can interrupt (a hung NVML call: the driver does not return) is
// detached instead of blocking its owner, so SIGTERM and SIGHUP finish on time whatever the
// driver does. The thread's function must therefore own (or share, e.g. through a shared_ptr it
// captured) everything it touches after the stop request, and check the stop token before it
// touches anything else once a blocking call returns.
//
// Thread-safety: Start/StopAndJoinUntil/the destructor from the owner thread only.

#include <chrono>
#include <condition_variable>
#include <memory>
#include <mutex>
#include <stop_token>
#include <thread>
#include <utility>

namespace kgpu {

class BoundedThread {
 public:
  BoundedThread() = default;
  ~BoundedThread() {
    if (thread_.joinable()) {
      thread_.request_stop();
      thread_.join();
    }
  }
  BoundedThread(const BoundedThread&) = delete;
  BoundedThread& operator=(const BoundedThread&) = delete;

  // Runs fn(std::stop_token) on a new thread.
  template <typename F>
  void Start(F&& fn) {
    done_ = std::make_shared<Done>();
    thread_ = std::jthread([done = done_, f = std::forward<F>(fn)](std::stop_token stop) mutable {
      f(stop);
      std::lock_guard<std::mutex> lock(done->mu);
      done->done = true;
      done->cv.notify_all();
    });
  }
  void RequestStop() { thread_.request_stop(); }
  bool running() const { return thread_.joinable(); }
  // Requests a stop and waits until `deadline` for the thread to end. Joins it and returns true,
  // or detaches it (it ends on its own once its call returns) and returns false.
  bool StopAndJoinUntil(std::chrono::steady_clock::time_point deadline) {
    if (!thread_.joinable()) return true;
    thread_.request_stop();
    bool ended = false;
    {
      std::unique_lock<std::mutex> lock(done_->mu);
      ended = done_->cv.wait_until(lock, deadline, [&] { return done_->done; });
    }
    if (ended) {
      thread_.join();
    } else {
      thread_.detach();
    }
    return ended;
  }

 private:
  struct Done {
    std::mutex mu;
    std::condition_variable cv;
    bool done = false;
  };
  std::shared_ptr<Done> done_;
  std::jthread thread_;
};

}  // namespace kgpu
