// Pod attribution of GPU processes: cgroup and checkpoint parsers, the PodAttributor join over a
// fake /proc and checkpoint, and the PodResources client against a fake kubelet server.
#include "exporter/attribution.h"

#include <atomic>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <string>
#include <thread>
#include <vector>

#include <gtest/gtest.h>
#include <sys/socket.h>
#include <sys/un.h>
#include <unistd.h>

#include "common/strings.h"
#include "kubelet/checkpoint.h"
#include "kubelet/podresources.h"
#include "testing/fake_podresources.h"
#include "testing/kubelet_checkpoint.h"

namespace kgpu::exporter {
namespace {

namespace fs = std::filesystem;

// ---------------------------------------------------------------- samples

constexpr char kUidA[] = "5c6e5f2a-7b0e-4c1e-9d0b-2f1a3e4d5c6b";
constexpr char kUidB[] = "0a1b2c3d-4e5f-4a6b-8c7d-9e0f1a2b3c4d";
constexpr char kUidC[] = "f0e1d2c3-b4a5-4968-8776-655443322110";
constexpr char kCtr[] = "3f4e5d6c7b8a99887766554433221100ffeeddccbbaa00112233445566778899";

constexpr char kGpu[] = "GPU-9d2e1b4c-0a1f-4f6e-8c3d-7b5a6e9f0d12";
constexpr char kGpu2[] = "GPU-11111111-2222-3333-4444-555555555555";
constexpr char kMig[] = "MIG-4b8f2a1c-6d3e-5f70-9a1b-2c3d4e5f6a7b";

std::string Underscored(std::string uid) {
  for (char& c : uid) {
    if (c == '-') c = '_';
  }
  return uid;
}

// A cgroup v2 file for a containerd container of a burstable pod (systemd driver).
std::string CgroupV2Systemd(const std::string& uid, const std::string& ctr = kCtr) {
  return "0::/kubepods.slice/kubepods-burstable.slice/kubepods-burstable-pod" + Underscored(uid) +
         ".slice/cri-containerd-" + ctr + ".scope\n";
}

// ---------------------------------------------------------------- ParseCgroup

TEST(AttributionCgroupTest, V1Cgroupfs) {
  const std::string text = std::string("12:hugetlb:/kubepods/burstable/pod") + kUidA + "/" + kCtr +
                           "\n11:memory:/kubepods/burstable/pod" + kUidA + "/" + kCtr +
                           "\n2:cpu,cpuacct:/kubepods/burstable/pod" + kUidA + "/" + kCtr +
                           "\n1:name=systemd:/kubepods/burstable/pod" + kUidA + "/" + kCtr + "\n";
  auto info = ParseCgroup(text);
  ASSERT_TRUE(info.has_value());
  EXPECT_EQ(info->pod_uid, kUidA);
  EXPECT_EQ(info->container_id, kCtr);
}

TEST(AttributionCgroupTest, V1SystemdDriverConvertsUnderscores) {
  const std::string path = std::string("/kubepods.slice/kubepods-besteffort.slice/") + "kubepods-besteffort-pod" +
                           Underscored(kUidB) + ".slice/cri-containerd-" + kCtr + ".scope";
  const std::string text = "11:devices:" + path + "\n4:memory:" + path + "\n1:name=systemd:" + path + "\n0::/\n";
  auto info = ParseCgroup(text);
  ASSERT_TRUE(info.has_value());
  EXPECT_EQ(info->pod_uid, kUidB);
  EXPECT_EQ(info->container_id, kCtr);
}

TEST(AttributionCgroupTest, V2SystemdRuntimes) {
  for (const std::string scope : {"cri-containerd-", "crio-", "docker-"}) {
    const std::string text = "0::/kubepods.slice/kubepods-burstable.slice/kubepods-burstable-pod" + Underscored(kUidA) +
                             ".slice/" + scope + kCtr + ".scope\n";
    auto info = ParseCgroup(text);
    ASSERT_TRUE(info.has_value()) << scope;
    EXPECT_EQ(info->pod_uid, kUidA) << scope;
    EXPECT_EQ(info->container_id, kCtr) << scope;
  }
  // Guaranteed pods sit directly under kubepods.slice.
  auto info = ParseCgroup(std::string("0::/kubepods.slice/kubepods-pod") + Underscored(kUidC) +
                          ".slice/cri-containerd-" + kCtr + ".scope\n");
  ASSERT_TRUE(info.has_value());
  EXPECT_EQ(info->pod_uid, kUidC);
  EXPECT_EQ(info->container_id, kCtr);
}

TEST(AttributionCgroupTest, V2CgroupfsDriver) {
  auto info = ParseCgroup(std::string("0::/kubepods/besteffort/pod") + kUidA + "/" + kCtr + "\n");
  ASSERT_TRUE(info.has_value());
  EXPECT_EQ(info->pod_uid, kUidA);
  EXPECT_EQ(info->container_id, kCtr);
  // CRI-O with cgroupfs, and a guaranteed pod.
  info = ParseCgroup(std::string("0::/kubepods/pod") + kUidB + "/crio-" + kCtr);
  ASSERT_TRUE(info.has_value());
  EXPECT_EQ(info->pod_uid, kUidB);
  EXPECT_EQ(info->container_id, kCtr);
}

TEST(AttributionCgroupTest, CgroupNamespaceKindAndNestedPaths) {
  // Seen from inside a private cgroup namespace.
  auto info = ParseCgroup(std::string("0::/../../kubepods-besteffort-pod") + Underscored(kUidA) +
                          ".slice/cri-containerd-" + kCtr + ".scope\n");
  ASSERT_TRUE(info.has_value());
  EXPECT_EQ(info->pod_uid, kUidA);
  EXPECT_EQ(info->container_id, kCtr);
  // kind nodes.
  info = ParseCgroup(std::string("0::/kubelet.slice/kubelet-kubepods.slice/") +
                     "kubelet-kubepods-besteffort.slice/kubelet-kubepods-besteffort-pod" + Underscored(kUidB) +
                     ".slice/cri-containerd-" + kCtr + ".scope");
  ASSERT_TRUE(info.has_value());
  EXPECT_EQ(info->pod_uid, kUidB);
  // A sub-cgroup inside the container.
  info = ParseCgroup(std::string("0::/kubepods/burstable/pod") + kUidC + "/" + kCtr + "/init.scope");
  ASSERT_TRUE(info.has_value());
  EXPECT_EQ(info->pod_uid, kUidC);
  EXPECT_EQ(info->container_id, kCtr);
  // A runtime on cgroupfs given a systemd cgroupsPath ("slice:prefix:name") keeps it literally.
  info = ParseCgroup(std::string("0::/system.slice/containerd.service/kubepods-burstable-pod") + Underscored(kUidA) +
                     ".slice:cri-containerd:" + kCtr + "\n");
  ASSERT_TRUE(info.has_value());
  EXPECT_EQ(info->pod_uid, kUidA);
  EXPECT_EQ(info->container_id, kCtr);
}

TEST(AttributionCgroupTest, StaticPodHashUidAndPodLevelCgroup) {
  const std::string hash = "8f2d7e1c9b3a4f5e6d7c8b9a0f1e2d3c";  // static pods: 32 hex, no dashes
  auto info = ParseCgroup("0::/kubepods/burstable/pod" + hash + "/" + kCtr);
  ASSERT_TRUE(info.has_value());
  EXPECT_EQ(info->pod_uid, hash);
  // A process in the pod's cgroup itself, and CRI-O's conmon: a pod but no container ID.
  info = ParseCgroup(std::string("0::/kubepods/burstable/pod") + kUidA + "\n");
  ASSERT_TRUE(info.has_value());
  EXPECT_EQ(info->pod_uid, kUidA);
  EXPECT_EQ(info->container_id, "");
  info = ParseCgroup(std::string("0::/kubepods.slice/kubepods-pod") + Underscored(kUidA) + ".slice/crio-conmon-" +
                     kCtr + ".scope");
  ASSERT_TRUE(info.has_value());
  EXPECT_EQ(info->container_id, "");
}

TEST(AttributionCgroupTest, NotInAPod) {
  EXPECT_FALSE(ParseCgroup(""));
  EXPECT_FALSE(ParseCgroup("0::/\n"));
  EXPECT_FALSE(ParseCgroup("0::/user.slice/user-1000.slice/session-3.scope\n"));
  EXPECT_FALSE(ParseCgroup("0::/system.slice/containerd.service\n"));
  EXPECT_FALSE(ParseCgroup(std::string("0::/docker/") + kCtr + "\n"));
  EXPECT_FALSE(ParseCgroup("garbage without colons"));
  EXPECT_FALSE(ParseCgroup("0::/kubepods/burstable/podnot-a-uid/abc"));
  EXPECT_FALSE(ParseCgroup("0::/kubepods/burstable/pod5c6e5f2a-7b0e-4c1e-9d0b-2f1a3e4d5c6/x"));
  // '_' is systemd's form only; a "-pod" slice outside kubepods is not a pod.
  EXPECT_FALSE(ParseCgroup("0::/kubepods/burstable/pod" + Underscored(kUidA) + "/" + kCtr));
  EXPECT_FALSE(ParseCgroup("0::/system.slice/foo-pod" + Underscored(kUidA) + ".slice"));
}

// ---------------------------------------------------------------- ParseCheckpoint

// A checkpoint as Kubernetes >= 1.20 writes it (NUMA map), with the fields we ignore.
std::string CheckpointNuma() {
  return std::string(R"({"Data":{"PodDeviceEntries":[)") +  //
         R"({"PodUID":")" + kUidA + R"(","ContainerName":"train","ResourceName":"nvidia.com/gpu",)" +
         R"("DeviceIDs":{"-1":[")" + kGpu + R"(::0"]},"AllocResp":"CiQKFk5WSURJQV9WSVNJQkxFX0RFVklDRVM="},)" +
         R"({"PodUID":")" + kUidB + R"(","ContainerName":"infer","ResourceName":"nvidia.com/gpu",)" +
         R"("DeviceIDs":{"0":[")" + kGpu + R"(::1"],"1":[")" + kGpu2 + R"(::1"],"2":null},"AllocResp":null})" +
         R"(],"RegisteredDevices":{"nvidia.com/gpu":[")" + kGpu + R"(::0",")" + kGpu + R"(::1"]}},)" +
         R"("Checksum":1234567890})";
}

// Written by kubelets (Kubernetes 1.2x, NVIDIA's plugin), with the checksums they computed.
const char* const kRealCheckpoints[] = {
    R"({"Data":{"PodDeviceEntries":null,"RegisteredDevices":{"nvidia.com/gpu":["GPU-0650a168-e770-3ea8-8ac3-8a1d419763e0"]}},"Checksum":3952659280})",
    R"({"Data":{"PodDeviceEntries":[{"PodUID":"513cb897-0262-4868-826f-aa943ee45a38","ContainerName":"app","ResourceName":"nvidia.com/gpu","DeviceIDs":{"0":["GPU-77a702db-e37f-3a74-d46d-c5713f66058c"]},"AllocResp":"CkIKFk5WSURJQV9WSVNJQkxFX0RFVklDRVMSKEdQVS03N2E3MDJkYi1lMzdmLTNhNzQtZDQ2ZC1jNTcxM2Y2NjA1OGMaJAoOL2Rldi9udmlkaWFjdGwSDi9kZXYvbnZpZGlhY3RsGgJydxomCg8vZGV2L252aWRpYS11dm0SDy9kZXYvbnZpZGlhLXV2bRoCcncaMgoVL2Rldi9udmlkaWEtdXZtLXRvb2xzEhUvZGV2L252aWRpYS11dm0tdG9vbHMaAnJ3Gi4KEy9kZXYvbnZpZGlhLW1vZGVzZXQSEy9kZXYvbnZpZGlhLW1vZGVzZXQaAnJ3GiAKDC9kZXYvbnZpZGlhMBIML2Rldi9udmlkaWEwGgJydw=="}],"RegisteredDevices":{"nvidia.com/gpu":["GPU-77a702db-e37f-3a74-d46d-c5713f66058c","GPU-9b341c59-f96b-ba85-c137-78c3652fea65","GPU-c1e9f249-b37b-81c2-a8d9-ba5ca0294841"]}},"Checksum":133412836})",
    R"({"Data":{"PodDeviceEntries":[{"PodUID":"513cb897-0262-4868-826f-aa943ee45a38","ContainerName":"app","ResourceName":"nvidia.com/gpu","DeviceIDs":{"0":["GPU-77a702db-e37f-3a74-d46d-c5713f66058c"]},"AllocResp":"CkIKFk5WSURJQV9WSVNJQkxFX0RFVklDRVMSKEdQVS03N2E3MDJkYi1lMzdmLTNhNzQtZDQ2ZC1jNTcxM2Y2NjA1OGMaJAoOL2Rldi9udmlkaWFjdGwSDi9kZXYvbnZpZGlhY3RsGgJydxomCg8vZGV2L252aWRpYS11dm0SDy9kZXYvbnZpZGlhLXV2bRoCcncaMgoVL2Rldi9udmlkaWEtdXZtLXRvb2xzEhUvZGV2L252aWRpYS11dm0tdG9vbHMaAnJ3Gi4KEy9kZXYvbnZpZGlhLW1vZGVzZXQSEy9kZXYvbnZpZGlhLW1vZGVzZXQaAnJ3GiAKDC9kZXYvbnZpZGlhMBIML2Rldi9udmlkaWEwGgJydw=="},{"PodUID":"94283d1b-ce5a-4797-bff8-0cf0c7143b2b","ContainerName":"app","ResourceName":"nvidia.com/gpu","DeviceIDs":{"1":["GPU-c1e9f249-b37b-81c2-a8d9-ba5ca0294841","GPU-9b341c59-f96b-ba85-c137-78c3652fea65"]},"AllocResp":"CmsKFk5WSURJQV9WSVNJQkxFX0RFVklDRVMSUUdQVS1jMWU5ZjI0OS1iMzdiLTgxYzItYThkOS1iYTVjYTAyOTQ4NDEsR1BVLTliMzQxYzU5LWY5NmItYmE4NS1jMTM3LTc4YzM2NTJmZWE2NRokCg4vZGV2L252aWRpYWN0bBIOL2Rldi9udmlkaWFjdGwaAnJ3GiYKDy9kZXYvbnZpZGlhLXV2bRIPL2Rldi9udmlkaWEtdXZtGgJydxoyChUvZGV2L252aWRpYS11dm0tdG9vbHMSFS9kZXYvbnZpZGlhLXV2bS10b29scxoCcncaLgoTL2Rldi9udmlkaWEtbW9kZXNldBITL2Rldi9udmlkaWEtbW9kZXNldBoCcncaIAoML2Rldi9udmlkaWExEgwvZGV2L252aWRpYTEaAnJ3GiAKDC9kZXYvbnZpZGlhMhIML2Rldi9udmlkaWEyGgJydw=="}],"RegisteredDevices":{"nvidia.com/gpu":["GPU-77a702db-e37f-3a74-d46d-c5713f66058c","GPU-9b341c59-f96b-ba85-c137-78c3652fea65","GPU-c1e9f249-b37b-81c2-a8d9-ba5ca0294841"]}},"Checksum":2442330366})",
};

// kubelet's checksum (FNV-32a of go-spew's "%#v" of Data) reproduced on files real kubelets
// wrote; a file whose contents were changed afterwards is refused, naming it.
TEST(AttributionCheckpointTest, KubeletChecksumIsVerified) {
  for (const char* real : kRealCheckpoints) {
    auto ok = ParseCheckpoint(real, "/cp");
    EXPECT_TRUE(ok.ok()) << ok.status();
    EXPECT_TRUE(kubelet::RegisteredResources(real, "/cp").ok());
  }
  std::string edited = kRealCheckpoints[2];
  const size_t at = edited.find("GPU-c1e9f249");
  ASSERT_NE(at, std::string::npos);
  edited.replace(at, 12, "GPU-d1e9f249");  // a device moved to another container by hand
  auto refused = ParseCheckpoint(edited, "/var/lib/kubelet/device-plugins/kubelet_internal_checkpoint");
  ASSERT_FALSE(refused.ok());
  EXPECT_EQ(
      std::string(refused.status().message())
          .rfind("/var/lib/kubelet/device-plugins/kubelet_internal_checkpoint: checksum 2442330366 does not match its "
                 "contents (",
                 0),
      0u)
      << refused.status();
  EXPECT_NE(refused.status().message().find("corrupt or was edited"), std::string::npos);
  EXPECT_FALSE(kubelet::RegisteredResources(edited, "/cp").ok());
  // The older layout (DeviceIDs a list) and a file without a checksum are not verified.
  EXPECT_TRUE(
      ParseCheckpoint(
          R"({"Data":{"PodDeviceEntries":[{"PodUID":"u","ContainerName":"c","ResourceName":"r","DeviceIDs":["a"]}]},"Checksum":7})",
          "/cp")
          .ok());
  EXPECT_TRUE(ParseCheckpoint(R"({"Data":{"PodDeviceEntries":null}})", "/cp").ok());
}

TEST(AttributionCheckpointTest, NumaMapShape) {
  auto entries = ParseCheckpoint(kgpu::testing::SignedCheckpoint(CheckpointNuma()), "/cp");
  ASSERT_TRUE(entries.ok()) << entries.status();
  ASSERT_EQ(entries->size(), 2u);
  EXPECT_EQ((*entries)[0].pod_uid, kUidA);
  EXPECT_EQ((*entries)[0].container, "train");
  EXPECT_EQ((*entries)[0].resource, "nvidia.com/gpu");
  EXPECT_EQ((*entries)[0].device_ids, std::vector<std::string>{std::string(kGpu) + "::0"});
  EXPECT_EQ((*entries)[1].device_ids,
            (std::vector<std::string>{std::string(kGpu) + "::1", std::string(kGpu2) + "::1"}));
}

TEST(AttributionCheckpointTest, OldListShapeAndEmptyForms) {
  const std::string old = std::string(R"({"Data":{"PodDeviceEntries":[{"PodUID":")") + kUidC +
                          R"(","ContainerName":"c","ResourceName":"nvidia.com/mig-1g.10gb",)" + R"("DeviceIDs":[")" +
                          kMig + R"("],"AllocResp":"AA=="}],)" + R"("RegisteredDevices":null},"Checksum":42})";
  auto entries = ParseCheckpoint(old, "/cp");
  ASSERT_TRUE(entries.ok()) << entries.status();
  ASSERT_EQ(entries->size(), 1u);
  EXPECT_EQ((*entries)[0].device_ids, std::vector<std::string>{kMig});
  EXPECT_EQ((*entries)[0].resource, "nvidia.com/mig-1g.10gb");

  // No pods: Go writes a nil slice as null; a fresh kubelet may omit nothing else.
  for (const char* empty : {R"({"Data":{"PodDeviceEntries":null,"RegisteredDevices":{}},"Checksum":1})",
                            R"({"Data":{"PodDeviceEntries":[]},"Checksum":1})", R"({"Data":{}})"}) {
    auto e = ParseCheckpoint(kgpu::testing::SignedCheckpoint(empty), "/cp");
    ASSERT_TRUE(e.ok()) << empty << ": " << e.status();
    EXPECT_TRUE(e->empty());
  }
}

