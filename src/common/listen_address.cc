#include "common/listen_address.h"

#include <cerrno>
#include <charconv>
#include <cstring>

#include <netdb.h>
#include <sys/socket.h>
#include <unistd.h>

#include "common/strings.h"

namespace kgpu {
namespace {

std::string Quote(std::string_view s) {
  return "'" + std::string(s) + "'";
}

}  // namespace

absl::StatusOr<ListenAddress> ParseListenAddress(std::string_view flag, std::string_view value) {
  auto bad = [&](std::string_view why) {
    return absl::InvalidArgumentError(std::string(flag) + " " + Quote(value) + ": " + std::string(why) +
                                      " (expected host:port, :port, [v6]:port or port, e.g. 0.0.0.0:9400)");
  };
  std::string_view host, port_text;
  if (!value.empty() && value.front() == '[') {
    const auto close = value.find(']');
    if (close == std::string_view::npos) return bad("an IPv6 address opened with [ is not closed with ]");
    host = value.substr(1, close - 1);
    if (host.empty()) return bad("empty IPv6 address between [ and ]");
    const std::string_view rest = value.substr(close + 1);
    if (rest.size() < 2 || rest.front() != ':') return bad("the port after ]: is missing");
    port_text = rest.substr(1);
  } else if (const auto colon = value.rfind(':'); colon == std::string_view::npos) {
    port_text = value;  // a bare port
  } else {
    host = value.substr(0, colon);
    port_text = value.substr(colon + 1);
    if (host.find(':') != std::string_view::npos) return bad("an IPv6 address must be written in brackets, [::1]:port");
  }
  if (port_text.empty()) return bad("the port is missing");
  int port = -1;
  const auto [end, ec] = std::from_chars(port_text.data(), port_text.data() + port_text.size(), port);
  if (ec != std::errc() || end != port_text.data() + port_text.size()) return bad("the port is not a number");
  if (port < 0 || port > 65535) return bad("the port must be 1-65535 (0: any free port)");
  ListenAddress a;
  a.host = host.empty() ? "0.0.0.0" : std::string(host);
  a.port = port;
  return a;
}

void ExclusiveListenSocketOptions(int fd) {
  int yes = 1;
  setsockopt(fd, SOL_SOCKET, SO_REUSEADDR, &yes, sizeof yes);
}

std::string WhyCannotListen(const ListenAddress& address) {
  addrinfo hints{};
  hints.ai_family = AF_UNSPEC;
  hints.ai_socktype = SOCK_STREAM;
  hints.ai_flags = AI_PASSIVE;
  addrinfo* found = nullptr;
  const std::string service = std::to_string(address.port);
  if (const int rc = getaddrinfo(address.host.c_str(), service.c_str(), &hints, &found); rc != 0) {
    return "cannot resolve host " + Quote(address.host) + " (" + gai_strerror(rc) + ")";
  }
  std::string why;
  for (addrinfo* ai = found; ai != nullptr && why.empty(); ai = ai->ai_next) {
    const int fd = socket(ai->ai_family, ai->ai_socktype | SOCK_CLOEXEC, ai->ai_protocol);
    if (fd < 0) {
      why = std::string("cannot open a socket: ") + std::strerror(errno);
      continue;
    }
    ExclusiveListenSocketOptions(fd);
    if (bind(fd, ai->ai_addr, ai->ai_addrlen) != 0 || listen(fd, 1) != 0) {
      const int e = errno;
      if (e == EADDRINUSE) {
        why = "port " + service + " is already in use by another process (stop it, or choose another port)";
      } else if (e == EACCES) {
        why = "port " + service + " needs root or CAP_NET_BIND_SERVICE (ports below 1024), or choose another port";
      } else if (e == EADDRNOTAVAIL) {
        why = "no interface of this machine has the address " + address.host;
      } else {
        why = std::string("bind failed: ") + std::strerror(e);
      }
    }
    close(fd);
  }
  freeaddrinfo(found);
  return why;
}

std::string UrlHost(std::string_view host) {
  return host.find(':') != std::string_view::npos ? Cat("[", host, "]") : std::string(host);
}

}  // namespace kgpu
