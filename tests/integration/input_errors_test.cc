// Careless inputs, as an operator would make them, against the real binaries (kgpu, kgpu-simctl)
// on a simulated node: each one must fail with a message that names the input, the position and
// the fix, with the documented exit code (1 bad input, 2 usage), and change nothing.

#include <chrono>
#include <filesystem>
#include <fstream>
#include <string>
#include <thread>

#include <gtest/gtest.h>
#include <nlohmann/json.hpp>
#include <signal.h>
#include <sys/wait.h>

#include "testing/net.h"
#include "testing/plugin_process.h"
#include "testing/poll.h"
#include "testing/shell.h"
#include "testing/sim_node.h"
#include "testing/spawn.h"

namespace kgpu {
namespace {

using namespace std::chrono_literals;
using testing::CommandResult;
using testing::Quote;
using testing::Shell;
using testing::SimNode;

// True when `text` holds a byte a terminal would act on (NUL, ESC, other controls but \n and \t).
bool HasControlBytes(const std::string& text) {
  for (unsigned char c : text) {
    if ((c < 0x20 && c != '\n' && c != '\t') || c == 0x7F) return true;
  }
  return false;
}

class InputErrorsTest : public ::testing::Test {
 protected:
  void SetUp() override {
    sim_ = std::make_unique<SimNode>("l4x4");
    kubelet_dir_ = sim_->dir() + "/device-plugins";
    std::filesystem::create_directories(kubelet_dir_);
  }
  void TearDown() override {
    std::error_code ec;
    for (const auto& e : std::filesystem::directory_iterator(sim_->dir(), ec)) {
      if (e.path().filename() != "sim.state") std::filesystem::remove_all(e.path(), ec);
    }
  }
  // `kgpu <args>` on the simulated node.
  CommandResult Kgpu(const std::string& args) const {
    return Shell(Cat("KGPU_MIG_LOCK_FILE=", sim_->dir(), "/mig.lock ", KGPU_BIN, " --nvml-library ",
                     SimNode::LibraryPath(), " ", args));
  }
  CommandResult Simctl(const std::string& args) const { return Shell(Cat(KGPU_SIMCTL, " ", args)); }
  CommandResult Plugin(const std::string& args) const {
    return Kgpu(Cat("device-plugin --kubelet-dir ", kubelet_dir_, " ", args));
  }
  std::string Write(const std::string& name, const std::string& text) const {
    const std::string path = sim_->dir() + "/" + name;
    std::ofstream(path, std::ios::binary) << text;
    return path;
  }
  template <typename... A>
  static std::string Cat(const A&... parts) {
    std::string out;
    ((out += parts), ...);
    return out;
  }

