#include "deviceplugin/kubelet_checkpoint.h"

#include <nlohmann/json.hpp>

#include "common/kubelet_checksum.h"
#include "common/strings.h"

namespace kgpu::deviceplugin {

absl::StatusOr<std::vector<std::string>> RegisteredResources(std::string_view json, std::string_view origin) {
  const nlohmann::json doc = nlohmann::json::parse(json, nullptr, /*allow_exceptions=*/false);
  if (doc.is_discarded()) return absl::InvalidArgumentError(Cat(origin, ": not valid JSON"));
  if (!doc.is_object() || !doc.contains("Data") || !doc["Data"].is_object()) {
    return absl::InvalidArgumentError(Cat(origin, ": no \"Data\" object (not a kubelet device-manager checkpoint)"));
  }
  if (auto st = VerifyKubeletCheckpoint(doc, origin); !st.ok()) return st;
  const auto& data = doc["Data"];
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

}  // namespace kgpu::deviceplugin
