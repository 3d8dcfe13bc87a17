#pragma once
// nvml::Library: the only code in kgpu that touches NVML. It dlopen()s libnvidia-ml.so.1 (by
// soname, or from an explicit path), resolves every entry point it uses with _vN probing (newest
// first), treats every symbol but a small core as optional, holds one nvmlInit reference for its
// lifetime, and turns NVML return codes into absl::Status values that name the call and carry
// NVML's own error string and return code.
//
// Thread-safety: NVML is thread-safe; so is every const method here. Open/destruction are not
// concurrent with other calls.

#include <cstdint>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"

namespace kgpu::nvml {

// NVML return codes kgpu reacts to (the values are NVML's).
enum class Return : int {
  kSuccess = 0,
  kUninitialized = 1,
  kInvalidArgument = 2,
  kNotSupported = 3,
  kNoPermission = 4,
  kNotFound = 6,
  kInsufficientSize = 7,
  kDriverNotLoaded = 9,
  kTimeout = 10,
  kFunctionNotFound = 13,
  kGpuIsLost = 15,
  kInUse = 19,
  kNoData = 21,
  kUnknown = 999,
};

// The NVML return code behind a status made by this library (kSuccess for OK, kUnknown when the
// status did not come from NVML).
Return ReturnOf(const absl::Status& status);
// True for NOT_SUPPORTED, NO_PERMISSION, NOT_FOUND, NO_DATA, FUNCTION_NOT_FOUND: "no value".
bool IsNoValue(const absl::Status& status);
bool IsGpuLost(const absl::Status& status);

// An opaque NVML device handle (GPU or MIG device).
struct Device {
  void* handle = nullptr;
  bool operator==(const Device&) const = default;
};

struct LoadOptions {
  // Explicit library path (flag --nvml-library, env KGPU_NVML_LIBRARY); empty: by soname.
  std::string path;
};

struct PciInfo {
  std::string bus_id;  // "00000000:18:00.0"
  unsigned domain = 0, bus = 0, device = 0;
  unsigned pci_device_id = 0;
  unsigned pci_subsystem_id = 0;
};

struct MemoryInfo {
  uint64_t total = 0, reserved = 0, used = 0, free = 0;  // bytes
  bool reserved_known = false;  // nvmlDeviceGetMemoryInfo_v2 answered (v1 counts reserved as used)
};

struct MigMode {
  bool current = false;
  bool pending = false;
};

struct MigDeviceInfo {
  Device handle;
  unsigned gi = 0, ci = 0;
  unsigned profile_index = 0;  // NVML_GPU_INSTANCE_PROFILE_* index of the GI
  unsigned gi_slices = 0, ci_slices = 0;
  uint64_t memory_mib = 0;  // of the GPU instance
  unsigned sm_count = 0;    // of the compute instance
  // Engines the GPU instance shares among its compute instances (nvmlDeviceAttributes_t.shared*).
  unsigned copy_engines = 0, decoders = 0, encoders = 0, jpegs = 0, ofas = 0;
};

// NVML's compute modes (nvmlComputeMode_t values).
enum class ComputeMode : int { kDefault = 0, kExclusiveThread = 1, kProhibited = 2, kExclusiveProcess = 3 };

// A GPU-instance profile a MIG-capable GPU offers (nvmlGpuInstanceProfileInfo_t).
struct GpuInstanceProfile {
  unsigned index = 0;   // NVML_GPU_INSTANCE_PROFILE_* (what the *ProfileInfo calls take)
  unsigned id = 0;      // profile id (what create/placement calls take)
  unsigned slices = 0;  // compute slices
  unsigned max_instances = 0;
  uint64_t memory_mib = 0;
  unsigned sm_count = 0;
  // Engines an instance of this profile gets (nvmlGpuInstanceProfileInfo_t.*Count).
  unsigned copy_engines = 0, decoders = 0, encoders = 0, jpegs = 0, ofas = 0;
};
struct Placement {
  unsigned start = 0, size = 0;  // in memory slices
  bool operator==(const Placement&) const = default;
};
struct GpuInstance {
  void* handle = nullptr;
  unsigned id = 0;
  unsigned profile_index = 0, profile_id = 0;
  Placement placement;
};

struct NvLink {
  unsigned link = 0;
  std::string remote_bus_id;
  bool remote_is_switch = false;
};

struct Event {
  Device device;
  uint64_t type = 0;
  uint64_t data = 0;
  unsigned gi = 0xFFFFFFFFU, ci = 0xFFFFFFFFU;
};

inline constexpr uint64_t kEventSingleBitEcc = 0x1;
inline constexpr uint64_t kEventDoubleBitEcc = 0x2;
inline constexpr uint64_t kEventXid = 0x8;
inline constexpr uint64_t kEventMigConfigChange = 0x100;  // nvmlEventMigConfigChange
inline constexpr unsigned kNoInstance = 0xFFFFFFFFU;
inline constexpr unsigned kNoInstanceId = kNoInstance;

class Library;

// One GPM sample buffer (nvmlGpmSampleAlloc/Free, RAII): Library::GpmSampleGet or GpmMigSampleGet
// fills it, and GpmMetrics compares two of them. Movable, not copyable; an empty one (default
// constructed, or moved from) holds nothing. It must not outlive the Library that allocated it.
class GpmSample {
 public:
  GpmSample() = default;
  ~GpmSample();
  GpmSample(GpmSample&& other) noexcept : lib_(other.lib_), sample_(other.sample_) { other.sample_ = nullptr; }
  GpmSample& operator=(GpmSample&& other) noexcept;
  GpmSample(const GpmSample&) = delete;
  GpmSample& operator=(const GpmSample&) = delete;
  bool empty() const { return sample_ == nullptr; }

