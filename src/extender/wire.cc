#include "extender/wire.h"

#include <algorithm>
#include <cctype>
#include <cstdio>
#include <stdexcept>

#include "common/fast_json.h"
#include "common/strings.h"

namespace kgpu::extender {
namespace {
using json = nlohmann::json;

bool EqualFold(std::string_view a, std::string_view b) {
  if (a.size() != b.size()) return false;
  for (size_t i = 0; i < a.size(); ++i) {
    if (std::tolower(static_cast<unsigned char>(a[i])) != std::tolower(static_cast<unsigned char>(b[i]))) return false;
  }
  return true;
}

// The body through simdjson (ParseJsonFast); nlohmann parses again only a text simdjson rejects.
absl::StatusOr<FastJson> ParseBody(std::string_view body, std::string_view type,
                                   const std::function<bool(std::string_view)>& divert = {}) {
  auto fast = ParseJsonFast(body, divert);
  if (!fast) {
    json doc = json::parse(body.begin(), body.end(), nullptr, /*allow_exceptions=*/false);
    if (doc.is_discarded()) {
      return absl::InvalidArgumentError(Cat(type, ": the request body is not valid JSON (", body.size(), " bytes)"));
    }
    fast = FastJson{std::move(doc), {}};
  }
  if (!fast->doc.is_object())
    return absl::InvalidArgumentError(Cat(type, ": expected a JSON object, got ", fast->doc.type_name()));
  return std::move(*fast);
}

absl::StatusOr<json> ParseObject(std::string_view body, std::string_view type) {
  auto f = ParseBody(body, type);
  if (!f.ok()) return f.status();
  return std::move(f->doc);
}

// The field Go's encoding/json decodes into a struct field: the exact name, else the first
// case-insensitive match.
json::const_iterator FindField(const json& obj, std::string_view name) {
  if (auto it = obj.find(std::string(name)); it != obj.end()) return it;
  for (auto it = obj.begin(); it != obj.end(); ++it) {
    if (EqualFold(it.key(), name)) return it;
  }
  return obj.end();
}

std::string Where(std::string_view type, std::string_view field) {
  return Cat(type, ".", field);
}

// An optional []string: absent or null -> nullopt.
absl::StatusOr<std::optional<std::vector<std::string>>> OptStrings(const json& obj, std::string_view type,
                                                                   std::string_view field) {
  const json* v = Field(obj, field);
  if (v == nullptr || v->is_null()) return std::optional<std::vector<std::string>>();
  if (!v->is_array())
    return absl::InvalidArgumentError(Cat(Where(type, field), ": expected an array of strings or null"));
  std::vector<std::string> out;
  out.reserve(v->size());
  for (const auto& e : *v) {
    if (!e.is_string()) {
      return absl::InvalidArgumentError(
          Cat(Where(type, field), ": expected an array of strings, found a ", e.type_name()));
    }
    out.push_back(e.get<std::string>());
  }
  return std::optional<std::vector<std::string>>(std::move(out));
}

constexpr std::string_view kNodeNames = "NodeNames";

// An envelope with a NodeNames member (5,000 names from a large cluster's scheduler): those go
// straight into strings, without a json value per name.
absl::StatusOr<FastJson> ParseWithNodeNames(std::string_view body, std::string_view type) {
  return ParseBody(body, type, [](std::string_view key) { return EqualFold(key, kNodeNames); });
}

absl::StatusOr<std::optional<std::vector<std::string>>> NodeNamesOf(FastJson& parsed, std::string_view type) {
  if (const auto field = FindField(parsed.doc, kNodeNames); field != parsed.doc.end()) {
    for (auto& [key, strings] : parsed.strings) {
      if (key == field.key()) return std::optional<std::vector<std::string>>(std::move(strings));
    }
  }
  return OptStrings(parsed.doc, type, kNodeNames);
}

absl::StatusOr<std::string> OptString(const json& obj, std::string_view type, std::string_view field) {
  const json* v = Field(obj, field);
  if (v == nullptr || v->is_null()) return std::string();
  if (!v->is_string())
    return absl::InvalidArgumentError(Cat(Where(type, field), ": expected a string, got ", v->type_name()));
  return v->get<std::string>();
}

absl::StatusOr<json> PodOf(const json& obj, std::string_view type) {
  const json* pod = Field(obj, "Pod");
  if (pod == nullptr || pod->is_null())
    return absl::InvalidArgumentError(Cat(Where(type, "Pod"), ": missing (the pod to schedule)"));
  if (!pod->is_object())
    return absl::InvalidArgumentError(Cat(Where(type, "Pod"), ": expected a Pod object, got ", pod->type_name()));
  return *pod;
}

absl::StatusOr<std::optional<std::vector<json>>> OptNodeList(const json& obj, std::string_view type) {
  const json* nodes = Field(obj, "Nodes");
  if (nodes == nullptr || nodes->is_null()) return std::optional<std::vector<json>>();
  if (!nodes->is_object()) {
    return absl::InvalidArgumentError(
        Cat(Where(type, "Nodes"), ": expected a NodeList object or null, got ", nodes->type_name()));
  }
  std::vector<json> items;
  if (auto it = nodes->find("items"); it != nodes->end() && !it->is_null()) {
    if (!it->is_array())
      return absl::InvalidArgumentError(Cat(Where(type, "Nodes.items"), ": expected an array of Node objects"));
    for (const auto& n : *it) {
      if (!n.is_object())
        return absl::InvalidArgumentError(
            Cat(Where(type, "Nodes.items"), ": expected Node objects, found a ", n.type_name()));
      items.push_back(n);
    }
  }
  return std::optional<std::vector<json>>(std::move(items));
}

absl::StatusOr<NodeReasons> StringMap(const json& obj, std::string_view type, std::string_view field) {
  NodeReasons out;
  const json* v = Field(obj, field);
  if (v == nullptr || v->is_null()) return out;
  if (!v->is_object())
    return absl::InvalidArgumentError(Cat(Where(type, field), ": expected an object of strings or null"));
  for (auto it = v->begin(); it != v->end(); ++it) {
    if (!it->is_string())
      return absl::InvalidArgumentError(Cat(Where(type, field), ".", it.key(), ": expected a string"));
    out.Append(it.key(), it->get<std::string>());  // the keys of a json object are unique
  }
  return out;
}

absl::StatusOr<int64_t> OptInt(const json& obj, std::string_view type, std::string_view field) {
  const json* v = Field(obj, field);
  if (v == nullptr || v->is_null()) return 0;
  if (!v->is_number_integer()) return absl::InvalidArgumentError(Cat(Where(type, field), ": expected an integer"));
  return v->get<int64_t>();
}

// map[string]*MetaVictims (or *Victims when `full`).
absl::StatusOr<std::map<std::string, MetaVictims>> VictimMap(const json& v, std::string_view where, bool full) {
  std::map<std::string, MetaVictims> out;
  if (v.is_null()) return out;
  if (!v.is_object()) return absl::InvalidArgumentError(Cat(where, ": expected an object keyed by node name"));
  for (auto it = v.begin(); it != v.end(); ++it) {
    const std::string node_where = Cat(where, ".", it.key());
    if (!it->is_object()) return absl::InvalidArgumentError(Cat(node_where, ": expected a victims object"));
    MetaVictims mv;
    auto pdb = OptInt(*it, node_where, "NumPDBViolations");
    if (!pdb.ok()) return pdb.status();
    mv.num_pdb_violations = *pdb;
    const json* pods = Field(*it, "Pods");
    if (pods != nullptr && !pods->is_null()) {
      if (!pods->is_array()) return absl::InvalidArgumentError(Cat(node_where, ".Pods: expected an array"));
      for (const auto& p : *pods) {
        if (!p.is_object())
          return absl::InvalidArgumentError(Cat(node_where, ".Pods: expected objects, found a ", p.type_name()));
        std::string uid;
        if (full) {
          const auto meta = p.find("metadata");
          if (meta != p.end() && meta->is_object()) {
            if (auto u = meta->find("uid"); u != meta->end() && u->is_string()) uid = u->get<std::string>();
          }
        } else {
          auto u = OptString(p, Cat(node_where, ".Pods[]"), "UID");
          if (!u.ok()) return u.status();
          uid = *u;
        }
        if (uid.empty()) return absl::InvalidArgumentError(Cat(node_where, ".Pods: a victim without a UID"));
        mv.pod_uids.push_back(std::move(uid));
      }
    }
    out[it.key()] = std::move(mv);
  }
  return out;
}

json MetaVictimsJson(const std::map<std::string, MetaVictims>& victims) {
  json out = json::object();
  for (const auto& [node, mv] : victims) {
    json pods = json::array();
    for (const auto& uid : mv.pod_uids) pods.push_back({{"UID", uid}});
    out[node] = {{"Pods", pods}, {"NumPDBViolations", mv.num_pdb_violations}};
  }
  return out;
}

json NodeListJson(const std::vector<json>& nodes) {
  return {{"metadata", json::object()}, {"items", nodes}};
}

}  // namespace

const NodeReasons::Entry* NodeReasons::Find(std::string_view node) const {
  for (const auto& e : entries_) {
    if (e.first == node) return &e;
  }
  return nullptr;
}

std::string& NodeReasons::operator[](std::string_view node) {
  if (const Entry* e = Find(node)) return const_cast<Entry*>(e)->second;
  return entries_.emplace_back(std::string(node), std::string()).second;
}

const std::string& NodeReasons::at(std::string_view node) const {
  if (const Entry* e = Find(node)) return e->second;
  throw std::out_of_range(Cat("NodeReasons: no node ", node));
}

bool NodeReasons::operator==(const NodeReasons& o) const {
  if (size() != o.size()) return false;
  auto a = entries_, b = o.entries_;
  std::sort(a.begin(), a.end());
  std::sort(b.begin(), b.end());
  return a == b;
}

const json* Field(const json& obj, std::string_view name) {
  if (!obj.is_object()) return nullptr;
  const auto it = FindField(obj, name);
  return it == obj.end() ? nullptr : &*it;
}

absl::StatusOr<ExtenderArgs> ParseExtenderArgs(std::string_view body) {
  constexpr std::string_view kType = "ExtenderArgs";
  auto parsed = ParseWithNodeNames(body, kType);
  if (!parsed.ok()) return parsed.status();
  ExtenderArgs a;
  auto pod = PodOf(parsed->doc, kType);
  if (!pod.ok()) return pod.status();
  a.pod = std::move(*pod);
  auto nodes = OptNodeList(parsed->doc, kType);
  if (!nodes.ok()) return nodes.status();
  a.nodes = std::move(*nodes);
  auto names = NodeNamesOf(*parsed, kType);
  if (!names.ok()) return names.status();
  a.node_names = std::move(*names);
  return a;
}

absl::StatusOr<BindingArgs> ParseBindingArgs(std::string_view body) {
  constexpr std::string_view kType = "ExtenderBindingArgs";
  auto doc = ParseObject(body, kType);
  if (!doc.ok()) return doc.status();
  BindingArgs b;
  for (auto [field, dst] : {std::pair<std::string_view, std::string*>{"PodName", &b.pod_name},
                            {"PodNamespace", &b.pod_namespace},
                            {"PodUID", &b.pod_uid},
                            {"Node", &b.node}}) {
    auto v = OptString(*doc, kType, field);
    if (!v.ok()) return v.status();
    *dst = std::move(*v);
  }
  if (b.pod_name.empty()) return absl::InvalidArgumentError("ExtenderBindingArgs.PodName: missing");
  if (b.node.empty()) return absl::InvalidArgumentError("ExtenderBindingArgs.Node: missing");
  return b;
}

absl::StatusOr<PreemptionArgs> ParsePreemptionArgs(std::string_view body) {
  constexpr std::string_view kType = "ExtenderPreemptionArgs";
  auto doc = ParseObject(body, kType);
  if (!doc.ok()) return doc.status();
  PreemptionArgs a;
  auto pod = PodOf(*doc, kType);
  if (!pod.ok()) return pod.status();
  a.pod = std::move(*pod);
  const json* meta = Field(*doc, "NodeNameToMetaVictims");
  const json* full = Field(*doc, "NodeNameToVictims");
  if (meta != nullptr && !meta->is_null()) {
    auto v = VictimMap(*meta, Where(kType, "NodeNameToMetaVictims"), false);
    if (!v.ok()) return v.status();
    a.victims = std::move(*v);
  } else if (full != nullptr && !full->is_null()) {
    auto v = VictimMap(*full, Where(kType, "NodeNameToVictims"), true);
    if (!v.ok()) return v.status();
    a.victims = std::move(*v);
    a.full_victims = true;
  }
  return a;
}

absl::StatusOr<FilterResult> ParseFilterResult(std::string_view body) {
  constexpr std::string_view kType = "ExtenderFilterResult";
  auto parsed = ParseWithNodeNames(body, kType);
  if (!parsed.ok()) return parsed.status();
  const json* doc = &parsed->doc;
  FilterResult r;
  auto nodes = OptNodeList(*doc, kType);
  if (!nodes.ok()) return nodes.status();
  r.nodes = std::move(*nodes);
  auto names = NodeNamesOf(*parsed, kType);
  if (!names.ok()) return names.status();
  r.node_names = std::move(*names);
  auto failed = StringMap(*doc, kType, "FailedNodes");
  if (!failed.ok()) return failed.status();
  r.failed_nodes = std::move(*failed);
  auto unres = StringMap(*doc, kType, "FailedAndUnresolvableNodes");
  if (!unres.ok()) return unres.status();
  r.failed_and_unresolvable = std::move(*unres);
  auto err = OptString(*doc, kType, "Error");
  if (!err.ok()) return err.status();
  r.error = std::move(*err);
  return r;
}

absl::StatusOr<std::vector<HostPriority>> ParseHostPriorityList(std::string_view body) {
  if (auto pairs = ParseStringIntArrayFast(body, "Host", "Score")) {  // the usual reply, 500 or 5,000 hosts
    std::vector<HostPriority> out;
    out.reserve(pairs->size());
    for (auto& [host, score] : *pairs) out.push_back({std::move(host), score});
    return out;
  }
  auto fast = ParseJsonFast(body);
  json doc = fast ? std::move(fast->doc) : json::parse(body.begin(), body.end(), nullptr, false);
  if (doc.is_discarded()) return absl::InvalidArgumentError("HostPriorityList: not valid JSON");
  std::vector<HostPriority> out;
  if (doc.is_null()) return out;
  if (!doc.is_array()) return absl::InvalidArgumentError("HostPriorityList: expected an array");
  for (const auto& e : doc) {
    if (!e.is_object()) return absl::InvalidArgumentError("HostPriorityList: expected objects");
    HostPriority h;
    auto host = OptString(e, "HostPriority", "Host");
    if (!host.ok()) return host.status();
    auto score = OptInt(e, "HostPriority", "Score");
    if (!score.ok()) return score.status();
    out.push_back({*host, *score});
  }
  return out;
}

absl::StatusOr<std::map<std::string, MetaVictims>> ParsePreemptionResult(std::string_view body) {
  auto doc = ParseObject(body, "ExtenderPreemptionResult");
  if (!doc.ok()) return doc.status();
  const json* v = Field(*doc, "NodeNameToMetaVictims");
  if (v == nullptr) return std::map<std::string, MetaVictims>();
  return VictimMap(*v, "ExtenderPreemptionResult.NodeNameToMetaVictims", false);
}

absl::StatusOr<std::string> ParseBindingResult(std::string_view body) {
  auto doc = ParseObject(body, "ExtenderBindingResult");
  if (!doc.ok()) return doc.status();
  return OptString(*doc, "ExtenderBindingResult", "Error");
}

namespace {

// A JSON string, written straight into `out`: the verbs' replies hold one string per node (5,000
// and more), and building a json tree first costs more than the decision itself. Bytes beyond
// ASCII go through nlohmann, which replaces invalid UTF-8 as every other reply does.
void AppendString(std::string& out, std::string_view s) {
  if (std::any_of(s.begin(), s.end(), [](char c) { return static_cast<unsigned char>(c) >= 0x80; })) {
    out += json(std::string(s)).dump(-1, ' ', false, json::error_handler_t::replace);
    return;
  }
  out += '"';
  // Runs of characters that need no escape are appended whole (node names and reasons are such
  // runs from end to end).
  while (!s.empty()) {
    const size_t run = static_cast<size_t>(
        std::find_if(s.begin(), s.end(),
                     [](char c) { return c == '"' || c == '\\' || static_cast<unsigned char>(c) < 0x20; }) -
        s.begin());
    out.append(s.data(), run);
    if (run == s.size()) break;
    const char c = s[run];
    s.remove_prefix(run + 1);
    switch (c) {
      case '"':
        out += "\\\"";
        break;
      case '\\':
        out += "\\\\";
        break;
      case '\n':
        out += "\\n";
        break;
      case '\r':
        out += "\\r";
        break;
      case '\t':
        out += "\\t";
        break;
      case '\b':
        out += "\\b";
        break;
      case '\f':
        out += "\\f";
        break;
      default:
        char buf[8];
        std::snprintf(buf, sizeof buf, "\\u%04x", static_cast<unsigned>(static_cast<unsigned char>(c)));
        out += buf;
    }
  }
  out += '"';
}

void AppendStringMap(std::string& out, const NodeReasons& m) {
  out += '{';
  bool first = true;
  for (const auto& [k, v] : m) {
    if (!first) out += ',';
    first = false;
    AppendString(out, k);
    out += ':';
    AppendString(out, v);
  }
  out += '}';
}

}  // namespace

// The envelope's keys in nlohmann's (sorted) order, as json::dump wrote them; the failed nodes in
// the order they were added.
std::string EncodeFilterResult(const FilterResult& r) {
  std::string out;
  size_t reserve = 128;
  if (r.node_names) {
    for (const auto& n : *r.node_names) reserve += n.size() + 3;
  }
  for (const auto* m : {&r.failed_nodes, &r.failed_and_unresolvable}) {
    for (const auto& [k, v] : *m) reserve += k.size() + v.size() + 6;
  }
  out.reserve(reserve);
  out += "{\"Error\":";
  AppendString(out, r.error);
  out += ",\"FailedAndUnresolvableNodes\":";
  AppendStringMap(out, r.failed_and_unresolvable);
  out += ",\"FailedNodes\":";
  AppendStringMap(out, r.failed_nodes);
  out += ",\"NodeNames\":";
  if (r.node_names) {
    out += '[';
    for (size_t i = 0; i < r.node_names->size(); ++i) {
      if (i > 0) out += ',';
      AppendString(out, (*r.node_names)[i]);
    }
    out += ']';
  } else {
    out += "null";
  }
  out += ",\"Nodes\":";
  out += r.nodes ? NodeListJson(*r.nodes).dump(-1, ' ', false, json::error_handler_t::replace) : std::string("null");
  out += '}';
  return out;
}

std::string EncodeHostPriorityList(const std::vector<HostPriority>& list) {
  std::string out;
  out.reserve(list.size() * 40 + 2);
  out += '[';
  for (size_t i = 0; i < list.size(); ++i) {
    if (i > 0) out += ',';
    out += "{\"Host\":";
    AppendString(out, list[i].host);
    out += ",\"Score\":";
    out += std::to_string(list[i].score);
    out += '}';
  }
  out += ']';
  return out;
}

std::string EncodeBindingResult(const std::string& error) {
  return json{{"Error", error}}.dump(-1, ' ', false, json::error_handler_t::replace);
}

std::string EncodePreemptionResult(const std::map<std::string, MetaVictims>& victims) {
  return json{{"NodeNameToMetaVictims", MetaVictimsJson(victims)}}.dump(-1, ' ', false, json::error_handler_t::replace);
}

std::string EncodeExtenderArgs(const json& pod, const std::vector<std::string>& node_names) {
  // Keys in nlohmann's order, as json::dump wrote them; the names without a json tree (5,000 of them).
  std::string out = "{\"NodeNames\":[";
  for (size_t i = 0; i < node_names.size(); ++i) {
    if (i > 0) out += ',';
    AppendString(out, node_names[i]);
  }
  out += "],\"Nodes\":null,\"Pod\":";
  out += pod.dump();
  out += '}';
  return out;
}

std::string EncodeExtenderArgsFull(const json& pod, const std::vector<json>& nodes) {
  return json{{"Pod", pod}, {"Nodes", NodeListJson(nodes)}, {"NodeNames", nullptr}}.dump();
}

std::string EncodeBindingArgs(const BindingArgs& b) {
  return json{{"PodName", b.pod_name}, {"PodNamespace", b.pod_namespace}, {"PodUID", b.pod_uid}, {"Node", b.node}}
      .dump();
}

std::string EncodePreemptionArgs(const json& pod, const std::map<std::string, MetaVictims>& victims) {
  return json{{"Pod", pod}, {"NodeNameToVictims", nullptr}, {"NodeNameToMetaVictims", MetaVictimsJson(victims)}}.dump();
}

}  // namespace kgpu::extender
