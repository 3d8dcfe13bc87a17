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
#include <memory>
#include <string>
#include <string_view>
#include <thread>

#include <sys/socket.h>

#include "absl/status/statusor.h"
#include "common/listen_address.h"

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

// Binds an httplib server (Server or SSLServer) to `value`, the listen address given as `flag`,
// exclusively: no SO_REUSEPORT, so a port another process (a second kgpu included) listens on is
// an error, never a silent share of the connections. Returns the port bound (the one the kernel
// chose for port 0). InvalidArgument when `value` is not an address, Unavailable with the reason
// (in use, privileged, no such interface) when it cannot be bound; both name the flag.
template <typename Server>
absl::StatusOr<int> BindListenAddress(Server& server, std::string_view flag, std::string_view value) {
  auto address = ParseListenAddress(flag, value);
  if (!address.ok()) return address.status();
  auto listen_fd = std::make_shared<int>(-1);
  server.set_socket_options([listen_fd](int fd) {
    ExclusiveListenSocketOptions(fd);
    *listen_fd = fd;  // the last socket httplib creates is the one it binds
  });
  const int port = address->port == 0 ? server.bind_to_any_port(address->host)
                                      : (server.bind_to_port(address->host, address->port) ? address->port : -1);
  server.set_socket_options(ExclusiveListenSocketOptions);
  if (port > 0) {
    // httplib 0.11 listens with a backlog of 5 (CPPHTTPLIB_LISTEN_BACKLOG, compiled into Debian's
    // library): a burst of connections beyond it (a thousand watches, a scheduler's parallel
    // filter calls) waits for SYN retransmits, 1 s, then 3 s. Go's listeners (kube-apiserver,
    // kube-scheduler) use the kernel's somaxconn; listen() on a listening socket sets its backlog.
    if (*listen_fd >= 0) ::listen(*listen_fd, SOMAXCONN);
    return port;
  }
  std::string why = WhyCannotListen(*address);
  if (why.empty()) why = "the bind failed (try again)";
  return absl::UnavailableError(std::string(flag) + " '" + std::string(value) + "': cannot listen there: " + why);
}

}  // namespace kgpu
