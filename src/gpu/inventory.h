#pragma once
// gpu::Inventory: an immutable snapshot of what a node has — GPUs, MIG devices (with parent and
// GI/CI ids and their profile names), NUMA nodes from sysfs, and the NVLink/PCIe topology of every
// GPU pair, computed once at discovery (never per request).
//
// Thread-safety: an Inventory is immutable after Discover(); share it as
// std::shared_ptr<const Inventory> and read it from any thread.

#include <chrono>
#include <cstdint>
#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "nvml/library.h"

namespace kgpu::gpu {

struct MigDevice {
  std::string uuid;         // MIG-...
  unsigned parent = 0;      // index of the parent GPU
  unsigned index = 0;       // NVML MIG device index on the parent
  unsigned gi = 0, ci = 0;  // GPU / compute instance ids
  std::string profile;      // "3g.20gb", "1g.10gb+me", "1c.3g.20gb"
  uint64_t memory_mib = 0;
  unsigned gi_slices = 0, ci_slices = 0;
  // nvmlDeviceGetAttributes of the MIG device: its SMs, and the engines its GPU instance shares
  // (GPU Feature Discovery's mig-<profile>.multiprocessors and .engines.* labels).
  unsigned sm_count = 0;
  unsigned copy_engines = 0, decoders = 0, encoders = 0, jpegs = 0, ofas = 0;
  nvml::Device handle;
};

struct Gpu {
  unsigned index = 0;
  std::string uuid;
  std::string name;
  std::string bus_id;  // "00000000:18:00.0"
  unsigned minor = 0;
  uint64_t memory_mib = 0;
  int cc_major = 0, cc_minor = 0;
  unsigned power_limit_w = 0;
  int numa_node = -1;  // -1: unknown
  // The PCIe root complex the GPU hangs under ("pci0000:00"), from the sysfs device path; empty
  // when unknown (Kubernetes' resource.kubernetes.io/pcieRoot attribute).
  std::string pcie_root;
  int brand = -1;                       // nvmlBrandType_t; -1: unread
  unsigned architecture = 0xFFFFFFFFU;  // nvmlDeviceArchitecture_t; NVML_DEVICE_ARCH_UNKNOWN when unread
  // The PCI class code with its programming interface, from <sysfs>/bus/pci/devices/<bdf>/class:
  // 0x030200 a 3D controller (compute mode), 0x030000 a VGA controller (graphics mode); 0: unread.
  uint32_t pci_class = 0;
  bool mig_capable = false;
  bool mig_enabled = false;
  bool mig_pending = false;  // the pending mode differs from the current one (needs a reset)
  std::vector<MigDevice> migs;
  bool lost = false;  // NVML reported GPU_IS_LOST during discovery
  bool hung = false;  // its NVML calls did not return within the discovery deadline
  std::string error;  // why the GPU could not be read (empty when fine)
  nvml::Device handle;
};

// PCIe relationship of two GPUs, as nvidia-smi topo -m names it.
enum class PcieLevel { kSelf, kPix, kPxb, kPhb, kNode, kSys, kUnknown };
const char* PcieLevelName(PcieLevel level);

struct Link {
  unsigned nvlinks = 0;  // NVLink lanes connecting the pair (directly or through NVSwitches)
  PcieLevel pcie = PcieLevel::kUnknown;
};

struct DiscoverOptions {
  // NUMA nodes and PCI classes come from <root>/bus/pci/devices/<bdf>/{numa_node,class}.
  std::string sysfs_root = "/sys";
};

class Inventory {
 public:
  static absl::StatusOr<std::shared_ptr<const Inventory>> Discover(const nvml::Library& lib,
                                                                   const DiscoverOptions& options);
  // The same, but each GPU is read on its own thread and a GPU whose NVML calls have not returned
  // within `deadline` is recorded as hung (Gpu::hung, Gpu::error), so this returns within about
  // `deadline` whatever the driver does. A thread stuck in NVML is left behind holding `lib`.
  static absl::StatusOr<std::shared_ptr<const Inventory>> Discover(std::shared_ptr<const nvml::Library> lib,
                                                                   const DiscoverOptions& options,
                                                                   std::chrono::milliseconds deadline);
  // For tests: an inventory built from parts.
  static std::shared_ptr<const Inventory> FromPartsForTest(std::vector<Gpu> gpus, std::vector<std::vector<Link>> links);

  const std::vector<Gpu>& gpus() const { return gpus_; }
  const Link& link(unsigned a, unsigned b) const { return links_[a][b]; }
  // "X", "NV18", "PIX", "NODE", "SYS", ...
  std::string TopologyLabel(unsigned a, unsigned b) const;

  const Gpu* FindGpu(const std::string& uuid) const;
  const MigDevice* FindMig(const std::string& uuid) const;
  // Index of the GPU whose NVML handle is `handle`, or -1.
  int IndexOfHandle(nvml::Device handle) const;

  const std::string& driver_version() const { return driver_version_; }
  const std::string& cuda_version() const { return cuda_version_; }  // "12.4"
  const std::string& nvml_version() const { return nvml_version_; }

 private:
  Inventory() = default;
  static absl::StatusOr<std::shared_ptr<const Inventory>> Build(
      const nvml::Library& lib, const std::function<std::vector<Gpu>(unsigned count)>& read_gpus);
  std::vector<Gpu> gpus_;
  std::vector<std::vector<Link>> links_;
  std::string driver_version_, cuda_version_, nvml_version_;
};

// What MIG looks like on the node, per GPU: mode (current/pending) and MIG device UUIDs. The first
// form reads an inventory, the second asks NVML now (a few calls per GPU; GPUs that cannot be read
// keep the inventory's value), so comparing the two tells whether MIG was re-partitioned.
std::string MigFingerprint(const Inventory& inventory);
std::string MigFingerprintNow(const nvml::Library& lib, const Inventory& inventory);

// go-nvlib's names for a GPU's brand ("Nvidia", "Tesla", "GeForceRTX") and architecture
// ("Ampere", "Ada Lovelace", "Hopper"), the strings NVIDIA's DRA driver publishes; "Unknown" for an
// unknown or unread value.
std::string BrandName(int brand);
std::string ArchitectureName(unsigned architecture);

// nvidia-smi / NVIDIA device-plugin style MIG profile name from NVML attributes:
// "<G>g.<GB>gb" with go-nvlib's memory rounding, "<C>c." prefix when the compute instance is a
// part of its GPU instance, and "+me" / "-me" / "+me.all" / "+gfx" from the GI profile index.
std::string MigProfileName(unsigned gi_slices, unsigned ci_slices, uint64_t memory_mib, uint64_t gpu_memory_bytes,
                           unsigned profile_index);

}  // namespace kgpu::gpu
