#pragma once
// Publishing what schedulers need about this node to the Kubernetes API:
//  - GFD-compatible labels (deviceplugin/gfd_labels.h) patched onto the Node (JSON merge patch on
//    metadata.labels; RBAC: get and patch nodes), or written as an NFD feature file, as GFD
//    offers; only labels we own are ever set or removed;
//  - the GPU inventory annotation kgpu.io/gpu-inventory for the scheduler extender: compact,
//    versioned JSON (per GPU index, UUID, model, memory MiB, NUMA node, discovery health, MIG
//    devices with profiles; NVLink and PCIe-switch islands; the sharing mode and slots), written
//    only when it changes.
// `kgpu node-labels` runs it once or on an interval (GFD's --sleep-interval), relabelling when the
// inventory (a MIG re-partition) or the config (sharing) changes.
//
// Thread-safety: functions are reentrant; each call does its own API requests.

#include <CLI/CLI.hpp>
#include <nlohmann/json.hpp>

#include <csignal>
#include <map>
#include <string>

#include "absl/status/statusor.h"
#include "cli/commands.h"
#include "cli/device_plugin_cmd.h"
#include "deviceplugin/config.h"
#include "gpu/inventory.h"
#include "k8s/client.h"

namespace kgpu::cli {

inline constexpr char kInventoryAnnotation[] = "kgpu.io/gpu-inventory";

// The annotation's value (format version 1).
std::string InventoryAnnotation(const gpu::Inventory& inventory, const deviceplugin::Config& config);

// The merge patch that brings `node` to the desired labels and annotation: owned labels not
// desired become null, changed ones are set, others untouched; the annotation only when it
// differs. Null when nothing changes.
nlohmann::json NodePatch(const nlohmann::json& node, const std::map<std::string, std::string>& labels,
                         const std::string& inventory_annotation);

struct PublishResult {
  bool patched = false;
  size_t labels_set = 0, labels_removed = 0;
  bool annotation_changed = false;
};
absl::StatusOr<PublishResult> PublishToNode(k8s::Client& client, const std::string& node_name,
                                            const std::map<std::string, std::string>& labels,
                                            const std::string& inventory_annotation);

// Writes the NFD feature file atomically (temporary file, then rename).
absl::Status WriteFeatureFile(const std::string& path, const std::map<std::string, std::string>& labels);

struct NodeLabelsFlags {
  std::string kubeconfig, context;
  std::string node_name;  // NODE_NAME
  std::string output = "api";  // api | file
  std::string feature_file = "/etc/kubernetes/node-feature-discovery/features.d/gfd";
  unsigned interval_s = 60;  // 0: once
  bool oneshot = false;
  bool no_timestamp = false;
  std::string machine_file = "/sys/class/dmi/id/product_name";
};
void AddNodeLabelsFlags(CLI::App* app, NodeLabelsFlags* flags);
// Runs until *stop is set (or once). Returns the exit code.
int RunNodeLabels(const NodeOptions& node, const DevicePluginFlags& dp, const NodeLabelsFlags& flags,
                  const volatile std::sig_atomic_t* stop, std::ostream& out);

}  // namespace kgpu::cli
