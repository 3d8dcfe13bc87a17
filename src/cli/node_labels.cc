#include "cli/node_labels.h"

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <ctime>
#include <filesystem>
#include <fstream>
#include <set>
#include <thread>

#include "common/files.h"
#include "common/log.h"
#include "common/strings.h"
#include "deviceplugin/gfd_labels.h"
#include "deviceplugin/plan.h"
#include "k8s/config.h"

namespace kgpu::cli {
namespace {
using json = nlohmann::json;

// Connected components of GPUs under `linked`.
json Islands(const gpu::Inventory& inv, const std::function<bool(unsigned, unsigned)>& linked) {
  const unsigned n = static_cast<unsigned>(inv.gpus().size());
  std::vector<int> comp(n, -1);
  json out = json::array();
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
    json ids = json::array();
    for (unsigned m : members) ids.push_back(inv.gpus()[m].index);
    out.push_back(ids);
  }
  return out;
}

}  // namespace

std::string InventoryAnnotation(const gpu::Inventory& inv, const deviceplugin::Config& config) {
  // GPUs that serve kgpu.io/gpu shares (time-slicing or MPS renamed to kgpu.io/gpu): their slots.
  auto slots_of = [&](const gpu::Gpu& g) {
    if (g.mig_enabled) return 0;
    for (const auto& r : config.sharing.resources) {
      if ((r.rename.empty() ? r.name : r.rename) != deviceplugin::kKgpuSharesResource || r.name != "nvidia.com/gpu") continue;
      if (r.devices.empty()) return r.replicas;
      for (const auto& d : r.devices) {
        if (d == g.uuid || d == std::to_string(g.index)) return r.replicas;
      }
    }
    return 0;
  };
  bool any_slots = false;
  json gpus = json::array();
  for (const auto& g : inv.gpus()) {
    json e = {{"i", g.index}, {"uuid", g.uuid}, {"model", g.name}, {"memMiB", g.memory_mib},
              {"numa", g.numa_node}, {"health", g.lost ? "lost" : !g.error.empty() ? "error" : "ok"}};
    if (const int slots = slots_of(g); slots > 0) {
      e["slots"] = slots;
      any_slots = true;
    }
    if (g.mig_enabled) {
      json migs = json::array();
      for (const auto& m : g.migs) {
        migs.push_back({{"uuid", m.uuid}, {"profile", m.profile}, {"gi", m.gi}, {"ci", m.ci}, {"memMiB", m.memory_mib}});
      }
      e["mig"] = migs;
    }
    gpus.push_back(e);
  }
  json sharing = {{"mode", config.sharing.strategy == deviceplugin::SharingStrategy::kMps           ? "mps"
                           : config.sharing.strategy == deviceplugin::SharingStrategy::kTimeSlicing ? "time-slicing"
                                                                                                    : "none"}};
  json slots = json::object();
  for (const auto& r : config.sharing.resources) {
    if (r.replicas > 1) slots[r.rename.empty() ? r.name : r.rename] = r.replicas;
  }
  if (!slots.empty()) sharing["replicas"] = slots;
  // The enforcement modes shares can have here (docs/sharing-model.md): MPS limits under MPS;
  // else the CUDA interposer's hard limit, or none (time-slicing without isolation).
  if (any_slots) {
    sharing["kgpu"] = {{"enforcement", config.sharing.strategy == deviceplugin::SharingStrategy::kMps
                                           ? json::array({"mps"})
                                           : json::array({"hard", "none"})}};
  }
  const json doc = {
      {"v", 1},
      {"gpus", gpus},
      {"nvlinkIslands", Islands(inv, [&](unsigned a, unsigned b) { return inv.link(a, b).nvlinks > 0; })},
      {"pcieIslands", Islands(inv,
                              [&](unsigned a, unsigned b) {
                                const auto l = inv.link(a, b).pcie;
                                return l == gpu::PcieLevel::kPix || l == gpu::PcieLevel::kPxb;
                              })},
      {"migStrategy", config.mig_strategy},
      {"sharing", sharing},
  };
  return doc.dump();
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
                                            const std::string& annotation) {
  const std::string path = k8s::FindResource("nodes")->Path("", node_name);
  auto node = client.Get(path);
  if (!node.ok()) return node.status();
  const json patch = NodePatch(*node, labels, annotation);
  PublishResult r;
  if (patch.is_null()) return r;
  if (patch["metadata"].contains("labels")) {
    for (auto it = patch["metadata"]["labels"].begin(); it != patch["metadata"]["labels"].end(); ++it) {
      ++(it->is_null() ? r.labels_removed : r.labels_set);
    }
  }
  r.annotation_changed = patch["metadata"].contains("annotations");
  auto res = client.Patch(path, patch, "application/merge-patch+json");
  if (!res.ok()) return res.status();
  r.patched = true;
  return r;
}

