#pragma once
// One reading of a listen address for every HTTP server kgpu runs (exporter, extender, webhook,
// the Slurm bridge's /metrics): `host:port`, `:port`, `[v6]:port` or a bare `port`, as Go's
// net.Listen and dcgm-exporter's `-a` take it. The port must be 0-65535; 0 asks the kernel for a
// free port (tests; the server logs the one it got). A host written empty means every IPv4
// address (0.0.0.0), `[::]` every IPv6 one.
//
// Thread-safety: pure functions.

#include <string>
#include <string_view>

#include "absl/status/statusor.h"

namespace kgpu {

struct ListenAddress {
  std::string host;  // for bind(): "0.0.0.0", "::", "127.0.0.1", a name…
  int port = 0;      // 0: any free port
};

// InvalidArgument naming `flag`, the value and the expected form when `value` is not an address.
absl::StatusOr<ListenAddress> ParseListenAddress(std::string_view flag, std::string_view value);

// `host` as a URL or host:port writes it: an IPv6 address in brackets ("fd00::5" -> "[fd00::5]").
std::string UrlHost(std::string_view host);

// Why `address` cannot be bound, found by trying it with the socket options kgpu's servers use:
// "port 9400 is already in use by another process", "ports below 1024 need root or
// CAP_NET_BIND_SERVICE", "no interface of this machine has the address 10.9.9.9", "cannot
// resolve host 'x'". Empty when a bind would succeed now (the failure was transient).
std::string WhyCannotListen(const ListenAddress& address);

// The options every kgpu listener sets on its socket: SO_REUSEADDR (a restart binds at once while
// the old connections sit in TIME_WAIT) and never SO_REUSEPORT, so a second process on the same
// port is an error instead of a silent share of its connections (httplib's default sets both).
void ExclusiveListenSocketOptions(int fd);

}  // namespace kgpu