TEST(AttributionCheckpointTest, ErrorsNameOriginAndProblem) {
  const std::string entry_prefix = R"({"Data":{"PodDeviceEntries":[)";
  const struct {
    std::string json;
    std::string expect;
  } cases[] = {
      {"", "/k/cp: empty file"},
      {"{\"Data\":", "/k/cp: not valid JSON: parse error"},
      {"[]", "/k/cp: expected a JSON object at the top, got array"},
      {R"({"Checksum":1})", "/k/cp: no \"Data\" object"},
      {R"({"Data":[]})", "/k/cp: \"Data\": expected an object, got array"},
      {R"({"Data":{"PodDeviceEntries":{}}})", "/k/cp: Data.PodDeviceEntries: expected a list"},
      {entry_prefix + "1]}}", "/k/cp: Data.PodDeviceEntries[0]: expected an object, got number"},
      {entry_prefix + R"({"ContainerName":"c","ResourceName":"r","DeviceIDs":[]}]}})",
       "/k/cp: Data.PodDeviceEntries[0].PodUID: missing"},
      {entry_prefix + R"({"PodUID":"","ContainerName":"c","ResourceName":"r","DeviceIDs":[]}]}})",
       "/k/cp: Data.PodDeviceEntries[0].PodUID: empty"},
      {entry_prefix + R"({"PodUID":"u","ContainerName":7,"ResourceName":"r","DeviceIDs":[]}]}})",
       "/k/cp: Data.PodDeviceEntries[0].ContainerName: expected a string, got number"},
      {entry_prefix + R"({"PodUID":"u","ContainerName":"c","ResourceName":"r"}]}})",
       "/k/cp: Data.PodDeviceEntries[0].DeviceIDs: missing"},
      {entry_prefix + R"({"PodUID":"u","ContainerName":"c","ResourceName":"r","DeviceIDs":"x"}]}})",
       "/k/cp: Data.PodDeviceEntries[0].DeviceIDs: expected a map of NUMA node"},
      {entry_prefix + R"({"PodUID":"u","ContainerName":"c","ResourceName":"r","DeviceIDs":[1]}]}})",
       "/k/cp: Data.PodDeviceEntries[0].DeviceIDs[0]: expected a device ID string, got number"},
      {entry_prefix + R"({"PodUID":"u","ContainerName":"c","ResourceName":"r",)" + R"("DeviceIDs":{"0":"GPU-x"}}]}})",
       "/k/cp: Data.PodDeviceEntries[0].DeviceIDs[\"0\"]: expected a list of device IDs"},
  };
  for (const auto& c : cases) {
    auto e = ParseCheckpoint(c.json, "/k/cp");
    ASSERT_FALSE(e.ok()) << c.json;
    EXPECT_EQ(e.status().code(), absl::StatusCode::kInvalidArgument) << c.json;
    EXPECT_EQ(std::string(e.status().message()).rfind(c.expect, 0), 0u)
        << c.json << "\n  got: " << e.status().message() << "\n  want prefix: " << c.expect;
  }
}

