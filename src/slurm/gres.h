#pragma once
// `kgpu slurm gres`: the gres.conf lines and the slurm.conf NodeName line for this node, from
// its inventory — Debian's Slurm 22.05 has no NVML plugin (AutoDetect=nvml is unavailable), so
// every GPU must be listed by hand:
//   NodeName=<n> Name=gpu Type=<model> File=/dev/nvidia<minor> Cores=<NUMA's logical cores> Links=<NVLink lanes>
//   NodeName=<n> Name=gpu Type=<MIG profile> MultipleFiles=/dev/nvidia<minor>,<GI cap>,<CI cap>
//   NodeName=<n> Name=mps Count=<per GPU> File=/dev/nvidia<minor>        (when MPS is configured)
// Types follow what AutoDetect=nvml would report (the NVML name, lower case, spaces as '_';
// MIG instances by profile), so a cluster that later gets the NVML plugin keeps its job scripts.
// Cores= are Slurm's logical core indices (socket-major, as `lstopo -l` numbers them), computed
// from sysfs: the GPU's NUMA node's cpulist mapped through each CPU's package and core id.
//
// Thread-safety: pure functions over their inputs (and the sysfs files they read).

#include <map>
#include <set>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "gpu/inventory.h"
#include "gpu/mig_minors.h"

namespace kgpu::slurm {

struct GresOptions {
  std::string node_name;            // NodeName=
  std::string dev_dir = "/dev";     // File= paths: <dev_dir>/nvidia<minor>, <dev_dir>/nvidia-caps/...
  std::string sysfs_root = "/sys";  // NUMA cpulists and CPU topology
  gpu::MigMinors mig_minors;        // /proc/driver/nvidia-caps/mig-minors (MIG lines need it)
  unsigned mps_count_per_gpu = 0;   // Name=mps Count= per GPU; 0: no MPS lines
  std::string type_override;        // Type= for whole GPUs instead of the NVML name
  bool cores = true;                // Cores= (needs sysfs)
  bool links = true;                // Links= (a line per GPU, as gres.conf requires with Links)
  // slurm.conf NodeName line: CPU layout and memory are the operator's; 0 leaves them out.
  unsigned cpus = 0;
  unsigned real_memory_mib = 0;
};

struct GresOutput {
  std::string gres_conf;              // lines for gres.conf (with a comment header)
  std::string node_line;              // "NodeName=<n> Gres=gpu:<type>:<k>,...,mps:<total>"
  std::set<std::string> gres_types;   // for slurm.conf GresTypes= ("gpu", "mps")
  std::vector<std::string> warnings;  // what could not be filled in (no MIG minors, no sysfs NUMA)
};

absl::StatusOr<GresOutput> RenderGres(const gpu::Inventory& inventory, const GresOptions& options);

// The Type= AutoDetect=nvml derives from an NVML name: "NVIDIA H100 80GB HBM3" -> "nvidia_h100_80gb_hbm3".
std::string GresTypeFromName(const std::string& nvml_name);

// NUMA node -> Slurm logical core indices, from <sysfs>/devices/system/node/node*/cpulist and
// <sysfs>/devices/system/cpu/cpu*/topology/{physical_package_id,core_id}. Errors when sysfs has no
// NUMA nodes. A CPU without topology files counts as its own core.
absl::StatusOr<std::map<int, std::vector<unsigned>>> NumaLogicalCores(const std::string& sysfs_root);

// "0-3,8,10-11" -> {0,1,2,3,8,10,11}; errors name the text.
absl::StatusOr<std::vector<unsigned>> ParseCpuList(const std::string& text);
// {0,1,2,3,8} -> "0-3,8".
std::string FormatCpuList(const std::vector<unsigned>& cpus);

}  // namespace kgpu::slurm
