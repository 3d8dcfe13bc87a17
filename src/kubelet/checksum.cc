#include "kubelet/checksum.h"

#include <algorithm>
#include <cstdlib>
#include <vector>

#include "absl/strings/escaping.h"
#include "common/strings.h"

namespace kgpu::kubelet {
namespace {
using json = nlohmann::json;

// A []string value: nil, or its elements bare.
bool Strings(const json& v, std::string& out) {
  if (v.is_null()) {
    out += "<nil>";
    return true;
  }
  if (!v.is_array()) return false;
  out += '[';
  for (size_t i = 0; i < v.size(); ++i) {
    if (!v[i].is_string()) return false;
    if (i > 0) out += ' ';
    out += v[i].get<std::string>();
  }
  out += ']';
  return true;
}

bool Entry(const json& e, std::string& out) {
  if (!e.is_object()) return false;
  auto str = [&](const char* key) -> std::optional<std::string> {
    const auto it = e.find(key);
    if (it == e.end() || it->is_null()) return std::string();
    if (!it->is_string()) return std::nullopt;
    return it->get<std::string>();
  };
  const auto uid = str("PodUID"), container = str("ContainerName"), resource = str("ResourceName");
  if (!uid || !container || !resource) return false;
  out += Cat("{PodUID:(string)", *uid, " ContainerName:(string)", *container, " ResourceName:(string)", *resource,
             " DeviceIDs:(checkpoint.DevicesPerNUMA)");
  const auto ids = e.find("DeviceIDs");
  if (ids == e.end() || ids->is_null()) {
    out += "<nil>";
  } else if (ids->is_object()) {
    std::vector<std::pair<int64_t, const json*>> numa;
    for (auto it = ids->begin(); it != ids->end(); ++it) {
      char* end = nullptr;
      const long long node = std::strtoll(it.key().c_str(), &end, 10);
      if (it.key().empty() || *end != '\0') return false;
      numa.emplace_back(node, &it.value());
    }
    std::sort(numa.begin(), numa.end(), [](const auto& a, const auto& b) { return a.first < b.first; });
    out += "map[";
    for (size_t i = 0; i < numa.size(); ++i) {
      if (i > 0) out += ' ';
      out += Cat(numa[i].first, ":");
      if (!Strings(*numa[i].second, out)) return false;
    }
    out += ']';
  } else {
    return false;  // the older layout (a list), or not kubelet's
  }
  out += " AllocResp:([]uint8)";
  const auto resp = e.find("AllocResp");
  if (resp == e.end() || resp->is_null()) {
    out += "<nil>";
  } else {
    if (!resp->is_string()) return false;
    std::string bytes;
    if (!absl::Base64Unescape(resp->get<std::string>(), &bytes)) return false;
    out += '[';
    for (size_t i = 0; i < bytes.size(); ++i) {
      if (i > 0) out += ' ';
      out += std::to_string(static_cast<unsigned char>(bytes[i]));
    }
    out += ']';
  }
  out += '}';
  return true;
}

}  // namespace

std::optional<uint32_t> KubeletCheckpointChecksum(const json& data) {
  if (!data.is_object()) return std::nullopt;
  std::string text = "(checkpoint.checkpointData){PodDeviceEntries:([]checkpoint.PodDevicesEntry)";
  const auto entries = data.find("PodDeviceEntries");
  if (entries == data.end() || entries->is_null()) {
    text += "<nil>";
  } else {
    if (!entries->is_array()) return std::nullopt;
    text += '[';
    for (size_t i = 0; i < entries->size(); ++i) {
      if (i > 0) text += ' ';
      if (!Entry((*entries)[i], text)) return std::nullopt;
    }
    text += ']';
  }
  text += " RegisteredDevices:(map[string][]string)";
  const auto reg = data.find("RegisteredDevices");
  if (reg == data.end() || reg->is_null()) {
    text += "<nil>";
  } else {
    if (!reg->is_object()) return std::nullopt;
    text += "map[";
    bool first = true;
    for (auto it = reg->begin(); it != reg->end(); ++it) {  // nlohmann's objects are sorted by key
      if (!first) text += ' ';
      first = false;
      text += it.key() + ":";
      if (!Strings(it.value(), text)) return std::nullopt;
    }
    text += ']';
  }
  text += '}';
  uint32_t h = 2166136261U;  // FNV-32a
  for (const char c : text) {
    h ^= static_cast<unsigned char>(c);
    h *= 16777619U;
  }
  return h;
}

absl::Status VerifyKubeletCheckpoint(const json& doc, std::string_view origin) {
  if (!doc.is_object()) return absl::OkStatus();
  const auto data = doc.find("Data");
  if (data == doc.end()) return absl::OkStatus();
  const auto want = KubeletCheckpointChecksum(*data);
  if (!want) return absl::OkStatus();  // the older layout: not verified
  const auto got = doc.find("Checksum");
  if (got == doc.end()) return absl::OkStatus();  // not kubelet's own file: the structure is checked instead
  if (!got->is_number_unsigned()) {
    return absl::FailedPreconditionError(
        Cat(origin, ": \"Checksum\" is a ", got->type_name(), ", kubelet writes an unsigned number"));
  }
  if (got->get<uint64_t>() != *want) {
    return absl::FailedPreconditionError(Cat(origin, ": checksum ", got->get<uint64_t>(),
                                             " does not match its contents (", *want,
                                             "): the file is corrupt or was edited (kubelet discards such a checkpoint "
                                             "too); it is rewritten at kubelet's next "
                                             "allocation or restart"));
  }
  return absl::OkStatus();
}

json WithKubeletChecksum(json doc) {
  if (!doc.is_object() || !doc.contains("Data")) return doc;
  if (const auto sum = KubeletCheckpointChecksum(doc["Data"])) doc["Checksum"] = *sum;
  return doc;
}

}  // namespace kgpu::kubelet
