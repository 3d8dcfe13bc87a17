#include "profile.h"

#include <algorithm>
#include <array>
#include <cstdio>
#include <fstream>
#include <set>
#include <sstream>

#include <yaml-cpp/yaml.h>

#include "common/files.h"
#include "common/strings.h"
#include "common/yaml_util.h"

namespace kgpu::sim {
using kgpu::Cat;
using kgpu::Join;
namespace {

// One MIG row: index, id, name, compute slices, memory slices, max instances, starts, MiB,
// SMs, copy engines, decoders, jpegs, ofas (no A100 or H100 profile has an encoder).
MigProfile Mig(unsigned index, unsigned id, std::string name, unsigned cs, unsigned ms, unsigned max,
               std::vector<unsigned> starts, uint64_t mib, unsigned sms, unsigned ce, unsigned dec, unsigned jpg,
               unsigned ofa) {
  MigProfile p;
  p.index = index;
  p.id = id;
  p.name = std::move(name);
  p.compute_slices = cs;
  p.memory_slices = ms;
  p.max_instances = max;
  p.starts = std::move(starts);
  p.memory_mib = mib;
  p.sm_count = sms;
  p.copy_engines = ce;
  p.decoders = dec;
  p.jpegs = jpg;
  p.ofas = ofa;
  return p;
}

// The figures of one GPU-instance profile, as a row of `nvidia-smi mig -lgip` gives them:
// name, memory (MiB), SM, CE, DEC, JPEG, OFA.
struct MigRow {
  const char* name;
  uint64_t mib;
  unsigned sms, ce, dec, jpg, ofa;
};

// GA100 and GH100 parts share the seven profiles' ids, indices, slices and placements (MIG user
// guide, "Supported MIG Profiles"); `rows` gives each part's own figures in the order 1g, 1g+me,
// 1g with 2 memory slices, 2g, 3g, 4g, 7g.
std::vector<MigProfile> MigTable(const std::array<MigRow, 7>& rows) {
  const std::vector<unsigned> all7 = {0, 1, 2, 3, 4, 5, 6};
  struct Shape {
    unsigned index, id, cs, ms, max;
    std::vector<unsigned> starts;
  };
  const Shape shapes[7] = {
      {0x0, 19, 1, 1, 7, all7},      {0x7, 20, 1, 1, 1, all7},  {0x9, 15, 1, 2, 4, {0, 2, 4, 6}},
      {0x1, 14, 2, 2, 3, {0, 2, 4}}, {0x2, 9, 3, 4, 2, {0, 4}}, {0x3, 5, 4, 4, 1, {0}},
      {0x4, 0, 7, 8, 1, {0}},
  };
  std::vector<MigProfile> out;
  for (size_t i = 0; i < rows.size(); ++i) {
    const Shape& s = shapes[i];
    const MigRow& r = rows[i];
    out.push_back(Mig(s.index, s.id, r.name, s.cs, s.ms, s.max, s.starts, r.mib, r.sms, r.ce, r.dec, r.jpg, r.ofa));
  }
  return out;
}

std::vector<GpuModel> BuildModels() {
  std::vector<GpuModel> models;
  {
    GpuModel m;
    m.key = "H100-SXM5-80GB";
    m.name = "NVIDIA H100 80GB HBM3";
    m.memory_mib = 81559;
    m.reserved_mib = 530;
    m.cc_major = 9;
    m.architecture = 9;
    m.power_limit_w = 700;
    m.power_min_w = 200;
    m.idle_power_w = 72;
    m.max_sm_mhz = 1980;
    m.idle_sm_mhz = 345;
    m.max_mem_mhz = 2619;
    m.pci_device_id = 0x233010DE;
    m.pci_subsystem_id = 0x16C110DE;
    m.nvlinks = 18;
    m.nvlink_version = 4;
    m.pcie_gen = 5;
    m.pcie_width = 16;
    m.sm_count = 132;
    m.cuda_cores = 16896;
    m.bus_width = 5120;
    m.temp_shutdown = 92;
    m.temp_slowdown = 89;
    m.temp_gpu_max = 87;
    m.temp_mem_max = 95;
    m.idle_temp = 33;
    m.vbios = "96.00.74.00.0F";
    m.part_number = "692-2G520-0200-000";
    m.max_mig_devices = 7;
    // `nvidia-smi mig -lgip` on an H100 80GB HBM3 (https://jbarrow.ai/field_notes/nvidia-mig/): Hopper
    // gives every GPU instance a decoder and a JPEG engine per compute slice, 1g.20gb 26 SMs, and
    // 7g.80gb 8 copy engines.
    m.mig_profiles = MigTable({{
        {"1g.10gb", 9984, 16, 1, 1, 1, 0},
        {"1g.10gb+me", 9984, 16, 1, 1, 1, 1},
        {"1g.20gb", 20096, 26, 1, 1, 1, 0},
        {"2g.20gb", 20096, 32, 2, 2, 2, 0},
        {"3g.40gb", 40448, 60, 3, 3, 3, 0},
        {"4g.40gb", 40448, 64, 4, 4, 4, 0},
        {"7g.80gb", 81152, 132, 8, 7, 7, 1},
    }});
    models.push_back(m);
  }
  {
    GpuModel m;
    m.key = "A100-SXM4-40GB";
    m.name = "NVIDIA A100-SXM4-40GB";
    m.memory_mib = 40960;
    m.reserved_mib = 418;
    m.cc_major = 8;
    m.architecture = 7;
    m.power_limit_w = 400;
    m.power_min_w = 100;
    m.idle_power_w = 54;
    m.max_sm_mhz = 1410;
    m.idle_sm_mhz = 210;
    m.max_mem_mhz = 1215;
    m.pci_device_id = 0x20B010DE;
    m.pci_subsystem_id = 0x134F10DE;
    m.nvlinks = 12;
    m.nvlink_version = 3;
    m.pcie_gen = 4;
    m.pcie_width = 16;
    m.sm_count = 108;
    m.cuda_cores = 6912;
    m.bus_width = 5120;
    m.temp_shutdown = 92;
    m.temp_slowdown = 89;
    m.temp_gpu_max = 85;
    m.temp_mem_max = 95;
    m.idle_temp = 30;
    m.vbios = "92.00.45.00.03";
    m.part_number = "692-2G506-0200-003";
    m.max_mig_devices = 7;
    // The MIG user guide's `nvidia-smi mig -lgip` table for A100-SXM4-40GB
    // (https://docs.nvidia.com/datacenter/tesla/mig-user-guide/, "List GPU Instance Profiles").
    m.mig_profiles = MigTable({{
        {"1g.5gb", 4864, 14, 1, 0, 0, 0},
        {"1g.5gb+me", 4864, 14, 1, 1, 1, 1},
        {"1g.10gb", 9856, 14, 1, 1, 0, 0},
        {"2g.10gb", 9856, 28, 2, 1, 0, 0},
        {"3g.20gb", 19968, 42, 3, 2, 0, 0},
        {"4g.20gb", 19968, 56, 4, 2, 0, 0},
        {"7g.40gb", 40192, 98, 7, 5, 1, 1},
    }});
    models.push_back(m);
  }
  {
    GpuModel m;
    m.key = "H200-SXM-141GB";
    m.name = "NVIDIA H200";
    m.memory_mib = 143771;
    m.reserved_mib = 560;
    m.cc_major = 9;
    m.architecture = 9;
    m.power_limit_w = 700;
    m.power_min_w = 200;
    m.idle_power_w = 76;
    m.max_sm_mhz = 1980;
    m.idle_sm_mhz = 345;
    m.max_mem_mhz = 3201;
    m.pci_device_id = 0x233510DE;
    m.pci_subsystem_id = 0x18B010DE;
    m.nvlinks = 18;
    m.nvlink_version = 4;
    m.pcie_gen = 5;
    m.pcie_width = 16;
    m.sm_count = 132;
    m.cuda_cores = 16896;
    m.bus_width = 6144;
    m.temp_shutdown = 92;
    m.temp_slowdown = 89;
    m.temp_gpu_max = 87;
    m.temp_mem_max = 95;
    m.idle_temp = 31;
    m.vbios = "96.00.A5.00.01";
    m.part_number = "692-2G520-0280-000";
    m.max_mig_devices = 7;
    // Engines and SMs from `nvidia-smi mig -lgip` on an H200 (https://github.com/NVIDIA/mig-parted/issues/120),
    // the same as H100's. The memory figures differ by board and driver (that H200 shows 16.00,
    // 32.25, 69.50 and 139.75 GiB); these are kept as they were.
    m.mig_profiles = MigTable({{
        {"1g.18gb", 17920, 16, 1, 1, 1, 0},
        {"1g.18gb+me", 17920, 16, 1, 1, 1, 1},
        {"1g.35gb", 35840, 26, 1, 1, 1, 0},
        {"2g.35gb", 35840, 32, 2, 2, 2, 0},
        {"3g.71gb", 71808, 60, 3, 3, 3, 0},
        {"4g.71gb", 71808, 64, 4, 4, 4, 0},
        {"7g.141gb", 143616, 132, 8, 7, 7, 1},
    }});
    models.push_back(m);
  }
  {
    GpuModel m;
    m.key = "L4";
    m.name = "NVIDIA L4";
    m.memory_mib = 23034;
    m.reserved_mib = 310;
    m.cc_major = 8;
    m.cc_minor = 9;
    m.architecture = 8;
    m.power_limit_w = 72;
    m.power_min_w = 40;
    m.idle_power_w = 16;
    m.max_sm_mhz = 2040;
    m.idle_sm_mhz = 210;
    m.max_mem_mhz = 6251;
    m.pci_device_id = 0x27B810DE;
    m.pci_subsystem_id = 0x16CA10DE;
    m.pcie_gen = 4;
    m.pcie_width = 16;
    m.sm_count = 58;
    m.cuda_cores = 7424;
    m.bus_width = 192;
    m.temp_shutdown = 95;
    m.temp_slowdown = 92;
    m.temp_gpu_max = 90;
    m.temp_mem_max = 0;
    m.idle_temp = 36;
    m.vbios = "95.04.29.00.06";
    m.part_number = "900-2G193-0000-001";
    models.push_back(m);
  }
  return models;
}

constexpr const char* kDgxH100 = R"(version: v1
name: dgx-h100
driverVersion: "550.90.07"
cudaVersion: "12.4"
nvlink: nvswitch
nvswitches: 4
numaNodes: 2
pcieSwitchGroup: 2
gpus:
  - model: H100-SXM5-80GB
    count: 8
    busIds: [0x18, 0x2a, 0x3a, 0x5d, 0x9a, 0xab, 0xba, 0xdb]
)";

constexpr const char* kDgxA100Mig = R"(version: v1
name: dgx-a100-mig
driverVersion: "535.183.01"
cudaVersion: "12.2"
nvlink: nvswitch
nvswitches: 6
numaNodes: 2
pcieSwitchGroup: 2
gpus:
  - model: A100-SXM4-40GB
    count: 8
    busIds: [0x07, 0x0f, 0x47, 0x4e, 0x87, 0x90, 0xb7, 0xbd]
mig:
  - gpu: 0
    instances: ["3g.20gb@4", "2g.10gb@0", "1g.5gb@2", "1g.5gb@3"]
  - gpu: 1
    instances: [1g.5gb, 1g.5gb, 1g.5gb, 1g.5gb, 1g.5gb, 1g.5gb, 1g.5gb]
)";

