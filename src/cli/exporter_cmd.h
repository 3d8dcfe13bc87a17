#pragma once
// `kgpu exporter` (dcgm-exporter's flags and DCGM_EXPORTER_* variables) and `kgpu node` (the
// device plugin and the exporter in one process, sharing one NVML session and one inventory).
//
// Every flag and environment variable of dcgm-exporter 4.x (pkg/cmd/app.go) is accepted with its
// meaning, or accepted with a logged note where it has none in kgpu (DCGM's own settings), or
// refused with the reason and what to use instead; none is ignored silently. docs/exporter.md has
// the table. Exit codes: 2 for the command line (an unknown flag, a malformed value, a flag kgpu
// refuses), 1 for bad input behind it (a counters, web config or config file; a ConfigMap; a GPU
// -d names that the node lacks) and for failures.
//
// Thread-safety: set-up code, single-threaded.

#include <chrono>
#include <cstdint>
#include <map>
#include <memory>
#include <mutex>
#include <regex>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include <CLI/CLI.hpp>
#include <nlohmann/json_fwd.hpp>

#include "absl/status/statusor.h"
#include "cli/commands.h"
#include "cli/device_plugin_cmd.h"
#include "exporter/exporter.h"
#include "kubelet/podresources.h"

namespace kgpu::k8s {
class Client;
class Informer;
}  // namespace kgpu::k8s

namespace kgpu::cli {

struct ExporterFlags {
  // dcgm-exporter's flags, in pkg/cmd/app.go's order, with their defaults.
  std::string collectors;  // -f; empty: built-in default counters
  bool collectors_given = false;
  std::string config_file;  // --config-file (4.6+ YAML); `kgpu node`: --exporter-config-file
  std::string address = ":9400";
  std::string web_read_timeout = "10s", web_write_timeout = "30s";
  unsigned max_concurrent_scrapes = 16;
  bool exporter_metrics = false;
  unsigned interval_ms = 30000;
  bool interval_given = false;
  std::string watch_max_keep_age = "10m";
  int64_t watch_max_keep_samples = 0;
  bool kubernetes = false;
  bool use_old_namespace = false;       // -o
  std::string cpu_devices = "f";        // -p
  std::string configmap_data = "none";  // -m <namespace>:<name>
  std::string remote_hostengine;        // -r; empty: not given
  bool pod_labels = false;              // --kubernetes-enable-pod-labels
  bool pod_uid = false;                 // --kubernetes-enable-pod-uid
  std::string gpu_id_type = "uid";
  std::vector<std::string> pod_label_allowlist;  // --kubernetes-pod-label-allowlist-regex
  std::string devices = "f";                     // -d
  bool no_hostname = false;
  bool health_require_gpus = false;
  std::string switch_devices = "f";  // -s
  bool fake_gpus = false;
  std::string web_config_file;
  unsigned xid_window_ms = 300000;  // -x
  bool replace_blanks = false;      // --replace-blanks-in-model-name, -rbmn
  bool debug = false;
  unsigned clock_events_window_ms = 300000;
  bool dcgm_log = false;
  std::string dcgm_log_level = "NONE";
  std::string log_format = "text";
  std::string pod_resources_socket = kubelet::kPodResourcesSocket;
  std::string hpc_job_mapping_dir;
  bool container_labels = false;
  std::string container_runtime_socket;
  std::vector<std::string> nvidia_resource_names;
  bool virtual_gpus = false;  // --kubernetes-virtual-gpus
  bool dump_enabled = false;
  std::string dump_directory = "/tmp/dcgm-exporter-debug";
  int dump_retention = 24;
  bool dump_compression = true;
  bool dra = false;  // --kubernetes-enable-dra
  bool disable_startup_validate = false;
  bool bind_unbind_watch = false;
  std::string bind_unbind_poll_interval = "1s";
  bool pprof = false;
  bool systemd_socket = false;  // --web-systemd-socket

