#pragma once
// The dcgm-exporter-compatible GPU metrics exporter.
//
// Collector samples NVML on the exporter's timer (never on a scrape) and encodes one Prometheus
// text buffer per collection: dcgm-exporter's names, HELP/TYPE, labels and label order, one series
// per GPU, or per GPU instance on MIG GPUs. Values NVML does not have are omitted, never zeroed.
// The DCGM_FI_PROF_* figures are GPM's between consecutive collections (none on the first); the
// DCGM_EXP_* families are computed as dcgm-exporter's collectors compute them.
// With pod attribution on, a device held by one pod carries its container/namespace/pod labels;
// a device shared by several pods (time-slicing) also gets one DCGM_FI_DEV_FB_USED and
// DCGM_FI_DEV_GPU_UTIL series per pod, from the pod's own processes.
// Every GPU also has kgpu_gpu_up (0 while NVML cannot read it: lost, unreadable) and one
// kgpu_gpu_unhealthy_reason series per current fault, so a failed GPU never goes silent; its XID
// families stay (XID 79 counts when it happens) and each up/down change is logged once.
//
// Exporter runs the collection timer and the PodResources refresh timer (XIDs and health come from
// the process's one gpu::HealthMonitor: the device plugin's in `kgpu node`, its own otherwise), and
// serves /metrics and /health over HTTP; a scrape returns the latest pre-encoded buffer plus a few
// lines of the exporter's own metrics, so it costs O(1) in the number of GPUs and pods.
//
// Thread-safety: Collector is used by one thread at a time (the collection thread), apart from
// RecordXid, which may be called from any thread. Exporter's Scrape() may be called from any
// thread; Start/Stop from its owner.

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cstdint>
#include <deque>
#include <functional>
#include <map>
#include <memory>
#include <mutex>
#include <optional>
#include <set>
#include <string>
#include <thread>
#include <vector>

#include "absl/status/status.h"
#include "common/log_once.h"
#include "common/web_config.h"
#include "exporter/attribution.h"
#include "exporter/counters.h"
#include "gpu/health.h"
#include "gpu/inventory.h"
#include "kubelet/podresources.h"
#include "nvml/library.h"

namespace httplib {
class Server;
}

namespace kgpu::exporter {

class GzipBody;  // exporter/gzip_body.h

// -d/--devices, dcgm-exporter's GPU selector: which devices have series. `f` (flex, the default):
// each GPU, or its GPU instances when MIG is on (a MIG GPU with no GPU instance, or whose instances
// could not be listed, as a whole GPU: a GPU never goes without kgpu_gpu_up). `g[:ids]`: whole GPUs
// by index (a MIG GPU too, as one series); `i[:ids]`: GPU instances by GPU_I_ID, on MIG GPUs (NVML
// numbers instances per GPU, so an id selects that instance on every GPU; DCGM's ids are
// node-wide); `g+i`: both. No ids: every one.
struct DeviceSelector {
  bool flex = true;
  bool gpus = false, instances = false;
  std::vector<unsigned> gpu_ids, instance_ids;  // empty: all
  bool Gpu(unsigned index) const {
    return gpus && (gpu_ids.empty() || std::find(gpu_ids.begin(), gpu_ids.end(), index) != gpu_ids.end());
  }
  bool Instance(unsigned gi) const {
    return instances &&
           (instance_ids.empty() || std::find(instance_ids.begin(), instance_ids.end(), gi) != instance_ids.end());
  }
};

// Event counts by key over a sliding window (DCGM_EXP_XID_ERRORS_COUNT by XID code,
// DCGM_EXP_CLOCK_EVENTS_COUNT by reason bit), kept as counts in time slots of window / kSlots (at
// least 1 ms): an event counts until the start of its slot is a window old, so it leaves the count
// up to window / kSlots early (0.3 s of dcgm-exporter's 5 minutes). Memory is bounded whatever the
// rate: at most kSlots + 2 slots, each holding one 64-bit count per key seen in it, so a storm of
// one key neither evicts another key's events nor makes a count stop growing.
//
// Thread-safety: none (the owner locks).
class WindowCounts {
 public:
  using TimePoint = std::chrono::steady_clock::time_point;
  static constexpr int kSlots = 1024;
  // `n` events of `key` at `at` (slots older than the window are dropped first).
  void Add(TimePoint at, uint64_t key, std::chrono::milliseconds window, uint64_t n = 1);
  // Drops the slots that began a window or more before `now`.
  void Expire(TimePoint now, std::chrono::milliseconds window);
  // key -> its events within the window before `now`.
  std::map<uint64_t, uint64_t> Counts(TimePoint now, std::chrono::milliseconds window) const;
  size_t slots() const { return slots_.size(); }

