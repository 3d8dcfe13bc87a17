#pragma once
// NodePrepareResources / NodeUnprepareResources for kgpu's DRA driver (docs/dra.md "Prepare"):
// what kubelet asks before a pod's containers start and after the pod is gone, for each claim.
//
// Prepare reads the claim from the API server (it must be allocated and have the UID kubelet
// named), takes the results of this driver in this node's pool, and writes one CDI spec per claim
// (<cdi dir>/<vendor>-claim_<uid>.json, vendor "k8s.<driver>", class "claim", one CDI device
// "<uid>-<device>" per allocated device): the GPU's device nodes (a MIG instance's capability
// nodes too), NVIDIA_VISIBLE_DEVICES, and for a share (a device with consumed capacity less than
// the whole GPU) the CUDA interposer with the claim's memory and compute limits and an accounting
// region of the claim's own. A claim kgpu cannot enforce fails with the reason; it never runs
// unlimited. What was prepared is kept in a checkpoint file in the plugin's directory, so a
// prepare repeated (after a plugin restart too) answers the same, and unprepare — which may come
// for a claim already gone from the API server — removes exactly what prepare made.
//
// Thread-safety: Prepare and Unprepare may be called from any thread; they run one at a time
// (kubelet's plugin helper serializes them too).

#include <map>
#include <memory>
#include <mutex>
#include <set>
#include <string>
#include <string_view>
#include <vector>

#include <nlohmann/json.hpp>

#include "absl/status/statusor.h"
#include "gpu/inventory.h"
#include "gpu/mig_layout.h"
#include "gpu/mig_minors.h"
#include "nvml/library.h"

namespace kgpu::k8s {
class Client;
}

namespace kgpu::dra {

struct PrepareOptions {
  std::string driver;
  std::string node_name;                 // this node's pool
  std::string plugin_dir;                // the checkpoint (checkpoint.json) lives here
  std::string cdi_dir = "/var/run/cdi";  // where the runtime reads CDI specs
  std::string dev_root;                  // the host's root of /dev nodes ("" = /)
  std::set<unsigned> shared_gpus;        // GPU indices published as consumable shares
  // The CUDA interposer for shares (deviceplugin/interposer.h); empty: this node cannot enforce a
  // share, and prepare refuses one.
  std::string cuda_interposer;
  std::string cuda_interposer_load = "env";
  std::string cuda_shared_root = "/var/lib/kgpu/cuda";
  gpu::MigMinors mig_minors;  // the driver's MIG capability minors
  // ReadMigCatalog of each MIG-mode GPU, by index: which existing instance a device name is.
  std::map<unsigned, gpu::MigCatalog> mig;
  // Dynamic MIG: a MIG device name that is no existing instance is carved at prepare (GPU instance
  // at the name's profile and placement, one compute instance spanning it) and destroyed at
  // unprepare. Needs the NVML library (Create's `lib`).
  bool dynamic_mig = false;
};

struct ClaimRef {
  std::string ns, uid, name;
};

struct PreparedDevice {
  std::vector<std::string> requests;  // request names, subrequests stripped ("mig" for "mig/one-g")
  std::string pool, device;
  std::vector<std::string> cdi_ids;
  std::string share_id;
  bool operator==(const PreparedDevice&) const = default;
};

// The checkpoint's text ({"version": 1, "claims": {uid: {namespace, name, spec, devices[{requests,
// pool, device, cdi_ids, share_id}], regions[], carved[{gpu, gi}]}}}), every field of the type
// prepare and unprepare read; DataLoss naming `origin` and the field otherwise.
absl::StatusOr<nlohmann::json> ParseCheckpoint(std::string_view text, std::string_view origin);

class Preparer {
 public:
  // Loads the checkpoint (a corrupt one is an error naming the file: nothing is assumed).
  // With dynamic MIG, GPU instances on MIG-mode GPUs that the checkpoint does not record are
  // destroyed first (left by a claim whose unprepare never came, or made by hand): the driver owns
  // MIG on those GPUs. `lib` may be null without dynamic MIG.
  static absl::StatusOr<std::unique_ptr<Preparer>> Create(std::shared_ptr<k8s::Client> client,
                                                          std::shared_ptr<const gpu::Inventory> inventory,
                                                          PrepareOptions options,
                                                          std::shared_ptr<const nvml::Library> lib = nullptr);

  absl::StatusOr<std::vector<PreparedDevice>> Prepare(const ClaimRef& claim);
  absl::Status Unprepare(const ClaimRef& claim);
  // Claim UIDs prepared now (from the checkpoint).
  std::vector<std::string> Prepared() const;

  // The CDI spec file of a claim, and the CDI vendor/class ("k8s.gpu.nvidia.com/claim").
  std::string SpecPath(const std::string& uid) const;
  std::string CdiKind() const;

 private:
  Preparer(std::shared_ptr<k8s::Client> client, std::shared_ptr<const gpu::Inventory> inventory, PrepareOptions options,
           std::shared_ptr<const nvml::Library> lib);
  // Carves the MIG instance `name` names on GPU `g`; records it in `record`.
  absl::StatusOr<gpu::MigDevice> Carve(const gpu::Gpu& g, const std::string& name, nlohmann::json& record);
  absl::Status DestroyCarved(const nlohmann::json& carved);
  absl::Status Save();
  absl::StatusOr<std::vector<PreparedDevice>> PrepareLocked(const ClaimRef& claim, nlohmann::json& record);

  std::shared_ptr<k8s::Client> client_;
  std::shared_ptr<const gpu::Inventory> inventory_;
  PrepareOptions opts_;
  std::shared_ptr<const nvml::Library> lib_;
  mutable std::mutex mu_;
  nlohmann::json checkpoint_;  // {"version": 1, "claims": {uid: {...}}}
};

}  // namespace kgpu::dra
