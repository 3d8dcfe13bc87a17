#include "slurm/gres.h"

#include <algorithm>
#include <cctype>
#include <filesystem>

#include "common/files.h"
#include "common/strings.h"

namespace kgpu::slurm {
namespace {

std::string Trim(std::string s) {
  while (!s.empty() && std::isspace(static_cast<unsigned char>(s.back()))) s.pop_back();
  size_t i = 0;
  while (i < s.size() && std::isspace(static_cast<unsigned char>(s[i]))) ++i;
  return s.substr(i);
}

std::string DevPath(const std::string& dev_dir, const std::string& abs_dev_path) {
  // abs_dev_path starts with "/dev/".
  std::string root = dev_dir;
  while (root.size() > 1 && root.back() == '/') root.pop_back();
  return root + abs_dev_path.substr(4);
}

// Slurm type names: letters, digits and ._-+ only (the rest as '_').
std::string SafeType(std::string t) {
  for (char& c : t) {
    const unsigned char u = static_cast<unsigned char>(c);
    if (!std::isalnum(u) && c != '.' && c != '_' && c != '-' && c != '+') c = '_';
  }
  return t;
}

}  // namespace

std::string GresTypeFromName(const std::string& nvml_name) {
  std::string t;
  for (char c : Trim(nvml_name)) {
    t += c == ' ' ? '_' : static_cast<char>(std::tolower(static_cast<unsigned char>(c)));
  }
  return SafeType(t.empty() ? "gpu" : t);
}

absl::StatusOr<std::vector<unsigned>> ParseCpuList(const std::string& text) {
  std::vector<unsigned> out;
  const std::string t = Trim(text);
  if (t.empty()) return out;
  size_t start = 0;
  while (start <= t.size()) {
    size_t comma = t.find(',', start);
    if (comma == std::string::npos) comma = t.size();
    const std::string part = t.substr(start, comma - start);
    const auto dash = part.find('-');
    try {
      size_t used = 0;
      const unsigned long lo = std::stoul(part.substr(0, dash), &used);
      if (used != (dash == std::string::npos ? part.size() : dash)) throw std::invalid_argument(part);
      unsigned long hi = lo;
      if (dash != std::string::npos) {
        hi = std::stoul(part.substr(dash + 1), &used);
        if (used != part.size() - dash - 1) throw std::invalid_argument(part);
      }
      if (hi < lo || hi - lo > 65536 || hi > 1u << 20) throw std::invalid_argument(part);
      for (unsigned long c = lo; c <= hi; ++c) out.push_back(static_cast<unsigned>(c));
    } catch (const std::exception&) {
      return absl::InvalidArgumentError(
          Cat("CPU list '", Printable(t), "': '", Printable(part), "' is not N or N-M (as in 0-3,8)"));
    }
    start = comma + 1;
  }
  std::sort(out.begin(), out.end());
  out.erase(std::unique(out.begin(), out.end()), out.end());
  return out;
}

std::string FormatCpuList(const std::vector<unsigned>& cpus) {
  std::string out;
  for (size_t i = 0; i < cpus.size();) {
    size_t j = i;
    while (j + 1 < cpus.size() && cpus[j + 1] == cpus[j] + 1) ++j;
    if (!out.empty()) out += ',';
    out += std::to_string(cpus[i]);
    if (j > i) out += Cat("-", cpus[j]);
    i = j + 1;
  }
  return out;
}

absl::StatusOr<std::map<int, std::vector<unsigned>>> NumaLogicalCores(const std::string& sysfs_root) {
  namespace fs = std::filesystem;
  const fs::path node_dir = fs::path(sysfs_root) / "devices/system/node";
  const fs::path cpu_dir = fs::path(sysfs_root) / "devices/system/cpu";
  std::map<int, std::vector<unsigned>> numa_cpus;
  std::error_code ec;
  for (const auto& e : fs::directory_iterator(node_dir, ec)) {
    const std::string name = e.path().filename();
    if (name.rfind("node", 0) != 0 || name.size() == 4 || !std::all_of(name.begin() + 4, name.end(), [](char c) {
          return std::isdigit(static_cast<unsigned char>(c));
        })) {
      continue;
    }
    const auto text = ReadFile((e.path() / "cpulist").string());
    if (!text) continue;
    auto cpus = ParseCpuList(*text);
    if (!cpus.ok())
      return absl::InvalidArgumentError(Cat((e.path() / "cpulist").string(), ": ", cpus.status().message()));
    numa_cpus[std::stoi(name.substr(4))] = *cpus;
  }
  if (numa_cpus.empty()) {
    return absl::NotFoundError(
        Cat(node_dir.string(), " lists no NUMA node with a cpulist (use --sysfs-root, or --no-cores)"));
  }
  // Logical core index: every (package, core id) pair, sorted, numbered from 0.
  std::map<unsigned, std::pair<int, int>> cpu_core;  // cpu -> (package, core)
  std::set<std::pair<int, int>> cores;
  for (const auto& [numa, cpus] : numa_cpus) {
    for (unsigned c : cpus) {
      const fs::path topo = cpu_dir / Cat("cpu", c) / "topology";
      const auto pkg = ReadFile((topo / "physical_package_id").string());
      const auto core = ReadFile((topo / "core_id").string());
      std::pair<int, int> key{-1, static_cast<int>(c)};
      if (pkg && core) {
        try {
          key = {std::stoi(*pkg), std::stoi(*core)};
        } catch (const std::exception&) {
        }
      }
      cpu_core[c] = key;
      cores.insert(key);
    }
  }
  std::map<std::pair<int, int>, unsigned> index;
  unsigned next = 0;
  for (const auto& k : cores) index[k] = next++;
  std::map<int, std::vector<unsigned>> out;
  for (const auto& [numa, cpus] : numa_cpus) {
    std::set<unsigned> logical;
    for (unsigned c : cpus) logical.insert(index[cpu_core[c]]);
    out[numa] = std::vector<unsigned>(logical.begin(), logical.end());
  }
  return out;
}

absl::StatusOr<GresOutput> RenderGres(const gpu::Inventory& inventory, const GresOptions& options) {
  if (options.node_name.empty())
    return absl::InvalidArgumentError("slurm gres: the node name is empty (use --node-name)");
  GresOutput out;
  std::map<int, std::vector<unsigned>> numa;
  if (options.cores) {
    auto n = NumaLogicalCores(options.sysfs_root);
    if (n.ok()) {
      numa = std::move(*n);
    } else {
      out.warnings.push_back(Cat("no Cores=: ", n.status().message()));
    }
  }
  const std::string prefix = Cat("NodeName=", options.node_name, " ");
  std::string lines;
  std::map<std::string, unsigned> counts;  // "gpu:<type>" -> count, in first-seen order below
  std::vector<std::string> order;
  auto count = [&](const std::string& key, unsigned n) {
    if (!counts.count(key)) order.push_back(key);
    counts[key] += n;
  };
  unsigned mps_total = 0;
  const auto& gpus = inventory.gpus();
  for (const auto& g : gpus) {
    if (!g.error.empty() || g.lost) {
      out.warnings.push_back(Cat("GPU ", g.index, " (", g.bus_id, ") left out: ", g.lost ? "lost" : g.error));
      continue;
    }
    const std::string dev = DevPath(options.dev_dir, Cat("/dev/nvidia", g.minor));
    std::string cores;
    if (options.cores && !numa.empty()) {
      const auto it = numa.find(g.numa_node);
      if (it != numa.end() && !it->second.empty()) {
        cores = Cat(" Cores=", FormatCpuList(it->second));
      } else {
        out.warnings.push_back(Cat("GPU ", g.index, ": NUMA node ", g.numa_node, " has no CPUs in sysfs: no Cores="));
      }
    }
    if (g.mig_enabled) {
      if (g.migs.empty())
        out.warnings.push_back(Cat("GPU ", g.index, " is in MIG mode with no MIG devices: not listed"));
      for (const auto& m : g.migs) {
        const auto caps = gpu::MigCapNodes(options.mig_minors, g.minor, m.gi, m.ci);  // keyed by the minor
        if (caps.empty()) {
          out.warnings.push_back(Cat("MIG device ", m.uuid, " (GPU ", g.index, " GI ", m.gi, " CI ", m.ci,
                                     ") left out: its capability minors are not in the mig-minors file "
                                     "(--mig-minors, default /proc/driver/nvidia-caps/mig-minors)"));
          continue;
        }
        const std::string type = SafeType(m.profile);
        lines += Cat(prefix, "Name=gpu Type=", type, " MultipleFiles=", dev, ",", DevPath(options.dev_dir, caps[0]),
                     ",", DevPath(options.dev_dir, caps[1]), cores, "\n");
        count(Cat("gpu:", type), 1);
      }
      continue;
    }
    const std::string type = options.type_override.empty() ? GresTypeFromName(g.name) : SafeType(options.type_override);
    std::string links;
    if (options.links && gpus.size() > 1) {
      std::vector<std::string> l;
      bool any = false;
      for (const auto& other : gpus) {
        if (other.index == g.index) {
          l.push_back("-1");
        } else {
          const unsigned n = inventory.link(g.index, other.index).nvlinks;
          any = any || n > 0;
          l.push_back(std::to_string(n));
        }
      }
      if (any) links = Cat(" Links=", Join(l, ","));
    }
    lines += Cat(prefix, "Name=gpu Type=", type, " File=", dev, cores, links, "\n");
    count(Cat("gpu:", type), 1);
    if (options.mps_count_per_gpu > 0) {
      lines += Cat(prefix, "Name=mps Count=", options.mps_count_per_gpu, " File=", dev, "\n");
      mps_total += options.mps_count_per_gpu;
    }
  }
  out.gres_types.insert("gpu");
  std::vector<std::string> gres;
  for (const auto& k : order) gres.push_back(Cat(k, ":", counts[k]));
  if (mps_total > 0) {
    gres.push_back(Cat("mps:", mps_total));
    out.gres_types.insert("mps");
  }
  out.gres_conf =
      Cat("# gres.conf for ", options.node_name, ", written by kgpu slurm gres from the node's inventory\n", lines);
  out.node_line = Cat("NodeName=", options.node_name);
  if (options.cpus > 0) out.node_line += Cat(" CPUs=", options.cpus);
  if (options.real_memory_mib > 0) out.node_line += Cat(" RealMemory=", options.real_memory_mib);
  if (!gres.empty()) out.node_line += Cat(" Gres=", Join(gres, ","));
  return out;
}

}  // namespace kgpu::slurm
