#pragma once
// The kubelet device-plugin directory (--kubelet-dir), checked before anything is served in it:
// the plugin's sockets and the drain markers live there. gRPC's own failure to listen on a socket
// in a missing or read-only directory is a multi-line dump that names neither; this says which it is.
//
// Thread-safety: a pure function of the file system.

#include <string>

#include "absl/status/status.h"

namespace kgpu::deviceplugin {

// OK when `dir` is a directory this process can create sockets in. Errors name the directory,
// say whether it is missing, not a directory, read-only or not writable (or too long a path for a
// unix socket), and end with the fix (--kubelet-dir / KGPU_KUBELET_DIR, the pod's hostPath mount).
absl::Status CheckKubeletDir(const std::string& dir);

}  // namespace kgpu::deviceplugin