TEST(AttributionCheckpointTest, StripReplica) {
  EXPECT_EQ(StripReplica("GPU-x::3"), "GPU-x");
  EXPECT_EQ(StripReplica("GPU-x"), "GPU-x");
  EXPECT_EQ(StripReplica("MIG-y::0"), "MIG-y");
  EXPECT_EQ(StripReplica(""), "");
}

// ---------------------------------------------------------------- PodAttributor

struct Alloc {
  std::string uid, ns, pod, container, resource;
  std::vector<std::string> ids;
};

class PodAttributorTest : public ::testing::Test {
 protected:
  void SetUp() override {
    std::string tmpl = (fs::temp_directory_path() / "kgpu-attr-XXXXXX").string();
    ASSERT_NE(mkdtemp(tmpl.data()), nullptr);
    dir_ = tmpl;
    fs::create_directories(dir_ / "proc");
    options_.proc_root = (dir_ / "proc").string();
    options_.checkpoint_path = (dir_ / "kubelet_internal_checkpoint").string();
  }
  void TearDown() override {
    std::error_code ec;
    fs::remove_all(dir_, ec);
  }

  static void Write(const fs::path& p, const std::string& text) {
    std::ofstream out(p, std::ios::binary | std::ios::trunc);
    out << text;
  }
  void AddProcess(unsigned pid, const std::string& cgroup) {
    fs::create_directories(dir_ / "proc" / std::to_string(pid));
    Write(dir_ / "proc" / std::to_string(pid) / "cgroup", cgroup);
  }
  // Writes the checkpoint (NUMA-map shape, all on node "-1") for `allocs`.
  void WriteCheckpoint(const std::vector<Alloc>& allocs) {
    std::string json = R"({"Data":{"PodDeviceEntries":[)";
    for (size_t i = 0; i < allocs.size(); ++i) {
      const Alloc& a = allocs[i];
      json += (i ? "," : "") + std::string(R"({"PodUID":")") + a.uid + R"(","ContainerName":")" + a.container +
              R"(","ResourceName":")" + a.resource + R"(","DeviceIDs":{"-1":[)";
      for (size_t k = 0; k < a.ids.size(); ++k) json += (k ? ",\"" : "\"") + a.ids[k] + "\"";
      json += R"(]},"AllocResp":"AA=="})";
    }
    json += R"(],"RegisteredDevices":{}},"Checksum":1})";
    Write(options_.checkpoint_path, kgpu::testing::SignedCheckpoint(json));
  }
  // What PodResources List would say for `allocs` (device IDs flattened).
  static std::vector<kubelet::DeviceAllocation> Flat(const std::vector<Alloc>& allocs) {
    std::vector<kubelet::DeviceAllocation> out;
    for (const Alloc& a : allocs) {
      for (const auto& id : a.ids) out.push_back({a.resource, id, {a.ns, a.pod, a.container}});
    }
    return out;
  }
  void Serve(PodAttributor& attributor, const std::vector<Alloc>& allocs) {
    WriteCheckpoint(allocs);
    attributor.Update(Flat(allocs));
  }

  fs::path dir_;
  PodAttributor::Options options_;
};

constexpr char kGpuRes[] = "nvidia.com/gpu";

TEST_F(PodAttributorTest, ThreePodsOnOneTimeSlicedGpu) {
  const std::string g = kGpu;
  const std::vector<Alloc> allocs = {
      {kUidA, "ml", "train-0", "trainer", kGpuRes, {g + "::0"}},
      {kUidB, "ml", "infer-7", "server", kGpuRes, {g + "::1"}},
      {kUidC, "team-b", "notebook", "jupyter", kGpuRes, {g + "::2"}},
  };
  PodAttributor attributor(options_);
  Serve(attributor, allocs);
  AddProcess(101, CgroupV2Systemd(kUidA));
  AddProcess(102, "0::/kubepods/burstable/pod" + std::string(kUidB) + "/" + kCtr + "\n");
  AddProcess(103, CgroupV2Systemd(kUidC));

  EXPECT_EQ(attributor.Attribute(101, g, ""), (kubelet::PodRef{"ml", "train-0", "trainer"}));
  EXPECT_EQ(attributor.Attribute(102, g, ""), (kubelet::PodRef{"ml", "infer-7", "server"}));
  EXPECT_EQ(attributor.Attribute(103, g, ""), (kubelet::PodRef{"team-b", "notebook", "jupyter"}));
  // The same processes on another GPU belong to nobody.
  EXPECT_EQ(attributor.Attribute(101, kGpu2, ""), std::nullopt);

  EXPECT_EQ(attributor.PodsOnDevice(g),
            (std::vector<kubelet::PodRef>{
                {"ml", "infer-7", "server"}, {"ml", "train-0", "trainer"}, {"team-b", "notebook", "jupyter"}}));
  EXPECT_EQ(attributor.OwnerOf(g), std::nullopt);
  EXPECT_TRUE(attributor.PodsOnDevice(kGpu2).empty());
  EXPECT_EQ(attributor.OwnerOf(kGpu2), std::nullopt);
  EXPECT_EQ(attributor.CheckpointFailures(), 0u);
}

TEST_F(PodAttributorTest, WholeGpuHasOneOwner) {
  PodAttributor attributor(options_);
  Serve(attributor, {{kUidA, "default", "cuda", "main", kGpuRes, {kGpu, kGpu2}}});
  AddProcess(7, CgroupV2Systemd(kUidA));
  EXPECT_EQ(attributor.Attribute(7, kGpu2, ""), (kubelet::PodRef{"default", "cuda", "main"}));
  EXPECT_EQ(attributor.OwnerOf(kGpu), (kubelet::PodRef{"default", "cuda", "main"}));
  EXPECT_EQ(attributor.PodsOnDevice(kGpu2), (std::vector<kubelet::PodRef>{{"default", "cuda", "main"}}));
}

TEST_F(PodAttributorTest, MigDevice) {
  const std::string res = "nvidia.com/mig-1g.10gb";
  PodAttributor attributor(options_);
  Serve(attributor, {{kUidA, "ml", "small", "c", res, {kMig}},
                     {kUidB, "ml", "other", "c", res, {"MIG-00000000-1111-2222-3333-444444444444"}}});
  AddProcess(55, CgroupV2Systemd(kUidA));
  EXPECT_EQ(attributor.Attribute(55, kGpu, kMig), (kubelet::PodRef{"ml", "small", "c"}));
  EXPECT_EQ(attributor.Attribute(55, kGpu, "MIG-00000000-1111-2222-3333-444444444444"), std::nullopt);
  EXPECT_EQ(attributor.Attribute(55, kGpu, ""), std::nullopt);
  EXPECT_EQ(attributor.OwnerOf(kMig), (kubelet::PodRef{"ml", "small", "c"}));
  EXPECT_TRUE(attributor.PodsOnDevice(kGpu).empty());
}

TEST_F(PodAttributorTest, ProcessOutsideAnyPod) {
  PodAttributor attributor(options_);
  Serve(attributor, {{kUidA, "ml", "p", "c", kGpuRes, {std::string(kGpu) + "::0"}}});
  AddProcess(1, "0::/init.scope\n");
  AddProcess(2, "0::/system.slice/nvidia-persistenced.service\n");
  AddProcess(3, CgroupV2Systemd(kUidB));  // a pod that holds no device
  EXPECT_EQ(attributor.Attribute(1, kGpu, ""), std::nullopt);
  EXPECT_EQ(attributor.Attribute(2, kGpu, ""), std::nullopt);
  EXPECT_EQ(attributor.Attribute(3, kGpu, ""), std::nullopt);
  EXPECT_EQ(attributor.Attribute(99999, kGpu, ""), std::nullopt);  // no such process
}

TEST_F(PodAttributorTest, OldListShapeCheckpoint) {
  const std::string id = std::string(kGpu) + "::4";
  Write(options_.checkpoint_path, std::string(R"({"Data":{"PodDeviceEntries":[{"PodUID":")") + kUidC +
                                      R"(","ContainerName":"c","ResourceName":"nvidia.com/gpu","DeviceIDs":[")" + id +
                                      R"("],"AllocResp":"AA=="}],"RegisteredDevices":{}},"Checksum":9})");
  PodAttributor attributor(options_);
  attributor.Update({{kGpuRes, id, {"ns", "old", "c"}}});
  AddProcess(4, CgroupV2Systemd(kUidC));
  EXPECT_EQ(attributor.Attribute(4, kGpu, ""), (kubelet::PodRef{"ns", "old", "c"}));
}