  std::unique_ptr<SimNode> sim_;
  std::string kubelet_dir_;
};

// ---------------------------------------------------------------- listen addresses

// Every server kgpu runs reads its address the same way (host:port, :port, [v6]:port, port), refuses
// a port outside 0-65535 as a usage error (exit 2) naming the flag, and never shares a port with
// another listener: a port in use is an error naming the port and the flag (exit 1).
TEST_F(InputErrorsTest, ListenAddressesAreReadOnceAndNeverShared) {
  const std::string kubeconfig = Write("kubeconfig", R"(apiVersion: v1
kind: Config
clusters: [{name: c, cluster: {server: "http://127.0.0.1:1"}}]
users: [{name: u, user: {token: t}}]
contexts: [{name: x, context: {cluster: c, user: u}}]
current-context: x
)");
  struct Case {
    std::string args, message;
  };
  const std::vector<Case> impossible = {
      {"extender --kubeconfig " + kubeconfig + " --address :99999", "--address ':99999': the port must be 1-65535"},
      {"webhook --insecure-http --address :70000", "--address ':70000': the port must be 1-65535"},
      {"webhook --insecure-http --address 127.0.0.1:http", "--address '127.0.0.1:http': the port is not a number"},
      {"webhook --insecure-http --address ::1:8443", "an IPv6 address must be written in brackets"},
      {"exporter -a :99999", "-a/--address (DCGM_EXPORTER_LISTEN) ':99999': the port must be 1-65535"},
      {"exporter -a '[::1:9400'", "an IPv6 address opened with [ is not closed with ]"},
  };
  for (const auto& c : impossible) {
    const CommandResult r = Kgpu("--log-level warn " + c.args);
    EXPECT_EQ(r.code, 2) << c.args << "\n" << r.out;
    EXPECT_NE(r.out.find(c.message), std::string::npos) << c.args << "\n" << r.out;
  }

  // A webhook on a bare port, another on [::1] (where this machine has IPv6).
  auto healthz = [](const std::string& url) { return Shell("curl -gsf " + url + "/healthz").code == 0; };
  const int port = testing::FreePort();
  testing::SpawnOptions so;
  so.log = sim_->dir() + "/webhook.log";
  const pid_t first = testing::Spawn({KGPU_BIN, "webhook", "--insecure-http", "--address", std::to_string(port)}, so);
  ASSERT_GT(first, 0);
  ASSERT_TRUE(testing::WaitFor([&] { return healthz("http://127.0.0.1:" + std::to_string(port)); }, 20s))
      << testing::ReadFile(so.log);

  // The same port again, from the same program and from another: refused, nothing shared.
  for (const std::string& args : {"webhook --insecure-http --address 127.0.0.1:" + std::to_string(port),
                                  "exporter -a :" + std::to_string(port)}) {
    const CommandResult r = Kgpu("--log-level warn " + args);
    EXPECT_EQ(r.code, 1) << args << "\n" << r.out;
    EXPECT_NE(r.out.find("port " + std::to_string(port) + " is already in use"), std::string::npos) << args << "\n"
                                                                                                    << r.out;
    EXPECT_NE(r.out.find(args.rfind("webhook", 0) == 0 ? "--address" : "-a/--address"), std::string::npos) << r.out;
  }
  ::kill(first, SIGTERM);
  ::waitpid(first, nullptr, 0);

  if (Shell("test -e /proc/net/if_inet6 && grep -q . /proc/net/if_inet6").code == 0) {
    const int v6 = testing::FreePort();
    const pid_t six =
        testing::Spawn({KGPU_BIN, "webhook", "--insecure-http", "--address", "[::1]:" + std::to_string(v6)}, so);
    ASSERT_GT(six, 0);
    EXPECT_TRUE(testing::WaitFor([&] { return healthz("http://[::1]:" + std::to_string(v6)); }, 20s))
        << testing::ReadFile(so.log);
    ::kill(six, SIGTERM);
    ::waitpid(six, nullptr, 0);
  }
}

// ---------------------------------------------------------------- config file

TEST_F(InputErrorsTest, ConfigFileThatIsADirectoryIsRefused) {
  const std::string dir = sim_->dir() + "/config.d";
  std::filesystem::create_directories(dir);
  const CommandResult r = Plugin("--config-file " + dir);
  EXPECT_EQ(r.code, 1) << r.out;
  EXPECT_NE(r.out.find(dir + " is a directory, not a config file (check --config-file / CONFIG_FILE"),
            std::string::npos)
      << r.out;
  EXPECT_FALSE(std::filesystem::exists(kubelet_dir_ + "/nvidia-gpu.sock"));
  const CommandResult mig = Kgpu("mig show --config-file " + dir);
  EXPECT_EQ(mig.code, 1) << mig.out;
  EXPECT_NE(mig.out.find("is a directory"), std::string::npos) << mig.out;
}

TEST_F(InputErrorsTest, EmptyConfigFileIsRefusedUnlessAllowed) {
  for (const char* text : {"", "\n  \n", "# only a comment\n"}) {
    const std::string path = Write("config.yaml", text);
    const CommandResult r = Plugin("--config-file " + path);
    EXPECT_EQ(r.code, 1) << r.out;
    EXPECT_NE(r.out.find(path + ":1:1: the config file "), std::string::npos) << r.out;
    EXPECT_NE(r.out.find("pass --allow-empty-config"), std::string::npos) << r.out;
  }
  // Allowed on purpose: every default, the plugin serves.
  const std::string empty = Write("config.yaml", "");
  testing::Plugin p(kubelet_dir_, {"--config-file", empty, "--allow-empty-config"});
  const auto deadline = std::chrono::steady_clock::now() + 20s;
  while (!std::filesystem::exists(kubelet_dir_ + "/nvidia-gpu.sock") && std::chrono::steady_clock::now() < deadline) {
    std::this_thread::sleep_for(20ms);
  }
  EXPECT_TRUE(std::filesystem::exists(kubelet_dir_ + "/nvidia-gpu.sock")) << p.Log();
}

TEST_F(InputErrorsTest, ReplicasNameTheTypeAndTheRange) {
  const char* kTemplate = "version: v1\nsharing:\n  timeSlicing:\n    resources:\n    - name: gpu\n      replicas: ";
  for (const auto& [value, want] :
       {std::pair{"four",
                  "config.yaml:6:17: sharing.timeSlicing.resources[0].replicas must be an integer from 2 to "
                  "1024 (got 'four')"},
        std::pair{"100000000000",
                  "config.yaml:6:17: sharing.timeSlicing.resources[0].replicas must be an integer "
                  "from 2 to 1024 (got 100000000000, out of range)"}}) {
    const CommandResult r = Plugin("--config-file " + Write("config.yaml", std::string(kTemplate) + value + "\n"));
    EXPECT_EQ(r.code, 1) << r.out;
    EXPECT_NE(r.out.find(want), std::string::npos) << r.out;
  }
}

TEST_F(InputErrorsTest, EnumerationsAndDevicesCarryFileLineColumn) {
  const CommandResult mixd = Plugin("--config-file " + Write("config.yaml", "flags:\n  migStrategy: mixd\n"));
  EXPECT_EQ(mixd.code, 1) << mixd.out;
  EXPECT_NE(mixd.out.find("config.yaml:2:16: flags.migStrategy 'mixd' is invalid: use none, single or mixed (did "
                          "you mean mixed?)"),
            std::string::npos)
      << mixd.out;
  // A GPU this node does not have is found against the inventory, after parsing: still positioned.
  const CommandResult twelve = Plugin("--config-file " + Write("config.yaml",
                                                               "sharing:\n  timeSlicing:\n    resources:\n"
                                                               "    - {name: gpu, replicas: 2, devices: [1, 12]}\n"));
  EXPECT_EQ(twelve.code, 1) << twelve.out;
  EXPECT_NE(twelve.out.find("config.yaml:4:45: sharing.timeSlicing.resources[0].devices: no device '12' of resource "
                            "nvidia.com/gpu on this node (it has 0, 1, 2, 3;"),
            std::string::npos)
      << twelve.out;
  // A flag's bad value names the flag.
  const CommandResult flag = Plugin("--mig-strategy mixd");
  EXPECT_EQ(flag.code, 1) << flag.out;
  EXPECT_NE(flag.out.find("flags and environment: migStrategy 'mixd' (--mig-strategy / MIG_STRATEGY) is invalid"),
            std::string::npos)
      << flag.out;
}

TEST_F(InputErrorsTest, MigLayoutErrorsCarryFileLineColumn) {
  const std::string cfg = Write("config.yaml",
                                "mig:\n  layouts:\n    a:\n      - devices: [12]\n"
                                "        mig-devices: {\"1g.6gb\": 1}\n");
  const CommandResult r =
      Kgpu("mig apply --config-file " + cfg + " --layout a --no-kubelet-check --dry-run --kubelet-dir " + kubelet_dir_);
  EXPECT_EQ(r.code, 1) << r.out;
  EXPECT_NE(r.out.find("config.yaml:4:9: MIG layout 'a' entry 0: this node has no GPU 12 (it has 4 GPUs)"),
            std::string::npos)
      << r.out;
  const CommandResult count =
      Kgpu("mig show --config-file " +
           Write("config.yaml", "mig:\n  layouts:\n    a: [{devices: all, mig-devices: {1g.5gb: lots}}]\n"));
  EXPECT_EQ(count.code, 1) << count.out;
  EXPECT_NE(count.out.find("config.yaml:3:46: mig.layouts.a[0].mig-devices.1g.5gb must be an integer from 0 to 7 "
                           "(got 'lots')"),
            std::string::npos)
      << count.out;
}

// A layout that does not fit a GPU is found when planning against NVML: the entry's position still leads.
TEST(InputErrorsMigTest, LayoutThatDoesNotFitNamesItsEntry) {
  SimNode sim("dgx-a100-mig");
  const std::string cfg = sim.dir() + "/config.yaml";
  std::ofstream(cfg) << "mig:\n  layouts:\n    a:\n      - devices: [0]\n        mig-devices: {\"9g.99gb\": 1}\n";
  const CommandResult r = Shell(
      std::string(KGPU_BIN) + " --nvml-library " + SimNode::LibraryPath() + " mig apply --config-file " + cfg +
      " --layout a --no-kubelet-check --dry-run --kubelet-dir " + sim.dir() + " --lock-file " + sim.dir() + "/lock");
  std::filesystem::remove(cfg);
  std::filesystem::remove(sim.dir() + "/lock");
  EXPECT_EQ(r.code, 1) << r.out;
  EXPECT_NE(r.out.find("config.yaml:4:9: layout 'a': GPU 0 (NVIDIA A100-SXM4-40GB) has no MIG profile '9g.99gb'"),
            std::string::npos)
      << r.out;
}

TEST_F(InputErrorsTest, BinaryConfigFileIsEscaped) {
  constexpr char kBinary[] =
      "\x7f"
      "ELF\x02\x01\x01\x00\x00\x1b[2J\x1b]0;owned\x07:\xff\xfe: x\n";
  const std::string binary(kBinary, sizeof kBinary - 1);
  const CommandResult r = Plugin("--config-file " + Write("config.yaml", binary));
  EXPECT_EQ(r.code, 1) << r.out;
  EXPECT_NE(r.out.find("config.yaml:"), std::string::npos) << r.out;
  EXPECT_FALSE(HasControlBytes(r.out)) << r.out;
  const CommandResult unknown = Plugin("--config-file " + Write("config.yaml", std::string("fl\x1b[31mags: 1\n")));
  EXPECT_EQ(unknown.code, 1) << unknown.out;
  EXPECT_NE(unknown.out.find("unknown key 'fl\\x1B[31mags'"), std::string::npos) << unknown.out;
  EXPECT_FALSE(HasControlBytes(unknown.out)) << unknown.out;
}

// ---------------------------------------------------------------- exporter counters

TEST_F(InputErrorsTest, CountersTypoAndEmptyCsvAreErrors) {
  const CommandResult typo =
      Kgpu("exporter -a 127.0.0.1:0 -f " + Write("counters.csv",
                                                 "DCGM_FI_DEV_SM_CLOCK, gauge, SM clock\n"
                                                 "DCGM_FI_DEV_GPU_TMEP, gauge, GPU temperature (in C).\n"));
  EXPECT_EQ(typo.code, 1) << typo.out;
  EXPECT_NE(typo.out.find("counters.csv:2:1: unknown DCGM field DCGM_FI_DEV_GPU_TMEP (did you mean "
                          "DCGM_FI_DEV_GPU_TEMP?)"),
            std::string::npos)
      << typo.out;
  const CommandResult empty = Kgpu("exporter -a 127.0.0.1:0 -f " + Write("counters.csv", "# nothing\n"));
  EXPECT_EQ(empty.code, 1) << empty.out;
  EXPECT_NE(empty.out.find("counters.csv:1:1: the counters file lists no fields"), std::string::npos) << empty.out;
  const CommandResult dir = Kgpu("exporter -a 127.0.0.1:0 -f " + sim_->dir());
  EXPECT_EQ(dir.code, 1) << dir.out;
  EXPECT_NE(dir.out.find("is a directory, not a counters file"), std::string::npos) << dir.out;
}

// ---------------------------------------------------------------- kubelet directory

// Our message comes first and alone: no gRPC dump before it.
void ExpectOnlyOurMessage(const CommandResult& r, const std::string& want) {
  EXPECT_EQ(r.code, 1) << r.out;
  EXPECT_EQ(r.out.rfind("kgpu device-plugin: kubelet directory ", 0), 0u) << r.out;
  EXPECT_NE(r.out.find(want), std::string::npos) << r.out;
  EXPECT_EQ(std::count(r.out.begin(), r.out.end(), '\n'), 1) << r.out;
}

TEST_F(InputErrorsTest, KubeletDirectoryMissingOrNotADirectory) {
  const std::string missing = sim_->dir() + "/no-such-dir";
  ExpectOnlyOurMessage(Kgpu("device-plugin --kubelet-dir " + missing), missing + " does not exist");
  const std::string file = Write("plugins-file", "x");
  ExpectOnlyOurMessage(Kgpu("device-plugin --kubelet-dir " + file),
                       file + " is not a directory (it is a regular file)");
}

TEST_F(InputErrorsTest, KubeletDirectoryReadOnly) {
  // A read-only bind mount in a private mount namespace (needs CAP_SYS_ADMIN: skipped without).
  if (Shell("unshare -m sh -c " +
            Quote("mount --bind " + kubelet_dir_ + " " + kubelet_dir_ + " && mount -o remount,bind,ro " + kubelet_dir_ +
                  " && ! touch " + kubelet_dir_ + "/probe"))
          .code != 0) {
    GTEST_SKIP() << "cannot make a read-only bind mount here (unshare -m)";
  }
  const CommandResult r =
      Shell("unshare -m sh -c " +
            Quote("mount --bind " + kubelet_dir_ + " " + kubelet_dir_ + " && mount -o remount,bind,ro " + kubelet_dir_ +
                  " && exec " + KGPU_BIN + " --nvml-library " + SimNode::LibraryPath() +
                  " device-plugin --kubelet-dir " + kubelet_dir_));
  ExpectOnlyOurMessage(r, kubelet_dir_ + " is on a read-only file system");
}

// ---------------------------------------------------------------- simctl and the simulated library

TEST_F(InputErrorsTest, SimctlValidatesEveryValue) {
  const auto temp = [&] { return nlohmann::json::parse(Simctl("show").out)["gpus"][0]["temp"].get<int>(); };
  const int before = temp();
  for (const auto& [args, want] : {
           std::pair{"set 0 temp=-400", "temp=-400: GPU temperature, degrees C, must be an integer from 0 to 200"},
           std::pair{"set 0 memused=999999",
                     "memused=999999 is out of range: memory used outside listed processes, "
                     "MiB, must be an integer from 0 to "},
           std::pair{"set 0 util=150",
                     "util=150 is out of range: GPU utilisation besides the listed processes' (served: sum of both, at "
                     "most 100), %, must be an integer from 0 to 100"},
           std::pair{"set 0 temp=50 util=101", "util=101 is out of range"},
           std::pair{"set 0 powerlimit=5000", "powerlimit=5000 is out of range: power limit, W"},
           std::pair{"set 0 tmep=50", "'tmep' is not a settable value (did you mean temp?)"},
           std::pair{"proc add 0 4242 --mem 999999", "--mem 999999: more than the GPU has free"},
           std::pair{"proc add 0 4242 --util 150", "--util 150: must be 0 to 100"},
       }) {
    const CommandResult r = Simctl(args);
    EXPECT_EQ(r.code, 1) << args << ": " << r.out;
    EXPECT_NE(r.out.find(want), std::string::npos) << args << ": " << r.out;
  }
  EXPECT_EQ(temp(), before) << "a refused set changed the GPU";
  EXPECT_EQ(Simctl("set 0 temp=55 util=100").code, 0);
  EXPECT_EQ(temp(), 55);
}

TEST_F(InputErrorsTest, UnknownSimulatedProfileReportsTheSimulatorsError) {
  const CommandResult r = Shell(std::string("KGPU_SIM_NODE=dgx-h900 ") + KGPU_BIN + " --nvml-library " +
                                SimNode::LibraryPath() + " devices");
  EXPECT_EQ(r.code, 1) << r.out;
  EXPECT_NE(r.out.find("kgpu-simnvml: unknown node profile 'dgx-h900'"), std::string::npos) << r.out;
  EXPECT_EQ(r.out.find("kernel driver"), std::string::npos) << r.out;
  EXPECT_EQ(r.out.find("Driver Not Loaded"), std::string::npos) << r.out;
}

// ---------------------------------------------------------------- exit codes

TEST_F(InputErrorsTest, ExitCodesAreOneForBadInputAndTwoForUsage) {
  const std::string missing = sim_->dir() + "/missing.yaml";
  for (const auto& [args, code] : {
           std::pair{std::string("--no-such-flag devices"), 2},
           std::pair{std::string("no-such-command"), 2},
           std::pair{std::string("--log-level loud devices"), 2},
           std::pair{std::string("exporter -c 5"), 2},
           std::pair{std::string("device-plugin --mig-strategy"), 2},
           std::pair{"device-plugin --kubelet-dir " + kubelet_dir_ + " --config-file " + missing, 1},
           std::pair{"node --kubelet-dir " + kubelet_dir_ + " --config-file " + missing, 1},
           std::pair{"mig show --config-file " + missing, 1},
           std::pair{"mig apply --config-file " + missing, 1},
           std::pair{"exporter -f " + missing, 1},
       }) {
    const CommandResult r = Kgpu(args);
    EXPECT_EQ(r.code, code) << "kgpu " << args << ": " << r.out;
  }
  EXPECT_EQ(Simctl("set").code, 2);
  EXPECT_EQ(Simctl("set 0 temp=-1").code, 1);
  EXPECT_EQ(Kgpu("--help").code, 0);
}

// `kgpu node-template`: what a node like this one advertises, for an autoscaler node group that
// scales from zero: the plugin's resources under the config, the share capacity the plugin
// publishes, GFD's labels (without the timestamp); and a format it does not know is refused.
TEST(NodeTemplateTest, CapacityAndLabelsOfANodeLikeThisOne) {
  SimNode sim("dgx-h100");
  const std::string cfg = sim.dir() + "/template.yaml";
  std::ofstream(cfg) << "version: v1\nsharing:\n  timeSlicing:\n    resources:\n"
                        "    - {name: nvidia.com/gpu, replicas: 16, rename: kgpu.io/gpu, devices: [0, 1, 2, 3]}\n";
  const std::string kgpu = std::string(KGPU_BIN) + " --nvml-library " + SimNode::LibraryPath() + " node-template ";
  auto r = Shell(kgpu + "--config-file " + cfg + " --format json");
  ASSERT_EQ(r.code, 0) << r.out;
  const auto doc = nlohmann::json::parse(r.out);
  const auto devices = Shell(std::string(KGPU_BIN) + " --nvml-library " + SimNode::LibraryPath() + " devices --json");
  ASSERT_EQ(devices.code, 0) << devices.out;
  const int64_t mib = nlohmann::json::parse(devices.out)["gpus"][0]["memoryMiB"];
  EXPECT_EQ(doc["capacity"], nlohmann::json({{"kgpu.io/gpu", "64"},
                                             {"nvidia.com/gpu", "4"},
                                             {"kgpu.io/gpu-memory", std::to_string(4 * mib)},
                                             {"kgpu.io/gpu-cores", "400"}}));
  EXPECT_EQ(doc["labels"].value("nvidia.com/gpu.product", ""), "NVIDIA-H100-80GB-HBM3");
  EXPECT_FALSE(doc["labels"].contains("nvidia.com/gfd.timestamp"));
  auto aws = Shell(kgpu + "--config-file " + cfg + " --format aws");
  ASSERT_EQ(aws.code, 0) << aws.out;
  EXPECT_NE(aws.out.find("k8s.io/cluster-autoscaler/node-template/resources/kgpu.io/gpu-memory=" +
                         std::to_string(4 * mib) + "\n"),
            std::string::npos)
      << aws.out;
  auto bad = Shell(kgpu + "--format xml");
  EXPECT_EQ(bad.code, 2);
  EXPECT_NE(bad.out.find("--format: xml not in {yaml,aws,json}"), std::string::npos) << bad.out;
}

}  // namespace
}  // namespace kgpu