constexpr const char* kHgxH200 = R"(version: v1
name: hgx-h200
driverVersion: "560.35.03"
cudaVersion: "12.6"
nvlink: nvswitch
nvswitches: 4
numaNodes: 2
pcieSwitchGroup: 2
gpus:
  - model: H200-SXM-141GB
    count: 8
    busIds: [0x19, 0x3b, 0x4c, 0x5d, 0x9b, 0xbb, 0xcb, 0xdb]
)";

constexpr const char* kL4x4 = R"(version: v1
name: l4x4
driverVersion: "550.90.07"
cudaVersion: "12.4"
nvlink: none
numaNodes: 1
pcieSwitchGroup: 2
gpus:
  - model: L4
    count: 4
    busIds: [0x01, 0x02, 0x81, 0x82]
)";

struct Builtin {
  const char* name;
  const char* yaml;
};
constexpr Builtin kBuiltins[] = {
    {"dgx-h100", kDgxH100}, {"dgx-a100-mig", kDgxA100Mig}, {"hgx-h200", kHgxH200}, {"l4x4", kL4x4}};

using kgpu::yaml::At;
using kgpu::yaml::CheckKeys;
using kgpu::yaml::Scalar;

absl::StatusOr<int> ParseCudaVersion(std::string_view origin, const YAML::Node& node) {
  auto text = Scalar<std::string>(origin, node, "cudaVersion");
  if (!text.ok()) return text.status();
  unsigned major = 0, minor = 0;
  char tail = 0;
  if (std::sscanf(text->c_str(), "%u.%u%c", &major, &minor, &tail) != 2 || major == 0 || major > 99 || minor > 9) {
    return At(origin, node.Mark(), Cat("cudaVersion must look like \"12.4\" (got '", *text, "')"));
  }
  return static_cast<int>(major * 1000 + minor * 10);
}