 private:
  struct Slot {
    TimePoint start;
    std::map<uint64_t, uint64_t> counts;
  };
  std::deque<Slot> slots_;
};

struct ExporterOptions {
  std::vector<Counter> counters;              // from -f (default: DefaultCountersCsv())
  std::chrono::milliseconds interval{30000};  // -c
  std::string address = ":9400";              // -a
  bool kubernetes = false;                    // -k: pod attribution through PodResources
  std::string gpu_id_type = "uid";            // --kubernetes-gpu-id-type: uid | device-name
  std::string pod_resources_socket = "/var/lib/kubelet/pod-resources/kubelet.sock";
  std::chrono::milliseconds pod_resources_interval{10000};
  std::string proc_root = "/proc";
  std::string checkpoint_path = "/var/lib/kubelet/device-plugins/kubelet_internal_checkpoint";
  std::string cdi_spec_dir = "/var/run/cdi";  // the device plugin's: kgpu.io/gpu containers' GPUs and limits
  std::string hostname;                       // Hostname label; empty: no label (-n)
  gpu::DiscoverOptions discover;              // for re-discovery after a MIG re-partition
  bool replace_blanks_in_model_name = false;
  // The windows dcgm-exporter counts DCGM_EXP_XID_ERRORS_COUNT (-x / --xid-count-window-size) and
  // DCGM_EXP_CLOCK_EVENTS_COUNT (--clock-events-count-window-size) over; its defaults, 5 minutes.
  std::chrono::milliseconds xid_count_window{300000};
  std::chrono::milliseconds clock_events_count_window{300000};
  // The process's health source (`kgpu node`: the device plugin's monitor, whose XIDs it forwards
  // to Exporter::RecordXid). Unset: the exporter runs its own gpu::HealthMonitor, with the device
  // plugin's default XID policy, so a standalone exporter agrees with a plugin left at defaults.
  gpu::HealthReader health;
  // The own monitor's recovery (the plugin's health.recoverAfter; nullopt: never).
  std::optional<std::chrono::milliseconds> health_recover_after = gpu::kDefaultRecoverAfter;

  // dcgm-exporter's labels and selection (src/cli/exporter_cmd.cc maps its flags here; every flag
  // and what kgpu does with it: docs/exporter.md).
  bool use_old_namespace = false;           // -o: uuid, and container_name/pod_namespace/pod_name
  std::string hostname_label = "Hostname";  // --hostname-label: Hostname (dcgm-exporter <= 4.5) or hostname (4.6+)
  DeviceSelector devices;                   // -d
  bool pod_uid = false;                     // --kubernetes-enable-pod-uid: pod_uid on pod series
  bool virtual_gpus = false;                // --kubernetes-virtual-gpus: vgpu (the replica) on pod series
  PodMetadataReader pod_metadata;           // --kubernetes-enable-pod-labels: the CLI's pod informer
  std::shared_ptr<HpcJobs> hpc_jobs;        // --hpc-job-mapping-dir: hpc_job on each GPU's series
  bool health_require_gpus = false;         // --health-require-gpus: /health is 503 without a GPU

