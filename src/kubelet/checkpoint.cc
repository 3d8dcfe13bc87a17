#include "kubelet/checkpoint.h"

#include <nlohmann/json.hpp>

#include "absl/strings/escaping.h"
#include "common/strings.h"
#include "deviceplugin_v1beta1.pb.h"
#include "kubelet/checksum.h"

namespace kgpu::kubelet {

namespace {

// The checkpoint's JSON, checked to be one (a "Data" object, the checksum kubelet verifies).
absl::StatusOr<nlohmann::json> Checkpoint(std::string_view json, std::string_view origin) {
  nlohmann::json doc = nlohmann::json::parse(json, nullptr, /*allow_exceptions=*/false);
  if (doc.is_discarded()) return absl::InvalidArgumentError(Cat(origin, ": not valid JSON"));
  if (!doc.is_object() || !doc.contains("Data") || !doc["Data"].is_object()) {
    return absl::InvalidArgumentError(Cat(origin, ": no \"Data\" object (not a kubelet device-manager checkpoint)"));
  }
  if (auto st = VerifyKubeletCheckpoint(doc, origin); !st.ok()) return st;
  return doc;
}

}  // namespace

absl::StatusOr<std::set<std::string>> CheckpointedMountSources(std::string_view json, std::string_view origin) {
  auto doc = Checkpoint(json, origin);
  if (!doc.ok()) return doc.status();
  const auto& data = (*doc)["Data"];
  std::set<std::string> out;
  if (!data.contains("PodDeviceEntries") || data["PodDeviceEntries"].is_null()) return out;
  const auto& entries = data["PodDeviceEntries"];
  if (!entries.is_array()) {
    return absl::InvalidArgumentError(
        Cat(origin, ": Data.PodDeviceEntries is a ", entries.type_name(), ", expected an array"));
  }
  for (size_t i = 0; i < entries.size(); ++i) {
    const auto& e = entries[i];
    const std::string where = Cat(origin, ": Data.PodDeviceEntries[", i, "]");
    if (!e.is_object()) return absl::InvalidArgumentError(Cat(where, " is a ", e.type_name(), ", expected an object"));
    if (!e.contains("AllocResp") || e["AllocResp"].is_null()) continue;  // kubelet writes null for an empty one
    if (!e["AllocResp"].is_string()) {
      return absl::InvalidArgumentError(
          Cat(where, ".AllocResp is a ", e["AllocResp"].type_name(), ", expected base64"));
    }
    std::string bytes;
    if (!absl::Base64Unescape(e["AllocResp"].get_ref<const std::string&>(), &bytes)) {
      return absl::InvalidArgumentError(Cat(where, ".AllocResp is not base64"));
    }
    v1beta1::ContainerAllocateResponse resp;
    if (!resp.ParseFromString(bytes)) {
      return absl::InvalidArgumentError(Cat(where, ".AllocResp is not a ContainerAllocateResponse"));
    }
    for (const auto& m : resp.mounts()) out.insert(m.host_path());
  }
  return out;
}

absl::StatusOr<std::vector<std::string>> RegisteredResources(std::string_view json, std::string_view origin) {
  auto doc = Checkpoint(json, origin);
  if (!doc.ok()) return doc.status();
  const auto& data = (*doc)["Data"];
  std::vector<std::string> out;
  if (!data.contains("RegisteredDevices") || data["RegisteredDevices"].is_null()) return out;
  const auto& registered = data["RegisteredDevices"];
  if (!registered.is_object()) {
    return absl::InvalidArgumentError(Cat(origin, ": Data.RegisteredDevices is a ", registered.type_name(),
                                          ", expected an object of resource name -> device IDs"));
  }
  for (const auto& [name, ids] : registered.items()) out.push_back(name);
  return out;
}

}  // namespace kgpu::kubelet
