#include "k8s/patch.h"

#include <algorithm>
#include <map>
#include <string>

#include "common/strings.h"

namespace kgpu::k8s {
namespace {
using json = nlohmann::json;

// patchMergeKey of the lists in the core kinds we serve (k8s.io/api/core/v1 types.go,
// `patchStrategy:"merge" patchMergeKey:"..."`). Lists not named here are replaced whole, as
// strategic merge patch does for lists without a merge strategy (e.g. tolerations).
const std::map<std::string, std::string, std::less<>>& MergeKeys() {
  static const std::map<std::string, std::string, std::less<>> keys = {
      {"containers", "name"}, {"initContainers", "name"},    {"ephemeralContainers", "name"}, {"env", "name"},
      {"volumes", "name"},    {"volumeMounts", "mountPath"}, {"ports", "containerPort"},      {"conditions", "type"},
      {"taints", "key"},      {"imagePullSecrets", "name"},  {"ownerReferences", "uid"},      {"addresses", "type"},
      {"hostAliases", "ip"},  {"resourceClaims", "name"},    {"volumeDevices", "devicePath"},
  };
  return keys;
}

// Lists of scalars merged as sets (`patchStrategy:"merge"` on []string): finalizers.
bool IsMergedScalarList(std::string_view field) {
  return field == "finalizers";
}

absl::StatusOr<json> Strategic(json target, const json& patch);

absl::StatusOr<json> MergeList(const json& target, const json& patch, const std::string& key) {
  json out = target.is_array() ? target : json::array();
  for (const auto& item : patch) {
    if (!item.is_object() || !item.contains(key)) {
      // An item without its merge key cannot be matched; the apiserver rejects it.
      return absl::InvalidArgumentError(Cat("strategic merge patch: list item without merge key '", key, "'"));
    }
    const bool del = item.contains("$patch") && item["$patch"] == "delete";
    auto it = std::find_if(out.begin(), out.end(),
                           [&](const json& e) { return e.is_object() && e.contains(key) && e[key] == item[key]; });
    if (del) {
      if (it != out.end()) out.erase(it);
      continue;
    }
    if (it == out.end()) {
      json fresh = item;
      auto merged = Strategic(json::object(), fresh);
      if (!merged.ok()) return merged.status();
      out.push_back(*merged);
    } else {
      auto merged = Strategic(*it, item);
      if (!merged.ok()) return merged.status();
      *it = *merged;
    }
  }
  return out;
}

absl::StatusOr<json> Strategic(json target, const json& patch) {
  if (!patch.is_object()) return patch;
  if (!target.is_object()) target = json::object();
  if (patch.contains("$patch")) {
    const auto& p = patch["$patch"];
    if (p == "replace") {
      json copy = patch;
      copy.erase("$patch");
      return copy;
    }
    if (p == "delete") return json();  // caller drops it
  }
  for (auto it = patch.begin(); it != patch.end(); ++it) {
    const std::string& k = it.key();
    if (k == "$patch" || k == "$retainKeys" || k.rfind("$setElementOrder/", 0) == 0) continue;
    if (k.rfind("$deleteFromPrimitiveList/", 0) == 0) {
      const std::string field = k.substr(std::string_view("$deleteFromPrimitiveList/").size());
      if (target.contains(field) && target[field].is_array() && it->is_array()) {
        json kept = json::array();
        for (const auto& e : target[field]) {
          if (std::find(it->begin(), it->end(), e) == it->end()) kept.push_back(e);
        }
        target[field] = kept;
      }
      continue;
    }
    const json& v = *it;
    if (v.is_null()) {
      target.erase(k);
    } else if (v.is_object()) {
      if (v.contains("$patch") && v["$patch"] == "delete") {
        target.erase(k);
        continue;
      }
      auto merged = Strategic(target.contains(k) ? target[k] : json::object(), v);
      if (!merged.ok()) return merged.status();
      target[k] = *merged;
    } else if (v.is_array()) {
      auto mk = MergeKeys().find(k);
      bool items_are_objects = !v.empty() && v.front().is_object();
      if (mk != MergeKeys().end() && (items_are_objects || v.empty())) {
        // A list directive `[{"$patch": "replace"}]` replaces the whole list.
        bool replace = false;
        json items = json::array();
        for (const auto& e : v) {
          if (e.is_object() && e.size() == 1 && e.contains("$patch") && e["$patch"] == "replace") {
            replace = true;
          } else {
            items.push_back(e);
          }
        }
        if (replace) {
          target[k] = items;
          continue;
        }
        auto merged = MergeList(target.contains(k) ? target[k] : json::array(), items, mk->second);
        if (!merged.ok()) return merged.status();
        target[k] = *merged;
      } else if (IsMergedScalarList(k)) {
        json out = target.contains(k) && target[k].is_array() ? target[k] : json::array();
        for (const auto& e : v) {
          if (std::find(out.begin(), out.end(), e) == out.end()) out.push_back(e);
        }
        target[k] = out;
      } else {
        target[k] = v;
      }
    } else {
      target[k] = v;
    }
  }
  return target;
}

// RFC 6901 pointer parse with a message instead of an exception.
absl::StatusOr<json::json_pointer> Pointer(const json& op, std::string_view field, size_t index) {
  const std::string key(field);
  if (!op.contains(key) || !op[key].is_string()) {
    return absl::InvalidArgumentError(Cat("json patch operation ", index, ": missing '", field, "'"));
  }
  try {
    return json::json_pointer(op[key].get<std::string>());
  } catch (const json::exception& e) {
    return absl::InvalidArgumentError(Cat("json patch operation ", index, ": bad ", field, ": ", e.what()));
  }
}

// "add" of RFC 6902: into an object sets the member, into an array inserts at the index or
// appends for "-".
absl::Status Add(json& doc, const json::json_pointer& ptr, const json& value, size_t index) {
  if (ptr.empty()) {
    doc = value;
    return absl::OkStatus();
  }
  const json::json_pointer parent = ptr.parent_pointer();
  const std::string last = ptr.back();
  if (!doc.contains(parent)) {
    return absl::InvalidArgumentError(
        Cat("json patch operation ", index, ": path '", parent.to_string(), "' does not exist"));
  }
  json& p = doc[parent];
  if (p.is_object()) {
    p[last] = value;
  } else if (p.is_array()) {
    if (last == "-") {
      p.push_back(value);
    } else {
      size_t pos = 0;
      try {
        pos = std::stoul(last);
      } catch (...) {
        return absl::InvalidArgumentError(Cat("json patch operation ", index, ": bad array index '", last, "'"));
      }
      if (pos > p.size())
        return absl::InvalidArgumentError(Cat("json patch operation ", index, ": index ", pos, " out of range"));
      p.insert(p.begin() + static_cast<std::ptrdiff_t>(pos), value);
    }
  } else {
    return absl::InvalidArgumentError(
        Cat("json patch operation ", index, ": '", parent.to_string(), "' is not a container"));
  }
  return absl::OkStatus();
}

absl::Status Remove(json& doc, const json::json_pointer& ptr, size_t index) {
  if (ptr.empty() || !doc.contains(ptr)) {
    return absl::InvalidArgumentError(
        Cat("json patch operation ", index, ": path '", ptr.to_string(), "' does not exist"));
  }
  json& p = doc[ptr.parent_pointer()];
  if (p.is_object()) {
    p.erase(ptr.back());
  } else {
    p.erase(static_cast<size_t>(std::stoul(ptr.back())));
  }
  return absl::OkStatus();
}

}  // namespace

json MergePatch(json target, const json& patch) {
  if (!patch.is_object()) return patch;
  if (!target.is_object()) target = json::object();
  for (auto it = patch.begin(); it != patch.end(); ++it) {
    if (it->is_null()) {
      target.erase(it.key());
    } else {
      target[it.key()] = MergePatch(target.contains(it.key()) ? target[it.key()] : json(), *it);
    }
  }
  return target;
}

absl::StatusOr<json> JsonPatch(json target, const json& ops) {
  if (!ops.is_array()) return absl::InvalidArgumentError("json patch: the body must be a JSON array of operations");
  for (size_t i = 0; i < ops.size(); ++i) {
    const json& op = ops[i];
    if (!op.is_object() || !op.contains("op") || !op["op"].is_string()) {
      return absl::InvalidArgumentError(Cat("json patch operation ", i, ": missing 'op'"));
    }
    const std::string name = op["op"];
    auto path = Pointer(op, "path", i);
    if (!path.ok()) return path.status();
    try {
      if (name == "add" || name == "replace") {
        if (!op.contains("value"))
          return absl::InvalidArgumentError(Cat("json patch operation ", i, ": missing 'value'"));
        if (name == "replace") {
          if (!target.contains(*path)) {
            return absl::InvalidArgumentError(
                Cat("json patch operation ", i, ": path '", path->to_string(), "' does not exist"));
          }
          target[*path] = op["value"];
        } else if (auto s = Add(target, *path, op["value"], i); !s.ok()) {
          return s;
        }
      } else if (name == "remove") {
        if (auto s = Remove(target, *path, i); !s.ok()) return s;
      } else if (name == "move" || name == "copy") {
        auto from = Pointer(op, "from", i);
        if (!from.ok()) return from.status();
        if (!target.contains(*from)) {
          return absl::InvalidArgumentError(
              Cat("json patch operation ", i, ": from '", from->to_string(), "' does not exist"));
        }
        json value = target[*from];
        if (name == "move") {
          if (auto s = Remove(target, *from, i); !s.ok()) return s;
        }
        if (auto s = Add(target, *path, value, i); !s.ok()) return s;
      } else if (name == "test") {
        if (!target.contains(*path) || target[*path] != op.value("value", json())) {
          return absl::InvalidArgumentError(
              Cat("json patch operation ", i, ": test failed at '", path->to_string(), "'"));
        }
      } else {
        return absl::InvalidArgumentError(Cat("json patch operation ", i, ": unknown op '", name, "'"));
      }
    } catch (const json::exception& e) {
      return absl::InvalidArgumentError(Cat("json patch operation ", i, ": ", e.what()));
    } catch (const std::exception& e) {
      return absl::InvalidArgumentError(Cat("json patch operation ", i, ": ", e.what()));
    }
  }
  return target;
}

absl::StatusOr<json> StrategicMergePatch(json target, const json& patch, std::string_view /*kind*/) {
  if (!patch.is_object()) return absl::InvalidArgumentError("strategic merge patch: the body must be a JSON object");
  return Strategic(std::move(target), patch);
}

absl::StatusOr<json> ApplyPatch(const json& target, const json& patch, std::string_view content_type,
                                std::string_view kind) {
  const std::string_view base = content_type.substr(0, content_type.find(';'));
  if (base == kMergePatch) {
    if (!patch.is_object()) return absl::InvalidArgumentError("merge patch: the body must be a JSON object");
    return MergePatch(target, patch);
  }
  if (base == kJsonPatch) return JsonPatch(target, patch);
  if (base == kStrategicMergePatch) return StrategicMergePatch(target, patch, kind);
  return absl::InvalidArgumentError(Cat("unsupported patch type '", content_type, "'"));
}

}  // namespace kgpu::k8s
