// What a container held to a memory limit by the CUDA interposer (docs/isolation.md) gets, for
// kgpu.io/gpu shares (src/cli/share_handoff.cc, through CDI) and for time-slicing replicas with
// memoryIsolation hard (allocator.cc, in the Allocate response) alike.
#ifndef KGPU_DEVICEPLUGIN_INTERPOSER_H_
#define KGPU_DEVICEPLUGIN_INTERPOSER_H_

#include <chrono>
#include <cstdint>
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

// One GPU's limits for a container: memory in MiB (0: none), the compute share in percent of
// its SMs (0 or 100: none).
struct InterposerLimit {
  std::string uuid;
  uint64_t memory_mib = 0;
  int64_t cores = 0;
};

// The interposer's configuration file for `limits` (docs/isolation.md, "Where the limits come
// from"): "memory <uuid> <bytes>" and "cores <uuid> <percent>" lines.
std::string InterposerConfig(const std::vector<InterposerLimit>& limits);

// The environment and mounts of a container whose accounting directory on the host is `region`
// (created here). The directory gets the container's limits in `config` (mode 0444) and an
// empty accounting region `kgpu-cuda.region` (mode 0666: any UID of the container joins it),
// and is mounted read-only at /run/kgpu-cuda, with the region file mounted read-write over its
// own path: a process of the container can neither change its limits, nor delete or replace the
// region to start a fresh budget. With ld.so.preload, the file mounted
// (<shared_root>/ld.so.preload) is written too when it is missing or differs.
absl::StatusOr<InterposerEdits> InterposerEditsFor(const std::string& interposer, const std::string& load,
                                                   const std::string& shared_root, const std::string& region,
                                                   const std::vector<InterposerLimit>& limits);

// Where Allocate puts the accounting directory of a time-slicing replica container.
std::string TimeslicingRegion(const std::string& shared_root, const std::string& allocation_id);

// Removes the accounting directories of time-slicing replicas (<shared_root>/timeslicing/*) that
// no container mounts any more, and returns how many went. Allocate names no pod, so the owner of
// a directory is whichever container's Allocate response, as kubelet keeps it in its checkpoint
// (`checkpoint_path`, kubelet_checkpoint.h), mounts it: a directory that none mounts and that is
// older than `grace` (Allocate creates it before kubelet writes the response) goes, without
// following links (common/remove_tree.h). kubelet forgets a pod's responses once the pod is no
// longer active, at its next admission of any pod. A checkpoint that is missing or cannot be
// parsed removes nothing (the error says which).
absl::StatusOr<int> SweepTimeslicingRegions(const std::string& shared_root, const std::string& checkpoint_path,
                                            std::chrono::seconds grace);

}  // namespace kgpu::deviceplugin

#endif  // KGPU_DEVICEPLUGIN_INTERPOSER_H_
