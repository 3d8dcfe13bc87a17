#include "exporter/attribution.h"

#include <algorithm>
#include <array>
#include <cerrno>
#include <cstdlib>
#include <filesystem>
#include <map>
#include <set>
#include <system_error>
#include <tuple>
#include <unordered_map>
#include <utility>

#include <fcntl.h>
#include <nlohmann/json.hpp>
#include <unistd.h>

#include "absl/status/status.h"
#include "api/share_cdi.h"
#include "common/log.h"
#include "common/strings.h"
#include "kubelet/checksum.h"

namespace kgpu::exporter {
namespace {

constexpr size_t kMaxCgroupFile = size_t{64} * 1024;
constexpr size_t kMaxJobFile = size_t{64} * 1024;
constexpr size_t kMaxShareSpecFile = size_t{64} * 1024;
constexpr size_t kMaxCheckpointFile = size_t{64} * 1024 * 1024;

bool IsHex(char c) {
  return (c >= '0' && c <= '9') || (c >= 'a' && c <= 'f') || (c >= 'A' && c <= 'F');
}

bool StartsWith(std::string_view s, std::string_view prefix) {
  return s.size() >= prefix.size() && s.substr(0, prefix.size()) == prefix;
}

bool EndsWith(std::string_view s, std::string_view suffix) {
  return s.size() >= suffix.size() && s.substr(s.size() - suffix.size()) == suffix;
}

// A pod UID as it appears in a cgroup name: 32 hex digits, separated by `sep` ('-' for
// cgroupfs, '_' for systemd, which uses '-' for its slice hierarchy). Returned with '-'.
std::optional<std::string> PodUid(std::string_view raw, char sep) {
  std::string uid;
  int hex = 0;
  for (char c : raw) {
    if (IsHex(c)) {
      ++hex;
      uid.push_back(c);
    } else if (c == sep) {
      uid.push_back('-');
    } else {
      return std::nullopt;
    }
  }
  if (hex != 32 || uid.front() == '-' || uid.back() == '-') return std::nullopt;
  return uid;
}

// "pod<uid>" (cgroupfs) or "<...kubepods...>-pod<uid_>.slice" (systemd).
std::optional<std::string> PodFromComponent(std::string_view c) {
  if (StartsWith(c, "pod")) return PodUid(c.substr(3), '-');
  if (!EndsWith(c, ".slice")) return std::nullopt;
  c.remove_suffix(6);
  const size_t at = c.rfind("-pod");
  if (at == std::string_view::npos) return std::nullopt;
  if (c.substr(0, at).find("kubepods") == std::string_view::npos) return std::nullopt;
  return PodUid(c.substr(at + 4), '_');
}

// "<id>", "cri-containerd-<id>.scope", "crio-<id>", "docker-<id>.scope", ...: the hex ID.
std::string ContainerFromComponent(std::string_view c) {
  if (EndsWith(c, ".scope")) c.remove_suffix(6);
  for (std::string_view prefix : {"cri-containerd-", "containerd-", "crio-", "docker-"}) {
    if (StartsWith(c, prefix)) {
      c.remove_prefix(prefix.size());
      break;
    }
  }
  if (c.size() < 12 || c.size() > 128 || !std::all_of(c.begin(), c.end(), IsHex)) return {};
  return std::string(c);
}

std::vector<std::string_view> Split(std::string_view s, char sep) {
  std::vector<std::string_view> out;
  size_t start = 0;
  while (true) {
    const size_t end = s.find(sep, start);
    out.push_back(s.substr(start, end == std::string_view::npos ? std::string_view::npos : end - start));
    if (end == std::string_view::npos) break;
    start = end + 1;
  }
  return out;
}

std::optional<CgroupInfo> ParseCgroupPath(std::string_view path) {
  // Components, with "a.slice:cri-containerd:<id>" (the cgroupsPath of a runtime using the
  // systemd driver, left literal by one using cgroupfs) split into its parts.
  std::vector<std::string_view> tokens;
  for (std::string_view component : Split(path, '/')) {
    for (std::string_view part : Split(component, ':')) {
      if (part.empty() || part == "cri-containerd" || part == "crio" || part == "docker") continue;
      tokens.push_back(part);
    }
  }
  // The innermost pod (kubelet-in-a-pod setups nest one pod's cgroups inside another's).
  for (size_t i = tokens.size(); i-- > 0;) {
    auto uid = PodFromComponent(tokens[i]);
    if (!uid) continue;
    CgroupInfo info{std::move(*uid), {}};
    if (i + 1 < tokens.size()) info.container_id = ContainerFromComponent(tokens[i + 1]);
    return info;
  }
  return std::nullopt;
}

// Kubelet's checkpoint field path in error messages.
std::string Where(size_t i, const char* field) {
  return Cat("Data.PodDeviceEntries[", i, "].", field);
}

// The whole file (also /proc files, whose size reads as 0); errors start with the path.
absl::StatusOr<std::string> ReadSmallFile(const std::string& path, size_t limit) {
  const int fd = ::open(path.c_str(), O_RDONLY | O_CLOEXEC);
  if (fd < 0) {
    const int err = errno;
    const std::string why = Cat(path, ": ", std::error_code(err, std::generic_category()).message());
    return err == ENOENT ? absl::NotFoundError(why) : absl::UnavailableError(why);
  }
  std::string text;
  char buf[8192];
  absl::Status status;
  while (true) {
    const ssize_t n = ::read(fd, buf, sizeof buf);
    if (n < 0) {
      if (errno == EINTR) continue;
      status = absl::DataLossError(Cat(path, ": ", std::error_code(errno, std::generic_category()).message()));
      break;
    }
    if (n == 0) break;
    text.append(buf, static_cast<size_t>(n));
    if (text.size() > limit) {
      status = absl::ResourceExhaustedError(Cat(path, ": larger than ", limit, " bytes"));
      break;
    }
  }
  ::close(fd);
  if (!status.ok()) return status;
  return text;
}

using HeldKey = std::tuple<std::string, std::string, std::string, std::string>;  // ns,pod,ctr,res

HeldKey Held(const kubelet::PodRef& p, const std::string& resource) {
  return {p.namespace_name, p.pod, p.container, resource};
}

bool PodLess(const kubelet::PodRef& a, const kubelet::PodRef& b) {
  return std::tie(a.namespace_name, a.pod, a.container) < std::tie(b.namespace_name, b.pod, b.container);
}

bool SamePod(const kubelet::PodRef& a, const kubelet::PodRef& b) {
  return a.namespace_name == b.namespace_name && a.pod == b.pod;
}

// One pod from several containers' refs: the ref itself if they agree, the pod with an empty
// container if only the containers differ, nullopt if the pods differ.
std::optional<kubelet::PodRef> Merge(const std::vector<kubelet::PodRef>& refs) {
  if (refs.empty()) return std::nullopt;
  kubelet::PodRef out = refs.front();
  for (const kubelet::PodRef& r : refs) {
    if (!SamePod(r, out)) return std::nullopt;
    if (r.container != out.container) out.container.clear();
  }
  return out;
}

}  // namespace

std::string_view StripReplica(std::string_view device_id) {
  const size_t at = device_id.find("::");
  return at == std::string_view::npos ? device_id : device_id.substr(0, at);
}

std::optional<CgroupInfo> ParseCgroup(std::string_view text) {
  std::optional<CgroupInfo> best;
  for (std::string_view line : Split(text, '\n')) {
    if (!line.empty() && line.back() == '\r') line.remove_suffix(1);
    // "hierarchy-ID:controller-list:cgroup-path"; the path itself may contain ':'.
    const size_t c1 = line.find(':');
    if (c1 == std::string_view::npos) continue;
    const size_t c2 = line.find(':', c1 + 1);
    if (c2 == std::string_view::npos) continue;
    auto info = ParseCgroupPath(line.substr(c2 + 1));
    if (!info) continue;
    if (!info->container_id.empty()) return info;
    if (!best) best = std::move(info);
  }
  return best;
}

absl::StatusOr<std::vector<CheckpointEntry>> ParseCheckpoint(std::string_view json, std::string_view origin) {
  auto fail = [&](const std::string& what) { return absl::InvalidArgumentError(Cat(origin, ": ", what)); };
  auto got = [](const nlohmann::json& j) { return std::string(j.type_name()); };
  if (json.find_first_not_of(" \t\r\n") == std::string_view::npos) {
    return fail("empty file (not a kubelet device-manager checkpoint)");
  }
  try {
    const nlohmann::json doc = nlohmann::json::parse(json.begin(), json.end());
    if (!doc.is_object()) return fail(Cat("expected a JSON object at the top, got ", got(doc)));
    const auto data = doc.find("Data");
    if (data == doc.end()) {
      return fail("no \"Data\" object: not a kubelet device-manager checkpoint");
    }
    if (!data->is_object()) return fail(Cat("\"Data\": expected an object, got ", got(*data)));
    if (auto st = kubelet::VerifyKubeletCheckpoint(doc, origin); !st.ok()) return st;
    std::vector<CheckpointEntry> out;
    const auto entries = data->find("PodDeviceEntries");
    if (entries == data->end() || entries->is_null()) return out;  // Go writes a nil slice as null
    if (!entries->is_array()) {
      return fail(Cat("Data.PodDeviceEntries: expected a list, got ", got(*entries)));
    }
    for (size_t i = 0; i < entries->size(); ++i) {
      const nlohmann::json& e = (*entries)[i];
      if (!e.is_object()) {
        return fail(Cat("Data.PodDeviceEntries[", i, "]: expected an object, got ", got(e)));
      }
      CheckpointEntry entry;
      const std::array<std::pair<const char*, std::string*>, 3> fields{{
          {"PodUID", &entry.pod_uid},
          {"ContainerName", &entry.container},
          {"ResourceName", &entry.resource},
      }};
      for (const auto& [field, dest] : fields) {
        const auto it = e.find(field);
        if (it == e.end()) return fail(Cat(Where(i, field), ": missing"));
        if (!it->is_string()) {
          return fail(Cat(Where(i, field), ": expected a string, got ", got(*it)));
        }
        *dest = it->get<std::string>();
      }
      if (entry.pod_uid.empty()) return fail(Cat(Where(i, "PodUID"), ": empty"));
      auto add_ids = [&](const nlohmann::json& list, const std::string& where) -> absl::Status {
        if (list.is_null()) return absl::OkStatus();
        if (!list.is_array()) {
          return fail(Cat(where, ": expected a list of device IDs, got ", got(list)));
        }
        for (size_t k = 0; k < list.size(); ++k) {
          if (!list[k].is_string()) {
            return fail(Cat(where, "[", k, "]: expected a device ID string, got ", got(list[k])));
          }
          entry.device_ids.push_back(list[k].get<std::string>());
        }
        return absl::OkStatus();
      };
      const auto ids = e.find("DeviceIDs");
      const std::string where = Where(i, "DeviceIDs");
      if (ids == e.end()) return fail(Cat(where, ": missing"));
      if (ids->is_object()) {
        // Kubernetes >= 1.20: NUMA node ("-1" when unknown) -> IDs.
        for (const auto& [numa, list] : ids->items()) {
          if (auto s = add_ids(list, Cat(where, "[\"", numa, "\"]")); !s.ok()) return s;
        }
      } else if (ids->is_array() || ids->is_null()) {
        if (auto s = add_ids(*ids, where); !s.ok()) return s;  // Kubernetes <= 1.19
      } else {
        return fail(Cat(where, ": expected a map of NUMA node to device IDs or a list, got ", got(*ids)));
      }
      out.push_back(std::move(entry));
    }
    return out;
  } catch (const nlohmann::json::exception& e) {
    std::string what = e.what();
    // "[json.exception.parse_error.101] parse error at line 1, ..." -> "parse error at line 1, ..."
    if (StartsWith(what, "[json.exception.")) {
      if (const size_t end = what.find("] "); end != std::string::npos) what.erase(0, end + 2);
    }
    return fail(Cat("not valid JSON: ", what));
  }
}

absl::StatusOr<ShareSpec> ParseShareSpec(std::string_view text, std::string_view origin) {
  auto fail = [&](const std::string& what) { return absl::InvalidArgumentError(Cat(origin, ": ", what)); };
  const nlohmann::json doc = nlohmann::json::parse(text.begin(), text.end(), nullptr, /*allow_exceptions=*/false);
  if (doc.is_discarded()) return fail("not valid JSON");
  if (!doc.is_object()) return fail("expected a CDI spec object");
  const auto devices = doc.find("devices");
  if (devices == doc.end() || !devices->is_array() || devices->size() != 1 || !(*devices)[0].is_object()) {
    return fail("expected \"devices\" with exactly one device");
  }
  const auto edits = (*devices)[0].find("containerEdits");
  if (edits == (*devices)[0].end() || !edits->is_object()) return fail("devices[0].containerEdits: missing");
  const auto env = edits->find("env");
  if (env == edits->end() || !env->is_array()) return fail("devices[0].containerEdits.env: missing");
  ShareSpec spec;
  std::string limits, mps_limits;
  bool visible = false;
  for (size_t i = 0; i < env->size(); ++i) {
    const auto& e = (*env)[i];
    if (!e.is_string()) return fail(Cat("devices[0].containerEdits.env[", i, "]: expected a string"));
    const std::string kv = e.get<std::string>();
    const size_t eq = kv.find('=');
    if (eq == std::string::npos) continue;
    const std::string key = kv.substr(0, eq), value = kv.substr(eq + 1);
    if (key == "NVIDIA_VISIBLE_DEVICES") {
      visible = true;
      for (const std::string_view u : Split(value, ',')) {
        if (!u.empty()) spec.uuids.emplace_back(u);
      }
    } else if (key == "KGPU_ENFORCEMENT") {
      spec.enforcement = value;
    } else if (key == "KGPU_CUDA_MEMORY_LIMIT") {
      limits = value;
    } else if (key == "CUDA_MPS_PINNED_DEVICE_MEM_LIMIT") {
      mps_limits = value;
    } else if (key == "KGPU_GPU_CORES") {
      spec.cores = std::strtoll(value.c_str(), nullptr, 10);
    }
  }
  if (!visible || spec.uuids.empty()) return fail("no NVIDIA_VISIBLE_DEVICES in the container's env");
  // hard: "GPU-a=4000Mi,GPU-b=4000Mi"; mps: "0=4000M,1=4000M" (device ordinals in that order).
  for (const std::string_view view : Split(limits, ',')) {
    const std::string item(view);
    const size_t eq = item.rfind('=');
    if (item.empty() || eq == std::string::npos) continue;
    spec.limit_mib[item.substr(0, eq)] = std::strtoll(item.c_str() + eq + 1, nullptr, 10);
  }
  for (const std::string_view view : Split(mps_limits, ',')) {
    const std::string item(view);
    const size_t eq = item.find('=');
    if (item.empty() || eq == std::string::npos) continue;
    const long long ordinal = std::strtoll(item.c_str(), nullptr, 10);
    if (ordinal < 0 || static_cast<size_t>(ordinal) >= spec.uuids.size()) {
      return fail(Cat("CUDA_MPS_PINNED_DEVICE_MEM_LIMIT names device ", ordinal, " of ", spec.uuids.size()));
    }
    spec.limit_mib[spec.uuids[static_cast<size_t>(ordinal)]] = std::strtoll(item.c_str() + eq + 1, nullptr, 10);
  }
  return spec;
}

// ---------------------------------------------------------------- PodAttributor

struct PodAttributor::Snapshot {
  // Checkpoint: pod UID -> its entries. Shared between snapshots while the file is unreadable.
  std::shared_ptr<const std::unordered_map<std::string, std::vector<CheckpointEntry>>> by_pod;
  // PodResources: (resource, device ID) -> every container listed with it (normally one).
  std::map<std::pair<std::string, std::string>, std::vector<kubelet::PodRef>> holders;
  // (namespace, pod, container, resource) -> every device ID the container holds.
  std::map<HeldKey, std::set<std::string>> held;
  // Device UUID ("::<n>" stripped; a kgpu.io/gpu container's spec GPUs) -> containers holding
  // any ID of it, sorted, unique.
  std::unordered_map<std::string, std::vector<kubelet::PodRef>> by_device;
  // kgpu.io/gpu containers with a spec, by CDI name (api::ShareCdiName of their slot IDs).
  std::unordered_map<std::string, ShareSpec> shares;
  // (namespace, pod) -> pod UID, from the checkpoint entries that resolve to the pod.
  std::map<std::pair<std::string, std::string>, std::string> uids;