TEST_F(PodAttributorTest, MalformedCheckpointKeepsPreviousData) {
  const std::string g = kGpu;
  const std::vector<Alloc> allocs = {{kUidA, "ml", "a", "c", kGpuRes, {g + "::0"}},
                                     {kUidB, "ml", "b", "c", kGpuRes, {g + "::1"}}};
  PodAttributor attributor(options_);
  Serve(attributor, allocs);
  AddProcess(10, CgroupV2Systemd(kUidA));
  AddProcess(11, CgroupV2Systemd(kUidB));
  ASSERT_EQ(attributor.Attribute(10, g, ""), (kubelet::PodRef{"ml", "a", "c"}));

  Write(options_.checkpoint_path, R"({"Data":{"PodDeviceEntries":[{"PodUID":)");  // torn write
  attributor.Update(Flat(allocs));
  EXPECT_EQ(attributor.CheckpointFailures(), 1u);
  EXPECT_EQ(attributor.Attribute(10, g, ""), (kubelet::PodRef{"ml", "a", "c"}));
  EXPECT_EQ(attributor.Attribute(11, g, ""), (kubelet::PodRef{"ml", "b", "c"}));

  fs::remove(options_.checkpoint_path);  // missing file: also degraded, data kept
  attributor.Update(Flat(allocs));
  EXPECT_EQ(attributor.CheckpointFailures(), 2u);
  EXPECT_EQ(attributor.Attribute(11, g, ""), (kubelet::PodRef{"ml", "b", "c"}));

  // A readable checkpoint again replaces the old data: pod a is gone.
  Serve(attributor, {allocs[1]});
  EXPECT_EQ(attributor.CheckpointFailures(), 2u);
  EXPECT_EQ(attributor.Attribute(10, g, ""), std::nullopt);
  EXPECT_EQ(attributor.Attribute(11, g, ""), (kubelet::PodRef{"ml", "b", "c"}));
}