absl::Status WriteFeatureFile(const std::string& path, const std::map<std::string, std::string>& labels) {
  std::error_code ec;
  const auto dir = std::filesystem::path(path).parent_path();
  if (!dir.empty()) std::filesystem::create_directories(dir, ec);
  const std::string tmp = path + ".tmp";
  {
    std::ofstream out(tmp);
    out << deviceplugin::NfdFeatureFile(labels);
    if (!out) return absl::UnavailableError(Cat(tmp, ": cannot write the feature file"));
  }
  if (std::rename(tmp.c_str(), path.c_str()) != 0) {
    return absl::UnavailableError(Cat(path, ": cannot rename ", tmp, " into place"));
  }
  return absl::OkStatus();
}

void AddNodeLabelsFlags(CLI::App* app, NodeLabelsFlags* f) {
  app->add_option("--kubeconfig", f->kubeconfig, "kubeconfig (default: in-cluster, else $KUBECONFIG)")
      ->envname("KUBECONFIG_FILE");
  app->add_option("--context", f->context, "kubeconfig context");
  app->add_option("--node-name", f->node_name, "this node's name")->envname("NODE_NAME");
  app->add_option("--output", f->output, "api (patch the Node) or file (NFD feature file)")
      ->check(CLI::IsMember({"api", "file"}))
      ->capture_default_str();
  app->add_option("--output-file", f->feature_file, "NFD feature file for --output file")
      ->envname("GFD_OUTPUT_FILE")
      ->capture_default_str();
  app->add_option("--sleep-interval", f->interval_s, "seconds between relabels (GFD's flag)")
      ->envname("GFD_SLEEP_INTERVAL")
      ->capture_default_str();
  app->add_flag("--oneshot", f->oneshot, "label once and exit")->envname("GFD_ONESHOT");
  app->add_flag("--no-timestamp", f->no_timestamp, "omit nvidia.com/gfd.timestamp")->envname("GFD_NO_TIMESTAMP");
}

int RunNodeLabels(const NodeOptions& node, const DevicePluginFlags& dp, const NodeLabelsFlags& flags,
                  const volatile std::sig_atomic_t* stop, std::ostream& out) {
  auto log = Log("cli");
  std::unique_ptr<k8s::Client> client;
  if (flags.output == "api") {
    if (flags.node_name.empty()) {
      out << "kgpu node-labels: --node-name (or NODE_NAME) is required with --output api\n";
      return 2;
    }
    auto cfg = k8s::DefaultConfig(flags.kubeconfig, flags.context);
    if (!cfg.ok()) {
      out << "kgpu node-labels: " << cfg.status().message() << "\n";
      return 2;
    }
    auto c = k8s::Client::Create(*cfg);
    if (!c.ok()) {
      out << "kgpu node-labels: " << c.status().message() << "\n";
      return 2;
    }
    client = std::move(*c);
  }
  std::string last_error;
  for (;;) {
    int rc = 0;
    auto config = ResolveConfig(dp);
    auto session = config.ok() ? OpenSession(node) : absl::StatusOr<Session>(config.status());
    if (!session.ok()) {
      out << "kgpu node-labels: " << session.status().message() << "\n";
      rc = 1;
    } else {
      deviceplugin::GfdOptions go;
      go.timestamp = !flags.no_timestamp;
      go.now_seconds = static_cast<int64_t>(std::time(nullptr));
      if (auto m = ReadFile(flags.machine_file)) {
        std::string v = *m;
        while (!v.empty() && (v.back() == '\n' || v.back() == ' ')) v.pop_back();
        go.machine = v;
      }
      const auto labels = deviceplugin::GfdLabels(*session->inventory, *config, go);
      if (flags.output == "file") {
        if (auto s = WriteFeatureFile(flags.feature_file, labels); !s.ok()) {
          out << "kgpu node-labels: " << s.message() << "\n";
          rc = 1;
        } else {
          log->info("wrote {} labels to {}", labels.size(), flags.feature_file);
        }
      } else {
        auto r = PublishToNode(*client, flags.node_name, labels, InventoryAnnotation(*session->inventory, *config));
        if (!r.ok()) {
          const std::string msg(r.status().message());
          if (msg != last_error) out << "kgpu node-labels: " << msg << "\n";
          last_error = msg;
          rc = 1;
        } else {
          last_error.clear();
          log->info("node {}: {} labels set, {} removed, inventory annotation {}", flags.node_name, r->labels_set,
                    r->labels_removed, r->annotation_changed ? "updated" : "unchanged");
        }
      }
    }
    if (flags.oneshot || flags.interval_s == 0) return rc;
    for (unsigned i = 0; i < flags.interval_s * 10; ++i) {
      if (stop && *stop) return 0;
      std::this_thread::sleep_for(std::chrono::milliseconds(100));
    }
  }
}

}  // namespace kgpu::cli
