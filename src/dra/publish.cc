#include "dra/publish.h"

#include <map>

#include "common/log.h"
#include "common/strings.h"
#include "k8s/client.h"
#include "k8s/resources.h"

namespace kgpu::dra {
namespace {

using json = nlohmann::json;

// A slice's spec without the pool's generation and the taints' timeAdded (the API server sets it):
// what decides whether the pool changed.
json Comparable(json spec) {
  if (!spec.is_object()) return spec;
  if (spec.contains("pool") && spec["pool"].is_object()) spec["pool"].erase("generation");
  if (spec.contains("devices") && spec["devices"].is_array()) {
    for (auto& d : spec["devices"]) {
      if (!d.is_object() || !d.contains("taints") || !d["taints"].is_array()) continue;
      for (auto& t : d["taints"]) {
        if (t.is_object()) t.erase("timeAdded");
      }
    }
  }
  return spec;
}

// A taint that stays keeps the time it was added (eviction's tolerationSeconds count from it).
void KeepTimesAdded(api::dra::ResourceSlice& slice, const json& existing) {
  std::map<std::string, std::string> added;  // device/key/value/effect -> timeAdded
  for (const auto& d : k8s::Field(existing, "spec").value("devices", json::array())) {
    for (const auto& t : d.value("taints", json::array())) {
      added[Cat(d.value("name", ""), "/", t.value("key", ""), "/", t.value("value", ""), "/", t.value("effect", ""))] =
          t.value("timeAdded", "");
    }
  }
  for (auto& d : slice.devices) {
    for (auto& t : d.taints) {
      const auto it = added.find(Cat(d.name, "/", t.key, "/", t.value, "/", t.effect));
      if (t.time_added.empty() && it != added.end()) t.time_added = it->second;
    }
  }
}

}  // namespace

SlicePublisher::SlicePublisher(std::shared_ptr<k8s::Client> client, std::string driver, std::string node)
    : client_(std::move(client)), driver_(std::move(driver)), node_(std::move(node)) {}

absl::StatusOr<PublishResult> SlicePublisher::Publish(std::vector<api::dra::ResourceSlice> slices) {
  const k8s::Resource* rs = k8s::FindResource("resourceslices");
  k8s::ListOptions lo;
  lo.field_selector = Cat("spec.nodeName=", node_, ",spec.driver=", driver_);
  auto list = client_->List(rs->Path(), lo);
  if (!list.ok()) return absl::Status(list.status().code(), Cat("listing ResourceSlices: ", list.status().message()));
  std::map<std::string, json> existing;  // name -> object
  int64_t generation = 0;
  for (const auto& item : list->value("items", json::array())) {
    existing[k8s::Field(item, "metadata").value("name", "")] = item;
    generation = std::max<int64_t>(generation, k8s::Field(k8s::Field(item, "spec"), "pool").value("generation", 0));
  }
  // Unchanged: the same names with the same specs, all at one generation (a publish cut short leaves
  // some slices behind, which the next one must finish). A spec the API server stored without some
  // fields (a feature gate off) compares with what it stored the last time we wrote the same thing.
  std::vector<json> desired;
  for (const auto& s : slices) desired.push_back(Comparable(api::dra::ToJson(s)["spec"]));
  bool same = existing.size() == slices.size();
  for (size_t i = 0; i < slices.size() && same; ++i) {
    const auto it = existing.find(slices[i].name);
    if (it == existing.end()) {
      same = false;
      break;
    }
    const json have = Comparable(k8s::Field(it->second, "spec"));
    const int64_t g = k8s::Field(k8s::Field(it->second, "spec"), "pool").value("generation", int64_t{0});
    const auto stored = stored_.find(slices[i].name);
    same = g == generation &&
           (have == desired[i] || (desired == last_desired_ && stored != stored_.end() && stored->second == have));
  }
  PublishResult result;
  result.generation = generation;
  if (same) return result;
  if (node_uid_.empty() && !slices.empty()) {
    auto node = client_->Get(k8s::FindResource("nodes")->Path("", node_));
    if (!node.ok()) {
      return absl::Status(node.status().code(),
                          Cat("reading Node ", node_, " (the owner of its ResourceSlices): ", node.status().message()));
    }
    node_uid_ = k8s::Field(*node, "metadata").value("uid", "");
  }
  result.changed = true;
  result.generation = generation + 1;
  for (auto& s : slices) {
    s.generation = result.generation;
    const auto it = existing.find(s.name);
    if (it != existing.end()) KeepTimesAdded(s, it->second);
    json obj = api::dra::ToJson(s);
    obj["metadata"]["ownerReferences"] = json::array(
        {{{"apiVersion", "v1"}, {"kind", "Node"}, {"name", node_}, {"uid", node_uid_}, {"controller", true}}});
    absl::StatusOr<json> wrote;
    if (it == existing.end()) {
      wrote = client_->Create(rs->Path(), obj);
    } else {
      obj["metadata"]["resourceVersion"] = k8s::Field(it->second, "metadata").value("resourceVersion", "");
      wrote = client_->Update(rs->Path("", s.name), obj);
      existing.erase(it);
    }
    if (!wrote.ok()) {
      return absl::Status(wrote.status().code(), Cat("writing ResourceSlice ", s.name, ": ", wrote.status().message()));
    }
    const json got = Comparable(k8s::Field(*wrote, "spec"));
    if (got != Comparable(obj["spec"]) && !warned_dropped_) {
      Log("dra")->error(
          "the API server stored ResourceSlice {} without some of its fields: a DRA feature gate is off (device "
          "taints need DRADeviceTaints, shares DRAConsumableCapacity, dynamic MIG DRAPartitionableDevices); what "
          "depends on them does not work until it is on",
          s.name);
      warned_dropped_ = true;
    }
    stored_[s.name] = got;
    ++result.written;
  }
  last_desired_ = desired;
  for (const auto& [name, obj] : existing) {
    stored_.erase(name);
    auto del = client_->Delete(rs->Path("", name));
    if (!del.ok() && del.status().code() != absl::StatusCode::kNotFound) {
      return absl::Status(del.status().code(), Cat("deleting ResourceSlice ", name, ": ", del.status().message()));
    }
    ++result.deleted;
  }
  return result;
}

absl::Status SlicePublisher::Withdraw() {
  auto r = Publish({});
  return r.ok() ? absl::OkStatus() : r.status();
}

}  // namespace kgpu::dra