TEST_F(PodAttributorTest, NoCheckpointYetMeansNoAttribution) {
  PodAttributor attributor(options_);
  attributor.Update({{kGpuRes, kGpu, {"ns", "p", "c"}}});
  AddProcess(5, CgroupV2Systemd(kUidA));
  EXPECT_EQ(attributor.CheckpointFailures(), 1u);
  EXPECT_EQ(attributor.Attribute(5, kGpu, ""), std::nullopt);
  EXPECT_EQ(attributor.OwnerOf(kGpu), (kubelet::PodRef{"ns", "p", "c"}));  // PodResources alone
}

TEST_F(PodAttributorTest, RequiresExactlyTheSameDevices) {
  const std::string g = kGpu;
  PodAttributor attributor(options_);
  // The checkpoint says the container holds ::0 and ::1, PodResources only ::0: no match.
  WriteCheckpoint({{kUidA, "ml", "a", "c", kGpuRes, {g + "::0", g + "::1"}}});
  attributor.Update({{kGpuRes, g + "::0", {"ml", "a", "c"}}});
  AddProcess(20, CgroupV2Systemd(kUidA));
  EXPECT_EQ(attributor.Attribute(20, g, ""), std::nullopt);
  // Same devices, other container name: no match either.
  attributor.Update({{kGpuRes, g + "::0", {"ml", "a", "other"}}, {kGpuRes, g + "::1", {"ml", "a", "other"}}});
  EXPECT_EQ(attributor.Attribute(20, g, ""), std::nullopt);
  // A stale checkpoint entry of a pod kubelet no longer lists.
  attributor.Update({});
  EXPECT_EQ(attributor.Attribute(20, g, ""), std::nullopt);
  // Kubelet splits one container's devices by NUMA node; the flat list makes that invisible.
  attributor.Update({{kGpuRes, g + "::1", {"ml", "a", "c"}}, {kGpuRes, g + "::0", {"ml", "a", "c"}}});
  EXPECT_EQ(attributor.Attribute(20, g, ""), (kubelet::PodRef{"ml", "a", "c"}));
}