  // kgpu's own.
  std::string hostname_label = "Hostname";  // --hostname-label: Hostname or hostname (dcgm-exporter 4.6+)
  std::chrono::milliseconds pod_resources_interval{10000};  // --pod-resources-interval
  std::string proc_root = "/proc";
  std::string checkpoint = "/var/lib/kubelet/device-plugins/kubelet_internal_checkpoint";
  std::string cdi_spec_dir = "/var/run/cdi";
  // The exporter's own health monitor (`kgpu exporter`; `kgpu node` follows the plugin's config):
  // how long after its last fault a GPU is up again, a duration or "never".
  std::string health_recover_after = "5m";
  // The API server for -m and --kubernetes-enable-pod-labels: `kgpu node` sets these from its
  // --kubeconfig, --context, --in-cluster and --node-name; `kgpu exporter` resolves as kubectl does
  // (KUBECONFIG, ~/.kube/config, else the pod's service account, as dcgm-exporter) and takes
  // NODE_NAME.
  std::string kubeconfig, kube_context, node_name;
  bool in_cluster = false;
};

void AddExporterFlags(CLI::App* app, ExporterFlags* flags);

// The command line's own checks (exit 2): a malformed selector, duration, ConfigMap name or
// regular expression, and the flags kgpu refuses (--fake-gpus, --kubernetes-enable-dra,
// --web-systemd-socket, --container-labels, a -p or -s selection), each with the reason and the
// kgpu equivalent.
absl::Status CheckExporterFlags(const ExporterFlags& flags);
// The options, reading what the flags name (exit 1 on failure): the counters (-f, -m's ConfigMap,
// --config-file), the web config. Logs once what a flag without a kgpu meaning does not do.
absl::StatusOr<exporter::ExporterOptions> ResolveExporterOptions(const ExporterFlags& flags);

// dcgm-exporter's device selector (-d, -s, -p): f | g[:ids] | i[:ids] | g[:ids]+i[:ids], ids a
// comma list of numbers and ranges (0,2-4). Errors name `flag` and show the syntax.
absl::StatusOr<exporter::DeviceSelector> ParseDeviceSelector(std::string_view flag, std::string_view value);

// dcgm-exporter reads its command line with Go's flag package (urfave/cli), which takes a long
// flag after one dash as well as two (-collectors x, -web-config-file=x) and has the 4-letter
// alias -rbmn. CLI11 reads "-collectors" as a cluster of short flags, so main() passes the
// command line through this first: after the `exporter` or `node` subcommand, an argument "-name"
// or "-name=value" whose name is one of that subcommand's long options becomes "--name[=value]",
// and -rbmn becomes --replace-blanks-in-model-name; a one-letter "-x=value" (Go's form, which
// CLI11 would read as the value "=value") becomes "--<long name of x>=value". The subcommand is
// looked for past kgpu's own options and their values, up to the first other positional argument.
// Everything else (and anything after "--") is left as it is. Run under the name dcgm-exporter (a link to kgpu:
// manifests and images that start dcgm-exporter with its own arguments, or none, as the GPU Operator's DaemonSet does),
// the command line is `kgpu exporter <its arguments>`. The result includes argv[0].
std::vector<std::string> GoStyleFlags(const CLI::App& app, int argc, const char* const* argv);

// --kubernetes-enable-pod-labels: this node's pods (flags.node_name, else NODE_NAME) from a pod
// informer (spec.nodeName=<node>), kept as the labels (PodMetricLabels: sanitised, allow-listed)
// and UID the exporter puts on pod series. A map follows the informer's events, so a collection
// reads it without calling the API server. Must outlive the Exporter its Reader() is given to.
class PodMetadataSource {
 public:
  // Errors (no node name, no API server, a malformed allowlist) name the flag to fix. Waits up to
  // 10 s for the first list; later pods appear as the informer sees them.
  static absl::StatusOr<std::unique_ptr<PodMetadataSource>> Start(const ExporterFlags& flags);
  ~PodMetadataSource();
  PodMetadataSource(const PodMetadataSource&) = delete;
  PodMetadataSource& operator=(const PodMetadataSource&) = delete;
  exporter::PodMetadataReader Reader();

 private:
  PodMetadataSource();
  void Put(const nlohmann::json& pod);
  void Remove(const nlohmann::json& pod);

  std::vector<std::regex> allow_;
  std::unique_ptr<k8s::Client> client_;
  std::unique_ptr<k8s::Informer> informer_;
  std::mutex mu_;
  std::map<std::pair<std::string, std::string>, exporter::PodMetadata> pods_;  // (namespace, name)
};

// Both run until SIGTERM/SIGINT; the caller has blocked SIGHUP, SIGTERM, SIGINT and SIGQUIT.
int RunExporter(const NodeOptions& node, const ExporterFlags& flags);
int RunNode(const NodeOptions& node, const DevicePluginFlags& plugin, const ExporterFlags& exporter,
            const NodeLabelsFlags& labels = {});

}  // namespace kgpu::cli
