#pragma once
// Which Kubernetes pod a GPU process belongs to, from node-local kubelet data only, also when
// several pods share one time-sliced GPU (device IDs "GPU-<uuid>::<n>"):
//
//   pid --(<proc_root>/<pid>/cgroup)--> pod UID
//   pod UID --(kubelet's device-manager checkpoint)--> (container name, allocated device IDs)
//   device IDs --(PodResources List)--> (namespace, pod, container)
//
// For a process on GPU G, the checkpoint entries of its pod UID whose device IDs (with "::<n>"
// stripped; for kgpu.io/gpu slots, the GPUs of the container's CDI spec) include G's UUID or its
// MIG UUID are candidates; a candidate counts when exactly one
// PodResources container, of the same name and resource, holds exactly the same device IDs.
// PodResources alone cannot do this: it has no pod UID, and every replica of G is just "G".
//
// ParseCgroup and ParseCheckpoint are pure parsers of untrusted text (fuzzed).
//
// Thread-safety: PodAttributor's Update may run on one thread while Attribute, PodsOnDevice
// and OwnerOf run on others. Update builds a new immutable snapshot without the lock and swaps
// it in; readers take a reference to the current snapshot under the lock and do their file
// reads and lookups without it.

#include <atomic>
#include <cstdint>
#include <functional>
#include <map>
#include <memory>
#include <mutex>
#include <optional>
#include <regex>
#include <set>
#include <string>
#include <string_view>
#include <vector>

#include "absl/status/statusor.h"
#include "common/log_once.h"
#include "kubelet/podresources.h"

namespace kgpu::exporter {

struct CgroupInfo {
  std::string pod_uid;       // with '-' (systemd's '_' converted back)
  std::string container_id;  // the runtime's container ID (hex); empty if not in a container
};

// Parses /proc/<pid>/cgroup (v1 "N:controllers:/path" lines and v2 "0::/path"), with the
// cgroupfs driver (".../pod<uid>/<id>", also "crio-<id>", "docker-<id>") and the systemd driver
// (".../kubepods-<qos>-pod<uid_with_underscores>.slice/cri-containerd-<id>.scope", also
// "crio-<id>.scope", "docker-<id>.scope"), anywhere in the path (so also under a cgroup
// namespace, "/../.." prefixes, or kind's "kubelet-kubepods" slices). A pod UID is 32 hex digits
// with optional dashes (UUIDs, and static pods' hash UIDs). nullopt when no line names a pod.
std::optional<CgroupInfo> ParseCgroup(std::string_view text);

struct CheckpointEntry {
  std::string pod_uid, container, resource;
  std::vector<std::string> device_ids;  // as stored (with any "::<n>"), NUMA groups concatenated
};

// Parses kubelet's device-manager checkpoint (<kubelet dir>/device-plugins/
// kubelet_internal_checkpoint): {"Data":{"PodDeviceEntries":[{"PodUID","ContainerName",
// "ResourceName","DeviceIDs","AllocResp"}],"RegisteredDevices":{...}},"Checksum":N}. DeviceIDs is
// a map NUMA node -> IDs (Kubernetes >= 1.20) or a plain list (older). The checksum is verified
// for the current layout (kubelet/checksum.h): a file whose contents do not match it is
// refused, as kubelet refuses it. Errors start with "<origin>: " and say what is wrong where.
[[nodiscard]] absl::StatusOr<std::vector<CheckpointEntry>> ParseCheckpoint(std::string_view json,
                                                                           std::string_view origin);

// What a kgpu.io/gpu container really holds, from the CDI spec the device plugin wrote for it at
// PreStartContainer (api/share_cdi.h): its slot IDs are only a count (kubelet picks any
// free slots; the extender's allocation record decides the GPUs), so the slots' GPU is not the
// GPU the container uses.
struct ShareSpec {
  std::vector<std::string> uuids;            // NVIDIA_VISIBLE_DEVICES, in order
  std::string enforcement;                   // KGPU_ENFORCEMENT: hard, mps or none
  std::map<std::string, int64_t> limit_mib;  // GPU UUID -> enforced MiB (hard, mps); absent: none
  int64_t cores = 0;                         // KGPU_GPU_CORES: % of the SMs (0: not limited)
};

// Parses such a spec (untrusted text: fuzzed). Errors start with "<origin>: ".
[[nodiscard]] absl::StatusOr<ShareSpec> ParseShareSpec(std::string_view json, std::string_view origin);

// "GPU-x::3" -> "GPU-x"; IDs without "::" are returned unchanged.
std::string_view StripReplica(std::string_view device_id);

class PodAttributor {
 public:
  struct Options {
    std::string proc_root = "/proc";
    std::string checkpoint_path = "/var/lib/kubelet/device-plugins/kubelet_internal_checkpoint";
    // Where the device plugin writes CDI specs (its --cdi-spec-dir): kgpu.io/gpu containers'
    // GPUs and limits are read from there.
    std::string cdi_spec_dir = "/var/run/cdi";
  };

  explicit PodAttributor(Options options);
  ~PodAttributor();
  PodAttributor(const PodAttributor&) = delete;
  PodAttributor& operator=(const PodAttributor&) = delete;
  PodAttributor(PodAttributor&&) = delete;
  PodAttributor& operator=(PodAttributor&&) = delete;

  // Replaces the PodResources view and re-reads the checkpoint. If the checkpoint cannot be
  // read or parsed, the previous checkpoint data is kept, CheckpointFailures() goes up, and a
  // warning naming the file is logged (once per distinct error, not on every call).
  void Update(std::vector<kubelet::DeviceAllocation> allocations);

