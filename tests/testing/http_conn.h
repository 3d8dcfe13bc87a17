#pragma once
// Connection-level helpers for the stand-ins' HTTP servers (cpp-httplib 0.11, Debian 12), which
// serve every connection on a task-queue thread and keep long-lived responses (watches) on it:
//  - ElasticTaskQueue: a pool that grows by one thread whenever every thread is busy, so that
//    a thousand open watches never starve a /version or a list (httplib's fixed ThreadPool queues
//    every later connection behind them). Threads are kept for reuse and joined at shutdown.
//  - ConnectionFd / PeerClosed: the socket a request arrived on and whether its client has gone
//    (sent FIN or reset), which httplib 0.11 cannot tell a content provider. kube-apiserver (Go's
//    net/http) learns the same from its background read on the connection and cancels the
//    request's context; a watch must notice a vanished client without waiting for an event.
//
// Thread-safety: ElasticTaskQueue is driven by httplib from any thread; the functions are
// reentrant.

#include <condition_variable>
#include <deque>
#include <functional>
#include <mutex>
#include <string>
#include <thread>
#include <vector>

#include <httplib.h>

namespace kgpu::testing {

class ElasticTaskQueue : public httplib::TaskQueue {
 public:
  // `initial` threads at once; at most `max` (beyond it, connections wait for a free thread).
  ElasticTaskQueue(size_t initial, size_t max);
  ~ElasticTaskQueue() override;
  void enqueue(std::function<void()> fn) override;
  void shutdown() override;
  size_t threads() const;

 private:
  void Spawn();  // under mu_
  void Work();

  mutable std::mutex mu_;
  std::condition_variable cv_;
  std::deque<std::function<void()>> jobs_;
  std::vector<std::thread> threads_;
  size_t idle_ = 0;
  size_t max_;
  bool shutdown_ = false;
};

// The descriptor of this process's TCP socket whose local and peer ports are those given (the
// connection a request arrived on: Request::local_port, Request::remote_port), or -1.
int ConnectionFd(int local_port, const std::string& remote_addr, int remote_port);

// Whether the peer of `fd` has closed its side or reset the connection (POLLRDHUP/HUP/ERR).
bool PeerClosed(int fd);

}  // namespace kgpu::testing