// Checks that `instances` fit on a GPU of `model`: known profiles, valid and free placements,
// compute slices and per-profile instance limits. Fills in automatic starts.
absl::Status PlaceMig(std::string_view origin, const YAML::Mark& mark, const GpuModel& model,
                      std::vector<MigInstanceSpec>& instances) {
  unsigned used_mem = 0;  // bit mask of memory slices
  unsigned compute = 0;
  std::vector<unsigned> per_profile(32, 0);
  for (auto& inst : instances) {
    const MigProfile* p = FindMigProfileByName(model, inst.profile);
    if (p == nullptr) {
      std::vector<std::string> names;
      for (const auto& mp : model.mig_profiles) names.push_back(mp.name);
      return At(origin, mark,
                Cat("unknown MIG profile '", inst.profile, "' for ", model.key, " (known: ", Join(names, ", "), ")"));
    }
    auto mask_at = [&](unsigned start) { return ((1U << p->memory_slices) - 1U) << start; };
    if (inst.start < 0) {
      for (unsigned s : p->starts) {
        if ((used_mem & mask_at(s)) == 0) {
          inst.start = static_cast<int>(s);
          break;
        }
      }
      if (inst.start < 0) {
        return At(origin, mark, Cat("no free placement left for ", inst.profile));
      }
    } else if (std::find(p->starts.begin(), p->starts.end(), static_cast<unsigned>(inst.start)) == p->starts.end()) {
      return At(origin, mark,
                Cat(inst.profile, " cannot start at memory slice ", inst.start,
                    " (valid starts: ", Join(p->starts, ", "), ")"));
    }
    const unsigned mask = mask_at(static_cast<unsigned>(inst.start));
    if ((used_mem & mask) != 0) {
      return At(origin, mark, Cat(inst.profile, "@", inst.start, " overlaps another instance"));
    }
    used_mem |= mask;
    compute += p->compute_slices;
    if (compute > 7) {
      return At(origin, mark, "MIG layout needs more than the 7 compute slices of a GPU");
    }
    if (++per_profile[p->index] > p->max_instances) {
      return At(origin, mark, Cat("at most ", p->max_instances, " instances of ", inst.profile));
    }
  }
  return absl::OkStatus();
}