TEST_F(PodAttributorTest, InitContainerDevicesReusedByAppContainer) {
  // Kubelet lets an app container reuse its init container's devices; PodResources lists only
  // the app container (plain init containers are not reported).
  const std::string id = std::string(kGpu) + "::3";
  PodAttributor attributor(options_);
  WriteCheckpoint({{kUidA, "ml", "p", "init", kGpuRes, {id}}, {kUidA, "ml", "p", "main", kGpuRes, {id}}});
  attributor.Update({{kGpuRes, id, {"ml", "p", "main"}}});
  AddProcess(30, CgroupV2Systemd(kUidA));
  EXPECT_EQ(attributor.Attribute(30, kGpu, ""), (kubelet::PodRef{"ml", "p", "main"}));
  // Were both listed (a sidecar, which PodResources reports), the container would be unclear.
  attributor.Update({{kGpuRes, id, {"ml", "p", "main"}}, {kGpuRes, id, {"ml", "p", "init"}}});
  EXPECT_EQ(attributor.Attribute(30, kGpu, ""), (kubelet::PodRef{"ml", "p", ""}));
}

TEST_F(PodAttributorTest, TwoContainersOfOnePodOnOneGpu) {
  const std::string g = kGpu;
  PodAttributor attributor(options_);
  Serve(attributor, {{kUidA, "ml", "p", "a", kGpuRes, {g + "::0"}}, {kUidA, "ml", "p", "b", kGpuRes, {g + "::1"}}});
  AddProcess(40, CgroupV2Systemd(kUidA));
  // The cgroup's container ID cannot tell "a" from "b": the pod, without a container.
  EXPECT_EQ(attributor.Attribute(40, g, ""), (kubelet::PodRef{"ml", "p", ""}));
  EXPECT_EQ(attributor.OwnerOf(g), (kubelet::PodRef{"ml", "p", ""}));
  EXPECT_EQ(attributor.PodsOnDevice(g).size(), 2u);
}