 private:
  friend class Library;
  GpmSample(const Library* lib, void* sample) : lib_(lib), sample_(sample) {}
  const Library* lib_ = nullptr;
  void* sample_ = nullptr;
};

// An NVML event set (RAII).
class EventSet {
 public:
  ~EventSet();
  EventSet(const EventSet&) = delete;
  EventSet& operator=(const EventSet&) = delete;
  [[nodiscard]] absl::Status Register(Device device, uint64_t types) const;
  // Waits up to timeout_ms; nullopt on timeout.
  [[nodiscard]] absl::StatusOr<std::optional<Event>> Wait(unsigned timeout_ms) const;

 private:
  friend class Library;
  EventSet(const Library& lib, void* set) : lib_(lib), set_(set) {}
  const Library& lib_;
  void* set_;
};

class Library {
 public:
  struct Symbols;

  // Loads the library and calls nvmlInit. Errors say where it looked and how to fix it.
  static absl::StatusOr<std::unique_ptr<Library>> Open(const LoadOptions& options);
  ~Library();
  Library(const Library&) = delete;
  Library& operator=(const Library&) = delete;

  // The file the dynamic loader actually opened.
  const std::string& path() const { return path_; }
  // Where a library is looked for when no explicit path is given (for messages).
  static std::vector<std::string> SearchPath();

  absl::StatusOr<std::string> DriverVersion() const;
  absl::StatusOr<std::string> NvmlVersion() const;
  absl::StatusOr<int> CudaDriverVersion() const;  // 12040 = 12.4

  absl::StatusOr<unsigned> DeviceCount() const;
  absl::StatusOr<Device> DeviceByIndex(unsigned index) const;
  absl::StatusOr<Device> DeviceByUuid(const std::string& uuid) const;
  absl::StatusOr<std::string> Uuid(Device d) const;
  absl::StatusOr<std::string> Name(Device d) const;
  absl::StatusOr<unsigned> MinorNumber(Device d) const;
  absl::StatusOr<PciInfo> Pci(Device d) const;
  absl::StatusOr<MemoryInfo> Memory(Device d) const;
  absl::StatusOr<std::pair<int, int>> ComputeCapability(Device d) const;
  absl::StatusOr<unsigned> PowerLimitMw(Device d) const;
  absl::StatusOr<unsigned> TemperatureC(Device d) const;
  absl::StatusOr<MigMode> GetMigMode(Device d) const;
  // MIG management (nvidia-smi mig -cgi/-dgi/-cci/-dci through NVML). SetMigMode's value is the
  // activation status: OK when the mode took effect at once, else why it is pending (IN_USE: the
  // GPU must be reset first).
  absl::StatusOr<absl::Status> SetMigMode(Device d, bool enable) const;
  absl::StatusOr<std::vector<GpuInstanceProfile>> GpuInstanceProfiles(Device gpu) const;
  absl::StatusOr<std::vector<Placement>> GpuInstancePlacements(Device gpu, unsigned profile_id) const;
  absl::StatusOr<std::vector<GpuInstance>> GpuInstances(Device gpu) const;
  absl::StatusOr<GpuInstance> CreateGpuInstance(Device gpu, const GpuInstanceProfile& profile,
                                                Placement placement) const;
  absl::Status DestroyGpuInstance(const GpuInstance& gi) const;
  // Compute instances of a GPU instance (opaque handles), of every compute profile.
  absl::StatusOr<std::vector<void*>> ComputeInstances(const GpuInstance& gi) const;
  // One compute instance spanning the whole GPU instance (`gi_slices` compute slices).
  absl::Status CreateFullComputeInstance(const GpuInstance& gi, unsigned gi_slices) const;
  absl::Status DestroyComputeInstance(void* ci) const;
  absl::StatusOr<ComputeMode> GetComputeMode(Device d) const;
  absl::Status SetComputeMode(Device d, ComputeMode mode) const;
  // MIG devices of a MIG-enabled GPU, in NVML's index order.
  absl::StatusOr<std::vector<MigDeviceInfo>> MigDevices(Device gpu) const;
  // Just the UUIDs of the MIG devices, in index order (a cheap "did the layout change" check).
  absl::StatusOr<std::vector<std::string>> MigDeviceUuids(Device gpu) const;
  // Topology level (0, 10, ... 50) between two GPUs.
  absl::StatusOr<int> CommonAncestor(Device a, Device b) const;
  absl::StatusOr<std::vector<NvLink>> ActiveNvLinks(Device d) const;
  absl::StatusOr<uint64_t> SupportedEvents(Device d) const;