absl::StatusOr<NodeProfile> ParseRoot(std::string_view origin, const YAML::Node& root) {
  if (!root.IsMap()) {
    return At(origin, root.Mark(), "a node profile must be a YAML mapping");
  }
  if (auto s = CheckKeys(origin, root, "the profile",
                         {"version", "name", "driverVersion", "cudaVersion", "nvlink", "nvswitches", "numaNodes",
                          "pcieSwitchGroup", "gpus", "mig"});
      !s.ok()) {
    return s;
  }
  NodeProfile profile;
  if (!root["version"]) return At(origin, root.Mark(), "missing 'version: v1'");
  auto version = Scalar<std::string>(origin, root["version"], "version");
  if (!version.ok()) return version.status();
  if (*version != "v1") {
    return At(origin, root["version"].Mark(), Cat("unsupported version '", *version, "' (expected v1)"));
  }
  if (!root["name"]) return At(origin, root.Mark(), "missing 'name'");
  auto name = Scalar<std::string>(origin, root["name"], "name");
  if (!name.ok()) return name.status();
  profile.name = *name;
  profile.driver_version = "550.90.07";
  if (root["driverVersion"]) {
    auto v = Scalar<std::string>(origin, root["driverVersion"], "driverVersion");
    if (!v.ok()) return v.status();
    profile.driver_version = *v;
  }
  profile.cuda_version = 12040;
  if (root["cudaVersion"]) {
    auto v = ParseCudaVersion(origin, root["cudaVersion"]);
    if (!v.ok()) return v.status();
    profile.cuda_version = *v;
  }
  profile.nvml_version = Cat(profile.cuda_version / 1000, ".", profile.driver_version);
  profile.nvlink = "none";
  if (root["nvlink"]) {
    auto v = Scalar<std::string>(origin, root["nvlink"], "nvlink");
    if (!v.ok()) return v.status();
    if (*v != "nvswitch" && *v != "none") {
      return At(origin, root["nvlink"].Mark(), Cat("nvlink must be 'nvswitch' or 'none' (got '", *v, "')"));
    }
    profile.nvlink = *v;
  }
  if (root["nvswitches"]) {
    auto v = Scalar<unsigned>(origin, root["nvswitches"], "nvswitches");
    if (!v.ok()) return v.status();
    if (*v < 1 || *v > 8) return At(origin, root["nvswitches"].Mark(), "nvswitches must be 1..8");
    profile.nvswitches = *v;
  }
  if (profile.nvlink == "nvswitch" && profile.nvswitches == 0) profile.nvswitches = 4;
  if (root["numaNodes"]) {
    auto v = Scalar<int>(origin, root["numaNodes"], "numaNodes");
    if (!v.ok()) return v.status();
    if (*v < 1 || *v > 8) return At(origin, root["numaNodes"].Mark(), "numaNodes must be 1..8");
    profile.numa_nodes = *v;
  }
  if (root["pcieSwitchGroup"]) {
    auto v = Scalar<unsigned>(origin, root["pcieSwitchGroup"], "pcieSwitchGroup");
    if (!v.ok()) return v.status();
    if (*v < 1 || *v > 8) {
      return At(origin, root["pcieSwitchGroup"].Mark(), "pcieSwitchGroup must be 1..8");
    }
    profile.pcie_switch_group = *v;
  }

  const YAML::Node gpus = root["gpus"];
  if (!gpus || !gpus.IsSequence() || gpus.size() == 0) {
    return At(origin, gpus ? gpus.Mark() : root.Mark(), "'gpus' must be a non-empty list of {model, count}");
  }
  std::set<unsigned> buses;
  for (const auto& group : gpus) {
    if (auto s = CheckKeys(origin, group, "a gpus entry", {"model", "count", "busIds", "pciClass"}); !s.ok()) {
      return s;
    }
    if (!group["model"]) return At(origin, group.Mark(), "a gpus entry needs 'model'");
    auto key = Scalar<std::string>(origin, group["model"], "model");
    if (!key.ok()) return key.status();
    const GpuModel* model = FindModel(*key);
    if (model == nullptr) {
      std::vector<std::string> keys;
      for (const auto& m : Models()) keys.push_back(m.key);
      return At(origin, group["model"].Mark(), Cat("unknown GPU model '", *key, "' (known: ", Join(keys, ", "), ")"));
    }
    unsigned count = 1;
    if (group["count"]) {
      auto c = Scalar<unsigned>(origin, group["count"], "count");
      if (!c.ok()) return c.status();
      count = *c;
    }
    if (count < 1 || profile.gpus.size() + count > 16) {
      return At(origin, group["count"] ? group["count"].Mark() : group.Mark(),
                "count must be >= 1 and a node has at most 16 GPUs");
    }
    std::vector<unsigned> bus_ids;
    if (group["busIds"]) {
      const YAML::Node ids = group["busIds"];
      if (!ids.IsSequence() || ids.size() != count) {
        return At(origin, ids.Mark(), Cat("busIds must list exactly ", count, " buses"));
      }
      for (const auto& id : ids) {
        auto b = Scalar<unsigned>(origin, id, "bus id");
        if (!b.ok()) return b.status();
        if (*b > 0xff) return At(origin, id.Mark(), "bus id must be 0x00..0xff");
        bus_ids.push_back(*b);
      }
    }
    unsigned pci_class = kPci3dControllerClass;
    if (group["pciClass"]) {
      auto c = Scalar<unsigned>(origin, group["pciClass"], "pciClass");
      if (!c.ok()) return c.status();
      if (*c > 0xffffff) {
        return At(origin, group["pciClass"].Mark(),
                  "pciClass is a 24-bit PCI class code: 0x030200 (3D controller, compute mode) or 0x030000 (VGA "
                  "controller, graphics mode)");
      }
      pci_class = *c;
    }
    for (unsigned i = 0; i < count; ++i) {
      GpuSpec g;
      g.model = model;
      g.pci_class = pci_class;
      g.bus = bus_ids.empty() ? 0x10 + 0x10 * static_cast<unsigned>(profile.gpus.size()) : bus_ids[i];
      if (!buses.insert(g.bus).second) {
        return At(origin, group.Mark(), Cat("PCI bus ", g.bus, " is used twice"));
      }
      profile.gpus.push_back(g);
    }
  }
  const auto total = profile.gpus.size();
  for (size_t i = 0; i < total; ++i) {
    profile.gpus[i].numa_node = static_cast<int>(i * static_cast<size_t>(profile.numa_nodes) / total);
  }

  if (const YAML::Node mig = root["mig"]; mig) {
    if (!mig.IsSequence()) return At(origin, mig.Mark(), "'mig' must be a list of {gpu, instances}");
    for (const auto& entry : mig) {
      if (auto s = CheckKeys(origin, entry, "a mig entry", {"gpu", "instances"}); !s.ok()) return s;
      if (!entry["gpu"]) return At(origin, entry.Mark(), "a mig entry needs 'gpu'");
      auto index = Scalar<unsigned>(origin, entry["gpu"], "gpu");
      if (!index.ok()) return index.status();
      if (*index >= total) {
        return At(origin, entry["gpu"].Mark(), Cat("gpu ", *index, " does not exist (the node has ", total, " GPUs)"));
      }
      GpuSpec& gpu = profile.gpus[*index];
      if (gpu.model->max_mig_devices == 0) {
        return At(origin, entry["gpu"].Mark(), Cat(gpu.model->key, " is not MIG capable"));
      }
      if (gpu.mig_enabled) {
        return At(origin, entry["gpu"].Mark(), Cat("gpu ", *index, " is listed twice"));
      }
      gpu.mig_enabled = true;
      const YAML::Node instances = entry["instances"];
      if (instances && !instances.IsSequence()) {
        return At(origin, instances.Mark(), "instances must be a list such as [3g.20gb, 1g.5gb@6]");
      }
      if (instances) {
        for (const auto& inst : instances) {
          auto text = Scalar<std::string>(origin, inst, "MIG instance");
          if (!text.ok()) return text.status();
          MigInstanceSpec spec;
          const auto at = text->find('@');
          spec.profile = text->substr(0, at);
          if (at != std::string::npos) {
            try {
              size_t used = 0;
              spec.start = std::stoi(text->substr(at + 1), &used);
              if (used != text->size() - at - 1 || spec.start < 0) throw std::invalid_argument("");
            } catch (const std::exception&) {
              return At(origin, inst.Mark(), Cat("'", *text, "': the start after '@' must be a slice number"));
            }
          }
          gpu.mig.push_back(spec);
        }
        if (auto s = PlaceMig(origin, instances.Mark(), *gpu.model, gpu.mig); !s.ok()) return s;
      }
    }
  }
  return profile;
}

}  // namespace