TEST_F(PodAttributorTest, UpdateWhileReading) {
  const std::string g = kGpu;
  const std::vector<Alloc> allocs = {{kUidA, "ml", "a", "c", kGpuRes, {g + "::0"}}};
  PodAttributor attributor(options_);
  Serve(attributor, allocs);
  AddProcess(50, CgroupV2Systemd(kUidA));
  std::atomic<bool> stop{false};
  std::thread writer([&] {
    while (!stop.load()) attributor.Update(Flat(allocs));
  });
  for (int i = 0; i < 300; ++i) {
    ASSERT_EQ(attributor.Attribute(50, g, ""), (kubelet::PodRef{"ml", "a", "c"}));
    ASSERT_EQ(attributor.OwnerOf(g), (kubelet::PodRef{"ml", "a", "c"}));
  }
  stop = true;
  writer.join();
}

// ---------------------------------------------------------------- kubelet::ListPodResources

class PodResourcesTest : public ::testing::Test {
 protected:
  void SetUp() override {
    std::string tmpl = (fs::temp_directory_path() / "kgpu-pr-XXXXXX").string();
    ASSERT_NE(mkdtemp(tmpl.data()), nullptr);
    dir_ = tmpl;
    socket_ = (dir_ / "kubelet.sock").string();
  }
  void TearDown() override {
    std::error_code ec;
    fs::remove_all(dir_, ec);
  }
  fs::path dir_;
  std::string socket_;
};

TEST_F(PodResourcesTest, ListReadsTheServer) {
  kgpu::testing::FakePodResources server(socket_);
  ASSERT_TRUE(server.Start().ok());
  v1::ListPodResourcesResponse answer;
  const std::string g = kGpu;
  kgpu::testing::AddDevices(answer, "ml", "train-0", "trainer", kGpuRes, {g + "::0"}, 0);
  kgpu::testing::AddDevices(answer, "ml", "train-0", "trainer", kGpuRes, {kGpu2}, 1);  // NUMA 1
  kgpu::testing::AddDevices(answer, "ml", "train-0", "sidecar", "example.com/nic", {"nic0"});
  kgpu::testing::AddDevices(answer, "team-b", "notebook", "jupyter", kGpuRes, {g + "::1"});
  answer.add_pod_resources()->set_name("no-devices");  // pods without devices are listed too
  server.SetListResponse(answer);

  auto list = kubelet::ListPodResources(socket_, std::chrono::seconds(5));
  ASSERT_TRUE(list.ok()) << list.status();
  EXPECT_EQ(server.ListCalls(), 1);
  ASSERT_EQ(list->size(), 4u);
  EXPECT_EQ((*list)[0].resource, kGpuRes);
  EXPECT_EQ((*list)[0].device_id, g + "::0");
  EXPECT_EQ((*list)[0].pod, (kubelet::PodRef{"ml", "train-0", "trainer"}));
  EXPECT_EQ((*list)[1].device_id, kGpu2);
  EXPECT_EQ((*list)[1].pod, (kubelet::PodRef{"ml", "train-0", "trainer"}));
  EXPECT_EQ((*list)[2].resource, "example.com/nic");
  EXPECT_EQ((*list)[2].pod, (kubelet::PodRef{"ml", "train-0", "sidecar"}));
  EXPECT_EQ((*list)[3].pod, (kubelet::PodRef{"team-b", "notebook", "jupyter"}));

  // End to end: the List answer and a checkpoint attribute a process.
  const fs::path proc = dir_ / "proc";
  fs::create_directories(proc / "77");
  std::ofstream(proc / "77" / "cgroup") << CgroupV2Systemd(kUidB);
  std::ofstream(dir_ / "cp") << kgpu::testing::SignedCheckpoint(
      Cat(R"({"Data":{"PodDeviceEntries":[{"PodUID":")", kUidB,
          R"(","ContainerName":"jupyter","ResourceName":"nvidia.com/gpu",)", R"("DeviceIDs":{"-1":[")", g,
          R"(::1"]}}]},"Checksum":1})"));
  PodAttributor attributor({.proc_root = proc.string(), .checkpoint_path = (dir_ / "cp").string()});
  attributor.Update(*std::move(list));
  EXPECT_EQ(attributor.Attribute(77, g, ""), (kubelet::PodRef{"team-b", "notebook", "jupyter"}));
  EXPECT_EQ(attributor.OwnerOf(kGpu2), (kubelet::PodRef{"ml", "train-0", "trainer"}));
}

