// What a container held to a memory limit by the CUDA interposer (docs/isolation.md) gets, for
// kgpu.io/gpu shares (src/cli/share_handoff.cc, through CDI) and for time-slicing replicas with
// memoryIsolation hard (allocator.cc, in the Allocate response) alike.
#ifndef KGPU_DEVICEPLUGIN_INTERPOSER_H_
#define KGPU_DEVICEPLUGIN_INTERPOSER_H_

#include <string>
#include <utility>
#include <vector>

#include "absl/status/statusor.h"
#include "deviceplugin/allocator.h"

namespace kgpu::deviceplugin {

// How the library gets into the container's processes (--cuda-interposer-load, config.h):
//   env            LD_PRELOAD names it; a process that clears LD_PRELOAD escapes
//   ld.so.preload  a file naming it is mounted at /etc/ld.so.preload, which the dynamic loader
//                  reads for every dynamically linked program whatever its environment (it hides
//                  an /etc/ld.so.preload the image has); statically linked programs still escape

struct InterposerEdits {
  std::vector<std::pair<std::string, std::string>> envs;  // in this order
  std::vector<MountSpec> mounts;
};

// The environment and mounts of a container whose accounting directory on the host is `region`
// (created here, mode 0777 so that random-UID containers can write it). With ld.so.preload, the
// file mounted (<shared_root>/ld.so.preload) is written too when it is missing or differs.
absl::StatusOr<InterposerEdits> InterposerEditsFor(const std::string& interposer, const std::string& load,
                                                   const std::string& shared_root, const std::string& region);

}  // namespace kgpu::deviceplugin

#endif  // KGPU_DEVICEPLUGIN_INTERPOSER_H_
