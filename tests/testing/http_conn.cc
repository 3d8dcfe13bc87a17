#include "testing/http_conn.h"

#include <cstdlib>

#include <arpa/inet.h>
#include <dirent.h>
#include <netinet/in.h>
#include <poll.h>
#include <sys/socket.h>

namespace kgpu::testing {

ElasticTaskQueue::ElasticTaskQueue(size_t initial, size_t max) : max_(max < 1 ? 1 : max) {
  std::lock_guard lock(mu_);
  for (size_t i = 0; i < initial && i < max_; ++i) Spawn();
}

ElasticTaskQueue::~ElasticTaskQueue() {
  shutdown();
}

void ElasticTaskQueue::Spawn() {
  ++idle_;
  threads_.emplace_back([this] { Work(); });
}

void ElasticTaskQueue::enqueue(std::function<void()> fn) {
  std::lock_guard lock(mu_);
  jobs_.push_back(std::move(fn));
  // Every idle thread already has a job waiting for it: one more thread for this one.
  if (idle_ < jobs_.size() && threads_.size() < max_) Spawn();
  cv_.notify_one();
}

void ElasticTaskQueue::shutdown() {
  std::vector<std::thread> threads;
  {
    std::lock_guard lock(mu_);
    shutdown_ = true;
    threads.swap(threads_);
  }
  cv_.notify_all();
  for (auto& t : threads) t.join();
}

size_t ElasticTaskQueue::threads() const {
  std::lock_guard lock(mu_);
  return threads_.size();
}

void ElasticTaskQueue::Work() {
  for (;;) {
    std::function<void()> job;
    {
      std::unique_lock lock(mu_);
      cv_.wait(lock, [&] { return shutdown_ || !jobs_.empty(); });
      // As httplib's ThreadPool: at shutdown the jobs already queued are still served.
      if (jobs_.empty()) return;
      job = std::move(jobs_.front());
      jobs_.pop_front();
      --idle_;
    }
    job();
    std::lock_guard lock(mu_);
    ++idle_;
  }
}

namespace {

bool SameEndpoint(const sockaddr_storage& ss, const std::string& addr, int port) {
  char buf[INET6_ADDRSTRLEN] = {};
  int p = -1;
  if (ss.ss_family == AF_INET) {
    const auto* in = reinterpret_cast<const sockaddr_in*>(&ss);
    inet_ntop(AF_INET, &in->sin_addr, buf, sizeof buf);
    p = ntohs(in->sin_port);
  } else if (ss.ss_family == AF_INET6) {
    const auto* in6 = reinterpret_cast<const sockaddr_in6*>(&ss);
    inet_ntop(AF_INET6, &in6->sin6_addr, buf, sizeof buf);
    p = ntohs(in6->sin6_port);
  } else {
    return false;
  }
  return p == port && (addr.empty() || addr == buf);
}

}  // namespace

int ConnectionFd(int local_port, const std::string& remote_addr, int remote_port) {
  DIR* dir = opendir("/proc/self/fd");
  if (!dir) return -1;
  int found = -1;
  while (dirent* e = readdir(dir)) {
    if (e->d_name[0] < '0' || e->d_name[0] > '9') continue;
    const int fd = std::atoi(e->d_name);
    sockaddr_storage local{}, peer{};
    socklen_t llen = sizeof local, plen = sizeof peer;
    if (getsockname(fd, reinterpret_cast<sockaddr*>(&local), &llen) != 0) continue;
    if (!SameEndpoint(local, "", local_port)) continue;
    if (getpeername(fd, reinterpret_cast<sockaddr*>(&peer), &plen) != 0) continue;
    if (!SameEndpoint(peer, remote_addr, remote_port)) continue;
    found = fd;
    break;
  }
  closedir(dir);
  return found;
}

bool PeerClosed(int fd) {
  if (fd < 0) return false;
  pollfd p{fd, POLLRDHUP, 0};
  if (poll(&p, 1, 0) <= 0) return false;
  return (p.revents & (POLLRDHUP | POLLHUP | POLLERR | POLLNVAL)) != 0;
}

}  // namespace kgpu::testing
