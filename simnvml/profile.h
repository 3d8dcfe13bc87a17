#pragma once
// Node profiles for the simulated NVML: what GPUs a simulated node has (model catalogue, MIG
// profile tables, PCI/NUMA/NVLink layout) and how they are described in YAML.
//
// Thread-safety: all types are plain values; the functions are pure and reentrant.

#include <cstdint>
#include <string>
#include <string_view>
#include <vector>

#include "absl/status/statusor.h"

namespace kgpu::sim {

// One GPU-instance profile of a MIG-capable model (a row of `nvidia-smi mig -lgip`).
struct MigProfile {
  unsigned index = 0;           // NVML_GPU_INSTANCE_PROFILE_* index
  unsigned id = 0;              // nvidia-smi profile id (nvmlGpuInstanceProfileInfo_t.id)
  std::string name;             // "1g.5gb", "1g.5gb+me"
  unsigned compute_slices = 0;  // of 7
  unsigned memory_slices = 0;   // of 8
  unsigned max_instances = 0;
  std::vector<unsigned> starts;  // valid placement starts (in memory slices)
  uint64_t memory_mib = 0;
  unsigned sm_count = 0;
  unsigned copy_engines = 0, decoders = 0, encoders = 0, jpegs = 0, ofas = 0;
};

struct GpuModel {
  std::string key;   // catalogue key used in profile files, e.g. "H100-SXM5-80GB"
  std::string name;  // nvmlDeviceGetName
  uint64_t memory_mib = 0;
  uint64_t reserved_mib = 0;
  int cc_major = 0, cc_minor = 0;
  unsigned architecture = 0;
  unsigned power_limit_w = 0, power_min_w = 0, idle_power_w = 0;
  unsigned max_sm_mhz = 0, idle_sm_mhz = 0, max_mem_mhz = 0;
  unsigned pci_device_id = 0;  // device << 16 | 0x10de
  unsigned pci_subsystem_id = 0;
  unsigned nvlinks = 0, nvlink_version = 0;
  unsigned pcie_gen = 0, pcie_width = 0;
  unsigned sm_count = 0, cuda_cores = 0, bus_width = 0;
  unsigned temp_shutdown = 0, temp_slowdown = 0, temp_gpu_max = 0, temp_mem_max = 0;
  unsigned idle_temp = 0;
  std::string vbios, part_number;
  unsigned max_mig_devices = 0;  // 0: not MIG capable
  std::vector<MigProfile> mig_profiles;
};

// The catalogue of models the simulator knows.
const std::vector<GpuModel>& Models();
const GpuModel* FindModel(std::string_view key);
// The profile of `model` whose name (e.g. "3g.20gb") matches, or nullptr.
const MigProfile* FindMigProfileByName(const GpuModel& model, std::string_view name);
const MigProfile* FindMigProfileByIndex(const GpuModel& model, unsigned index);
const MigProfile* FindMigProfileById(const GpuModel& model, unsigned id);

struct MigInstanceSpec {
  std::string profile;  // "3g.20gb"
  int start = -1;       // -1: first free placement
};

// PCI class codes (with the programming interface byte) a GPU shows in sysfs: a data-centre GPU
// in compute mode is a 3D controller, one switched to graphics mode (displaymodeselector) or a
// display card is a VGA controller. GPU Feature Discovery's nvidia.com/gpu.mode reads them.
inline constexpr unsigned kPci3dControllerClass = 0x030200;
inline constexpr unsigned kPciVgaControllerClass = 0x030000;

struct GpuSpec {
  const GpuModel* model = nullptr;
  unsigned bus = 0;  // PCI bus number
  int numa_node = 0;
  unsigned pci_class = kPci3dControllerClass;  // `pciClass` in the profile's gpus entry
  bool mig_enabled = false;
  std::vector<MigInstanceSpec> mig;  // initial layout when mig_enabled
};

struct NodeProfile {
  std::string name;
  std::string driver_version;
  int cuda_version = 0;  // 12040 for 12.4
  std::string nvml_version;
  std::string nvlink;  // "nvswitch" or "none"
  unsigned nvswitches = 0;
  int numa_nodes = 1;
  unsigned pcie_switch_group = 1;  // GPUs per PCIe switch
  std::vector<GpuSpec> gpus;
  std::string source;  // the YAML text the profile was parsed from
};

// Parses a profile from YAML. `origin` names the input in errors, which read
// "<origin>:<line>:<column>: <what is wrong>".
absl::StatusOr<NodeProfile> ParseProfile(std::string_view yaml, std::string_view origin);

// Names of the built-in profiles, and their YAML text.
std::vector<std::string> BuiltinProfileNames();
const char* BuiltinProfileYaml(std::string_view name);

// Resolves a profile spec: a built-in name, or a path to a YAML file (anything containing '/'
// or ending in .yaml/.yml). Unknown names list the known ones.
absl::StatusOr<NodeProfile> LoadProfile(std::string_view spec);

// Deterministic identifiers derived from (profile name, node name, GPU index).
std::string GpuUuid(std::string_view profile, std::string_view node, unsigned index);
std::string MigUuid(std::string_view gpu_uuid, unsigned gi, unsigned ci);
std::string GpuSerial(std::string_view profile, std::string_view node, unsigned index);
uint64_t Fnv1a(std::string_view data, uint64_t seed = 14695981039346656037ULL);

}  // namespace kgpu::sim
