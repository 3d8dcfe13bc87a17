#pragma once
// `kgpu exporter` (dcgm-exporter's flags and DCGM_EXPORTER_* variables) and `kgpu node` (the
// device plugin and the exporter in one process, sharing one NVML session and one inventory).
//
// Thread-safety: set-up code, single-threaded.

#include <string>

#include <CLI/CLI.hpp>

#include "absl/status/statusor.h"
#include "cli/commands.h"
#include "cli/device_plugin_cmd.h"
#include "exporter/exporter.h"

namespace kgpu::cli {

struct ExporterFlags {
  std::string collectors;  // -f; empty: built-in default counters
  std::string address = ":9400";
  unsigned interval_ms = 30000;
  bool kubernetes = false;
  std::string gpu_id_type = "uid";
  std::string pod_resources_socket = "/var/lib/kubelet/pod-resources/kubelet.sock";
  unsigned pod_resources_interval_ms = 10000;
  std::string proc_root = "/proc";
  std::string checkpoint = "/var/lib/kubelet/device-plugins/kubelet_internal_checkpoint";
  std::string cdi_spec_dir = "/var/run/cdi";
  bool no_hostname = false;
  bool replace_blanks = false;
  std::string devices = "f";
  // The exporter's own health monitor (`kgpu exporter`; `kgpu node` follows the plugin's config):
  // how long after its last fault a GPU is up again, a duration or "never".
  std::string health_recover_after = "5m";
};

void AddExporterFlags(CLI::App* app, ExporterFlags* flags);
absl::StatusOr<exporter::ExporterOptions> ResolveExporterOptions(const ExporterFlags& flags);

// Both run until SIGTERM/SIGINT; the caller has blocked SIGHUP, SIGTERM, SIGINT and SIGQUIT.
int RunExporter(const NodeOptions& node, const ExporterFlags& flags);
int RunNode(const NodeOptions& node, const DevicePluginFlags& plugin, const ExporterFlags& exporter,
            const NodeLabelsFlags& labels = {});

}  // namespace kgpu::cli
