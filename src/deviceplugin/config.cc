#include "deviceplugin/config.h"

#include <algorithm>
#include <fstream>
#include <sstream>

#include <fnmatch.h>

#include "api/names.h"
#include "common/files.h"
#include "common/strings.h"
#include "common/yaml_util.h"

namespace kgpu::deviceplugin {
namespace {

using yaml::At;
using yaml::CheckKeys;
using yaml::Position;
using yaml::Scalar;
using yaml::ScalarIn;

// The enumerated values of NVIDIA's config, checked where the file sets them (with a position) and
// again after flags and environment are merged (Validate).
struct Enumeration {
  const char* name;  // as in messages: the file key
  const char* flag;  // the flag and environment variable that set it too
  std::vector<const char*> allowed;
};
const Enumeration kMigStrategy{"migStrategy", "--mig-strategy / MIG_STRATEGY", {"none", "single", "mixed"}};
const Enumeration kDeviceListStrategy{"deviceListStrategy",
                                      "--device-list-strategy / DEVICE_LIST_STRATEGY",
                                      {"envvar", "volume-mounts", "cdi-annotations", "cdi-cri"}};
const Enumeration kDeviceIdStrategy{"deviceIDStrategy", "--device-id-strategy / DEVICE_ID_STRATEGY", {"uuid", "index"}};
const Enumeration kAllocationPolicy{"sharedDevicesAllocationPolicy",
                                    "--shared-devices-allocation-policy / SHARED_DEVICES_ALLOCATION_POLICY",
                                    {"distributed", "packed"}};

bool OneOf(const std::string& v, const std::vector<const char*>& allowed) {
  for (const char* a : allowed) {
    if (v == a) return true;
  }
  return false;
}

// "use none, single or mixed" (and the nearest allowed value when the given one is a near miss).
std::string Allowed(const Enumeration& e, const std::string& value) {
  std::string list;
  for (size_t i = 0; i < e.allowed.size(); ++i) {
    list += i == 0 ? "" : i + 1 == e.allowed.size() ? " or " : ", ";
    list += e.allowed[i];
  }
  const std::string near = Nearest(value, e.allowed, 2);
  return Cat("use ", list, near.empty() ? "" : Cat(" (did you mean ", near, "?)"));
}

// A value of the file that must be one of `e.allowed`.
absl::Status CheckEnum(std::string_view origin, const YAML::Node& n, const Enumeration& e, std::string_view path,
                       const std::string& value) {
  if (OneOf(value, e.allowed)) return absl::OkStatus();
  return At(origin, n.Mark(), Cat(path, " '", value, "' is invalid: ", Allowed(e, value)));
}

// Reads node[key] into *out when present.
template <typename T>
absl::Status Opt(std::string_view origin, const YAML::Node& node, const char* key, std::string_view path, T* out) {
  const YAML::Node v = node[key];
  if (!v) return absl::OkStatus();
  auto parsed = Scalar<T>(origin, v, path.empty() ? std::string(key) : Cat(path, ".", key));
  if (!parsed.ok()) return parsed.status();
  *out = *parsed;
  return absl::OkStatus();
}

#define KGPU_RETURN_IF_ERROR(expr) \
  do {                             \
    absl::Status _st = (expr);     \
    if (!_st.ok()) return _st;     \
  } while (0)

absl::StatusOr<std::chrono::milliseconds> ParseDuration(std::string_view origin, const YAML::Node& n,
                                                        std::string_view what) {
  auto text = Scalar<std::string>(origin, n, what);
  if (!text.ok()) return text.status();
  size_t used = 0;
  long long v = -1;
  try {
    v = std::stoll(*text, &used);
  } catch (const std::exception&) {
    used = 0;
  }
  const std::string unit = used > 0 ? text->substr(used) : "";
  const long long ms = unit == "ms" ? 1 : unit == "s" ? 1000 : unit == "m" ? 60000 : unit == "h" ? 3600000 : -1;
  if (used == 0 || v < 0 || ms < 0) {
    return At(origin, n.Mark(), Cat(what, " must be a duration such as 30s, 5m or 1h (got '", *text, "')"));
  }
  return std::chrono::milliseconds(v * ms);
}

absl::StatusOr<std::set<uint64_t>> XidList(std::string_view origin, const YAML::Node& n, std::string_view what) {
  if (!n.IsSequence()) return At(origin, n.Mark(), Cat(what, " must be a list of XID numbers"));
  std::set<uint64_t> out;
  for (const auto& x : n) {
    auto v = Scalar<uint64_t>(origin, x, what);
    if (!v.ok()) return v.status();
    out.insert(*v);
  }
  return out;
}

absl::Status ParseSharing(std::string_view origin, const YAML::Node& node, std::string_view path, bool mps,
                          Sharing* out, bool* present) {
  KGPU_RETURN_IF_ERROR(
      CheckKeys(origin, node, path, {"renameByDefault", "failRequestsGreaterThanOne", "memoryIsolation", "resources"}));
  Sharing s;
  s.strategy = mps ? SharingStrategy::kMps : SharingStrategy::kTimeSlicing;
  s.fail_requests_greater_than_one = mps;  // NVIDIA: true for MPS when omitted
  KGPU_RETURN_IF_ERROR(Opt(origin, node, "renameByDefault", path, &s.rename_by_default));
  KGPU_RETURN_IF_ERROR(Opt(origin, node, "failRequestsGreaterThanOne", path, &s.fail_requests_greater_than_one));
  if (const YAML::Node iso = node["memoryIsolation"]; iso) {
    std::string mode;
    KGPU_RETURN_IF_ERROR(Opt(origin, node, "memoryIsolation", path, &mode));
    if (mps) {
      return At(origin, iso.Mark(),
                Cat(path,
                    ".memoryIsolation is for timeSlicing; MPS limits each client's memory itself "
                    "(CUDA_MPS_PINNED_DEVICE_MEM_LIMIT)"));
    }
    if (mode != "none" && mode != "hard") {
      return At(origin, iso.Mark(),
                Cat(path, ".memoryIsolation '", mode,
                    "' is invalid: want none or hard (each replica held to the "
                    "GPU's memory / replicas by the CUDA interposer, docs/isolation.md)"));
    }
    s.hard_memory = mode == "hard";
  }
  const YAML::Node resources = node["resources"];
  if (!resources || !resources.IsSequence() || resources.size() == 0) {
    return At(origin, resources ? resources.Mark() : node.Mark(),
              Cat(path, ".resources must be a non-empty list of {name, replicas}"));
  }
  for (size_t i = 0; i < resources.size(); ++i) {
    const YAML::Node r = resources[i];
    const std::string rpath = Cat(path, ".resources[", i, "]");
    KGPU_RETURN_IF_ERROR(CheckKeys(origin, r, rpath, {"name", "replicas", "rename", "devices"}));
    ReplicatedResource rr;
    if (!r["name"]) return At(origin, r.Mark(), Cat(rpath, ".name is required"));
    KGPU_RETURN_IF_ERROR(Opt(origin, r, "name", rpath, &rr.name));
    if (rr.name.find('/') == std::string::npos) rr.name = "nvidia.com/" + rr.name;
    if (rr.name.size() > 63) {
      return At(origin, r["name"].Mark(), Cat(rpath, ".name must be at most 63 characters"));
    }
    if (!r["replicas"]) return At(origin, r.Mark(), Cat(rpath, ".replicas is required"));
    auto replicas = ScalarIn<int>(origin, r["replicas"], Cat(rpath, ".replicas"), 2, kMaxReplicas);
    if (!replicas.ok()) return replicas.status();
    rr.replicas = *replicas;
    rr.position = Position(origin, r.Mark());
    KGPU_RETURN_IF_ERROR(Opt(origin, r, "rename", rpath, &rr.rename));
    if (!rr.rename.empty() && rr.rename.find('/') == std::string::npos) {
      rr.rename = "nvidia.com/" + rr.rename;
    }
    for (const auto& [key, value] : {std::pair{"name", rr.name}, std::pair{"rename", rr.rename}}) {
      if (value.empty()) continue;
      const bool bad_chars =
          value.find_first_not_of("abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ0123456789-._/") !=
          std::string::npos;
      if (bad_chars || value.find("kubernetes.io/") != std::string::npos || value.back() == '/' ||
          std::count(value.begin(), value.end(), '/') != 1 || value.size() > 63) {
        return At(origin, r[key].Mark(),
                  Cat(rpath, ".", key, " '", value, "' is not an extended resource name such as nvidia.com/gpu"));
      }
    }
    if (const YAML::Node d = r["devices"]; d) {
      if (d.IsScalar() && d.Scalar() == "all") {
        // all GPUs: the default
      } else if (d.IsScalar()) {
        auto n = ScalarIn<int>(origin, d, Cat(rpath, ".devices"), 1, 1024);
        if (!n.ok()) {
          return At(origin, d.Mark(),
                    Cat(rpath,
                        ".devices must be \"all\", a count from 1 to 1024, or a list of "
                        "GPU indices, MIG indices (\"0:1\") or UUIDs (got '",
                        d.Scalar(), "')"));
        }
        for (int k = 0; k < *n; ++k) {
          rr.devices.push_back(std::to_string(k));
          rr.device_positions.push_back(Position(origin, d.Mark()));
        }
      } else if (d.IsSequence()) {
        for (const auto& x : d) {
          auto v = Scalar<std::string>(origin, x, Cat(rpath, ".devices[]"));
          if (!v.ok()) return v.status();
          rr.devices.push_back(*v);
          rr.device_positions.push_back(Position(origin, x.Mark()));
        }
      } else {
        return At(origin, d.Mark(), Cat(rpath, ".devices must be \"all\", a count or a list"));
      }
    }
    s.resources.push_back(std::move(rr));
  }
  *out = std::move(s);
  *present = true;
  return absl::OkStatus();
}

// mig: {rescanInterval, layouts: {name: [entry]}, nodes: {glob: name}}; entries in mig-parted's
// schema: {devices: all | [index], mig-enabled: bool, mig-devices: {profile: count}}.
absl::Status ParseMig(std::string_view origin, const YAML::Node& m, MigConfig* out) {
  KGPU_RETURN_IF_ERROR(CheckKeys(origin, m, "mig", {"rescanInterval", "layouts", "nodes"}));
  if (const YAML::Node r = m["rescanInterval"]; r) {
    auto d = ParseDuration(origin, r, "mig.rescanInterval");
    if (!d.ok()) return d.status();
    if (d->count() <= 0) return At(origin, r.Mark(), "mig.rescanInterval must be > 0");
    out->rescan_interval = *d;
  }
  if (const YAML::Node layouts = m["layouts"]; layouts) {
    if (!layouts.IsMap()) return At(origin, layouts.Mark(), "mig.layouts must map layout names to lists of entries");
    for (const auto& kv : layouts) {
      auto name = Scalar<std::string>(origin, kv.first, "mig.layouts key");
      if (!name.ok()) return name.status();
      const std::string path = Cat("mig.layouts.", *name);
      if (!kv.second.IsSequence() || kv.second.size() == 0) {
        return At(origin, kv.second.Mark(),
                  Cat(path, " must be a non-empty list of {devices, mig-enabled, mig-devices}"));
      }
      gpu::MigLayout layout;
      for (size_t i = 0; i < kv.second.size(); ++i) {
        const YAML::Node e = kv.second[i];
        const std::string epath = Cat(path, "[", i, "]");
        KGPU_RETURN_IF_ERROR(CheckKeys(origin, e, epath, {"devices", "mig-enabled", "mig-devices"}));
        gpu::MigLayoutEntry entry;
        out->positions[*name].push_back(Position(origin, e.Mark()));
        const YAML::Node d = e["devices"];
        if (!d) return At(origin, e.Mark(), Cat(epath, ".devices is required (all, or a list of GPU indices)"));
        if (d.IsSequence()) {
          for (const auto& x : d) {
            auto v = ScalarIn<unsigned>(origin, x, Cat(epath, ".devices[]"), 0, 1023);
            if (!v.ok()) return v.status();
            entry.devices.push_back(*v);
          }
          if (entry.devices.empty()) return At(origin, d.Mark(), Cat(epath, ".devices must not be empty"));
        } else if (!d.IsScalar() || d.Scalar() != "all") {
          return At(origin, d.Mark(), Cat(epath, ".devices must be all or a list of GPU indices"));
        }
        KGPU_RETURN_IF_ERROR(Opt(origin, e, "mig-enabled", epath, &entry.mig_enabled));
        if (const YAML::Node md = e["mig-devices"]; md) {
          if (!md.IsMap())
            return At(origin, md.Mark(), Cat(epath, ".mig-devices must map profiles to counts, e.g. {\"1g.10gb\": 7}"));
          for (const auto& p : md) {
            auto profile = Scalar<std::string>(origin, p.first, Cat(epath, ".mig-devices key"));
            if (!profile.ok()) return profile.status();
            auto count = ScalarIn<int>(origin, p.second, Cat(epath, ".mig-devices.", *profile), 0, 7);
            if (!count.ok()) return count.status();
            entry.mig_devices.emplace_back(*profile, *count);
          }
        }
        if (!entry.mig_enabled && !entry.mig_devices.empty()) {
          return At(origin, e.Mark(), Cat(epath, " has mig-enabled: false and mig-devices; drop one of them"));
        }
        layout.push_back(std::move(entry));
      }
      out->layouts[*name] = std::move(layout);
    }
  }
  if (const YAML::Node nodes = m["nodes"]; nodes) {
    if (!nodes.IsMap()) return At(origin, nodes.Mark(), "mig.nodes must map node-name patterns to layout names");
    out->nodes_position = Position(origin, nodes.Mark());
    for (const auto& kv : nodes) {
      auto pattern = Scalar<std::string>(origin, kv.first, "mig.nodes key");
      if (!pattern.ok()) return pattern.status();
      auto layout = Scalar<std::string>(origin, kv.second, Cat("mig.nodes.", *pattern));
      if (!layout.ok()) return layout.status();
      if (out->layouts.count(*layout) == 0) {
        return At(origin, kv.second.Mark(), Cat("mig.nodes.", *pattern, ": no layout '", *layout, "' in mig.layouts"));
      }
      out->nodes.emplace_back(*pattern, *layout);
    }
  }
  return absl::OkStatus();
}

absl::Status ParseRoot(std::string_view origin, const YAML::Node& root, Config* c) {
  KGPU_RETURN_IF_ERROR(
      CheckKeys(origin, root, "the config", {"version", "flags", "resources", "sharing", "imex", "health", "mig"}));
  std::string version = "v1";
  KGPU_RETURN_IF_ERROR(Opt(origin, root, "version", "", &version));
  if (version.empty()) version = "v1";
  if (version != "v1") {
    return At(origin, root["version"].Mark(), Cat("unknown version '", version, "' (expected v1)"));
  }
  if (const YAML::Node f = root["flags"]; f) {
    KGPU_RETURN_IF_ERROR(
        CheckKeys(origin, f, "flags",
                  {"migStrategy", "failOnInitError", "mpsRoot", "nvidiaDriverRoot", "nvidiaDevRoot", "gdrcopyEnabled",
                   "gdsEnabled", "mofedEnabled", "useNodeFeatureAPI", "deviceDiscoveryStrategy", "plugin", "gfd"}));
    KGPU_RETURN_IF_ERROR(Opt(origin, f, "migStrategy", "flags", &c->mig_strategy));
    if (f["migStrategy"]) {
      KGPU_RETURN_IF_ERROR(CheckEnum(origin, f["migStrategy"], kMigStrategy, "flags.migStrategy", c->mig_strategy));
      c->positions["flags.migStrategy"] = Position(origin, f["migStrategy"].Mark());
    }
    KGPU_RETURN_IF_ERROR(Opt(origin, f, "failOnInitError", "flags", &c->fail_on_init_error));
    KGPU_RETURN_IF_ERROR(Opt(origin, f, "mpsRoot", "flags", &c->mps_root));
    if (f["mpsRoot"]) c->positions["flags.mpsRoot"] = Position(origin, f["mpsRoot"].Mark());
    KGPU_RETURN_IF_ERROR(Opt(origin, f, "nvidiaDriverRoot", "flags", &c->driver_root));
    KGPU_RETURN_IF_ERROR(Opt(origin, f, "nvidiaDevRoot", "flags", &c->dev_root));
    KGPU_RETURN_IF_ERROR(Opt(origin, f, "gdrcopyEnabled", "flags", &c->gdrcopy_enabled));
    KGPU_RETURN_IF_ERROR(Opt(origin, f, "gdsEnabled", "flags", &c->gds_enabled));
    KGPU_RETURN_IF_ERROR(Opt(origin, f, "mofedEnabled", "flags", &c->mofed_enabled));
    std::string discovery = "auto";
    KGPU_RETURN_IF_ERROR(Opt(origin, f, "deviceDiscoveryStrategy", "flags", &discovery));
    if (discovery != "auto" && discovery != "nvml") {
      return At(origin, f["deviceDiscoveryStrategy"].Mark(),
                Cat("flags.deviceDiscoveryStrategy '", discovery, "' is not supported by kgpu (use auto or nvml)"));
    }
    if (const YAML::Node g = f["gfd"]; g) {
      KGPU_RETURN_IF_ERROR(CheckKeys(origin, g, "flags.gfd",
                                     {"oneshot", "noTimestamp", "sleepInterval", "outputFile", "machineTypeFile"}));
    }
    if (const YAML::Node p = f["plugin"]; p) {
      KGPU_RETURN_IF_ERROR(
          CheckKeys(origin, p, "flags.plugin",
                    {"passDeviceSpecs", "deviceListStrategy", "deviceIDStrategy", "cdiAnnotationPrefix",
                     "nvidiaCTKPath", "nvidiaCDIHookPath", "containerDriverRoot", "sharedDevicesAllocationPolicy"}));
      const std::string pp = "flags.plugin";
      KGPU_RETURN_IF_ERROR(Opt(origin, p, "passDeviceSpecs", pp, &c->pass_device_specs));
      if (const YAML::Node s = p["deviceListStrategy"]; s) {
        c->device_list_strategy.clear();
        if (s.IsSequence()) {
          for (const auto& x : s) {
            auto v = Scalar<std::string>(origin, x, "flags.plugin.deviceListStrategy[]");
            if (!v.ok()) return v.status();
            KGPU_RETURN_IF_ERROR(CheckEnum(origin, x, kDeviceListStrategy, "flags.plugin.deviceListStrategy", *v));
            c->device_list_strategy.push_back(*v);
          }
        } else {
          auto v = Scalar<std::string>(origin, s, "flags.plugin.deviceListStrategy");
          if (!v.ok()) return v.status();
          std::stringstream parts(*v);
          for (std::string item; std::getline(parts, item, ',');) {
            KGPU_RETURN_IF_ERROR(CheckEnum(origin, s, kDeviceListStrategy, "flags.plugin.deviceListStrategy", item));
            c->device_list_strategy.push_back(item);
          }
        }
        if (c->device_list_strategy.empty()) {
          return At(origin, s.Mark(),
                    Cat("flags.plugin.deviceListStrategy must name at least one strategy: ",
                        Allowed(kDeviceListStrategy, "")));
        }
      }
      KGPU_RETURN_IF_ERROR(Opt(origin, p, "deviceIDStrategy", pp, &c->device_id_strategy));
      if (p["deviceIDStrategy"]) {
        KGPU_RETURN_IF_ERROR(CheckEnum(origin, p["deviceIDStrategy"], kDeviceIdStrategy,
                                       "flags.plugin.deviceIDStrategy", c->device_id_strategy));
      }
      KGPU_RETURN_IF_ERROR(Opt(origin, p, "cdiAnnotationPrefix", pp, &c->cdi_annotation_prefix));
      KGPU_RETURN_IF_ERROR(Opt(origin, p, "nvidiaCTKPath", pp, &c->nvidia_ctk_path));
      KGPU_RETURN_IF_ERROR(Opt(origin, p, "nvidiaCDIHookPath", pp, &c->nvidia_ctk_path));
      KGPU_RETURN_IF_ERROR(Opt(origin, p, "containerDriverRoot", pp, &c->container_driver_root));
      KGPU_RETURN_IF_ERROR(Opt(origin, p, "sharedDevicesAllocationPolicy", pp, &c->shared_devices_allocation_policy));
      if (p["sharedDevicesAllocationPolicy"]) {
        KGPU_RETURN_IF_ERROR(CheckEnum(origin, p["sharedDevicesAllocationPolicy"], kAllocationPolicy,
                                       "flags.plugin.sharedDevicesAllocationPolicy",
                                       c->shared_devices_allocation_policy));
      }
    }
  }
  if (const YAML::Node r = root["resources"]; r) {
    KGPU_RETURN_IF_ERROR(CheckKeys(origin, r, "resources", {"gpus", "mig"}));
    c->warnings.push_back(Cat(origin, ": customizing the 'resources' field is not yet supported; ignoring it"));
  }
  if (const YAML::Node s = root["sharing"]; s) {
    KGPU_RETURN_IF_ERROR(CheckKeys(origin, s, "sharing", {"timeSlicing", "mps"}));
    Sharing ts, mps;
    bool has_ts = false, has_mps = false;
    if (s["timeSlicing"]) {
      KGPU_RETURN_IF_ERROR(ParseSharing(origin, s["timeSlicing"], "sharing.timeSlicing", false, &ts, &has_ts));
    }
    if (s["mps"]) {
      KGPU_RETURN_IF_ERROR(ParseSharing(origin, s["mps"], "sharing.mps", true, &mps, &has_mps));
    }
    if (has_ts && has_mps) {
      return At(origin, s.Mark(), "sharing.timeSlicing and sharing.mps cannot both be set; pick one");
    }
    if (has_mps && c->mig_strategy == "mixed") {
      return At(origin, s["mps"].Mark(),
                "sharing.mps is not supported with flags.migStrategy mixed; use none or single");
    }
    if (has_mps) c->positions["sharing.mps"] = Position(origin, s["mps"].Mark());
    if (has_ts) c->positions["sharing.timeSlicing"] = Position(origin, s["timeSlicing"].Mark());
    if (has_ts && s["timeSlicing"]["memoryIsolation"]) {
      c->positions["sharing.timeSlicing.memoryIsolation"] =
          Position(origin, s["timeSlicing"]["memoryIsolation"].Mark());
    }
    if (has_mps) {
      c->sharing = std::move(mps);
    } else if (has_ts) {
      c->sharing = std::move(ts);
    }
  }
  if (const YAML::Node i = root["imex"]; i) {
    KGPU_RETURN_IF_ERROR(CheckKeys(origin, i, "imex", {"channelIDs", "required"}));
    KGPU_RETURN_IF_ERROR(Opt(origin, i, "required", "imex", &c->imex_required));
    if (const YAML::Node ids = i["channelIDs"]; ids) {
      if (!ids.IsSequence()) return At(origin, ids.Mark(), "imex.channelIDs must be [] or [0]");
      for (const auto& x : ids) {
        auto v = ScalarIn<int>(origin, x, "imex.channelIDs[]", 0, 0);
        if (!v.ok()) return v.status();
        c->imex_channel_ids.push_back(*v);
      }
      if (c->imex_channel_ids.size() > 1 || (c->imex_channel_ids.size() == 1 && c->imex_channel_ids[0] != 0)) {
        return At(origin, ids.Mark(), "imex.channelIDs must be [] or [0]");
      }
    }
  }
  if (const YAML::Node h = root["health"]; h) {
    KGPU_RETURN_IF_ERROR(
        CheckKeys(origin, h, "health",
                  {"disabled", "ignoredXids", "fatalXids", "recoverAfter", "probeInterval", "hangThreshold"}));
    for (auto [key, out] : {std::pair{"probeInterval", &c->health.probe_interval},
                            std::pair{"hangThreshold", &c->health.hang_threshold}}) {
      if (!h[key]) continue;
      auto d = ParseDuration(origin, h[key], Cat("health.", key));
      if (!d.ok()) return d.status();
      if (d->count() <= 0) return At(origin, h[key].Mark(), Cat("health.", key, " must be > 0"));
      *out = *d;
    }
    KGPU_RETURN_IF_ERROR(Opt(origin, h, "disabled", "health", &c->health.disabled));
    if (h["ignoredXids"]) {
      auto v = XidList(origin, h["ignoredXids"], "health.ignoredXids");
      if (!v.ok()) return v.status();
      c->health.ignored_xids = *v;
    }
    if (h["fatalXids"]) {
      auto v = XidList(origin, h["fatalXids"], "health.fatalXids");
      if (!v.ok()) return v.status();
      c->health.fatal_xids = *v;
    }
    if (const YAML::Node r = h["recoverAfter"]; r) {
      if (r.IsScalar() && r.Scalar() == "never") {
        c->health.recover_after.reset();
      } else {
        auto d = ParseDuration(origin, r, "health.recoverAfter");
        if (!d.ok()) return d.status();
        c->health.recover_after = *d;
      }
    }
  }
  if (const YAML::Node m = root["mig"]; m) KGPU_RETURN_IF_ERROR(ParseMig(origin, m, &c->mig));
  return absl::OkStatus();
}

}  // namespace

absl::StatusOr<Config> ParseConfig(std::string_view text, std::string_view origin, const ParseOptions& options) {
  auto root = yaml::Load(text, origin);
  if (!root.ok()) return root.status();
  Config c;
  if (!root->IsDefined() || root->IsNull()) {
    if (options.allow_empty) return c;  // all defaults, on purpose
    const bool blank = text.find_first_not_of(" \t\r\n") == std::string_view::npos;
    return At(origin, YAML::Mark(),
              Cat(blank ? "the config file is empty" : "the config file holds no settings (only comments)",
                  ": check that --config-file / CONFIG_FILE names the intended file (a ConfigMap key that was not "
                  "mounted reads as an empty file); to run with every default on purpose, pass --allow-empty-config"));
  }
  try {
    KGPU_RETURN_IF_ERROR(ParseRoot(origin, *root, &c));
  } catch (const YAML::Exception& e) {
    return At(origin, e.mark, e.msg);
  }
  return c;
}

absl::StatusOr<Config> LoadConfigFile(const std::string& path, const ParseOptions& options) {
  auto text = ReadInputFile(path, "config file", "check --config-file / CONFIG_FILE");
  if (!text.ok()) return text.status();
  return ParseConfig(*text, path, options);
}

absl::Status Validate(const Config& c) {
  // Values from the file were checked with their position by ParseConfig; what fails here came
  // from a flag or the environment, or is a combination (the file's part named by its position).
  auto bad = [&](const char* key, std::string what) {
    const auto it = c.positions.find(key);
    return absl::InvalidArgumentError(Printable(it == c.positions.end() ? what : Cat(it->second, ": ", what)));
  };
  auto check = [&](const Enumeration& e, const std::string& value) -> absl::Status {
    if (OneOf(value, e.allowed)) return absl::OkStatus();
    return absl::InvalidArgumentError(
        Printable(Cat(e.name, " '", value, "' (", e.flag, ") is invalid: ", Allowed(e, value))));
  };
  if (auto st = check(kMigStrategy, c.mig_strategy); !st.ok()) return st;
  if (c.device_list_strategy.empty()) {
    return absl::InvalidArgumentError(Cat("deviceListStrategy (", kDeviceListStrategy.flag,
                                          ") must name at least one strategy: ", Allowed(kDeviceListStrategy, "")));
  }
  for (const auto& s : c.device_list_strategy) {
    if (auto st = check(kDeviceListStrategy, s); !st.ok()) return st;
  }
  if (auto st = check(kDeviceIdStrategy, c.device_id_strategy); !st.ok()) return st;
  if (auto st = check(kAllocationPolicy, c.shared_devices_allocation_policy); !st.ok()) return st;
  if (c.sharing.strategy == SharingStrategy::kMps) {
    if (c.mig_strategy == "mixed") return bad("sharing.mps", "using --mig-strategy=mixed is not supported with MPS");
    if (c.mps_root.empty()) return bad("sharing.mps", "MPS sharing needs --mps-root (MPS_ROOT, flags.mpsRoot)");
  }
  if (c.cuda_interposer_load != kInterposerLoadEnv && c.cuda_interposer_load != kInterposerLoadFile) {
    return absl::InvalidArgumentError(Printable(Cat("--cuda-interposer-load (KGPU_CUDA_INTERPOSER_LOAD) '",
                                                    c.cuda_interposer_load, "' is invalid: use env or ld.so.preload")));
  }
  if (c.sharing.hard_memory && c.cuda_interposer.empty()) {
    return bad("sharing.timeSlicing.memoryIsolation",
               "memoryIsolation hard needs the CUDA interposer: --cuda-interposer (KGPU_CUDA_INTERPOSER), the host "
               "path of libkgpu-cuda.so (docs/isolation.md)");
  }
  return absl::OkStatus();
}

absl::Status ApplyHealthcheckEnv(const std::string& disable, const std::string& enable, HealthConfig* health) {
  auto parse = [](const std::string& list, std::set<uint64_t>* out, bool* all) -> absl::Status {
    std::stringstream parts(list);
    for (std::string item; std::getline(parts, item, ',');) {
      item.erase(0, item.find_first_not_of(" \t"));
      item.erase(item.find_last_not_of(" \t") + 1);
      if (item.empty()) continue;
      if (item == "all" || item == "xids") {
        *all = true;
        continue;
      }
      try {
        size_t used = 0;
        const auto v = std::stoull(item, &used);
        if (used != item.size()) throw std::invalid_argument(item);
        out->insert(v);
      } catch (const std::exception&) {
        return absl::InvalidArgumentError(
            Cat("'", item, "' is not an XID number (expected a comma list, 'all' or 'xids')"));
      }
    }
    return absl::OkStatus();
  };
  bool disable_all = false, enable_all = false;
  std::set<uint64_t> extra_ignored, fatal;
  if (auto st = parse(disable, &extra_ignored, &disable_all); !st.ok()) {
    return absl::InvalidArgumentError(Cat("DP_DISABLE_HEALTHCHECKS: ", st.message()));
  }
  if (auto st = parse(enable, &fatal, &enable_all); !st.ok()) {
    return absl::InvalidArgumentError(Cat("DP_ENABLE_HEALTHCHECKS: ", st.message()));
  }
  if (disable_all) health->disabled = true;
  health->ignored_xids.insert(extra_ignored.begin(), extra_ignored.end());
  health->fatal_xids.insert(fatal.begin(), fatal.end());
  if (enable_all) {
    health->all_xids_fatal = true;
    health->disabled = false;
  }
  return absl::OkStatus();
}

absl::StatusOr<std::string> LayoutForNode(const MigConfig& mig, const std::string& node) {
  for (const auto& [pattern, layout] : mig.nodes) {
    if (fnmatch(pattern.c_str(), node.c_str(), 0) == 0) return layout;
  }
  return absl::NotFoundError(Cat("no mig.nodes pattern matches node '", node, "' (name a layout with --layout, or add ",
                                 "a pattern for this node to mig.nodes)"));
}

std::string SocketName(const std::string& resource) {
  const auto slash = resource.find('/');
  if (slash == std::string::npos) return Cat("nvidia-", resource, ".sock");
  // NVIDIA's naming for its own domain; another domain keeps its name, so a rename such as
  // kgpu.io/gpu never collides with nvidia.com/gpu's socket.
  const std::string domain = resource.substr(0, slash);
  return Cat(domain == "nvidia.com" ? std::string("nvidia") : domain, "-", resource.substr(slash + 1), ".sock");
}

gpu::HealthOptions HealthOptionsFor(const HealthConfig& health) {
  gpu::HealthOptions ho;
  ho.ignored_xids = health.all_xids_fatal ? std::set<uint64_t>{} : health.ignored_xids;
  ho.fatal_xids = health.fatal_xids;
  ho.recover_after = health.recover_after;
  ho.probe_interval = health.probe_interval;
  ho.hang_threshold = health.hang_threshold;
  return ho;
}

int ShareSlotsOf(const gpu::Gpu& g, const Config& config) {
  if (g.mig_enabled) return 0;
  for (const auto& r : config.sharing.resources) {
    if ((r.rename.empty() ? r.name : r.rename) != api::kShares || r.name != "nvidia.com/gpu") continue;
    if (r.devices.empty()) return r.replicas;
    for (const auto& d : r.devices) {
      if (d == g.uuid || d == std::to_string(g.index)) return r.replicas;
    }
  }
  return 0;
}

}  // namespace kgpu::deviceplugin
