#include "dra/slices.h"

#include <algorithm>
#include <cctype>
#include <cstdio>

#include "common/strings.h"

namespace kgpu::dra {
namespace {

namespace a = api::dra;
using a::Attribute;
using a::Capacity;

constexpr uint64_t kMi = uint64_t{1} << 20;

// "00000000:18:00.0" (NVML) -> "0000:18:00.0", the form resource.kubernetes.io/pciBusID takes.
std::string PciBusId(const std::string& nvml_bus_id) {
  std::string s = nvml_bus_id.size() == 16 ? nvml_bus_id.substr(4) : nvml_bus_id;
  std::transform(s.begin(), s.end(), s.begin(), [](unsigned char c) { return std::tolower(c); });
  return s;
}

std::string Clip(std::string s) {
  if (s.size() > a::kMaxStringAttribute) s.resize(a::kMaxStringAttribute);
  return s;
}

// The attributes every device of GPU `g` has (NVIDIA's CommonAttributesMig and GpuInfo.Attributes).
std::map<std::string, Attribute> CommonAttributes(const gpu::Inventory& inv, const gpu::Gpu& g, const char* type) {
  std::map<std::string, Attribute> out;
  out[a::kAttrType] = Attribute::String(type);
  out[a::kAttrProductName] = Attribute::String(Clip(g.name));
  out[a::kAttrBrand] = Attribute::String(gpu::BrandName(g.brand));
  out[a::kAttrArchitecture] = Attribute::String(gpu::ArchitectureName(g.architecture));
  if (g.cc_major > 0) {
    out[a::kAttrCudaComputeCapability] = Attribute::Version(*a::SemVer(Cat(g.cc_major, ".", g.cc_minor)));
  }
  if (auto v = a::SemVer(inv.driver_version())) out[a::kAttrDriverVersion] = Attribute::Version(*v);
  if (auto v = a::SemVer(inv.cuda_version())) out[a::kAttrCudaDriverVersion] = Attribute::Version(*v);
  if (!g.bus_id.empty()) out[a::kAttrPciBusId] = Attribute::String(PciBusId(g.bus_id));
  if (!g.pcie_root.empty()) out[a::kAttrPcieRoot] = Attribute::String(g.pcie_root);
  if (g.numa_node >= 0) out[a::kAttrNumaNode] = Attribute::Int(g.numa_node);
  return out;
}

Capacity Count(uint64_t n) {
  return {a::BinaryQuantity(n), std::nullopt};
}

a::Device WholeGpu(const gpu::Inventory& inv, const gpu::Gpu& g, bool shared) {
  a::Device d;
  d.name = a::GpuDeviceName(g.minor);
  d.attributes = CommonAttributes(inv, g, a::kTypeGpu);
  d.attributes[a::kAttrUuid] = Attribute::String(g.uuid);
  d.attributes[a::kAttrIndex] = Attribute::Int(g.index);
  const std::string memory = a::BinaryQuantity(g.memory_mib * kMi);
  if (!shared) {
    d.capacity[a::kCapMemory] = {memory, std::nullopt};
    return d;
  }
  // A share: several claims on one device, each consuming memory (whole MiB) and cores (percent);
  // a claim that asks for neither takes the whole GPU (NVIDIA's consumable shares, `memory` mode).
  d.allow_multiple_allocations = true;
  d.capacity[a::kCapMemory] = {memory, a::RequestPolicy{memory, "1Mi", memory, "1Mi"}};
  d.capacity[a::kCapCores] = {"100", a::RequestPolicy{"100", "1", "100", "1"}};
  return d;
}

// NVIDIA's CommonCapacitiesMig: what one MIG instance has, as whole numbers.
using Counts = std::map<std::string, uint64_t>;
Counts MigCounts(unsigned sms, unsigned ce, unsigned dec, unsigned enc, unsigned jpg, unsigned ofa,
                 uint64_t memory_mib) {
  return {{a::kCapMultiprocessors, sms},    {a::kCapCopyEngines, ce},  {a::kCapDecoders, dec},
          {a::kCapEncoders, enc},           {a::kCapJpegEngines, jpg}, {a::kCapOfaEngines, ofa},
          {a::kCapMemory, memory_mib * kMi}};
}

Counts ProfileCounts(const nvml::GpuInstanceProfile& p) {
  return MigCounts(p.sm_count, p.copy_engines, p.decoders, p.encoders, p.jpegs, p.ofas, p.memory_mib);
}

std::map<std::string, Capacity> AsCapacities(const Counts& counts) {
  std::map<std::string, Capacity> out;
  for (const auto& [name, v] : counts) out[name] = Count(v);
  return out;
}

// Counters (DNS labels: "copy-engines") for `counts` plus one per memory slice of a placement.
std::map<std::string, std::string> AsCounters(const Counts& counts, unsigned slice_start, unsigned slice_count) {
  std::map<std::string, std::string> out;
  for (const auto& [name, v] : counts) out[a::CounterName(name)] = a::BinaryQuantity(v);
  // emplace, not out[k] = "1": GCC 12 at -O2 warns falsely (-Wrestrict) on the inlined assignment.
  for (unsigned i = slice_start; i < slice_start + slice_count; ++i) out.emplace(a::MemorySliceCounter(i), "1");
  return out;
}

struct MigGpu {
  std::vector<a::Device> devices;
  a::CounterSet counters;
};

absl::StatusOr<MigGpu> DynamicMig(const gpu::Inventory& inv, const gpu::Gpu& g, const gpu::MigCatalog& cat) {
  MigGpu out;
  out.counters.name = a::CounterSetName(g.minor);
  // The GPU's counters: the largest of each capacity any profile has, and one per memory slice.
  Counts max;
  for (const auto& p : cat.profiles) {
    for (const auto& [name, v] : ProfileCounts(p.profile)) max[name] = std::max(max[name], v);
  }
  out.counters.counters = AsCounters(max, 0, cat.memory_slices);
  if (out.counters.counters.size() > a::kMaxCountersPerSet) {
    return absl::FailedPreconditionError(Cat("GPU ", g.index, " (", g.uuid, ") has ", cat.memory_slices,
                                             " memory slices: its counter set would have ",
                                             out.counters.counters.size(), " counters, more than the API's ",
                                             a::kMaxCountersPerSet, "; publish it without --dynamic-mig"));
  }
  for (const auto& p : cat.profiles) {
    for (const auto& pl : p.placements) {
      a::Device d;
      d.name = a::MigDeviceName(g.minor, p.name, p.profile.id, pl.start);
      d.attributes = CommonAttributes(inv, g, a::kTypeMig);
      d.attributes[a::kAttrParentUuid] = Attribute::String(g.uuid);
      d.attributes[a::kAttrProfile] = Attribute::String(p.name);
      const Counts counts = ProfileCounts(p.profile);
      d.capacity = AsCapacities(counts);
      d.consumes_counters.push_back({out.counters.name, AsCounters(counts, pl.start, pl.size)});
      out.devices.push_back(std::move(d));
    }
  }
  return out;
}

absl::StatusOr<std::vector<a::Device>> StaticMig(const gpu::Inventory& inv, const gpu::Gpu& g,
                                                 const gpu::MigCatalog& cat) {
  std::vector<a::Device> out;
  for (const auto& m : g.migs) {
    const auto gi = std::find_if(cat.instances.begin(), cat.instances.end(),
                                 [&](const nvml::GpuInstance& x) { return x.id == m.gi; });
    if (gi == cat.instances.end()) {
      return absl::FailedPreconditionError(Cat("GPU ", g.index, ": MIG device ", m.uuid, " is on GPU instance ", m.gi,
                                               ", which NVML no longer lists (MIG changed: rescan)"));
    }
    a::Device d;
    d.name = StaticMigName(g, m, cat);
    d.attributes = CommonAttributes(inv, g, a::kTypeMig);
    d.attributes[a::kAttrUuid] = Attribute::String(m.uuid);
    d.attributes[a::kAttrParentUuid] = Attribute::String(g.uuid);
    d.attributes[a::kAttrProfile] = Attribute::String(m.profile);
    d.capacity =
        AsCapacities(MigCounts(m.sm_count, m.copy_engines, m.decoders, m.encoders, m.jpegs, m.ofas, m.memory_mib));
    for (unsigned i = gi->placement.start; i < gi->placement.start + gi->placement.size; ++i) {
      d.capacity[Cat("memorySlice", i)] = Count(1);
    }
    out.push_back(std::move(d));
  }
  return out;
}

}  // namespace

std::string StaticMigName(const gpu::Gpu& g, const gpu::MigDevice& m, const gpu::MigCatalog& catalog) {
  for (const auto& gi : catalog.instances) {
    if (gi.id != m.gi) continue;
    std::string name = a::MigDeviceName(g.minor, m.profile, gi.profile_id, gi.placement.start);
    // A GPU instance split into several compute instances: one device each, told apart by the CI.
    const auto on_gi =
        std::count_if(g.migs.begin(), g.migs.end(), [&](const gpu::MigDevice& x) { return x.gi == m.gi; });
    if (on_gi > 1) name += Cat("-", m.ci);
    return name;
  }
  return "";
}

std::string SliceName(const std::string& node, const std::string& driver, size_t index) {
  const std::string tail = Cat("-", driver, "-", index);
  if (a::IsDnsSubdomain(node + tail)) return node + tail;
  // Too long, or the node's last label and the driver's first make one label over 63: shorten the
  // node's part and keep the names of different nodes apart by a hash of the whole name.
  uint32_t h = 2166136261U;  // FNV-1a
  for (unsigned char c : node) h = (h ^ c) * 16777619U;
  char hex[9];
  std::snprintf(hex, sizeof hex, "%08x", h);
  const std::string hashed_tail = Cat("-", hex, tail);
  std::string head = node;
  while (!head.empty() && !a::IsDnsSubdomain(head + hashed_tail)) {
    head.pop_back();
    while (!head.empty() && (head.back() == '-' || head.back() == '.')) head.pop_back();
  }
  return head.empty() ? std::string(hex) + tail : head + hashed_tail;
}

absl::StatusOr<std::vector<a::ResourceSlice>> BuildPool(const gpu::Inventory& inventory,
                                                        const std::map<unsigned, gpu::MigCatalog>& mig,
                                                        const PoolOptions& options) {
  std::vector<a::Device> plain;  // devices that consume no counters
  std::vector<MigGpu> dynamic;
  auto taint = [&](unsigned gpu_index, std::vector<a::Device>& devices) {
    const auto it = options.taints.find(gpu_index);
    if (it == options.taints.end()) return;
    for (auto& d : devices) d.taints = it->second;
  };
  for (const auto& g : inventory.gpus()) {
    if (!g.error.empty() || g.uuid.empty()) continue;
    std::vector<a::Device> devices;
    if (!g.mig_enabled) {
      devices.push_back(WholeGpu(inventory, g, options.shared_gpus.contains(g.index)));
    } else {
      const auto cat = mig.find(g.index);
      if (cat == mig.end()) {
        return absl::FailedPreconditionError(
            Cat("GPU ", g.index, " (", g.uuid, ") is in MIG mode but its MIG profiles were not read"));
      }
      if (options.dynamic_mig) {
        auto m = DynamicMig(inventory, g, cat->second);
        if (!m.ok()) return m.status();
        taint(g.index, m->devices);
        dynamic.push_back(std::move(*m));
        continue;
      }
      auto s = StaticMig(inventory, g, cat->second);
      if (!s.ok()) return s.status();
      devices = std::move(*s);
    }
    taint(g.index, devices);
    for (auto& d : devices) plain.push_back(std::move(d));
  }

  std::vector<a::ResourceSlice> out;
  auto add = [&](std::vector<a::Device> devices, std::vector<a::CounterSet> counters) {
    a::ResourceSlice s;
    s.driver = options.driver;
    s.node_name = options.node_name;
    s.pool = options.node_name;
    s.generation = options.generation;
    s.devices = std::move(devices);
    s.shared_counters = std::move(counters);
    out.push_back(std::move(s));
  };
  auto chunks = [](std::vector<a::Device> all, size_t limit) {
    std::vector<std::vector<a::Device>> parts;
    for (size_t i = 0; i < all.size(); i += limit) {
      parts.emplace_back(
          std::make_move_iterator(all.begin() + static_cast<std::ptrdiff_t>(i)),
          std::make_move_iterator(all.begin() + static_cast<std::ptrdiff_t>(std::min(all.size(), i + limit))));
    }
    return parts;
  };
  const bool plain_tainted =
      std::any_of(plain.begin(), plain.end(), [](const a::Device& d) { return !d.taints.empty(); });
  for (auto& part :
       chunks(std::move(plain), plain_tainted ? a::kMaxDevicesPerSliceWithTaintsOrCounters : a::kMaxDevicesPerSlice)) {
    add(std::move(part), {});
  }
  if (options.split_counters) {
    for (size_t i = 0; i < dynamic.size(); i += a::kMaxCounterSetsPerSlice) {
      std::vector<a::CounterSet> sets;
      for (size_t j = i; j < std::min(dynamic.size(), i + a::kMaxCounterSetsPerSlice); ++j) {
        sets.push_back(dynamic[j].counters);
      }
      add({}, std::move(sets));
    }
    for (auto& m : dynamic) {
      for (auto& part : chunks(std::move(m.devices), a::kMaxDevicesPerSliceWithTaintsOrCounters))
        add(std::move(part), {});
    }
  } else {
    for (auto& m : dynamic) {
      if (m.devices.size() > a::kMaxDevicesPerSliceWithTaintsOrCounters) {
        return absl::FailedPreconditionError(
            Cat("counter set ", m.counters.name, " has ", m.devices.size(), " MIG placements, more than the ",
                a::kMaxDevicesPerSliceWithTaintsOrCounters,
                " devices one slice may hold on Kubernetes 1.34 (1.35 and later split them)"));
      }
      add(std::move(m.devices), {std::move(m.counters)});
    }
  }
  for (size_t i = 0; i < out.size(); ++i) {
    out[i].name = SliceName(options.node_name, options.driver, i);
    out[i].slice_count = static_cast<int64_t>(out.size());
  }
  return out;
}

}  // namespace kgpu::dra