const std::vector<GpuModel>& Models() {
  static const std::vector<GpuModel> models = BuildModels();
  return models;
}

const GpuModel* FindModel(std::string_view key) {
  for (const auto& m : Models()) {
    if (m.key == key) return &m;
  }
  return nullptr;
}

const MigProfile* FindMigProfileByName(const GpuModel& model, std::string_view name) {
  for (const auto& p : model.mig_profiles) {
    if (p.name == name) return &p;
  }
  return nullptr;
}

const MigProfile* FindMigProfileByIndex(const GpuModel& model, unsigned index) {
  for (const auto& p : model.mig_profiles) {
    if (p.index == index) return &p;
  }
  return nullptr;
}

const MigProfile* FindMigProfileById(const GpuModel& model, unsigned id) {
  for (const auto& p : model.mig_profiles) {
    if (p.id == id) return &p;
  }
  return nullptr;
}

absl::StatusOr<NodeProfile> ParseProfile(std::string_view yaml, std::string_view origin) {
  auto root = kgpu::yaml::Load(yaml, origin);
  if (!root.ok()) return root.status();
  try {
    auto profile = ParseRoot(origin, *root);
    if (profile.ok()) profile->source = std::string(yaml);
    return profile;
  } catch (const YAML::Exception& e) {
    return At(origin, e.mark, e.msg);
  }
}