  // The GPUs a checkpoint entry's devices are on.
  bool OnDevice(const CheckpointEntry& e, const std::string& gpu_uuid, const std::string& mig_uuid) const {
    if (e.resource == api::kShares) {
      const auto it = shares.find(api::ShareCdiName(e.device_ids));
      return it != shares.end() &&
             std::find(it->second.uuids.begin(), it->second.uuids.end(), gpu_uuid) != it->second.uuids.end();
    }
    return std::any_of(e.device_ids.begin(), e.device_ids.end(), [&](const std::string& id) {
      const std::string_view d = StripReplica(id);
      return d == gpu_uuid || (!mig_uuid.empty() && d == mig_uuid);
    });
  }

  // The one PodResources container, of the entry's name, holding exactly the entry's devices.
  std::optional<kubelet::PodRef> Resolve(const CheckpointEntry& e) const {
    const std::set<std::string> ids(e.device_ids.begin(), e.device_ids.end());
    if (ids.empty()) return std::nullopt;
    const auto it = holders.find({e.resource, *ids.begin()});
    if (it == holders.end()) return std::nullopt;
    std::optional<kubelet::PodRef> found;
    for (const kubelet::PodRef& pod : it->second) {
      if (pod.container != e.container) continue;
      const auto h = held.find(Held(pod, e.resource));
      if (h == held.end() || h->second != ids) continue;
      if (found && !(*found == pod))
        return std::nullopt;  // two pods' containers of that name hold the same IDs: unclear
      found = pod;
    }
    return found;
  }
};

PodAttributor::PodAttributor(Options options) : options_(std::move(options)) {
  auto empty = std::make_shared<Snapshot>();
  empty->by_pod = std::make_shared<const std::unordered_map<std::string, std::vector<CheckpointEntry>>>();
  snapshot_ = std::move(empty);
}

PodAttributor::~PodAttributor() = default;

std::shared_ptr<const PodAttributor::Snapshot> PodAttributor::Current() const {
  std::lock_guard<std::mutex> lock(mu_);
  return snapshot_;
}

void PodAttributor::Update(std::vector<kubelet::DeviceAllocation> allocations) {
  std::lock_guard<std::mutex> update_lock(update_mu_);
  auto next = std::make_shared<Snapshot>();

  const std::string& path = options_.checkpoint_path;
  absl::StatusOr<std::vector<CheckpointEntry>> entries = [&]() -> absl::StatusOr<std::vector<CheckpointEntry>> {
    auto text = ReadSmallFile(path, kMaxCheckpointFile);
    if (!text.ok()) return text.status();
    return ParseCheckpoint(*text, path);
  }();
  if (entries.ok()) {
    auto by_pod = std::make_shared<std::unordered_map<std::string, std::vector<CheckpointEntry>>>();
    for (CheckpointEntry& e : *entries) (*by_pod)[e.pod_uid].push_back(std::move(e));
    next->by_pod = std::move(by_pod);
    if (!last_error_.empty()) {
      Log("exporter")->info("kubelet checkpoint {} is readable again", path);
      last_error_.clear();
    }
  } else {
    ++checkpoint_failures_;
    next->by_pod = Current()->by_pod;
    const std::string error(entries.status().message());
    if (error != last_error_) {
      Log("exporter")
          ->warn(
              "kubelet device-manager checkpoint unusable: {}; keeping its previous contents ({} "
              "pods). Attributing GPU processes to pods needs this file: mount the host's "
              "/var/lib/kubelet/device-plugins into the exporter (read-only is enough)",
              error, next->by_pod->size());
      last_error_ = error;
    }
  }

  for (kubelet::DeviceAllocation& a : allocations) {
    next->holders[{a.resource, a.device_id}].push_back(a.pod);
    next->held[Held(a.pod, a.resource)].insert(a.device_id);
    if (a.resource == api::kShares) continue;  // indexed by its spec's GPUs below
    next->by_device[std::string(StripReplica(a.device_id))].push_back(std::move(a.pod));
  }
  // kgpu.io/gpu containers: the GPUs their CDI spec names (written before the container
  // started; none yet means no process of it can run).
  for (const auto& [key, ids] : next->held) {
    if (std::get<3>(key) != api::kShares) continue;
    const std::string name = api::ShareCdiName({ids.begin(), ids.end()});
    const std::string file = api::ShareCdiSpecFile(options_.cdi_spec_dir, name);
    auto text = ReadSmallFile(file, kMaxShareSpecFile);
    if (!text.ok()) continue;  // not started yet (or the spec directory is not mounted)
    auto spec = ParseShareSpec(*text, file);
    if (!spec.ok()) {
      Log("exporter")
          ->warn("{} (its container's GPU figures are not attributed)", std::string(spec.status().message()));
      continue;
    }
    kubelet::PodRef pod;
    pod.namespace_name = std::get<0>(key);
    pod.pod = std::get<1>(key);
    pod.container = std::get<2>(key);
    for (const auto& u : spec->uuids) next->by_device[u].push_back(pod);
    next->shares[name] = std::move(*spec);
  }
  for (auto& [uuid, pods] : next->by_device) {
    std::sort(pods.begin(), pods.end(), PodLess);
    pods.erase(std::unique(pods.begin(), pods.end()), pods.end());
  }
  for (const auto& [uid, pod_entries] : *next->by_pod) {
    for (const CheckpointEntry& e : pod_entries) {
      if (auto pod = next->Resolve(e)) next->uids[{pod->namespace_name, pod->pod}] = uid;
    }
  }

  std::shared_ptr<const Snapshot> old;
  {
    std::lock_guard<std::mutex> lock(mu_);
    old = std::exchange(snapshot_, std::move(next));
  }
  // `old` is released here, outside mu_.
}

std::optional<kubelet::PodRef> PodAttributor::Attribute(unsigned pid, const std::string& gpu_uuid,
                                                        const std::string& mig_uuid) const {
  auto text = ReadSmallFile(Cat(options_.proc_root, "/", pid, "/cgroup"), kMaxCgroupFile);
  if (!text.ok()) return std::nullopt;  // the process ended, or no hostPID
  const auto cgroup = ParseCgroup(*text);
  if (!cgroup) return std::nullopt;

  const auto snap = Current();
  const auto entries = snap->by_pod->find(cgroup->pod_uid);
  if (entries == snap->by_pod->end()) return std::nullopt;
  std::vector<kubelet::PodRef> found;
  for (const CheckpointEntry& e : entries->second) {
    if (!snap->OnDevice(e, gpu_uuid, mig_uuid)) continue;
    if (auto pod = snap->Resolve(e)) found.push_back(std::move(*pod));
  }
  return Merge(found);
}

std::vector<kubelet::PodRef> PodAttributor::PodsOnDevice(const std::string& gpu_or_mig_uuid) const {
  const auto snap = Current();
  const auto it = snap->by_device.find(gpu_or_mig_uuid);
  if (it == snap->by_device.end()) return {};
  return it->second;
}

std::optional<ShareSpec> PodAttributor::ShareOf(const kubelet::PodRef& container) const {
  const auto snap = Current();
  const auto held = snap->held.find(Held(container, api::kShares));
  if (held == snap->held.end()) return std::nullopt;
  const auto it = snap->shares.find(api::ShareCdiName({held->second.begin(), held->second.end()}));
  if (it == snap->shares.end()) return std::nullopt;
  return it->second;
}

std::optional<kubelet::PodRef> PodAttributor::OwnerOf(const std::string& uuid) const {
  return Merge(PodsOnDevice(uuid));
}

std::string PodAttributor::PodUid(const kubelet::PodRef& pod) const {
  const auto snap = Current();
  const auto it = snap->uids.find({pod.namespace_name, pod.pod});
  return it == snap->uids.end() ? std::string() : it->second;
}

std::string PodAttributor::ReplicaOn(const kubelet::PodRef& container, const std::vector<std::string>& uuids) const {
  const auto snap = Current();
  auto replica = [](std::string_view id) {
    const size_t at = id.find("::");
    return at == std::string_view::npos ? std::string() : std::string(id.substr(at + 2));
  };
  auto named = [&](std::string_view uuid) { return std::find(uuids.begin(), uuids.end(), uuid) != uuids.end(); };
  // The container's entries: (namespace, pod, container, every resource).
  for (auto it = snap->held.lower_bound(HeldKey{container.namespace_name, container.pod, container.container, ""});
       it != snap->held.end() && std::get<0>(it->first) == container.namespace_name &&
       std::get<1>(it->first) == container.pod && std::get<2>(it->first) == container.container;
       ++it) {
    const std::set<std::string>& ids = it->second;
    if (ids.empty()) continue;
    if (std::get<3>(it->first) == api::kShares) {
      const auto spec = snap->shares.find(api::ShareCdiName({ids.begin(), ids.end()}));
      if (spec == snap->shares.end()) continue;
      if (std::any_of(spec->second.uuids.begin(), spec->second.uuids.end(), named)) return replica(*ids.begin());
      continue;
    }
    for (const std::string& id : ids) {
      if (named(StripReplica(id))) {
        if (std::string r = replica(id); !r.empty()) return r;
      }
    }
  }
  return {};
}

// ---------------------------------------------------------------- pod labels, HPC jobs

std::vector<std::pair<std::string, std::string>> PodMetricLabels(const std::map<std::string, std::string>& labels,
                                                                 const std::vector<std::regex>& allow) {
  std::vector<std::pair<std::string, std::string>> out;
  std::set<std::string> seen;
  for (const auto& [key, value] : labels) {
    if (!allow.empty() &&
        std::none_of(allow.begin(), allow.end(), [&](const std::regex& re) { return std::regex_search(key, re); })) {
      continue;
    }
    std::string name = key;
    for (char& c : name) {
      const bool ok = (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || (c >= '0' && c <= '9') || c == '_';
      if (!ok) c = '_';
    }
    if (name.empty() || (name.front() >= '0' && name.front() <= '9')) name.insert(name.begin(), '_');
    if (!seen.insert(name).second) continue;
    out.emplace_back(std::move(name), value);
  }
  std::sort(out.begin(), out.end());
  return out;
}

void HpcJobs::Refresh() {
  std::error_code ec;
  std::filesystem::directory_iterator dir(dir_, ec);
  if (ec) {
    jobs_.clear();
    log_.Report(spdlog::level::warn, Cat("--hpc-job-mapping-dir ", dir_, ": ", ec.message(),
                                         "; no hpc_job labels until it can be read (logged again when the "
                                         "error changes)"));
    return;
  }
  std::map<std::string, std::vector<std::string>> jobs;
  std::set<std::string> capped;
  // increment(ec), not ++: a directory changing under the listing must not throw.
  for (auto it = std::filesystem::begin(dir); it != std::filesystem::end(dir); it.increment(ec)) {
    if (ec) break;
    const auto& entry = *it;
    const std::string name = entry.path().filename().string();
    // "<gpu index>" or "<gpu index>.<GPU instance id>"; other files are not job files.
    const size_t dot = name.find('.');
    auto digits = [](std::string_view s) {
      return !s.empty() && s.size() <= 9 &&
             std::all_of(s.begin(), s.end(), [](char c) { return c >= '0' && c <= '9'; });
    };
    if (!digits(std::string_view(name).substr(0, dot)) ||
        (dot != std::string::npos && !digits(std::string_view(name).substr(dot + 1)))) {
      continue;
    }
    std::error_code type_ec;
    if (!entry.is_regular_file(type_ec)) continue;
    auto text = ReadSmallFile(entry.path().string(), kMaxJobFile);
    if (!text.ok()) continue;  // removed between the listing and the read: the next refresh sees it
    std::vector<std::string>& ids = jobs[name];
    std::set<std::string_view> seen;  // views into *text, which outlives the loop
    size_t listed = 0;                // distinct jobs in the file, kept or not
    for (std::string_view line : Split(*text, '\n')) {
      constexpr std::string_view kBlank = " \t\r\f\v";
      const size_t b = line.find_first_not_of(kBlank);
      if (b == std::string_view::npos) continue;
      line = line.substr(b, line.find_last_not_of(kBlank) - b + 1);
      // The same job twice would write the same series twice (Prometheus refuses the page).
      if (!seen.insert(line).second) continue;
      if (++listed <= kMaxJobsPerDevice) ids.emplace_back(line);
    }
    if (listed > kMaxJobsPerDevice) {
      if (capped.insert(name).second && capped_.count(name) == 0) {
        Log("exporter")
            ->warn(
                "--hpc-job-mapping-dir {}/{}: {} jobs; the first {} label its device's series (each job repeats "
                "every series of the device; logged once while the file holds more)",
                dir_, name, listed, kMaxJobsPerDevice);
      }
    }
  }
  log_.Clear(Cat("--hpc-job-mapping-dir ", dir_, " is readable again"));
  jobs_ = std::move(jobs);
  capped_ = std::move(capped);
}

std::vector<std::string> HpcJobs::Jobs(unsigned gpu, std::optional<unsigned> gi) const {
  if (gi) {
    if (const auto it = jobs_.find(Cat(gpu, ".", *gi)); it != jobs_.end()) return it->second;
  }
  const auto it = jobs_.find(std::to_string(gpu));
  return it == jobs_.end() ? std::vector<std::string>() : it->second;
}

}  // namespace kgpu::exporter
