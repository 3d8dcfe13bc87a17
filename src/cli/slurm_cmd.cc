#include "cli/slurm_cmd.h"

#include <unistd.h>

#include <algorithm>
#include <cstdio>
#include <iostream>
#include <fstream>

#include "common/files.h"
#include "common/strings.h"
#include "slurm/client.h"
#include "slurm/gres.h"

namespace kgpu::cli {

CLI::App* AddSlurmGresCommand(CLI::App* slurm, SlurmGresFlags* f) {
  auto* gres = slurm->add_subcommand(
      "gres", "print gres.conf lines and the slurm.conf NodeName line for this node, from its GPU inventory");
  gres->add_option("--node-name", f->node_name, "Slurm NodeName (default: the host name)")->envname("NODE_NAME");
  gres->add_option("--mig-minors", f->mig_minors, "the driver's MIG capability minors (for MultipleFiles=)")
      ->capture_default_str();
  gres->add_option("--mps-count", f->mps_count,
                   "Name=mps Count= per GPU (default: 100 when the config's sharing strategy is MPS, else no mps lines)");
  gres->add_option("--gpu-type", f->gpu_type, "Type= for whole GPUs (default: the NVML name as AutoDetect=nvml names it)");
  gres->add_flag("--no-cores", f->no_cores, "leave out Cores= (NUMA affinity from sysfs)");
  gres->add_flag("--no-links", f->no_links, "leave out Links= (NVLink lanes)");
  gres->add_option("--cpus", f->cpus, "CPUs= for the slurm.conf node line (default: left out)");
  gres->add_option("--real-memory", f->real_memory, "RealMemory= MiB for the slurm.conf node line (default: left out)");
  gres->add_option("--output", f->output, "gres (gres.conf lines), node (slurm.conf line) or both")
      ->check(CLI::IsMember({"gres", "node", "both"}))
      ->capture_default_str();
  gres->add_option("--write-gres-conf", f->write_gres_conf, "also write the gres.conf lines to this file (atomically)");
  return gres;
}

int RunSlurmGres(const NodeOptions& node, const DevicePluginFlags& dp, const SlurmGresFlags& flags, std::ostream& out) {
  auto config = ResolveConfig(dp);
  if (!config.ok()) {
    out << "kgpu slurm gres: " << config.status().message() << "\n";
    return 1;
  }
  auto session = OpenSession(node);
  if (!session.ok()) {
    out << "kgpu slurm gres: " << session.status().message() << "\n";
    return 1;
  }
  slurm::GresOptions go;
  go.node_name = flags.node_name;
  if (go.node_name.empty()) {
    char host[256] = {};
    ::gethostname(host, sizeof(host) - 1);
    go.node_name = host;
    if (const auto dot = go.node_name.find('.'); dot != std::string::npos) go.node_name.resize(dot);
  }
  if (auto s = slurm::ValidateNodeName(go.node_name); !s.ok()) {
    out << "kgpu slurm gres: --node-name: " << s.message() << "\n";
    return 1;
  }
  go.dev_root = node.dev_root;
  go.sysfs_root = node.sysfs_root;
  go.cores = !flags.no_cores;
  go.links = !flags.no_links;
  go.type_override = flags.gpu_type;
  go.cpus = flags.cpus;
  go.real_memory_mib = flags.real_memory;
  if (flags.mps_count >= 0) {
    go.mps_count_per_gpu = static_cast<unsigned>(flags.mps_count);
  } else if (config->sharing.strategy == deviceplugin::SharingStrategy::kMps) {
    go.mps_count_per_gpu = 100;
  }
  const bool any_mig = std::any_of(session->inventory->gpus().begin(), session->inventory->gpus().end(),
                                   [](const gpu::Gpu& g) { return g.mig_enabled; });
  if (any_mig) {
    auto text = ReadInputFile(flags.mig_minors, "MIG minors file", "check --mig-minors");
    if (!text.ok()) {
      out << "kgpu slurm gres: " << text.status().message() << "\n";
      return 1;
    }
    auto minors = deviceplugin::ParseMigMinors(*text, flags.mig_minors);
    if (!minors.ok()) {
      out << "kgpu slurm gres: " << minors.status().message() << "\n";
      return 1;
    }
    go.mig_minors = std::move(*minors);
  }
  auto r = slurm::RenderGres(*session->inventory, go);
  if (!r.ok()) {
    out << "kgpu slurm gres: " << r.status().message() << "\n";
    return 1;
  }
  for (const auto& w : r->warnings) std::cerr << "kgpu slurm gres: warning: " << w << "\n";
  if (!flags.write_gres_conf.empty()) {
    const std::string tmp = flags.write_gres_conf + ".tmp";
    {
      std::ofstream f(tmp);
      f << r->gres_conf;
      if (!f) {
        out << "kgpu slurm gres: cannot write " << Printable(tmp) << " (check --write-gres-conf)\n";
        return 1;
      }
    }
    if (std::rename(tmp.c_str(), flags.write_gres_conf.c_str()) != 0) {
      out << "kgpu slurm gres: cannot rename " << Printable(tmp) << " to " << Printable(flags.write_gres_conf) << "\n";
      return 1;
    }
  }
  if (flags.output == "gres" || flags.output == "both") out << r->gres_conf;
  if (flags.output == "node" || flags.output == "both") {
    if (flags.output == "both") out << "# slurm.conf (GresTypes must include " << Join(r->gres_types, ",") << "):\n";
    out << r->node_line << "\n";
  }
  return 0;
}

}  // namespace kgpu::cli
