#include "cli/node_labels.h"

#include <algorithm>
#include <chrono>
#include <cstdlib>
#include <ctime>
#include <filesystem>
#include <set>
#include <thread>

#include "api/inventory.h"
#include "api/names.h"
#include "cli/device_plugin_cmd.h"
#include "cli/flags.h"
#include "common/files.h"
#include "common/log.h"
#include "common/strings.h"
#include "deviceplugin/gfd_labels.h"
#include "deviceplugin/plan.h"
#include "deviceplugin/server.h"
#include "k8s/config.h"

namespace kgpu::cli {
namespace {
using json = nlohmann::json;

// Connected components of GPUs under `linked`.
std::vector<std::vector<int>> Islands(const gpu::Inventory& inv,
                                      const std::function<bool(unsigned, unsigned)>& linked) {
  const unsigned n = static_cast<unsigned>(inv.gpus().size());
  std::vector<int> comp(n, -1);
  std::vector<std::vector<int>> out;
  for (unsigned s = 0; s < n; ++s) {
    if (comp[s] >= 0) continue;
    std::vector<unsigned> stack{s}, members;
    comp[s] = static_cast<int>(out.size());
    while (!stack.empty()) {
      const unsigned a = stack.back();
      stack.pop_back();
      members.push_back(a);
      for (unsigned b = 0; b < n; ++b) {
        if (comp[b] < 0 && b != a && linked(a, b)) {
          comp[b] = comp[s];
          stack.push_back(b);
        }
      }
    }
    if (members.size() < 2) continue;  // a lone GPU is no island
    std::sort(members.begin(), members.end());
    std::vector<int> ids;
    for (unsigned m : members) ids.push_back(static_cast<int>(inv.gpus()[m].index));
    out.push_back(std::move(ids));
  }
  return out;
}

}  // namespace

std::map<std::string, int64_t> ShareCapacity(const gpu::Inventory& inv, const deviceplugin::Config& config) {
  int64_t memory = 0, gpus = 0;
  for (const auto& g : inv.gpus()) {
    if (deviceplugin::ShareSlotsOf(g, config) == 0) continue;
    memory += static_cast<int64_t>(g.memory_mib);
    ++gpus;
  }
  if (gpus == 0) return {};
  return {{api::kShareMemory, memory}, {api::kShareCores, 100 * gpus}};
}

json CapacityPatch(const json& node, const std::map<std::string, int64_t>& capacity) {
  const json status = node.value("status", json::object());
  json patch = json::object();
  for (const char* field : {"capacity", "allocatable"}) {
    const json current = status.value(field, json::object());
    json p = json::object();
    for (const char* name : {api::kShareMemory, api::kShareCores}) {
      const auto want = capacity.find(name);
      if (want == capacity.end()) {
        if (current.contains(name)) p[name] = nullptr;
      } else if (current.value(name, json()) != json(std::to_string(want->second))) {
        p[name] = std::to_string(want->second);
      }
    }
    if (!p.empty()) patch["status"][field] = p;
  }
  return patch.empty() ? json() : patch;
}

UsedMemoryMiB UsedMemory(const nvml::Library& lib, const gpu::Inventory& inventory, UsedMemoryMiB* last) {
  UsedMemoryMiB out;
  for (const auto& g : inventory.gpus()) {
    if (g.lost || g.hung || !g.error.empty() || g.mig_enabled) continue;
    auto m = lib.Memory(g.handle);
    if (!m.ok()) continue;
    const auto mib = static_cast<int64_t>(m->used >> 20);
    if (last == nullptr) {
      out[g.uuid] = mib;
      continue;
    }
    auto [it, fresh] = last->try_emplace(g.uuid, mib);
    if (!fresh && std::abs(mib - it->second) >= kUsedMemoryStepMiB) it->second = mib;
    out[g.uuid] = it->second;
  }
  return out;
}

std::string InventoryAnnotation(const gpu::Inventory& inv, const deviceplugin::Config& config, const LiveHealth* live,
                                const UsedMemoryMiB* used) {
  // Discovery's verdict wins (a lost GPU is lost whatever was last served); else the plugin's.
  auto health = [&](const std::string& uuid, const char* discovered) -> const char* {
    if (std::string_view(discovered) != "ok" || live == nullptr) return discovered;
    const auto it = live->find(uuid);
    return it == live->end() || it->second ? "ok" : "unhealthy";
  };
  api::NodeInventory out;  // encoded by api::EncodeInventory, the parser's neighbour
  bool any_slots = false;
  for (const auto& g : inv.gpus()) {
    const char* discovered = g.lost ? "lost" : !g.error.empty() ? "error" : "ok";
    api::InventoryGpu e;
    e.index = static_cast<int>(g.index);
    e.uuid = g.uuid;
    e.model = g.name;
    e.memory_mib = static_cast<int64_t>(g.memory_mib);
    e.numa = g.numa_node;
    e.health = health(g.uuid, discovered);
    e.slots = std::max(0, deviceplugin::ShareSlotsOf(g, config));
    any_slots = any_slots || e.slots > 0;
    if (used != nullptr) {
      if (const auto u = used->find(g.uuid); u != used->end()) e.used_mib = u->second;
    }
    e.mig_enabled = g.mig_enabled;
    if (g.mig_enabled) {
      for (const auto& m : g.migs) {
        e.mig.push_back({m.uuid, m.profile, static_cast<int>(m.gi), static_cast<int>(m.ci),
                         static_cast<int64_t>(m.memory_mib), health(m.uuid, discovered)});
      }
    }
    out.gpus.push_back(std::move(e));
  }
  out.sharing_mode = config.sharing.strategy == deviceplugin::SharingStrategy::kMps           ? "mps"
                     : config.sharing.strategy == deviceplugin::SharingStrategy::kTimeSlicing ? "time-slicing"
                                                                                              : "none";
  for (const auto& r : config.sharing.resources) {
    if (r.replicas > 1) out.replicas[r.rename.empty() ? r.name : r.rename] = r.replicas;
  }
  // The enforcement modes shares can have here (docs/sharing-model.md), the default first: MPS
  // limits under MPS; else the CUDA interposer's hard limit where the plugin has one
  // (--cuda-interposer), and none (time-slicing without isolation).
  if (any_slots) {
    out.enforcement = config.sharing.strategy == deviceplugin::SharingStrategy::kMps ? std::vector<std::string>{"mps"}
                      : config.cuda_interposer.empty()                               ? std::vector<std::string>{"none"}
                                                       : std::vector<std::string>{"hard", "none"};
  }
  out.nvlink_islands = Islands(inv, [&](unsigned a, unsigned b) { return inv.link(a, b).nvlinks > 0; });
  out.pcie_islands = Islands(inv, [&](unsigned a, unsigned b) {
    const auto l = inv.link(a, b).pcie;
    return l == gpu::PcieLevel::kPix || l == gpu::PcieLevel::kPxb;
  });
  out.mig_strategy = config.mig_strategy;
  return api::EncodeInventory(out);
}

json NodePatch(const json& node, const std::map<std::string, std::string>& labels, const std::string& annotation) {
  const json meta = node.value("metadata", json::object());
  const json current = meta.value("labels", json::object());
  json lp = json::object();
  for (auto it = current.begin(); it != current.end(); ++it) {
    if (deviceplugin::OwnsLabel(it.key()) && !labels.contains(it.key())) lp[it.key()] = nullptr;
  }
  for (const auto& [k, v] : labels) {
    if (!current.contains(k) || current[k] != v) lp[k] = v;
  }
  json patch = json::object();
  if (!lp.empty()) patch["metadata"]["labels"] = lp;
  const json ann = meta.value("annotations", json::object());
  if (!annotation.empty() && ann.value(kInventoryAnnotation, "") != annotation) {
    patch["metadata"]["annotations"][kInventoryAnnotation] = annotation;
  }
  return patch.empty() ? json() : patch;
}

absl::StatusOr<PublishResult> PublishToNode(k8s::Client& client, const std::string& node_name,
                                            const std::map<std::string, std::string>& labels,
                                            const std::string& annotation,
                                            const std::map<std::string, int64_t>* capacity) {
  const std::string path = k8s::FindResource("nodes")->Path("", node_name);
  auto node = client.Get(path);
  if (!node.ok()) return node.status();
  PublishResult r;
  if (const json patch = NodePatch(*node, labels, annotation); !patch.is_null()) {
    if (patch["metadata"].contains("labels")) {
      for (auto it = patch["metadata"]["labels"].begin(); it != patch["metadata"]["labels"].end(); ++it) {
        ++(it->is_null() ? r.labels_removed : r.labels_set);
      }
    }
    r.annotation_changed = patch["metadata"].contains("annotations");
    auto res = client.Patch(path, patch, "application/merge-patch+json");
    if (!res.ok()) return res.status();
    r.patched = true;
  }
  if (capacity != nullptr) {
    // The status subresource: kubelet keeps extended resources it does not manage (and zeroes
    // them only when it re-creates its Node, which the next publish repairs).
    if (const json cp = CapacityPatch(*node, *capacity); !cp.is_null()) {
      auto res = client.Patch(path + "/status", cp, "application/merge-patch+json");
      if (!res.ok()) {
        return absl::Status(
            res.status().code(),
            Cat("patch nodes/", node_name, "/status (the share capacity autoscalers read; the role needs ",
                "patch on nodes/status, deploy/shares/rbac.yaml): ", res.status().message()));
      }
      r.capacity_changed = r.patched = true;
    }
  }
  return r;
}

absl::Status WriteFeatureFile(const std::string& path, const std::map<std::string, std::string>& labels) {
  std::error_code ec;
  const auto dir = std::filesystem::path(path).parent_path();
  if (!dir.empty()) std::filesystem::create_directories(dir, ec);
  if (auto st = WriteFileAtomically(path, deviceplugin::NfdFeatureFile(labels)); !st.ok()) {
    return absl::UnavailableError(Cat("the feature file: ", st.message()));
  }
  return absl::OkStatus();
}

namespace {

// GFD's names for where labels go and how often (gpu-feature-discovery's --output-file,
// --sleep-interval, --no-timestamp, --machine-type-file; --output is kgpu's: the Node or the file),
// one spelling in kgpu node-labels and in the node agent's --publish-labels.
void AddLabelOutputFlags(CLI::App* app, NodeLabelsFlags* f, const std::string& interval_help) {
  app->add_option("--output", f->output, "api (patch the Node) or file (NFD feature file)")
      ->check(CLI::IsMember({"api", "file"}))
      ->capture_default_str();
  app->add_option("--output-file", f->feature_file, "NFD feature file for --output file")
      ->envname("GFD_OUTPUT_FILE")
      ->capture_default_str();
  AddDurationOption(app, "--sleep-interval", &f->interval, interval_help, {.bare_unit = "s"})
      ->envname("GFD_SLEEP_INTERVAL");
  app->add_flag("--no-timestamp", f->no_timestamp, "omit nvidia.com/gfd.timestamp")->envname("GFD_NO_TIMESTAMP");
  app->add_option("--machine-type-file", f->machine_file,
                  "file holding the machine type for nvidia.com/gpu.machine (unknown when it cannot be read)")
      ->envname("GFD_MACHINE_TYPE_FILE")
      ->capture_default_str();
}

}  // namespace

void AddNodeLabelsFlags(CLI::App* app, NodeLabelsFlags* f) {
  app->add_option("--kubeconfig", f->kubeconfig, k8s::kKubeconfigFlagHelp)->envname("KUBECONFIG_FILE");
  app->add_option("--context", f->context, "kubeconfig context");
  app->add_flag("--in-cluster", f->in_cluster,
                "use the pod's service account (the default in a pod without KUBECONFIG or ~/.kube/config)");
  app->add_option("--node-name", f->node_name, "this node's name")->envname("NODE_NAME");
  AddLabelOutputFlags(app, f, "between relabels (GFD's flag; 0s: label once and exit)");
  app->add_flag("--oneshot", f->oneshot, "label once and exit")->envname("GFD_ONESHOT");
}

void AddPublishLabelsFlags(CLI::App* app, NodeLabelsFlags* f) {
  app->add_flag("--publish-labels", f->publish,
                "also publish the GFD labels and the kgpu.io/gpu-inventory annotation (as kgpu node-labels), "
                "on an interval and whenever health, the MIG layout or the config changes")
      ->envname("KGPU_PUBLISH_LABELS");
  app->add_option("--kubeconfig", f->kubeconfig,
                  "kubeconfig for --publish-labels and the kgpu.io/gpu handoff (default: the files of $KUBECONFIG "
                  "merged, else ~/.kube/config, else the pod's service account)")
      ->envname("KUBECONFIG_FILE");
  app->add_option("--context", f->context, "kubeconfig context");
  app->add_flag("--in-cluster", f->in_cluster,
                "use the pod's service account (the default in a pod without KUBECONFIG or ~/.kube/config)");
  app->add_option("--node-name", f->node_name, "this node's Node name (--publish-labels, kgpu.io/gpu handoff)")
      ->envname("NODE_NAME");
  AddLabelOutputFlags(app, f, "between relabels besides those on change (0s: on change only)");
  // The spellings of earlier releases, for one more: GFD's names above are the ones kgpu
  // node-labels takes too.
  const std::string cmd = "kgpu " + app->get_name();
  AddDeprecatedOption(app, cmd, "--labels-output", "--output", [f](const std::string& v) {
    if (v != "api" && v != "file") throw CLI::ValidationError("--labels-output", "'" + v + "': api or file");
    f->output = v;
  });
  AddDeprecatedOption(app, cmd, "--labels-output-file", "--output-file",
                      [f](const std::string& v) { f->feature_file = v; });
  AddDeprecatedDurationOption(app, cmd, "--labels-interval", "--sleep-interval", &f->interval, {.bare_unit = "s"});
  AddDeprecatedFlag(app, cmd, "--labels-no-timestamp", "--no-timestamp",
                    [f](std::int64_t n) { f->no_timestamp = n > 0; });
  AddDeprecatedOption(app, cmd, "--labels-machine-type-file", "--machine-type-file",
                      [f](const std::string& v) { f->machine_file = v; });
}

absl::StatusOr<std::unique_ptr<NodeLabeller>> NodeLabeller::Create(const NodeLabelsFlags& flags) {
  std::unique_ptr<NodeLabeller> l(new NodeLabeller(flags));
  if (flags.output == "api") {
    if (flags.node_name.empty()) {
      return absl::InvalidArgumentError("--node-name (or NODE_NAME) is required to label the Node (or write a file)");
    }
    auto cfg = k8s::ConfigFromFlags(flags.kubeconfig, flags.context, flags.in_cluster);
    if (!cfg.ok()) return cfg.status();
    auto c = k8s::Client::Create(*cfg);
    if (!c.ok()) return c.status();
    l->client_ = std::move(*c);
  }
  // Read once: the DMI product name does not change while the node runs.
  l->machine_ = deviceplugin::ReadMachineType(flags.machine_file);
  return l;
}

absl::Status NodeLabeller::Publish(const gpu::Inventory& inventory, const deviceplugin::Config& config,
                                   const LiveHealth* live, const UsedMemoryMiB* used) {
  auto log = Log("cli");
  deviceplugin::GfdOptions go;
  go.timestamp = !flags_.no_timestamp;
  go.now_seconds = static_cast<int64_t>(std::time(nullptr));
  go.machine = machine_;
  const auto labels = deviceplugin::GfdLabels(inventory, config, go);
  if (flags_.output == "file") {
    if (auto s = WriteFeatureFile(flags_.feature_file, labels); !s.ok()) return s;
    log->info("wrote {} labels to {}", labels.size(), flags_.feature_file);
    return absl::OkStatus();
  }
  const auto capacity = ShareCapacity(inventory, config);
  auto r =
      PublishToNode(*client_, flags_.node_name, labels, InventoryAnnotation(inventory, config, live, used), &capacity);
  if (!r.ok()) return r.status();
  log->info("node {}: {} labels set, {} removed, inventory annotation {}, share capacity {}", flags_.node_name,
            r->labels_set, r->labels_removed, r->annotation_changed ? "updated" : "unchanged",
            r->capacity_changed ? "updated" : "unchanged");
  return absl::OkStatus();
}

LabelPublisher::LabelPublisher(std::unique_ptr<NodeLabeller> labeller, Source source, std::chrono::seconds interval,
                               std::chrono::milliseconds debounce)
    : labeller_(std::move(labeller)), source_(std::move(source)), interval_(interval), debounce_(debounce) {}

LabelPublisher::~LabelPublisher() {
  Stop();
}

void LabelPublisher::Start() {
  if (thread_.joinable()) return;
  {
    std::lock_guard<std::mutex> lock(hook_->mu);
    hook_->target = this;
  }
  thread_ = std::jthread([this](std::stop_token st) { Loop(st); });
}

std::function<void()> LabelPublisher::Notifier() {
  return [hook = hook_] {
    std::lock_guard<std::mutex> lock(hook->mu);
    if (hook->target != nullptr) hook->target->Notify();
  };
}

void LabelPublisher::Stop() {
  {
    std::lock_guard<std::mutex> lock(hook_->mu);
    hook_->target = nullptr;
  }
  if (!thread_.joinable()) return;
  thread_.request_stop();
  cv_.notify_all();
  thread_.join();
}

void LabelPublisher::Notify() {
  {
    std::lock_guard<std::mutex> lock(mu_);
    pending_ = true;
  }
  cv_.notify_all();
}

uint64_t LabelPublisher::passes() const {
  std::lock_guard<std::mutex> lock(mu_);
  return passes_;
}

void LabelPublisher::Loop(std::stop_token stop) {
  auto log = Log("cli");
  using Clock = std::chrono::steady_clock;
  constexpr auto kMaxWait = std::chrono::hours(24 * 365);
  const auto interval = interval_.count() > 0 ? std::chrono::duration_cast<Clock::duration>(interval_) : kMaxWait;
  auto backoff = std::chrono::milliseconds(1000);
  auto next = Clock::now();  // the first pass at once
  std::string last_error;
  while (!stop.stop_requested()) {
    {
      std::unique_lock<std::mutex> lock(mu_);
      cv_.wait_until(lock, stop, next, [&] { return pending_; });
      if (stop.stop_requested()) return;
      if (pending_) {
        // A change is often a burst (a re-partition, a reload): publish once it is over.
        cv_.wait_for(lock, stop, debounce_, [] { return false; });
        if (stop.stop_requested()) return;
        pending_ = false;
      } else if (Clock::now() < next) {
        continue;
      }
    }
    absl::Status st;
    bool skipped = false;
    auto snap = source_();
    if (!snap.ok()) {
      st = snap.status();
    } else if (!snap->inventory || !snap->config) {
      skipped = true;  // not serving yet: the start notifies
    } else {
      st = labeller_->Publish(*snap->inventory, *snap->config, &snap->healthy, &snap->used);
    }
    {
      std::lock_guard<std::mutex> lock(mu_);
      if (!skipped) ++passes_;
    }
    if (skipped) {
      next = Clock::now() + interval;
      continue;
    }
    if (st.ok()) {
      if (!last_error.empty()) log->info("labels published again");
      last_error.clear();
      backoff = std::chrono::milliseconds(1000);
      next = Clock::now() + interval;
    } else {
      const std::string msg(st.message());
      if (msg != last_error) log->warn("publishing labels: {}; retrying", msg);
      last_error = msg;
      next = Clock::now() + std::min<Clock::duration>(backoff, interval);
      backoff = std::min<std::chrono::milliseconds>(backoff * 2, std::chrono::minutes(5));
    }
  }
}

absl::StatusOr<std::unique_ptr<LabelPublisher>> MakeLabelPublisher(deviceplugin::Manager& manager,
                                                                   const NodeLabelsFlags& flags) {
  if (!flags.publish) return std::unique_ptr<LabelPublisher>();
  auto labeller = NodeLabeller::Create(flags);
  if (!labeller.ok())
    return absl::Status(labeller.status().code(), Cat("--publish-labels: ", labeller.status().message()));
  auto last = std::make_shared<UsedMemoryMiB>();  // the passes run on the publisher's one thread
  auto source = [&manager, last]() -> absl::StatusOr<LabelPublisher::Snapshot> {
    auto a = manager.advertised();
    UsedMemoryMiB used = a.inventory ? UsedMemory(manager.lib(), *a.inventory, last.get()) : UsedMemoryMiB();
    return LabelPublisher::Snapshot{std::move(a.inventory), std::move(a.config), std::move(a.healthy), std::move(used)};
  };
  auto p = std::make_unique<LabelPublisher>(std::move(*labeller), source, flags.interval);
  manager.SetOnChange(p->Notifier());
  p->Start();
  return p;
}

int RunNodeLabels(const NodeOptions& node, const DevicePluginFlags& dp, const NodeLabelsFlags& flags,
                  const volatile std::sig_atomic_t* stop, std::ostream& out) {
  // A missing node name is usage (2); a kubeconfig that is missing or wrong is bad input (1), as in
  // every command (README "Exit codes").
  const bool usage = flags.output == "api" && flags.node_name.empty();
  auto labeller = NodeLabeller::Create(flags);
  if (!labeller.ok()) {
    out << "kgpu node-labels: " << labeller.status().message() << "\n";
    return usage ? 2 : 1;
  }
  // Without a plugin to follow, each pass re-reads the config and re-discovers the GPUs (a MIG
  // re-partition or a config change shows at the next pass); health is discovery's.
  UsedMemoryMiB last;
  auto source = [&]() -> absl::StatusOr<LabelPublisher::Snapshot> {
    auto cs = OpenConfiguredSession(node, dp);
    if (!cs.ok()) return cs.status();
    UsedMemoryMiB used = UsedMemory(*cs->session.lib, *cs->session.inventory, &last);
    return LabelPublisher::Snapshot{
        cs->session.inventory, std::make_shared<const deviceplugin::Config>(cs->config), {}, std::move(used)};
  };
  if (flags.oneshot || flags.interval.count() == 0) {
    auto snap = source();
    absl::Status st =
        snap.ok() ? (*labeller)->Publish(*snap->inventory, *snap->config, nullptr, &snap->used) : snap.status();
    if (!st.ok()) out << "kgpu node-labels: " << st.message() << "\n";
    return st.ok() ? 0 : 1;
  }
  LabelPublisher publisher(std::move(*labeller), source, flags.interval);
  publisher.Start();
  while (!(stop && *stop)) std::this_thread::sleep_for(std::chrono::milliseconds(100));
  publisher.Stop();
  return 0;
}

int RunNodeTemplate(const NodeOptions& node, const DevicePluginFlags& dp, const std::string& format,
                    std::ostream& out) {
  auto cs = OpenConfiguredSession(node, dp);
  if (!cs.ok()) {
    out << "kgpu node-template: " << cs.status().message() << "\n";
    return 1;
  }
  const deviceplugin::Config& config = cs->config;
  const auto& inventory = cs->session.inventory;
  auto plan = deviceplugin::BuildPlan(inventory, config);
  if (!plan.ok()) {
    out << "kgpu node-template: " << plan.status().message() << "\n";
    return 1;
  }
  std::map<std::string, int64_t> capacity = ShareCapacity(*inventory, config);
  for (const auto& r : (*plan)->resources) {
    if (!r.retired && !r.devices.empty()) capacity[r.name] = static_cast<int64_t>(r.devices.size());
  }
  deviceplugin::GfdOptions go;
  go.timestamp = false;  // a template describes every such node, not one moment
  go.machine = deviceplugin::ReadMachineType(deviceplugin::kDefaultMachineTypeFile);
  const auto labels = deviceplugin::GfdLabels(*inventory, config, go);
  if (format == "json") {
    json c = json::object(), l = json::object();
    for (const auto& [k, v] : capacity) c[k] = std::to_string(v);
    for (const auto& [k, v] : labels) l[k] = v;
    out << json({{"capacity", c}, {"labels", l}}).dump(2) << "\n";
  } else if (format == "aws") {
    for (const auto& [k, v] : capacity)
      out << "k8s.io/cluster-autoscaler/node-template/resources/" << k << "=" << v << "\n";
    for (const auto& [k, v] : labels) out << "k8s.io/cluster-autoscaler/node-template/label/" << k << "=" << v << "\n";
  } else {
    out << "# kgpu node-template: what a node like this one advertises (every device healthy), for a\n"
           "# cluster-autoscaler node group that scales from zero. kgpu.io/gpu-memory and kgpu.io/gpu-cores\n"
           "# are what `kgpu device-plugin --publish-labels` writes into its Node's status.\n";
    out << "capacity:\n";
    for (const auto& [k, v] : capacity) out << "  " << k << ": \"" << v << "\"\n";
    out << "labels:\n";
    for (const auto& [k, v] : labels) out << "  " << k << ": " << json(v).dump() << "\n";
  }
  return 0;
}

}  // namespace kgpu::cli