// A periodic refresh keeps one channel (one connection to kubelet): a new one only after the
// socket was replaced (kubelet restarted) or a call failed.
TEST_F(PodResourcesTest, ClientKeepsOneChannelAcrossRefreshes) {
  auto server = std::make_unique<kgpu::testing::FakePodResources>(socket_);
  ASSERT_TRUE(server->Start().ok());
  v1::ListPodResourcesResponse answer;
  kgpu::testing::AddDevices(answer, "ml", "train-0", "trainer", kGpuRes, {kGpu2});
  server->SetListResponse(answer);
  kubelet::PodResourcesClient client(socket_);
  EXPECT_EQ(client.ChannelsCreated(), 0);
  for (int i = 0; i < 5; ++i) {
    auto list = client.List(std::chrono::seconds(5));
    ASSERT_TRUE(list.ok()) << list.status();
    ASSERT_EQ(list->size(), 1u);
  }
  EXPECT_EQ(server->ListCalls(), 5);
  EXPECT_EQ(client.ChannelsCreated(), 1);

  // Kubelet restarts: a new socket file at the same path.
  server.reset();
  server = std::make_unique<kgpu::testing::FakePodResources>(socket_);
  ASSERT_TRUE(server->Start().ok());
  server->SetListResponse(answer);
  auto after_restart = client.List(std::chrono::seconds(5));
  ASSERT_TRUE(after_restart.ok()) << after_restart.status();
  EXPECT_EQ(client.ChannelsCreated(), 2);
  ASSERT_TRUE(client.List(std::chrono::seconds(5)).ok());
  EXPECT_EQ(client.ChannelsCreated(), 2);

  // A failed call drops the channel; the next call makes a new one and succeeds.
  server->SetListStatus(absl::UnavailableError("kubelet is shutting down"));
  EXPECT_FALSE(client.List(std::chrono::seconds(5)).ok());
  server->SetListStatus(absl::OkStatus());
  ASSERT_TRUE(client.List(std::chrono::seconds(5)).ok());
  EXPECT_EQ(client.ChannelsCreated(), 3);
  EXPECT_EQ(server->ListCalls(), 4);
}

TEST_F(PodResourcesTest, MissingSocketSaysWhatToMount) {
  auto list = kubelet::ListPodResources(socket_, std::chrono::seconds(1));
  ASSERT_FALSE(list.ok());
  EXPECT_EQ(list.status().code(), absl::StatusCode::kNotFound);
  const std::string msg(list.status().message());
  EXPECT_NE(msg.find(socket_), std::string::npos) << msg;
  EXPECT_NE(msg.find("/var/lib/kubelet/pod-resources"), std::string::npos) << msg;
}

TEST_F(PodResourcesTest, DirectoryInsteadOfSocket) {
  fs::create_directories(socket_);
  auto list = kubelet::ListPodResources(socket_, std::chrono::seconds(1));
  ASSERT_FALSE(list.ok());
  EXPECT_EQ(list.status().code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_NE(std::string(list.status().message()).find("not a unix socket"), std::string::npos);
}

TEST_F(PodResourcesTest, StaleSocketIsUnavailable) {
  // A socket file nobody listens on, as kubelet leaves behind when it stops.
  const int fd = ::socket(AF_UNIX, SOCK_STREAM, 0);
  ASSERT_GE(fd, 0);
  sockaddr_un addr{};
  addr.sun_family = AF_UNIX;
  ASSERT_LT(socket_.size(), sizeof(addr.sun_path));
  socket_.copy(addr.sun_path, socket_.size());
  ASSERT_EQ(::bind(fd, reinterpret_cast<sockaddr*>(&addr), sizeof(addr)), 0);
  ::close(fd);
  auto list = kubelet::ListPodResources(socket_, std::chrono::seconds(2));
  ASSERT_FALSE(list.ok());
  EXPECT_EQ(list.status().code(), absl::StatusCode::kUnavailable) << list.status();
  const std::string msg(list.status().message());
  EXPECT_NE(msg.find("unix:" + socket_), std::string::npos) << msg;
  EXPECT_NE(msg.find("is it running?"), std::string::npos) << msg;
}

TEST_F(PodResourcesTest, ServerErrorAndDeadline) {
  kgpu::testing::FakePodResources server(socket_);
  ASSERT_TRUE(server.Start().ok());
  server.SetListStatus(absl::ResourceExhaustedError("rejected by the rate limiter"));
  auto list = kubelet::ListPodResources(socket_, std::chrono::seconds(5));
  ASSERT_FALSE(list.ok());
  EXPECT_EQ(list.status().code(), absl::StatusCode::kResourceExhausted);
  EXPECT_NE(std::string(list.status().message()).find("rejected by the rate limiter"), std::string::npos);
  EXPECT_EQ(server.ListCalls(), 1);

  server.SetListStatus(absl::OkStatus());
  server.SetListDelay(std::chrono::seconds(5));
  list = kubelet::ListPodResources(socket_, std::chrono::milliseconds(100));
  ASSERT_FALSE(list.ok());
  EXPECT_EQ(list.status().code(), absl::StatusCode::kDeadlineExceeded) << list.status();
  EXPECT_NE(std::string(list.status().message()).find(socket_), std::string::npos);
}

}  // namespace
}  // namespace kgpu::exporter
