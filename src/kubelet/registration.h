#pragma once
// kubelet's device-plugin Registration service (v1beta1, on <kubelet dir>/kubelet.sock): one call
// that tells kubelet a resource is served at an endpoint socket in the same directory. The
// device plugin's manager decides when to call it (at start, after kubelet restarts) and reads
// the result back through ListAndWatch; this file is only the wire.
//
// Thread-safety: a pure function of the socket; call it from any thread.

#include <chrono>
#include <string>

#include "absl/status/status.h"

namespace kgpu::kubelet {

// Registers `resource` served at `<kubelet dir>/<endpoint>` with the kubelet listening on
// `kubelet_socket` (GetPreferredAllocation offered; PreStartContainer when `pre_start_required`).
// Unavailable naming the resource and the socket when kubelet refuses or does not answer within
// `timeout`.
absl::Status RegisterDevicePlugin(const std::string& kubelet_socket, const std::string& endpoint,
                                  const std::string& resource, bool pre_start_required,
                                  std::chrono::milliseconds timeout);

}  // namespace kgpu::kubelet
