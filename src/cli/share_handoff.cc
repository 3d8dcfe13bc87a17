#include "cli/share_handoff.h"

#include <algorithm>
#include <cctype>
#include <condition_variable>
#include <cstdint>
#include <filesystem>
#include <map>
#include <set>

#include <nlohmann/json.hpp>

#include "common/files.h"
#include "common/log.h"
#include "common/remove_tree.h"
#include "common/strings.h"
#include "deviceplugin/cdi.h"
#include "deviceplugin/interposer.h"
#include "deviceplugin/mps.h"
#include "deviceplugin/plan.h"
#include "extender/request.h"
#include "k8s/resources.h"
#include "kubelet/podresources.h"

namespace kgpu::cli {
namespace {
using json = nlohmann::json;

std::string Csv(const std::vector<std::string>& v) {
  return Join(v, ",");
}

}  // namespace

std::vector<std::string> ShareEnv(const api::RecordContainer& c) {
  std::vector<std::string> uuids, limits, mps_limits, core_limits;
  for (size_t i = 0; i < c.gpus.size(); ++i) {
    const auto& g = c.gpus[i];
    uuids.push_back(g.uuid);
    if (g.memory_mib > 0) {
      limits.push_back(Cat(g.uuid, "=", g.memory_mib, "Mi"));
      mps_limits.push_back(Cat(i, "=", g.memory_mib, "M"));
    }
    if (g.cores > 0 && g.cores < 100) core_limits.push_back(Cat(g.uuid, "=", g.cores));
  }
  const std::string mode = c.enforcement.empty() ? "hard" : c.enforcement;
  const int64_t cores = c.gpus.empty() ? 0 : c.gpus[0].cores;
  std::vector<std::string> env = {Cat("NVIDIA_VISIBLE_DEVICES=", Csv(uuids)), Cat("KGPU_ENFORCEMENT=", mode),
                                  Cat("KGPU_GPU_CORES=", cores)};
  if (mode == "hard" && !limits.empty()) env.push_back(Cat("KGPU_CUDA_MEMORY_LIMIT=", Csv(limits)));
  if (mode == "hard" && !core_limits.empty()) env.push_back(Cat("KGPU_CUDA_CORE_LIMIT=", Csv(core_limits)));
  if (mode == "mps") {
    if (!mps_limits.empty()) env.push_back(Cat("CUDA_MPS_PINNED_DEVICE_MEM_LIMIT=", Csv(mps_limits)));
    if (cores > 0) env.push_back(Cat("CUDA_MPS_ACTIVE_THREAD_PERCENTAGE=", cores));
  }
  return env;
}

ShareHandoff::ShareHandoff(std::unique_ptr<k8s::Client> client, std::shared_ptr<const gpu::Inventory> inventory,
                           ShareHandoffOptions options, std::unique_ptr<k8s::Client> list_client)
    : client_(std::move(client)),
      list_client_(std::move(list_client)),
      inventory_(std::move(inventory)),
      opts_(std::move(options)) {
  events_ = std::make_unique<k8s::EventRecorder>(*client_, "kgpu-device-plugin", opts_.node_name);
  // Without this node's name the pods on it cannot be listed: every directory would look orphaned.
  if (!opts_.cuda_interposer.empty() && opts_.accounting_sweep.count() > 0 && !opts_.node_name.empty()) {
    sweeper_ = std::jthread([this](std::stop_token stop) {
      std::mutex mu;
      std::condition_variable_any cv;
      for (;;) {
        std::unique_lock lock(mu);
        if (cv.wait_for(lock, stop, opts_.accounting_sweep, [] { return false; }) || stop.stop_requested()) return;
        auto n = SweepAccounting();
        if (!n.ok()) {
          Log("deviceplugin")
              ->warn("accounting directories under {} not swept: {}", opts_.cuda_shared_root,
                     std::string(n.status().message()));
        }
      }
    });
  }
}

namespace {
// A Kubernetes object UID as the API server writes it (RFC 4122 text: 8-4-4-4-12 hex digits).
bool LooksLikeUid(std::string_view s) {
  if (s.size() != 36) return false;
  for (size_t i = 0; i < s.size(); ++i) {
    const bool dash = i == 8 || i == 13 || i == 18 || i == 23;
    if (dash ? s[i] != '-' : !std::isxdigit(static_cast<unsigned char>(s[i]))) return false;
  }
  return true;
}
}  // namespace

absl::StatusOr<int> ShareHandoff::SweepAccounting() {
  namespace fs = std::filesystem;
  auto log = Log("deviceplugin");
  if (opts_.node_name.empty()) {
    return absl::FailedPreconditionError(
        "no node name (--node-name or $NODE_NAME): the pods on this node cannot be listed");
  }
  // The directories first: a pod admitted after this read has its UID in the list below.
  std::vector<std::pair<std::string, fs::file_time_type>> dirs;
  std::error_code ec;
  for (fs::directory_iterator it(opts_.cuda_shared_root, ec), end; !ec && it != end; it.increment(ec)) {
    const std::string name = it->path().filename().string();
    std::error_code tec;
    if (!LooksLikeUid(name) || !it->is_directory(tec)) continue;
    const auto mtime = fs::last_write_time(it->path(), tec);
    if (!tec) dirs.emplace_back(name, mtime);
  }
  if (ec && ec != std::errc::no_such_file_or_directory) {
    return absl::UnavailableError(Cat("cannot read --cuda-shared-root ", opts_.cuda_shared_root, ": ", ec.message()));
  }
  if (dirs.empty()) return 0;
  const k8s::ListOptions lo{.label_selector = "",
                            .field_selector = Cat("spec.nodeName=", opts_.node_name),
                            .limit = 0,
                            .resource_version = ""};
  auto pods = client_->List(k8s::FindResource("pods")->Path(""), lo);
  if (!pods.ok()) {
    return absl::Status(pods.status().code(), Cat("the pods on node ", opts_.node_name, ": ", pods.status().message()));
  }
  std::set<std::string> live;
  for (const auto& p : pods->value("items", json::array())) {
    const std::string phase = p.value("status", json::object()).value("phase", "");
    if (phase == "Succeeded" || phase == "Failed") continue;  // its containers are gone for good
    live.insert(p.value("metadata", json::object()).value("uid", ""));
  }
  const auto now = fs::file_time_type::clock::now();
  int removed = 0;
  for (const auto& [uid, mtime] : dirs) {
    if (live.contains(uid) || now - mtime < opts_.accounting_grace) continue;
    const fs::path dir = fs::path(opts_.cuda_shared_root) / uid;
    if (auto rm = RemoveTreeNoFollow(dir.string()); !rm.ok()) {
      log->warn("cannot remove the accounting directory {} (its pod is no longer on this node): {}", dir.string(),
                std::string(rm.message()));
      continue;
    }
    log->info("removed the accounting directory {}: pod UID {} is no longer on this node", dir.string(), uid);
    ++removed;
  }
  return removed;
}

absl::StatusOr<kubelet::PodRef> ShareHandoff::Holder(const std::string& resource,
                                                     const std::vector<std::string>& ids) const {
  auto held = kubelet::ListPodResources(opts_.pod_resources_socket, opts_.timeout);
  if (!held.ok()) return absl::UnavailableError(Cat("PodResources: ", held.status().message()));
  const std::set<std::string> want(ids.begin(), ids.end());
  std::optional<kubelet::PodRef> owner;
  std::set<std::string> seen;
  for (const auto& d : *held) {
    if (d.resource != resource || !want.contains(d.device_id)) continue;
    seen.insert(d.device_id);
    if (owner && !(*owner == d.pod)) {
      return absl::FailedPreconditionError(Cat(resource, " devices ", Csv(ids), " are held by two containers (",
                                               owner->namespace_name, "/", owner->pod, "/", owner->container, " and ",
                                               d.pod.namespace_name, "/", d.pod.pod, "/", d.pod.container,
                                               "): kubelet's PodResources is inconsistent"));
    }
    owner = d.pod;
  }
  if (!owner) {
    return absl::NotFoundError(
        Cat("no container holds ", resource, " devices ", Csv(ids), " in kubelet's PodResources yet"));
  }
  if (seen.size() != want.size()) {
    return absl::FailedPreconditionError(Cat(owner->namespace_name, "/", owner->pod, " container ", owner->container,
                                             " holds ", seen.size(), " of ", resource, " devices ", Csv(ids),
                                             " in kubelet's PodResources; kubelet asked for all of them"));
  }
  return *owner;
}

ShareHandoff::~ShareHandoff() {
  if (reports_worker_.joinable()) {
    reports_worker_.request_stop();
    reports_cv_.notify_all();
    reports_worker_.join();
  }
}

void ShareHandoff::RecordAssignmentLater(std::string resource, std::vector<std::string> ids,
                                         std::vector<deviceplugin::AssignedDevice> devices) {
  std::lock_guard lock(reports_mu_);
  if (reports_.size() >= 1024) {
    Log("deviceplugin")
        ->warn(
            "{} {}: the allocation record is not checked against kubelet's choice (1024 checks wait "
            "already: is the API server reachable?)",
            resource, Join(ids, ","));
    return;
  }
  reports_.push_back({std::move(resource), std::move(ids), std::move(devices)});
  if (!reports_worker_.joinable()) {
    reports_worker_ = std::jthread([this](std::stop_token stop) {
      std::unique_lock held(reports_mu_);
      // wait() answers the predicate once a stop is asked for: leave then, whatever still waits.
      while (reports_cv_.wait(held, stop, [this] { return !reports_.empty(); }) && !stop.stop_requested()) {
        Report r = std::move(reports_.front());
        reports_.pop_front();
        held.unlock();
        if (auto st = RecordAssignment(r.resource, r.ids, r.devices); !st.ok()) {
          Log("deviceplugin")
              ->warn("{} {}: the allocation record may not say what the container has: {}", r.resource,
                     Join(r.ids, ","), std::string(st.message()));
        }
        held.lock();
      }
      if (!reports_.empty()) {
        Log("deviceplugin")
            ->warn("stopping: {} allocation record(s) not checked against kubelet's choice", reports_.size());
      }
    });
  }
  reports_cv_.notify_one();
}

absl::Status ShareHandoff::RecordAssignment(const std::string& resource, const std::vector<std::string>& ids,
                                            const std::vector<deviceplugin::AssignedDevice>& devices) {
  auto owner = Holder(resource, ids);
  if (!owner.ok()) return owner.status();
  const std::string who = Cat(owner->namespace_name, "/", owner->pod, " container ", owner->container);
  const std::string path = k8s::FindResource("pods")->Path(owner->namespace_name, owner->pod);
  std::vector<api::RecordGpu> given;
  std::vector<std::string> given_list;
  for (const auto& d : devices) {
    given.push_back({d.gpu_uuid, d.mig_uuid, d.profile, d.memory_mib, 0});
    given_list.push_back(given.back().Device());
  }
  const std::set<std::string> given_ids(given_list.begin(), given_list.end());
  for (int attempt = 0;; ++attempt) {
    auto pod = client_->Get(path);
    if (!pod.ok()) return absl::UnavailableError(Cat(who, ": ", pod.status().message()));
    const json meta = pod->value("metadata", json::object());
    auto on_pod = api::RecordOnPod(*pod);
    if (!on_pod.ok()) return absl::FailedPreconditionError(Cat(who, ": ", on_pod.status().message()));
    if (!on_pod->has_value()) return absl::OkStatus();  // not placed by kgpu extender
    auto& record = **on_pod;
    if (!opts_.node_name.empty() && record.node != opts_.node_name) {
      return absl::FailedPreconditionError(
          Cat(who, ": the record is for node ", record.node, ", this is ", opts_.node_name));
    }
    api::RecordContainer* rc = nullptr;
    for (auto& c : record.containers) {
      if (c.name == owner->container && c.resource == resource) rc = &c;
    }
    if (rc == nullptr) return absl::OkStatus();  // the extender placed none of this resource here
    // A regular init container's devices, which kubelet hands on to this container (it holds them
    // in PodResources, which lists no init containers): fewer than the container gets. Its own
    // PreStartContainer checks the record against all of them.
    if (rc->gpus.size() != ids.size()) return absl::OkStatus();
    std::vector<std::string> chosen_list;
    for (const auto& g : rc->gpus) chosen_list.push_back(g.Device());
    if (std::set<std::string>(chosen_list.begin(), chosen_list.end()) == given_ids) return absl::OkStatus();
    rc->gpus = given;
    json patch = {{"metadata",
                   {{"resourceVersion", meta.value("resourceVersion", "")},
                    {"annotations", {{extender::kAnnotationAllocation, api::EncodeRecord(record)}}}}}};
    auto p = client_->Patch(path, patch, "application/merge-patch+json");
    if (absl::IsAborted(p.status()) && attempt < 4) continue;  // 409: the pod changed meanwhile
    if (!p.ok())
      return absl::UnavailableError(Cat(who, ": cannot correct the allocation record: ", p.status().message()));
    const std::string note =
        Cat("container ", owner->container, ": kubelet gave ", resource, " ", Csv(given_list),
            " (the extender had chosen ", Csv(chosen_list), "); the allocation record now says what the container has");
    (void)events_->Record({"v1", "Pod", owner->namespace_name, owner->pod, meta.value("uid", "")}, "Normal",
                          "GpuAssignmentRecorded", "Allocate", note);
    Log("deviceplugin")->info("{}: {}", who, note);
    return absl::OkStatus();
  }
}

std::vector<std::vector<deviceplugin::AssignedDevice>> ShareHandoff::Pending(const std::string& resource,
                                                                             size_t size) const {
  if (opts_.node_name.empty() || list_client_ == nullptr) return {};
  const int64_t now =
      std::chrono::duration_cast<std::chrono::nanoseconds>(std::chrono::steady_clock::now().time_since_epoch()).count();
  if (now < list_paused_until_.load()) return {};
  // kubelet waits for this answer with no deadline while it admits the node's pods one by one, so
  // it is one try with a short deadline (list_client_), from the apiserver's watch cache (resourceVersion 0:
  // no quorum read of every pod in etcd), and a failure pauses the steering for a while.
  const k8s::ListOptions lo{
      .label_selector = "",
      .field_selector = Cat("spec.nodeName=", opts_.node_name),
      .limit = 0,
      .resource_version = std::string(1, '0')};  // "0": GCC 12's -Wrestrict misfires on the literal
  auto pods = list_client_->List(k8s::FindResource("pods")->Path(""), lo);
  if (!pods.ok()) {
    const bool refused = absl::IsPermissionDenied(pods.status());
    const auto pause = refused ? std::chrono::minutes(5) : std::chrono::minutes(1);
    list_paused_until_ = now + std::chrono::nanoseconds(pause).count();
    Log("deviceplugin")
        ->warn(
            "{}: kubelet is not steered to the extender's choice for {} minute(s) (the allocation "
            "records are corrected to kubelet's choice instead): listing this node's pods failed: {}{}",
            resource, refused ? 5 : 1, std::string(pods.status().message()),
            refused ? " (grant `list` on pods, as deploy/shares/rbac.yaml does)" : "");
    return {};
  }
  std::set<std::string> holding;  // ns/pod/container already holding `resource`
  auto held = kubelet::ListPodResources(opts_.pod_resources_socket, opts_.timeout);
  if (!held.ok()) return {};
  for (const auto& d : *held) {
    if (d.resource == resource) holding.insert(Cat(d.pod.namespace_name, "/", d.pod.pod, "/", d.pod.container));
  }
  struct Candidate {
    std::string created, name;
    std::vector<deviceplugin::AssignedDevice> devices;
  };
  std::vector<Candidate> found;
  for (const auto& pod : pods->value("items", json::array())) {
    const json meta = pod.value("metadata", json::object());
    const std::string phase = pod.value("status", json::object()).value("phase", "");
    if (phase == "Succeeded" || phase == "Failed" || meta.contains("deletionTimestamp")) continue;
    auto on_pod = api::RecordOnPod(pod);
    if (!on_pod.ok() || !on_pod->has_value() || (*on_pod)->node != opts_.node_name) continue;
    const auto& record = **on_pod;
    const std::string ns = meta.value("namespace", ""), name = meta.value("name", "");
    // The pod's GPU containers in kubelet's order. A regular init container is allocated first
    // and hands its devices on to its target (the record's entry), so it is steered to the first
    // of the target's devices; the target then gets the rest with those as must-include.
    std::vector<std::pair<std::string, size_t>> order;  // record entry, devices
    if (auto req = extender::ParsePodRequest(pod); req.ok()) {
      for (const auto& g : req->gpus) {
        if (g.Resource() != resource) continue;
        const std::string& entry = g.init ? req->gpus[static_cast<size_t>(g.target)].name : g.name;
        order.emplace_back(entry, g.init ? static_cast<size_t>(g.count) : SIZE_MAX);
      }
    }
    for (const auto& c : record.containers) {  // entries the spec did not name (a pod that does not parse)
      if (std::none_of(order.begin(), order.end(), [&](const auto& o) { return o.first == c.name; })) {
        order.emplace_back(c.name, SIZE_MAX);
      }
    }
    for (const auto& [entry, count] : order) {
      const auto c =
          std::find_if(record.containers.begin(), record.containers.end(),
                       [&](const api::RecordContainer& x) { return x.name == entry && x.resource == resource; });
      if (c == record.containers.end() || holding.contains(Cat(ns, "/", name, "/", entry))) continue;
      if (std::min(count, c->gpus.size()) != size) continue;
      Candidate cand{meta.value("creationTimestamp", ""), Cat(ns, "/", name), {}};
      for (size_t k = 0; k < size; ++k) {
        const auto& g = c->gpus[k];
        cand.devices.push_back({g.uuid, g.mig, g.profile, g.memory_mib});
      }
      found.push_back(std::move(cand));
    }
  }
  // kubelet admits pods oldest first (RFC 3339 timestamps sort as text), and a pod's containers in
  // its order, which is the record's (a stable sort keeps it).
  std::stable_sort(found.begin(), found.end(), [](const Candidate& a, const Candidate& b) {
    return a.created != b.created ? a.created < b.created : a.name < b.name;
  });
  std::vector<std::vector<deviceplugin::AssignedDevice>> out;
  for (auto& c : found) out.push_back(std::move(c.devices));
  return out;
}

std::string ShareHandoff::SpecPath(const std::string& cdi_name) const {
  return api::ShareCdiSpecFile(opts_.cdi_spec_dir, cdi_name);
}

absl::Status ShareHandoff::Resolve(const std::vector<std::string>& ids, const std::string& cdi_name) {
  // 1. Which container holds these slots: kubelet recorded it before calling PreStartContainer.
  auto owner = Holder(api::kShares, ids);
  if (!owner.ok()) return owner.status();
  const std::string who = Cat(owner->namespace_name, "/", owner->pod, " container ", owner->container);
  // 2. The record the extender wrote for it.
  const std::string path = k8s::FindResource("pods")->Path(owner->namespace_name, owner->pod);
  auto pod = client_->Get(path);
  if (!pod.ok()) return absl::UnavailableError(Cat(who, ": ", pod.status().message()));
  const json meta = pod->value("metadata", json::object());
  auto on_pod = api::RecordOnPod(*pod);
  if (!on_pod.ok()) return absl::FailedPreconditionError(Cat(who, ": ", on_pod.status().message()));
  if (!on_pod->has_value()) {
    return absl::FailedPreconditionError(Cat(who, ": the pod has no ", extender::kAnnotationAllocation,
                                             " record (was it scheduled by kgpu extender? check its schedulerName)"));
  }
  auto& record = **on_pod;
  if (!opts_.node_name.empty() && record.node != opts_.node_name) {
    return absl::FailedPreconditionError(
        Cat(who, ": the record is for node ", record.node, ", this is ", opts_.node_name));
  }
  const api::RecordContainer* rc = nullptr;
  for (const auto& c : record.containers) {
    if (c.name == owner->container && c.resource == api::kShares) rc = &c;
  }
  if (rc == nullptr)
    return absl::FailedPreconditionError(Cat(who, ": the record has no kgpu.io/gpu entry for this container"));
  if (rc->gpus.size() != ids.size()) {
    return absl::FailedPreconditionError(
        Cat(who, ": the record names ", rc->gpus.size(), " GPUs but kubelet gave ", ids.size(), " slots"));
  }
  // 3. The CDI spec: exactly the record's GPUs, its limits.
  json nodes = json::array();
  auto node = [&](const std::string& p) { return json{{"path", p}, {"hostPath", UnderRoot(opts_.dev_root, p)}}; };
  for (const auto& g : rc->gpus) {
    const auto& gpus = inventory_->gpus();
    const auto found = std::find_if(gpus.begin(), gpus.end(), [&](const gpu::Gpu& x) { return x.uuid == g.uuid; });
    if (found == gpus.end())
      return absl::FailedPreconditionError(Cat(who, ": the record names ", g.uuid, ", which this node does not have"));
    if (found->mig_enabled)
      return absl::FailedPreconditionError(Cat(who, ": ", g.uuid, " is in MIG mode and serves no shares"));
    nodes.push_back(node(Cat("/dev/nvidia", found->minor)));
  }
  for (const char* n : {"/dev/nvidiactl", "/dev/nvidia-uvm", "/dev/nvidia-uvm-tools"}) nodes.push_back(node(n));
  const std::string mode = rc->enforcement.empty() ? "hard" : rc->enforcement;
  json edits = {{"env", ShareEnv(*rc)}, {"deviceNodes", nodes}};
  if (mode == "hard") {
    // The CUDA interposer holds the container to KGPU_CUDA_MEMORY_LIMIT (docs/isolation.md):
    // preloaded from the node's versioned, read-only copy, with one accounting region for the
    // container's processes in a directory of its own (0777: random-UID containers write it).
    if (opts_.cuda_interposer.empty()) {
      return absl::FailedPreconditionError(
          Cat(who,
              ": the record asks for hard memory limits, but this node's plugin has no CUDA interposer "
              "(--cuda-interposer), so nothing would enforce them; delete the pod so that it is scheduled again "
              "(kgpu extender offers hard only on nodes whose inventory lists it)"));
    }
    std::vector<deviceplugin::InterposerLimit> limits;
    for (const auto& g : rc->gpus)
      limits.push_back({g.uuid, static_cast<uint64_t>(std::max<int64_t>(g.memory_mib, 0)), g.cores});
    auto iso = deviceplugin::InterposerEditsFor(
        opts_.cuda_interposer, opts_.cuda_interposer_load, opts_.cuda_shared_root,
        Cat(opts_.cuda_shared_root, "/", meta.value("uid", "unknown-uid"), "/", owner->container), limits);
    if (!iso.ok()) return absl::Status(iso.status().code(), Cat(who, ": ", iso.status().message()));
    for (const auto& [k, v] : iso->envs) edits["env"].push_back(Cat(k, "=", v));
    edits["mounts"] = deviceplugin::CdiMounts(iso->mounts);
  }
  if (mode == "mps") {
    // A client of the GPU's MPS daemon (round 1's, one per GPU serving kgpu.io/gpu): the record's
    // limits are its CUDA_MPS_PINNED_DEVICE_MEM_LIMIT and CUDA_MPS_ACTIVE_THREAD_PERCENTAGE
    // (ShareEnv), which the daemon enforces for this client.
    if (opts_.mps_root.empty()) {
      return absl::FailedPreconditionError(
          Cat(who, ": the record asks for MPS limits, but no MPS daemon serves ", api::kShares,
              " on this node (sharing.mps in the plugin's config); delete the pod so that it is scheduled again "
              "(kgpu extender offers mps only on nodes whose inventory lists it)"));
    }
    const auto client = deviceplugin::MpsClientFor(opts_.mps_root, api::kShares);
    edits["env"].push_back(Cat("CUDA_MPS_PIPE_DIRECTORY=", client.pipe_dir));
    edits["mounts"] = deviceplugin::CdiMounts(client.mounts);
  }
  const json spec = {{"cdiVersion", "0.5.0"},
                     {"kind", api::kShareCdiKind},
                     {"devices", json::array({{{"name", cdi_name}, {"containerEdits", edits}}})}};
  std::error_code ec;
  std::filesystem::create_directories(opts_.cdi_spec_dir, ec);
  const std::string file = SpecPath(cdi_name);
  // An init container and the container it hands its slots on to have the same spec, which two
  // PreStartContainer calls may write at once: each through a temporary file of its own.
  if (auto st = WriteFileAtomically(file, spec.dump(2) + "\n"); !st.ok()) {
    return absl::UnavailableError(
        Cat("the CDI spec: ", st.message(), " (mount the CDI spec directory, or change --cdi-spec-dir)"));
  }
  // 4. Say what was applied, on the pod.
  std::vector<std::string> what;
  for (const auto& g : rc->gpus) what.push_back(Cat(g.uuid, " (", g.memory_mib, " MiB, ", g.cores, "% cores)"));
  const std::string note =
      Cat("container ", owner->container, ": ", Join(what, ", "), "; enforcement ", mode,
          mode == "hard"  ? Cat(" (memory and compute share enforced by the CUDA interposer ", opts_.cuda_interposer,
                                " preloaded into the container, its limits read-only in /run/kgpu-cuda/config: "
                                 "docs/isolation.md)")
          : mode == "mps" ? " (MPS per-client limits)"
                          : " (time-slicing without isolation: these memory and compute limits are reserved by the "
                            "scheduler but NOT enforced on the GPU; enforcement hard needs the node's device plugin "
                            "started with --cuda-interposer)");
  // "<container>=<mode>" for each share container of the pod, comma-separated in name order; the
  // pod's other containers are handed off concurrently, so the write is a compare-and-swap.
  json current = *pod;
  for (int attempt = 0;; ++attempt) {
    const json cur_meta = current.value("metadata", json::object());
    std::map<std::string, std::string> applied;
    const json ann = cur_meta.value("annotations", json::object());
    if (const auto a = ann.find(extender::kAnnotationEnforcementApplied); a != ann.end() && a->is_string()) {
      for (const auto& item : extender::SplitList(a->get<std::string>())) {
        const auto eq = item.find('=');
        if (eq != std::string::npos) applied[item.substr(0, eq)] = item.substr(eq + 1);
      }
    }
    if (applied[owner->container] == mode && attempt > 0) break;
    applied[owner->container] = mode;
    std::vector<std::string> items;
    for (const auto& [c, m] : applied) items.push_back(Cat(c, "=", m));
    json patch = {{"metadata",
                   {{"resourceVersion", cur_meta.value("resourceVersion", "")},
                    {"annotations", {{extender::kAnnotationEnforcementApplied, Join(items, ",")}}}}}};
    auto p = client_->Patch(path, patch, "application/merge-patch+json");
    if (p.ok()) break;
    auto again = absl::IsAborted(p.status()) && attempt < 4 ? client_->Get(path) : absl::StatusOr<json>(p.status());
    if (!again.ok()) {
      Log("deviceplugin")
          ->warn("{}: cannot annotate the applied enforcement: {}", who, std::string(again.status().message()));
      break;
    }
    current = std::move(*again);
  }
  (void)events_->Record({"v1", "Pod", owner->namespace_name, owner->pod, meta.value("uid", "")}, "Normal",
                        "GpuShareAssigned", "Allocate", note);
  Log("deviceplugin")->info("{}: {}", who, note);
  return absl::OkStatus();
}

}  // namespace kgpu::cli