  // Serving (--web-config-file: Prometheus exporter-toolkit's TLS, basic auth, headers, rate limit;
  // --web-read-timeout, --web-write-timeout).
  std::optional<web::WebConfig> web;
  std::chrono::milliseconds web_read_timeout{10000};
  std::chrono::milliseconds web_write_timeout{30000};
};

class Collector {
 public:
  Collector(const nvml::Library& lib, std::shared_ptr<const gpu::Inventory> inventory, const ExporterOptions& options,
            const PodAttributor* attributor);
  // One collection: the text of every GPU family.
  std::string Collect();
  // After a MIG re-partition: the MIG series follow the new instances (GPM samples of the old
  // instances are dropped: a GPU instance id may now name another instance). Same thread as Collect().
  void SetInventory(std::shared_ptr<const gpu::Inventory> inventory) {
    inventory_ = std::move(inventory);
    gpm_.clear();
    p2p_.clear();
  }
  const gpu::Inventory& inventory() const { return *inventory_; }
  void RecordXid(unsigned gpu, unsigned gi, unsigned long long xid);
  // Where kgpu_gpu_up and kgpu_gpu_unhealthy_reason read device health. Before the first Collect.
  void SetHealthSource(gpu::HealthReader health) { health_ = std::move(health); }
  uint64_t nvml_errors() const { return nvml_errors_.load(); }
  // The clock of the counting windows (DCGM_EXP_*_COUNT) and rates; steady_clock by default. Tests
  // set it before the first RecordXid or Collect.
  void SetClock(std::function<std::chrono::steady_clock::time_point()> now) { now_ = std::move(now); }

 private:
  using TimePoint = std::chrono::steady_clock::time_point;
  struct XidState {
    unsigned long long last = 0;
    TimePoint last_at{};    // when `last` happened: a GPU instance shows the newer of its own and the GPU's
    uint64_t last_seq = 0;  // ... and the order of the calls, for XIDs of one instant
    std::map<unsigned long long, uint64_t> counts;
    WindowCounts recent;  // by XID code, over -x (DCGM_EXP_XID_ERRORS_COUNT)
  };
  // A GPU's clock-event reasons: the collections within the window in which each reason was
  // active (DCGM_EXP_CLOCK_EVENTS_COUNT, as dcgm-exporter counts DCGM's samples of
  // DCGM_FI_DEV_CLOCKS_EVENT_REASONS; in time slots, so a day's window at -c 100 does not
  // saturate), and each reason's activations since the first sample (DCGM_EXP_CLOCK_EVENTS_TOTAL;
  // a reason already active then is not an activation).
  struct ClockEventState {
    WindowCounts active;  // reason bit -> samples with it set
    bool primed = false;
    uint64_t previous = 0;
    std::map<uint64_t, uint64_t> totals;  // reason bit -> activations
  };
  // A device's last two GPM samples: the DCGM_FI_PROF_* figures are the metrics between them.
  struct GpmState {
    nvml::GpmSample older, newer;
    bool have_older = false;
    // GPM ids the driver refused on this device when asked alone (after it failed a call that
    // asked for several): no longer asked, so that they do not take the others' figures with them.
    std::set<unsigned> unsupported;
  };
  // Takes a GPM sample of the whole GPU (gi kNoInstance) or of one GPU instance and returns the
  // metrics (GPM id -> value) since the previous collection's; empty on the first collection and
  // on GPUs without GPM (logged once, for all of them).
  std::map<unsigned, double> SampleGpm(const gpu::Gpu& g, unsigned gi);
  // A GPM call that failed on GPU `g` other than with "not supported" (NO_PERMISSION when
  // profiling is restricted to administrators, ...): counted, and logged once per GPU with
  // NVML's message.
  void NoteGpmFailure(const gpu::Gpu& g, const absl::Status& status);

