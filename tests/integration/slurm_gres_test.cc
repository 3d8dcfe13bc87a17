// `kgpu slurm gres` against a real Slurm 22.05: the gres.conf lines and node line it prints for
// a simulated DGX H100 (NVLink, two NUMA nodes, MPS) and a DGX A100 in MIG mode are fed to a
// private cluster's slurmd; `scontrol show node` must report the GRES and `slurmd -G` the
// Cores= and Links= per GPU.
#include <filesystem>
#include <fstream>
#include <regex>

#include <gtest/gtest.h>
#include <sys/stat.h>
#include <sys/sysmacros.h>

#include "common/strings.h"
#include "testing/shell.h"
#include "testing/slurm_cluster.h"

namespace kgpu {
namespace {
namespace fs = std::filesystem;
using testing::Quote;
using testing::Shell;

class SlurmGresTest : public ::testing::Test {
 protected:
  void SetUp() override {
    if (auto why = testing::SlurmCluster::Unavailable(); !why.empty()) GTEST_SKIP() << why;
    char tmpl[] = "/tmp/kgpu-gres-XXXXXX";
    ASSERT_NE(::mkdtemp(tmpl), nullptr);
    dir_ = tmpl;
  }
  void TearDown() override {
    if (!dir_.empty()) fs::remove_all(dir_);
  }
  // A 2-CPU host: NUMA node 0 has cpu0 (package 0), node 1 has cpu1 (package 1).
  std::string WriteSysfs(const std::string& profile) {
    const std::string root = dir_ + "/sysfs-" + profile;
    EXPECT_EQ(Shell(Cat(SimEnv(profile), KGPU_SIMCTL, " sysfs ", Quote(root))).code, 0);
    for (int n = 0; n < 2; ++n) {
      fs::create_directories(Cat(root, "/devices/system/node/node", n));
      std::ofstream(Cat(root, "/devices/system/node/node", n, "/cpulist")) << n << "\n";
      const std::string topo = Cat(root, "/devices/system/cpu/cpu", n, "/topology");
      fs::create_directories(topo);
      std::ofstream(topo + "/physical_package_id") << n << "\n";
      std::ofstream(topo + "/core_id") << 0 << "\n";
    }
    return root;
  }
  std::string SimEnv(const std::string& profile) const {
    return Cat("KGPU_SIM_NODE=", profile, " KGPU_SIM_STATE=", dir_, "/", profile, ".state KGPU_SIM_NODE_NAME=", profile,
               " ");
  }
  // `root`: the device plugin's --dev-root (NVIDIA_DEV_ROOT), the root above dev/.
  testing::CommandResult Gres(const std::string& profile, const std::string& sysfs, const std::string& root,
                              const std::string& args) const {
    return Shell(Cat(SimEnv(profile), KGPU_BIN, " --nvml-library ", KGPU_SIM_LIB, " --sysfs-root ", Quote(sysfs),
                     " slurm gres --dev-root ", Quote(root), " ", args, " 2>/dev/null"));
  }
  std::string dir_;
};

TEST_F(SlurmGresTest, RealSlurmdReportsTheGresKgpuWrites) {
  testing::SlurmClusterOptions o;
  o.nodes = {"h100", "a100"};
  o.gpus_per_node = 8;
  o.gres_types = "gpu,mps";
  testing::SlurmCluster cluster(o);  // creates its directory; daemons start below

  // DGX H100: 8 GPUs on two NUMA nodes, NVSwitch (18 lanes between every pair), MPS.
  const std::string h_sysfs = WriteSysfs("dgx-h100");
  auto h_gres = Gres("dgx-h100", h_sysfs, cluster.dev_root("h100"), "--node-name h100 --mps-count 100 --output gres");
  ASSERT_EQ(h_gres.code, 0) << h_gres.out;
  auto h_node = Gres("dgx-h100", h_sysfs, cluster.dev_root("h100"),
                     "--node-name h100 --mps-count 100 --output node --cpus 2 --real-memory 1000");
  ASSERT_EQ(h_node.code, 0) << h_node.out;
  EXPECT_EQ(h_node.out, "NodeName=h100 CPUs=2 RealMemory=1000 Gres=gpu:nvidia_h100_80gb_hbm3:8,mps:800\n");
  EXPECT_NE(h_gres.out.find(Cat("NodeName=h100 Name=gpu Type=nvidia_h100_80gb_hbm3 File=", cluster.dev_dir("h100"),
                                "/nvidia0 Cores=0 Links=-1,18,18,18,18,18,18,18\n")),
            std::string::npos)
      << h_gres.out;
  EXPECT_NE(h_gres.out.find(Cat("File=", cluster.dev_dir("h100"), "/nvidia7 Cores=1 Links=18,18,18,18,18,18,18,-1\n")),
            std::string::npos)
      << h_gres.out;

  // DGX A100 with GPU 0 and 1 in MIG mode: each MIG device its own type, MultipleFiles= with
  // the GPU and its two capability nodes.
  const std::string a_sysfs = WriteSysfs("dgx-a100-mig");
  const std::string minors = dir_ + "/mig-minors";
  ASSERT_EQ(Shell(Cat(SimEnv("dgx-a100-mig"), KGPU_SIMCTL, " mig-minors ", minors)).code, 0);
  const std::string a_dev = cluster.dev_dir("a100");
  auto a_gres =
      Gres("dgx-a100-mig", a_sysfs, cluster.dev_root("a100"), "--node-name a100 --output gres --mig-minors " + minors);
  ASSERT_EQ(a_gres.code, 0) << a_gres.out;
  auto a_node = Gres("dgx-a100-mig", a_sysfs, cluster.dev_root("a100"),
                     "--node-name a100 --output node --cpus 2 --real-memory 1000 --mig-minors " + minors);
  ASSERT_EQ(a_node.code, 0) << a_node.out;
  EXPECT_NE(a_node.out.find("gpu:3g.20gb:1"), std::string::npos) << a_node.out;
  EXPECT_NE(a_node.out.find("gpu:1g.5gb:9"), std::string::npos) << a_node.out;
  EXPECT_NE(a_node.out.find("gpu:nvidia_a100-sxm4-40gb:6"), std::string::npos) << a_node.out;
  // The capability device nodes the MultipleFiles= lines name (character devices, as slurmd wants).
  std::regex cap(a_dev + "/nvidia-caps/nvidia-cap([0-9]+)");
  fs::create_directories(a_dev + "/nvidia-caps");
  for (auto it = std::sregex_iterator(a_gres.out.begin(), a_gres.out.end(), cap); it != std::sregex_iterator(); ++it) {
    const std::string path = (*it)[0];
    const unsigned minor = static_cast<unsigned>(std::stoul((*it)[1]));
    if (!fs::exists(path)) {
      ASSERT_EQ(::mknod(path.c_str(), S_IFCHR | 0666, makedev(236, minor)), 0) << path;
    }
  }

  auto params = [](const std::string& line, const std::string& name) {
    std::string p = line.substr(Cat("NodeName=", name, " ").size());
    while (!p.empty() && p.back() == '\n') p.pop_back();
    return p;
  };
  // The cluster gets exactly what kgpu printed.
  cluster.mutable_options().node_params = {{"h100", params(h_node.out, "h100")}, {"a100", params(a_node.out, "a100")}};
  cluster.mutable_options().gres_conf = h_gres.out + a_gres.out;
  auto started = cluster.Start();
  ASSERT_TRUE(started.ok()) << started.message();

  auto show = cluster.Run({"scontrol", "-o", "show", "node", "h100"});
  ASSERT_EQ(show.exit_code, 0) << show.err;
  EXPECT_NE(show.out.find("Gres=gpu:nvidia_h100_80gb_hbm3:8(S:"), std::string::npos) << show.out;
  EXPECT_NE(show.out.find(",mps:nvidia_h100_80gb_hbm3:800(S:"), std::string::npos) << show.out;
  show = cluster.Run({"scontrol", "-o", "show", "node", "a100"});
  ASSERT_EQ(show.exit_code, 0) << show.err;
  for (const char* g : {"gpu:3g.20gb:1", "gpu:2g.10gb:1", "gpu:1g.5gb:9", "gpu:nvidia_a100-sxm4-40gb:6"}) {
    EXPECT_NE(show.out.find(g), std::string::npos) << g << " in " << show.out;
  }
  // slurmd's own view of gres.conf: Cores= from NUMA, Links= from NVLink, per device.
  auto g = cluster.Run({"slurmd", "-N", "h100", "-G"});
  g.out += g.err;  // slurmd -G prints to stderr
  EXPECT_NE(g.out.find(Cat("Name=gpu Type=nvidia_h100_80gb_hbm3 Count=1 Index=0 ID=7696487 File=",
                           cluster.dev_dir("h100"), "/nvidia0 Cores=0 CoreCnt=2 Links=-1,18,18,18,18,18,18,18")),
            std::string::npos)
      << g.out << g.err;
  EXPECT_NE(g.out.find(Cat("/nvidia7 Cores=1 CoreCnt=2 Links=18,18,18,18,18,18,18,-1")), std::string::npos) << g.out;
  EXPECT_EQ(g.out.find("Invalid GRES"), std::string::npos) << g.out;
  EXPECT_EQ(g.out.find("is not a valid character or block device"), std::string::npos) << g.out;
  // A job gets the GPUs: CUDA_VISIBLE_DEVICES from the File= character devices.
  auto job =
      cluster.Run({"srun", "-w", "h100", "--gres=gpu:nvidia_h100_80gb_hbm3:2", "printenv", "CUDA_VISIBLE_DEVICES"},
                  std::chrono::seconds(60));
  EXPECT_EQ(job.out, "0,1\n") << job.err << cluster.Logs();
  job = cluster.Run({"srun", "-w", "a100", "--gres=gpu:3g.20gb:1", "env"}, std::chrono::seconds(60));
  EXPECT_EQ(job.exit_code, 0) << job.err << cluster.Logs();
  EXPECT_NE(job.out.find("SLURM_GPUS_ON_NODE=1\n"), std::string::npos) << job.out;
  EXPECT_NE(job.out.find("CUDA_VISIBLE_DEVICES=0\n"), std::string::npos) << job.out;
}

}  // namespace
}  // namespace kgpu
