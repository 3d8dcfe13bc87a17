#pragma once
// Starting an httplib server's accept loop on a thread so that it can always be stopped.
//
// cpp-httplib 0.11 (Debian 12) sets Server::is_running() only once listen_after_bind() has begun
// on its thread, and Server::stop() does nothing while is_running() is false: a stop() that comes
// first is lost, the accept loop then runs for ever and joining its thread hangs. (Later httplib
// versions added wait_until_ready() for this.) A server started and stopped at once, as a test or
// a failing start-up does, hit it: the K8s client test that restarts the API stand-in right after
// its fixture started one hung until ctest's timeout, about once in a hundred runs.
//
// Thread-safety: call from the thread that starts the server, before anything may stop it.

#include <chrono>
#include <thread>

namespace kgpu {

// Runs server.listen_after_bind() (bind_to_port or bind_to_any_port must have succeeded) on a new
// thread and returns it once the loop runs, so a later stop() ends it. Gives up waiting after 10 s
// (a loop that never starts is then reported by whoever uses the server, not hung here).
template <typename Server, typename Thread = std::thread>
Thread ListenOnThread(Server& server) {
  Thread t([&server] { server.listen_after_bind(); });
  const auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(10);
  while (!server.is_running() && std::chrono::steady_clock::now() < deadline) {
    std::this_thread::sleep_for(std::chrono::microseconds(200));
  }
  return t;
}

}  // namespace kgpu
