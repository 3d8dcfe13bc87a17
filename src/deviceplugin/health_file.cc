#include "deviceplugin/health_file.h"

#include <cstdio>

#include <nlohmann/json.hpp>

#include "common/files.h"
#include "common/strings.h"

namespace kgpu::deviceplugin {

std::string HealthFileJson(const std::vector<ServedHealth>& devices) {
  nlohmann::json j;
  j["version"] = 1;
  j["devices"] = nlohmann::json::array();
  for (const auto& d : devices) {
    nlohmann::json x = {{"id", d.id}, {"gpu", d.gpu}, {"mig", d.mig}, {"healthy", d.healthy}};
    if (!d.reason.empty()) x["reason"] = d.reason;
    j["devices"].push_back(std::move(x));
  }
  return j.dump(1) + "\n";
}

absl::StatusOr<std::vector<ServedHealth>> ParseHealthFile(const std::string& text, const std::string& source) {
  const nlohmann::json j = nlohmann::json::parse(text, nullptr, /*allow_exceptions=*/false);
  if (j.is_discarded() || !j.is_object()) {
    return absl::InvalidArgumentError(Cat(source,
                                          ": not a JSON object (a kgpu device plugin writes it; delete it if "
                                          "no plugin runs)"));
  }
  const auto version = j.find("version");
  if (version == j.end() || !version->is_number_integer() || version->get<int64_t>() != 1) {
    return absl::InvalidArgumentError(Cat(source, ": \"version\" must be 1 (written by another kgpu release?)"));
  }
  const auto devices = j.find("devices");
  if (devices == j.end() || !devices->is_array()) {
    return absl::InvalidArgumentError(Cat(source, ": \"devices\" must be an array"));
  }
  std::vector<ServedHealth> out;
  for (size_t i = 0; i < devices->size(); ++i) {
    const auto& x = (*devices)[i];
    auto bad = [&](const char* what) { return absl::InvalidArgumentError(Cat(source, ": devices[", i, "]: ", what)); };
    if (!x.is_object()) return bad("not an object");
    ServedHealth d;
    const auto id = x.find("id");
    if (id == x.end() || !id->is_string() || id->get<std::string>().empty()) return bad("\"id\" must be a string");
    d.id = id->get<std::string>();
    if (const auto g = x.find("gpu"); g != x.end()) {
      if (!g->is_number_integer() || g->get<int64_t>() < -1 || g->get<int64_t>() > 1023) {
        return bad("\"gpu\" must be an integer from -1 to 1023");
      }
      d.gpu = static_cast<int>(g->get<int64_t>());
    }
    if (const auto m = x.find("mig"); m != x.end()) {
      if (!m->is_boolean()) return bad("\"mig\" must be true or false");
      d.mig = m->get<bool>();
    }
    const auto h = x.find("healthy");
    if (h == x.end() || !h->is_boolean()) return bad("\"healthy\" must be true or false");
    d.healthy = h->get<bool>();
    if (const auto r = x.find("reason"); r != x.end()) {
      if (!r->is_string()) return bad("\"reason\" must be a string");
      d.reason = r->get<std::string>();
    }
    out.push_back(std::move(d));
  }
  return out;
}

absl::Status WriteHealthFile(const std::string& kubelet_dir, const std::vector<ServedHealth>& devices) {
  const std::string path = Cat(kubelet_dir, "/", kHealthFileName);
  return WriteFileAtomically(path, HealthFileJson(devices));
}

absl::StatusOr<std::vector<ServedHealth>> ReadHealthFile(const std::string& kubelet_dir) {
  const std::string path = Cat(kubelet_dir, "/", kHealthFileName);
  auto text = ReadFile(path);
  if (!text) return absl::NotFoundError(Cat("no ", path));
  return ParseHealthFile(*text, path);
}

void RemoveHealthFile(const std::string& kubelet_dir) {
  std::remove(Cat(kubelet_dir, "/", kHealthFileName).c_str());
}

}  // namespace kgpu::deviceplugin
