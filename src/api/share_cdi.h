#pragma once
// How a kgpu.io/gpu container's CDI spec is named (its kind is kShareCdiKind, names.h): written by
// the node agent's share handoff at PreStartContainer, read by the exporter to learn which GPUs and
// limits the container really has (its slots are only a count: kubelet picks any free ones, the
// allocation record decides the GPUs). Header-only, so the exporter needs no plugin library.

#include <algorithm>
#include <string>
#include <vector>

#include "api/names.h"

namespace kgpu::api {

// Where a hard-isolated container finds the CUDA interposer (bind-mounted read-only from the
// plugin's --cuda-interposer) and its accounting directory (KGPU_CUDA_SHARED_DIR).
inline constexpr char kInterposerInContainer[] = "/usr/lib/kgpu/libkgpu-cuda.so";
// The directory is mounted read-only (the limits in its `config`) with the region file
// read-write over it (deviceplugin/interposer.h); the library reads this fixed path.
inline constexpr char kRegionInContainer[] = "/run/kgpu-cuda";
inline constexpr char kRegionFile[] = "kgpu-cuda.region";

// The CDI device name for a container holding slot `ids`: the lowest ID, with "::" as "_".
inline std::string ShareCdiName(std::vector<std::string> ids) {
  if (ids.empty()) return "none";
  std::sort(ids.begin(), ids.end());
  const std::string& id = ids.front();
  std::string name;  // built afresh: GCC 12 at -O2 warns falsely (-Wrestrict) on an inlined replace()
  name.reserve(id.size());
  for (size_t i = 0; i < id.size(); ++i) {
    if (id[i] == ':' && i + 1 < id.size() && id[i + 1] == ':') {
      name += '_';
      ++i;
    } else {
      name += id[i];
    }
  }
  return name;
}

// The spec file of that device in the CDI spec directory.
inline std::string ShareCdiSpecFile(const std::string& spec_dir, const std::string& cdi_name) {
  return spec_dir + "/kgpu.io-share_" + cdi_name + ".json";
}

}  // namespace kgpu::api
