#pragma once
// The node ↔ control-plane contract under Dynamic Resource Allocation (resource.k8s.io/v1): the
// names kgpu's DRA driver publishes — the driver, its DeviceClasses, device types, attribute,
// capacity and counter names, all NVIDIA's where NVIDIA has one (a drop-in for claims written for
// NVIDIA's gpu.nvidia.com driver, kubernetes-sigs/dra-driver-nvidia-gpu; docs/dra.md) — and the ResourceSlice as a
// value type with its JSON encoder. The node's slice builder (dra/slices.h) fills these; the extender and the stand-ins
// read the same names.
//
// Thread-safety: constants, value types and pure functions.

#include <cstdint>
#include <map>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include <nlohmann/json.hpp>

namespace kgpu::api::dra {

// ---- the driver and its classes (NVIDIA's names: deployments/helm/.../deviceclass-*.yaml)
inline constexpr char kDriver[] = "gpu.nvidia.com";  // --driver-name sets another
inline constexpr char kGpuClass[] = "gpu.nvidia.com";
inline constexpr char kMigClass[] = "mig.nvidia.com";
// kgpu's own: a share of one GPU (a device with allowMultipleAllocations: memory and cores are
// consumable capacity, each claim held to what it consumed).
inline constexpr char kShareClass[] = "gpu-share.kgpu.io";

// ---- device types (attribute `type`)
inline constexpr char kTypeGpu[] = "gpu";
inline constexpr char kTypeMig[] = "mig";

// ---- attributes (bare names are in the driver's domain)
inline constexpr char kAttrType[] = "type";
inline constexpr char kAttrUuid[] = "uuid";
inline constexpr char kAttrIndex[] = "index";  // kgpu (NVIDIA ≤ v25.3 had it): the NVML index
inline constexpr char kAttrProductName[] = "productName";
inline constexpr char kAttrBrand[] = "brand";
inline constexpr char kAttrArchitecture[] = "architecture";
inline constexpr char kAttrCudaComputeCapability[] = "cudaComputeCapability";  // version
inline constexpr char kAttrDriverVersion[] = "driverVersion";                  // version
inline constexpr char kAttrCudaDriverVersion[] = "cudaDriverVersion";          // version
inline constexpr char kAttrParentUuid[] = "parentUUID";                        // MIG
inline constexpr char kAttrProfile[] = "profile";                              // MIG
inline constexpr char kAttrPciBusId[] = "resource.kubernetes.io/pciBusID";
inline constexpr char kAttrPcieRoot[] = "resource.kubernetes.io/pcieRoot";
inline constexpr char kAttrNumaNode[] = "resource.kubernetes.io/numaNode";

// ---- capacities
inline constexpr char kCapMemory[] = "memory";  // bytes
inline constexpr char kCapCores[] = "cores";    // kgpu shares: percent of the GPU's SMs
inline constexpr char kCapMultiprocessors[] = "multiprocessors";
inline constexpr char kCapCopyEngines[] = "copyEngines";
inline constexpr char kCapDecoders[] = "decoders";
inline constexpr char kCapEncoders[] = "encoders";
inline constexpr char kCapJpegEngines[] = "jpegEngines";
inline constexpr char kCapOfaEngines[] = "ofaEngines";

// ---- health taints (NVIDIA's keys, device_health.go)
inline constexpr char kTaintXid[] = "gpu.nvidia.com/xid";
inline constexpr char kTaintGpuLost[] = "gpu.nvidia.com/gpu-lost";

// A capacity or counter name as a counter (a DNS label): "copyEngines" -> "copy-engines".
std::string CounterName(std::string_view capacity);
// "memory-slice-<i>"
std::string MemorySliceCounter(unsigned slice);
// "gpu-<minor>", "gpu-<minor>-counter-set" and NVIDIA's MIG device name
// "gpu-<minor>-mig-<profile, dots removed, RFC 1123>-<GI profile id>-<placement start>".
std::string GpuDeviceName(unsigned minor);
std::string CounterSetName(unsigned minor);
std::string MigDeviceName(unsigned parent_minor, std::string_view profile, unsigned profile_id,
                          unsigned placement_start);

// Whether `name` may be a driver name (a DNS subdomain of at most 63 characters, lower case), or a
// node or pool name (a DNS subdomain, at most 253).
bool IsDnsSubdomain(std::string_view name, size_t max_size = 253);

// A quantity of bytes (or any count) in kube-apiserver's canonical binary form: "80Gi", "4864Mi",
// "512" (below 1 Ki or not a whole Ki: plain digits).
std::string BinaryQuantity(uint64_t value);
// A dotted version as semantic version 2.0.0 (the `version` attribute type): missing parts are 0,
// leading zeros dropped ("12.4" -> "12.4.0", "535.104.05" -> "535.104.5"); nullopt when a part is
// not a number or there are more than three.
std::optional<std::string> SemVer(std::string_view dotted);

struct Attribute {
  enum class Kind { kInt, kBool, kString, kVersion } kind = Kind::kString;
  int64_t int_value = 0;
  bool bool_value = false;
  std::string text;  // string or version
  static Attribute Int(int64_t v) { return {Kind::kInt, v, false, {}}; }
  static Attribute Bool(bool v) { return {Kind::kBool, 0, v, {}}; }
  static Attribute String(std::string v) { return {Kind::kString, 0, false, std::move(v)}; }
  static Attribute Version(std::string v) { return {Kind::kVersion, 0, false, std::move(v)}; }
  bool operator==(const Attribute&) const = default;
};

// requestPolicy of a consumable capacity: `default`, and validRange (min, max, step).
struct RequestPolicy {
  std::string default_value;
  std::string min, max, step;  // empty: unset
  bool operator==(const RequestPolicy&) const = default;
};

struct Capacity {
  std::string value;  // a quantity
  std::optional<RequestPolicy> policy;
  bool operator==(const Capacity&) const = default;
};

struct CounterConsumption {
  std::string counter_set;
  std::map<std::string, std::string> counters;  // name -> quantity
};

struct Taint {
  std::string key, value;
  std::string effect;      // NoSchedule | NoExecute | None
  std::string time_added;  // RFC 3339; empty: the server sets it
  bool operator==(const Taint&) const = default;
};

struct Device {
  std::string name;
  std::map<std::string, Attribute> attributes;
  std::map<std::string, Capacity> capacity;
  std::vector<CounterConsumption> consumes_counters;
  std::vector<Taint> taints;
  bool allow_multiple_allocations = false;
};

struct CounterSet {
  std::string name;
  std::map<std::string, std::string> counters;  // name -> quantity
};

struct ResourceSlice {
  std::string name;
  std::string driver;
  std::string node_name;
  std::string pool;
  int64_t generation = 1;
  int64_t slice_count = 1;
  std::vector<Device> devices;              // either devices ...
  std::vector<CounterSet> shared_counters;  // ... or counters (Kubernetes >= 1.35), or both (1.34)
};

// The ResourceSlice object (apiVersion resource.k8s.io/v1) without ownerReferences, which the
// publisher adds.
nlohmann::json ToJson(const ResourceSlice& slice);

// The API's limits a slice must keep (k8s.io/api resource/v1 types.go).
inline constexpr size_t kMaxDevicesPerSlice = 128;
inline constexpr size_t kMaxDevicesPerSliceWithTaintsOrCounters = 64;
inline constexpr size_t kMaxCounterSetsPerSlice = 8;
inline constexpr size_t kMaxCountersPerSet = 32;
inline constexpr size_t kMaxAttributesAndCapacities = 32;
inline constexpr size_t kMaxStringAttribute = 64;

}  // namespace kgpu::api::dra
