#pragma once
// Quota arithmetic for `kgpu quota` (docs/quota.md): what the cluster's GPU inventory holds, the
// one comparable unit "GPU-equivalents", and quota plans that divide the inventory by team
// percentages.
//
// GPU-equivalents of an amount of a GPU resource (the resource's name without "requests."):
//   nvidia.com/gpu            1 per GPU;
//   nvidia.com/mig-<profile>  the profile's compute slices over the GPU's: 1g.10gb on an A100 or
//                             H100 (7 slices) is 1/7, 3g.40gb is 3/7; on an A30 (4 slices) 1g.6gb
//                             is 1/4. The GPU's slices are MaxMigSlices of the GPUs that carry the
//                             profile; when they differ the smallest is used (the larger fraction);
//                             a profile no node carries counts against 7 slices;
//   kgpu.io/gpu-memory        MiB over the memory of the smallest healthy GPU that serves shares
//                             (the GPU a share may land on that makes it the largest fraction);
//   kgpu.io/gpu, kgpu.io/gpu-cores: none (a share's size is its memory).
//
// Plans: every resource total is divided by DivideByPercent, which never hands out more than the
// cluster has (see there).
//
// Thread-safety: pure functions and value types.

#include <cstdint>
#include <map>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "absl/status/statusor.h"
#include "extender/inventory.h"

namespace kgpu::extender {

// A GPU's MIG compute slices: 4 on an A30 (its product name contains "A30"), 7 on every other
// MIG-capable GPU (A100, H100, H200, H20, B200, GB200).
int MaxMigSlices(const GpuInfo& gpu);

struct ClusterGpus {
  int nodes = 0;                          // nodes with an inventory
  int whole = 0;                          // healthy GPUs neither in MIG mode nor serving shares
  std::map<std::string, int> mig;         // profile -> instances on healthy GPUs in MIG mode
  std::map<std::string, int> mig_slices;  // profile -> the smallest MaxMigSlices of GPUs carrying it
  int share_gpus = 0;                     // healthy GPUs serving shares (slots > 0)
  int64_t share_slots = 0;                // kgpu.io/gpu: the sum of their slots
  int64_t share_memory_mib = 0;           // kgpu.io/gpu-memory: the sum of their memory
  int64_t share_cores = 0;                // kgpu.io/gpu-cores: 100 per sharing GPU
  int unhealthy = 0;                      // GPUs left out because they are not healthy
  // The reference for share memory: the smallest healthy sharing GPU (0 when none).
  int64_t share_ref_mib = 0;
  std::string share_ref_model, share_ref_node;
  int share_models = 0;  // distinct models among sharing GPUs
};
ClusterGpus SummarizeInventory(const std::vector<NodeInfo>& nodes);

// The compute slices the GPU-equivalents of `profile` are counted against (7 when no GPU has it).
int MigSlicesOf(const ClusterGpus& c, const std::string& profile);

// GPU-equivalents of `amount` of `resource` (with or without the "requests." prefix); nullopt for
// resources without one (kgpu.io/gpu, kgpu.io/gpu-cores, non-GPU resources) and for share memory
// when no GPU serves shares.
std::optional<double> GpuEquivalents(std::string_view resource, int64_t amount, const ClusterGpus& c);
// Of the whole inventory: whole GPUs, MIG instances and share memory by the rules above (a sharing
// GPU larger than the reference counts for more than 1, as a quota on all its memory would).
double CapacityGpuEquivalents(const ClusterGpus& c);

// Whether `resource` (with or without "requests."/"limits.") is a GPU resource kgpu knows:
// nvidia.com/gpu, nvidia.com/mig-*, kgpu.io/gpu, kgpu.io/gpu-memory, kgpu.io/gpu-cores.
bool IsGpuResource(std::string_view resource);

// Whether `name` can name a namespace: an RFC 1123 label (1-63 lowercase letters, digits and '-',
// starting and ending with a letter or digit).
bool IsDnsLabel(std::string_view name);

struct TeamShare {
  std::string ns;
  int percent = 0;
};
// "team-a=50,team-b=30,team-c=20" (a trailing % is allowed). InvalidArgument naming `flag` and the
// item with the fix: not NAMESPACE=PERCENT, a namespace name that is not a DNS-1123 label, a
// percent that is not a whole number from 0 to 100, a namespace named twice, a sum over 100.
absl::StatusOr<std::vector<TeamShare>> ParseTeamShares(std::string_view text, std::string_view flag = "--shares");

// Divides `total` units by `percents` (each 0..100, sum <= 100). Each part gets
// floor(total * p / 100); the units left of floor(total * sum / 100) go one each to the largest
// remainders (ties: the larger percent, then the earlier entry). So the parts add up to
// floor(total * sum / 100) <= total (never over-allocated), each part is floor or ceil of its
// exact share, and with sum = 100 nothing is left over.
std::vector<int64_t> DivideByPercent(int64_t total, const std::vector<int>& percents);

struct PlannedQuota {
  std::string ns;
  int percent = 0;
  // "requests.nvidia.com/gpu", "requests.nvidia.com/mig-<p>" (each profile in the inventory),
  // "requests.kgpu.io/gpu", "requests.kgpu.io/gpu-memory", "requests.kgpu.io/gpu-cores": always
  // all of them, "0" included (a resource left out of a quota is unlimited).
  std::vector<std::pair<std::string, int64_t>> hard;
};
std::vector<PlannedQuota> PlanQuotas(const ClusterGpus& c, const std::vector<TeamShare>& teams);

}  // namespace kgpu::extender