  // Telemetry (the exporter's sampler).
  struct Utilization {
    unsigned gpu = 0, memory = 0;
  };
  struct RemappedRows {
    unsigned correctable = 0, uncorrectable = 0, pending = 0, failure = 0;
  };
  struct ProcessInfo {
    unsigned pid = 0;
    uint64_t used_bytes = 0;
    unsigned gi = kNoInstanceId, ci = kNoInstanceId;
    bool mps_client = false;  // listed by nvmlDeviceGetMPSComputeRunningProcesses
  };
  struct ProcessSample {
    unsigned pid = 0;
    unsigned sm_util = 0, mem_util = 0;
    uint64_t timestamp_us = 0;
  };
  enum class Clock { kGraphics = 0, kSm = 1, kMem = 2, kVideo = 3 };
  struct Bar1Memory {
    uint64_t total = 0, used = 0, free = 0;  // bytes
  };
  struct PowerLimits {
    unsigned min_mw = 0, max_mw = 0;
  };
  // nvmlTemperatureThresholds_t values.
  enum class TemperatureThreshold { kShutdown = 0, kSlowdown = 1, kMemoryMax = 2, kGpuMax = 3 };
  // nvmlPerfPolicyType_t values (what nvmlDeviceGetViolationStatus counts).
  enum class ViolationPolicy {
    kPower = 0,
    kThermal = 1,
    kSyncBoost = 2,
    kBoardLimit = 3,
    kLowUtilization = 4,
    kReliability = 5,
    kTotalAppClocks = 10,
    kTotalBaseClocks = 11,
  };
  // nvmlGpuP2PCapsIndex_t values.
  enum class P2PCaps { kRead = 0, kWrite = 1, kNvLink = 2, kAtomics = 3, kProp = 4 };
  // nvmlInforomObject_t values.
  enum class Inforom { kOem = 0, kEcc = 1, kPower = 2 };
  // A field id and its scope (for NVLink fields the link, or kAllLinks).
  struct ScopedField {
    unsigned id = 0;
    unsigned scope = 0;
  };
  static constexpr unsigned kAllLinks = 0xFFFFFFFFU;
  absl::StatusOr<Utilization> GetUtilization(Device d) const;
  absl::StatusOr<unsigned> EncoderUtilization(Device d) const;
  absl::StatusOr<unsigned> DecoderUtilization(Device d) const;
  absl::StatusOr<unsigned> ClockMhz(Device d, Clock clock) const;
  absl::StatusOr<unsigned> PowerMw(Device d) const;
  absl::StatusOr<uint64_t> EnergyMj(Device d) const;
  absl::StatusOr<unsigned> PcieReplayCounter(Device d) const;
  absl::StatusOr<uint64_t> EccErrors(Device d, bool uncorrected, bool aggregate) const;
  absl::StatusOr<RemappedRows> GetRemappedRows(Device d) const;
  // nvmlDeviceGetFieldValues: one entry per id, nullopt where NVML has no value for it.
  absl::StatusOr<std::vector<std::optional<uint64_t>>> FieldValues(Device d, const std::vector<unsigned>& ids) const;
  // The same, each id with its scope (NVLink throughput: the link, or kAllLinks for the sum).
  absl::StatusOr<std::vector<std::optional<uint64_t>>> ScopedFieldValues(Device d,
                                                                         const std::vector<ScopedField>& fields) const;
  absl::StatusOr<unsigned> MaxClockMhz(Device d, Clock clock) const;
  absl::StatusOr<unsigned> ApplicationsClockMhz(Device d, Clock clock) const;
  absl::StatusOr<unsigned> TemperatureThresholdC(Device d, TemperatureThreshold threshold) const;
  absl::StatusOr<unsigned> PowerManagementLimitMw(Device d) const;
  absl::StatusOr<unsigned> PowerManagementDefaultLimitMw(Device d) const;
  absl::StatusOr<PowerLimits> PowerManagementLimitConstraints(Device d) const;
  absl::StatusOr<unsigned> PerformanceState(Device d) const;  // 0 (P0, fastest) .. 15, 32 unknown
  absl::StatusOr<unsigned> FanSpeedPercent(Device d) const;
  // nvmlDeviceGetCurrentClocksEventReasons (the older ...ThrottleReasons on drivers without it).
  absl::StatusOr<uint64_t> ClocksEventReasons(Device d) const;
  absl::StatusOr<unsigned> PcieThroughputKBs(Device d, bool rx) const;  // KB/s over the last 20 ms
  absl::StatusOr<unsigned> PcieLinkGeneration(Device d, bool max) const;
  absl::StatusOr<unsigned> PcieLinkWidth(Device d, bool max) const;
  absl::StatusOr<uint64_t> ViolationNs(Device d, ViolationPolicy policy) const;  // since the driver loaded
  absl::StatusOr<std::pair<bool, bool>> EccMode(Device d) const;                 // current, pending
  absl::StatusOr<Bar1Memory> Bar1(Device d) const;
  absl::StatusOr<bool> PersistenceMode(Device d) const;
  absl::StatusOr<std::string> Serial(Device d) const;
  absl::StatusOr<std::string> VbiosVersion(Device d) const;
  absl::StatusOr<int> Brand(Device d) const;              // nvmlBrandType_t
  absl::StatusOr<unsigned> Architecture(Device d) const;  // nvmlDeviceArchitecture_t
  absl::StatusOr<std::string> InforomVersion(Device d, Inforom object) const;
  absl::StatusOr<std::string> InforomImageVersion(Device d) const;
  // nvmlGpuP2PStatus_t between two GPUs for one capability (0 OK ... 6 unknown).
  absl::StatusOr<int> P2PStatus(Device a, Device b, P2PCaps caps) const;

