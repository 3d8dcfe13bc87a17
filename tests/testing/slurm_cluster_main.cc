// kgpu-slurm-testcluster: the test harness's private Slurm cluster as a command, for the demo
// and for trying things by hand.
//
//   kgpu-slurm-testcluster up --base /tmp/ks --nodes node1,node2   # prints SLURM_CONF=...
//   SLURM_CONF=/tmp/ks/etc/slurm.conf sinfo
//   kgpu-slurm-testcluster down --base /tmp/ks
#include <iostream>

#include <CLI/CLI.hpp>

#include "common/strings.h"
#include "testing/slurm_cluster.h"

int main(int argc, char** argv) {
  CLI::App app{
      "kgpu-slurm-testcluster: a private Slurm cluster (own munged, slurmctld, one slurmd per node) on loopback"};
  app.require_subcommand(1);
  std::string base;
  std::vector<std::string> nodes = {"node1", "node2"};
  unsigned gpus = 2;
  auto* up = app.add_subcommand("up", "start the cluster in the background and wait until every node is idle");
  up->add_option("--base", base, "directory for its config, state and logs (short: unix socket paths)")->required();
  up->add_option("--nodes", nodes, "node names")->delimiter(',')->capture_default_str();
  up->add_option("--gpus", gpus, "fake GPUs per node")->capture_default_str();
  auto* down = app.add_subcommand("down", "stop the daemons of a cluster started with up, and remove --base");
  down->add_option("--base", base, "the directory given to up")->required();
  CLI11_PARSE(app, argc, argv);
  if (down->parsed()) {
    kgpu::testing::StopDetachedCluster(base);
    return 0;
  }
  if (auto why = kgpu::testing::SlurmCluster::Unavailable(); !why.empty()) {
    std::cerr << "kgpu-slurm-testcluster: " << why << "\n";
    return 77;
  }
  kgpu::testing::SlurmClusterOptions o;
  o.nodes = nodes;
  o.gpus_per_node = gpus;
  o.base = base;
  o.detach = true;
  kgpu::testing::SlurmCluster cluster(o);
  if (auto s = cluster.Start(); !s.ok()) {
    std::cerr << "kgpu-slurm-testcluster: " << s.message() << "\n";
    return 1;
  }
  std::cout << "SLURM_CONF=" << cluster.conf() << "\n";
  return 0;
}