std::vector<std::string> BuiltinProfileNames() {
  std::vector<std::string> names;
  for (const auto& b : kBuiltins) names.emplace_back(b.name);
  return names;
}

const char* BuiltinProfileYaml(std::string_view name) {
  for (const auto& b : kBuiltins) {
    if (name == b.name) return b.yaml;
  }
  return nullptr;
}

absl::StatusOr<NodeProfile> LoadProfile(std::string_view spec) {
  if (const char* yaml = BuiltinProfileYaml(spec); yaml != nullptr) {
    return ParseProfile(yaml, Cat("<built-in ", spec, ">"));
  }
  const bool looks_like_path =
      spec.find('/') != std::string_view::npos || spec.ends_with(".yaml") || spec.ends_with(".yml");
  if (!looks_like_path) {
    return absl::NotFoundError(Cat("unknown node profile '", spec, "' (known: ", Join(BuiltinProfileNames(), ", "),
                                   "; or give the path of a profile YAML file)"));
  }
  const auto text = kgpu::ReadFile(std::string(spec));
  if (!text) {
    return absl::NotFoundError(Cat(spec, ": cannot read the node profile file (check the path in KGPU_SIM_NODE)"));
  }
  return ParseProfile(*text, spec);
}

uint64_t Fnv1a(std::string_view data, uint64_t seed) {
  uint64_t h = seed;
  for (unsigned char c : data) {
    h ^= c;
    h *= 1099511628211ULL;
  }
  return h;
}