  const nvml::Library& lib_;
  std::shared_ptr<const gpu::Inventory> inventory_;
  const ExporterOptions& options_;
  const PodAttributor* attributor_;
  gpu::HealthReader health_;
  std::function<TimePoint()> now_ = [] { return std::chrono::steady_clock::now(); };
  // What the counters ask for, so that a collection reads nothing else.
  std::set<Field> wanted_;
  std::set<unsigned> nvlink_lanes_;  // links of DCGM_FI_DEV_NVLINK_BANDWIDTH_L<n> rows
  std::vector<unsigned> gpm_ids_;    // GPM metrics of the DCGM_FI_PROF_* rows
  // (GPU, link or nvml::Library::kAllLinks) -> the KiB counter and when it was read.
  std::map<std::pair<unsigned, unsigned>, std::pair<uint64_t, TimePoint>> nvlink_prev_;
  std::mutex xid_mu_;
  std::map<std::pair<unsigned, unsigned>, XidState> xids_;  // (gpu, gi or kNoInstance)
  uint64_t xid_seq_ = 0;                                    // RecordXid calls (under xid_mu_)
  std::map<unsigned, ClockEventState> clock_events_;        // by GPU index
  std::map<std::pair<unsigned, unsigned>, GpmState> gpm_;   // (gpu, gi or kNoInstance)
  std::map<unsigned, bool> gpm_supported_;                  // by GPU index
  std::set<unsigned> gpm_missing_logged_;                   // GPUs whose lack of GPM was logged
  std::set<unsigned> gpm_failure_logged_;                   // GPUs whose GPM failure was logged
  std::vector<std::string> gpm_missing_new_;                // ... found in this collection: "0 (NVIDIA A100...)"
  // A GPU's strings that never change (serial, VBIOS, brand, inforom versions), read once by UUID,
  // so that its label rows keep their values while it cannot be read. A string counts as read
  // once NVML gave it or said it has none; after any other error it is asked again at the next
  // collection (one transient error at start must not lose the label for the process's life).
  std::map<std::string, std::map<Field, std::string>> strings_;
  std::map<std::string, std::set<Field>> strings_read_;
  std::optional<std::string> nvml_version_;
  std::optional<int> cuda_driver_version_;
  bool nvml_version_read_ = false, cuda_driver_version_read_ = false;
  // Label names a pod's own labels must not take (--kubernetes-enable-pod-labels): every name
  // the collector writes, its options' (the hostname label) and the counters' label rows.
  std::set<std::string, std::less<>> reserved_labels_;
  std::map<std::pair<std::string, std::string>, int> p2p_;  // (UUID, peer UUID) -> nvmlGpuP2PStatus_t
  std::atomic<uint64_t> nvml_errors_{0};
  // GPU index -> why it cannot be read ("lost", "unreadable"), for logging each change once.
  std::map<unsigned, std::string> down_seen_;
  void NoteTransition(const gpu::Gpu& g, const std::string& down, const std::string& detail);
};

class Exporter {
 public:
  Exporter(const nvml::Library& lib, std::shared_ptr<const gpu::Inventory> inventory, ExporterOptions options);
  ~Exporter();
  Exporter(const Exporter&) = delete;
  Exporter& operator=(const Exporter&) = delete;

  // Collects once, then starts the timers and the HTTP server. Fails when the address cannot
  // be bound (the message names it).
  absl::Status Start();
  void Stop();
  // Collects now (tests and the CLI's --once).
  void CollectNow();
  // The body of GET /metrics.
  std::string Scrape();
  // The same, gzipped, with the collection deflated once for all scrapes (nullopt: zlib failed).
  std::optional<std::string> ScrapeGzip();
  int port() const { return port_; }
  // An XID the process's health monitor saw (options.health's owner calls it; any thread).
  void RecordXid(unsigned gpu, unsigned gi, unsigned long long xid) { collector_->RecordXid(gpu, gi, xid); }

 private:
  void RefreshPods();
  std::string OwnMetrics();                     // the exporter's own series, counting this scrape
  std::shared_ptr<const std::string> Buffer();  // the latest collection

  const nvml::Library& lib_;
  const std::shared_ptr<const gpu::Inventory> inventory_;
  const ExporterOptions options_;
  std::unique_ptr<PodAttributor> attributor_;
  std::unique_ptr<kubelet::PodResourcesClient> pod_resources_;  // one channel to kubelet across refreshes
  std::unique_ptr<Collector> collector_;
  std::unique_ptr<gpu::HealthMonitor> own_health_;  // when options.health is unset

  std::string mig_seen_;  // MIG fingerprint of the collector's inventory (collect thread)

  std::mutex buffer_mu_;
  std::shared_ptr<const std::string> buffer_;  // the latest collection, swapped whole

  std::mutex gzip_mu_;
  std::shared_ptr<const std::string> gzip_of_;  // the collection gzip_ was made from
  std::shared_ptr<const GzipBody> gzip_;

  std::atomic<uint64_t> scrapes_{0}, collections_{0}, pod_errors_{0}, gzip_compressions_{0};
  // Conditions retried on a timer (PodResources unreachable, MIG re-discovery failing): logged
  // once and when they change; the repeats show in kgpu_exporter_log_repeats_suppressed_total.
  ConditionLog pods_log_{"exporter"}, rediscovery_log_{"exporter"};
  std::atomic<double> last_duration_{0}, last_timestamp_{0};

  std::unique_ptr<httplib::Server> http_;
  int port_ = 0;
  std::jthread collect_thread_, pods_thread_, http_thread_;
};

}  // namespace kgpu::exporter
