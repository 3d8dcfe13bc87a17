#pragma once
// Test helper: a loopback TCP port that is free now (the kernel's choice for port 0, released at
// once), for a child process that takes its listen address on the command line.
//
// Thread-safety: any thread.

#include <netinet/in.h>
#include <sys/socket.h>
#include <unistd.h>

namespace kgpu::testing {

inline int FreePort() {
  const int fd = ::socket(AF_INET, SOCK_STREAM, 0);
  if (fd < 0) return -1;
  sockaddr_in a{};
  a.sin_family = AF_INET;
  a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  socklen_t len = sizeof a;
  int port = -1;
  if (::bind(fd, reinterpret_cast<sockaddr*>(&a), sizeof a) == 0 &&
      ::getsockname(fd, reinterpret_cast<sockaddr*>(&a), &len) == 0) {
    port = ntohs(a.sin_port);
  }
  ::close(fd);
  return port;
}

}  // namespace kgpu::testing