  // GPU performance monitoring (GPM, Hopper and newer): the DCGM_FI_PROF_* figures without DCGM.
  // Whether the GPU supports GPM (false, not an error, on older GPUs and drivers).
  absl::StatusOr<bool> GpmSupported(Device gpu) const;
  absl::StatusOr<GpmSample> GpmSampleAlloc() const;
  // Fills `sample` for the whole GPU, or for one GPU instance of a MIG GPU (the parent's handle).
  absl::Status GpmSampleGet(Device gpu, GpmSample& sample) const;
  absl::Status GpmMigSampleGet(Device gpu, unsigned gi, GpmSample& sample) const;
  // The metrics (NVML_GPM_METRIC_* ids, at most NVML_GPM_METRIC_MAX) between an older and a newer
  // sample of one device: one entry per id, nullopt where NVML has no value for it on this device.
  absl::StatusOr<std::vector<std::optional<double>>> GpmMetrics(const GpmSample& older, const GpmSample& newer,
                                                                const std::vector<unsigned>& ids) const;

  // Compute processes, and MPS client processes (merged, by pid).
  absl::StatusOr<std::vector<ProcessInfo>> ComputeProcesses(Device d) const;
  absl::StatusOr<std::vector<ProcessSample>> ProcessUtilization(Device d, uint64_t last_seen_us) const;
  absl::StatusOr<std::unique_ptr<EventSet>> CreateEventSet() const;

  const Symbols& symbols() const { return *syms_; }
  // NVML calls running now, on any thread (one stuck in a hung driver stays counted).
  int calls_in_flight() const;

 private:
  friend class EventSet;
  friend class GpmSample;
  Library() = default;
  void* dl_ = nullptr;
  std::string path_;
  std::unique_ptr<Symbols> syms_;
};

}  // namespace kgpu::nvml