  // The pod of process `pid` running on GPU `gpu_uuid` (MIG device `mig_uuid`, empty if not
  // MIG). Reads <proc_root>/<pid>/cgroup on each call. nullopt when the process is in no pod, or
  // its pod holds no matching allocation. If the process's pod holds the device through several
  // of its containers, the pod is returned with an empty container (a cgroup's container ID
  // cannot be mapped to a container name from this data).
  std::optional<kubelet::PodRef> Attribute(unsigned pid, const std::string& gpu_uuid,
                                           const std::string& mig_uuid) const;

  // Every PodResources container holding any ID of the device ("::<n>" stripped), sorted by
  // (namespace, pod, container), without duplicates.
  std::vector<kubelet::PodRef> PodsOnDevice(const std::string& gpu_or_mig_uuid) const;

  // The pod holding `uuid` if exactly one pod does (if several containers of that one pod hold
  // it, the container is empty); nullopt when none or several pods do.
  std::optional<kubelet::PodRef> OwnerOf(const std::string& uuid) const;

  // The GPUs and limits of a kgpu.io/gpu container (nullopt: not one, or its spec is not
  // written yet: the container has not started).
  std::optional<ShareSpec> ShareOf(const kubelet::PodRef& container) const;

  // The UID of `pod`'s pod (namespace and name), from the checkpoint entries that resolve to it
  // (--kubernetes-enable-pod-uid); empty when none does.
  std::string PodUid(const kubelet::PodRef& pod) const;

  // The replica `container` holds of any of `uuids` (the "<n>" of a "GPU-...::<n>" device ID; for
  // a kgpu.io/gpu container, of its lowest slot, when its spec names one of them): dcgm-exporter's
  // `vgpu` label (--kubernetes-virtual-gpus). Empty when it holds the device whole.
  std::string ReplicaOn(const kubelet::PodRef& container, const std::vector<std::string>& uuids) const;

  // Updates whose checkpoint read or parse failed (for a degraded-mode metric).
  uint64_t CheckpointFailures() const { return checkpoint_failures_.load(); }

 private:
  struct Snapshot;

  std::shared_ptr<const Snapshot> Current() const;

  const Options options_;
  std::mutex update_mu_;  // one Update at a time; guards last_error_
  std::string last_error_;
  std::atomic<uint64_t> checkpoint_failures_{0};

  mutable std::mutex mu_;
  std::shared_ptr<const Snapshot> snapshot_;  // guarded by mu_; never null
};

// What the API server says about a pod, for --kubernetes-enable-pod-labels and
// --kubernetes-enable-pod-uid: read by the CLI from a node-scoped pod informer (exporter/ does not
// talk to the API server) and handed to the exporter as a function.
struct PodMetadata {
  std::string uid;
  std::vector<std::pair<std::string, std::string>> labels;  // PodMetricLabels: sanitised, allowed
};
// (namespace, name) -> the pod's metadata; nullopt when the informer does not know the pod (yet).
// Called on the collection thread.
using PodMetadataReader = std::function<std::optional<PodMetadata>(const std::string&, const std::string&)>;

// A pod's labels as metric labels, as dcgm-exporter writes them: every character outside
// [a-zA-Z0-9_] of the key replaced by '_' (and '_' put before a leading digit, which Prometheus
// does not allow), kept when `allow` is empty or any of its patterns matches the original key
// (searched, as Go's Regexp.MatchString). Sorted by key; of keys that sanitise alike, the first.
// `allow` holds --kubernetes-pod-label-allowlist-regex's patterns, compiled (ECMAScript syntax).
std::vector<std::pair<std::string, std::string>> PodMetricLabels(const std::map<std::string, std::string>& labels,
                                                                 const std::vector<std::regex>& allow);

// --hpc-job-mapping-dir: the HPC jobs on each GPU, as dcgm-exporter reads them: a file per GPU,
// named by its index ("0", "1", ...), holding one job ID per line; kgpu also takes "<gpu>.<gi>"
// for one GPU instance of a MIG GPU. Each series of a GPU with jobs carries hpc_job, once per job.
// A line is trimmed of white space; a job listed twice counts once (in the order first listed),
// and a file's jobs stop at kMaxJobsPerDevice (each job multiplies the device's series; reaching
// the cap is logged once per file, and again after the file came back under it). Read again at
// every Refresh (the collection timer). A directory that cannot be read is logged once (and again
// when the error changes) and means no jobs.
//
// Thread-safety: one thread (the collection thread).
class HpcJobs {
 public:
  static constexpr size_t kMaxJobsPerDevice = 64;
  explicit HpcJobs(std::string dir) : dir_(std::move(dir)) {}
  void Refresh();
  // The jobs of GPU `gpu` (of its GPU instance `gi`, nullopt for the whole GPU): the
  // "<gpu>.<gi>" file when there is one, else the GPU's file; empty lines skipped.
  std::vector<std::string> Jobs(unsigned gpu, std::optional<unsigned> gi) const;
  const std::string& dir() const { return dir_; }

 private:
  const std::string dir_;
  std::map<std::string, std::vector<std::string>> jobs_;  // file name -> job IDs
  std::set<std::string> capped_;                          // files over kMaxJobsPerDevice at the last Refresh
  ConditionLog log_{"exporter"};
};

}  // namespace kgpu::exporter