namespace {
// splitmix64's finaliser: spreads FNV's similar outputs for similar keys over all bits.
uint64_t Mix(uint64_t x) {
  x ^= x >> 30;
  x *= 0xbf58476d1ce4e5b9ULL;
  x ^= x >> 27;
  x *= 0x94d049bb133111ebULL;
  return x ^ (x >> 31);
}

std::string FormatUuid(uint64_t hi, uint64_t lo) {
  char buf[40];
  std::snprintf(buf, sizeof buf, "%08x-%04x-%04x-%04x-%012llx", static_cast<unsigned>(hi >> 32),
                static_cast<unsigned>((hi >> 16) & 0xffff), static_cast<unsigned>(hi & 0xffff),
                static_cast<unsigned>(lo >> 48), static_cast<unsigned long long>(lo & 0xffffffffffffULL));
  return buf;
}
}  // namespace

std::string GpuUuid(std::string_view profile, std::string_view node, unsigned index) {
  const std::string key = Cat(profile, "/", node, "/", index);
  return Cat("GPU-", FormatUuid(Mix(Fnv1a(key)), Mix(Fnv1a(key, 0x9e3779b97f4a7c15ULL))));
}

std::string MigUuid(std::string_view gpu_uuid, unsigned gi, unsigned ci) {
  const std::string key = Cat(gpu_uuid, "/", gi, "/", ci);
  return Cat("MIG-", FormatUuid(Mix(Fnv1a(key)), Mix(Fnv1a(key, 0x9e3779b97f4a7c15ULL))));
}

std::string GpuSerial(std::string_view profile, std::string_view node, unsigned index) {
  const uint64_t h = Mix(Fnv1a(Cat("serial/", profile, "/", node, "/", index)));
  char buf[32];
  std::snprintf(buf, sizeof buf, "1654%09llu", static_cast<unsigned long long>(h % 1000000000ULL));
  return buf;
}

}  // namespace kgpu::sim
