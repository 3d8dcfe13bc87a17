// kgpu: one binary, many jobs. This file only declares the subcommands with their flags and runs the
// one the command line names, from one command table.

#include <algorithm>
#include <chrono>
#include <csignal>
#include <cstdlib>
#include <functional>
#include <iostream>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include <CLI/CLI.hpp>
#include <malloc.h>
#include <pthread.h>

#include "absl/strings/numbers.h"
#include "cli/commands.h"
#include "cli/device_plugin_cmd.h"
#include "cli/dra_cmd.h"
#include "cli/exporter_cmd.h"
#include "cli/extender_cmd.h"
#include "cli/flags.h"
#include "cli/mig_cmd.h"
#include "cli/node_labels.h"
#include "cli/quota_cmd.h"
#include "cli/reference.h"
#include "cli/sim_cmd.h"
#include "cli/slurm_cmd.h"
#include "cli/webhook_cmd.h"
#include "common/duration.h"
#include "common/files.h"
#include "common/log.h"
#include "common/strings.h"
#include "gpu/health.h"
#include "kgpu_version.h"

namespace {

volatile std::sig_atomic_t g_stop = 0;
void OnSignal(int) {
  g_stop = 1;
}

// How a command takes signals, set up once before it runs.
enum class Signals {
  kDefault,         // a short command: the default dispositions
  kStopFlag,        // SIGINT/SIGTERM set g_stop, which the command polls
  kStopFlagServer,  // the same, and a client that goes away gives EPIPE, not the end of the process
  kNodeDaemon,      // a node daemon: the signals are taken by sigwait() (blocked before any thread)
};

struct Command {
  CLI::App* app;
  Signals signals;
  std::function<int()> run;
};

void TakeSignals(Signals s) {
  switch (s) {
    case Signals::kDefault:
      return;
    case Signals::kStopFlag:
    case Signals::kStopFlagServer:
      std::signal(SIGINT, OnSignal);
      std::signal(SIGTERM, OnSignal);
      if (s == Signals::kStopFlagServer) std::signal(SIGPIPE, SIG_IGN);
      return;
    case Signals::kNodeDaemon: {
      sigset_t signals;
      sigemptyset(&signals);
      for (int sig : {SIGHUP, SIGTERM, SIGINT, SIGQUIT}) sigaddset(&signals, sig);
      pthread_sigmask(SIG_BLOCK, &signals, nullptr);
      // A long-running node daemon with a handful of threads: two malloc arenas are plenty
      // (glibc's default of 8 per core costs megabytes of RSS).
      mallopt(M_ARENA_MAX, 2);
      // A peer that goes away (a kubelet, an MPS client) must give EPIPE, not end the daemon.
      std::signal(SIGPIPE, SIG_IGN);
      return;
    }
  }
}

// The commands the command line selected, outermost first: the app, then each subcommand down to
// the deepest one.
std::vector<const CLI::App*> SelectedCommands(const CLI::App& app) {
  std::vector<const CLI::App*> chain = {&app};
  for (;;) {
    const std::vector<CLI::App*> selected = chain.back()->get_subcommands();
    if (selected.empty()) return chain;
    chain.push_back(selected.front());
  }
}

// What replaces CLI11's message when the command line names a command that does not exist, at any
// level ("kgpu: unknown command 'devces'; did you mean 'devices'?", "kgpu mig: unknown command
// 'aply'; ..."), or names none where one is required; "" leaves CLI11's. CLI11 files an unknown
// word with the extras and then reports only "A subcommand is required" (or, where the command is
// optional, an unexpected argument), so the word is found after parsing: the deepest command
// selected has commands of its own but none was selected, and the word is the first extra that is
// not an option after that command's name. Commands that take positional arguments (slurm-bridge
// reclaim, hook) are never the deepest with commands of their own, so their arguments are not
// taken for commands.
std::string UnknownCommandMessage(const CLI::App& app, const std::vector<std::string>& args,
                                  const CLI::ParseError& error) {
  const std::vector<const CLI::App*> chain = SelectedCommands(app);
  const CLI::App& group = *chain.back();
  std::vector<std::string> names;
  for (const CLI::App* sub :
       group.get_subcommands([](const CLI::App* s) { return !s->get_name().empty() && !s->get_disabled(); })) {
    names.push_back(sub->get_name());
  }
  if (names.empty()) return "";
  std::string path = "kgpu";
  size_t at = 0;  // where the group's name is in args
  for (size_t k = 1; k < chain.size(); ++k) {
    path += " " + chain[k]->get_name();
    for (size_t i = at + 1; i < args.size(); ++i) {
      if (args[i] == chain[k]->get_name()) {
        at = i;
        break;
      }
    }
  }
  const std::vector<std::string> extras = app.remaining(true);
  std::string word;
  for (size_t i = at + 1; i < args.size() && args[i] != "--"; ++i) {
    const std::string& a = args[i];
    if (a.size() > 1 && a[0] == '-') continue;
    if (std::find(extras.begin(), extras.end(), a) != extras.end()) {
      word = a;
      break;
    }
  }
  // A group whose command is optional (kgpu quota [plan]) may be given a stray word for another
  // reason (quota team-a for quota -n team-a): only a near miss is taken for a command there.
  const bool required = group.get_require_subcommand_min() > 0;
  const std::string list = kgpu::Cat("commands: ", kgpu::Join(names, ", "), " (", path, " --help)");
  if (word.empty()) {
    // CLI11's "A subcommand is required" (or "Requires at least N subcommands"), not a required option.
    const bool no_command = dynamic_cast<const CLI::RequiredError*>(&error) != nullptr &&
                            std::string_view(error.what()).find("ubcommand") != std::string_view::npos;
    return required && no_command ? kgpu::Cat(path, ": a command is required; ", list) : "";
  }
  // A typo is a letter or two (a quarter of a long word); a word of one letter suggests nothing.
  const size_t max_distance = std::min(std::max<size_t>(2, word.size() / 4), word.size() - 1);
  // An abbreviation first (kgpu dev: devices or device-plugin, though 'dra' is two letters away),
  // then a typo.
  std::vector<std::string> near;
  if (word.size() >= 2) {
    for (const std::string& name : names) {
      if (name.starts_with(word)) near.push_back(name);
    }
  }
  if (std::string nearest = kgpu::Nearest(word, names, max_distance); near.empty() && !nearest.empty()) {
    near.push_back(std::move(nearest));
  }
  const std::string head = kgpu::Cat(path, ": unknown command '", kgpu::Printable(word), "'");
  if (!near.empty()) return kgpu::Cat(head, "; did you mean '", kgpu::Join(near, "' or '"), "'?");
  return required ? kgpu::Cat(head, "; ", list) : "";
}

int Main(int argc, char** argv) {
  CLI::App app{
      "kgpu: GPUs for Kubernetes in one binary: device plugin (whole GPUs, shares, MIG, MPS), node labels, "
      "dcgm-exporter-compatible metrics, node checks, kube-scheduler extender and admission webhook, GPU quota, "
      "MIG layouts, placement simulator, and the Slurm bridge"};
  app.require_subcommand(1);
  // Global options may follow the command too (kgpu devices --log-level debug, kgpu mig show
  // --nvml-library ...): an option a command does not know falls through to its parent, up to the
  // app. Both are inherited, so they are set before any subcommand is added. A command's own option
  // of the same name wins; no command declares one (tests/integration/cli_test.sh holds the list).
  // --dev-root has one meaning, NVIDIA_DEV_ROOT's (the root above dev/), and belongs to the
  // commands that read device nodes (doctor, the device plugin's); the global --dev-root of
  // earlier releases (the /dev directory itself) is a hidden, deprecated spelling.
  app.fallthrough();
  app.footer(
      std::string("Global options (--nvml-library, --log-level, --sysfs-root) may come before or after the "
                  "command; a command's own option of the same name wins."));
  app.set_version_flag("--version", "kgpu " KGPU_VERSION " (commit " KGPU_GIT_COMMIT ")",
                       "print the version and the git commit it was built from");
  kgpu::cli::NodeOptions node;
  std::string log_level = "info";
  app.add_option("--nvml-library", node.nvml_library, "path of libnvidia-ml.so.1 (default: found by soname)")
      ->envname("KGPU_NVML_LIBRARY");
  app.add_option("--log-level", log_level, "trace, debug, info, warn, error, off")->envname("KGPU_LOG_LEVEL");
  app.add_option("--sysfs-root", node.sysfs_root, "root of sysfs, for NUMA nodes")
      ->envname("KGPU_SYSFS_ROOT")
      ->capture_default_str();
  // Deprecated: the /dev directory itself (KGPU_DEV_ROOT too), read by doctor and slurm gres when
  // their own --dev-root (the root above dev/) is not given.
  // Hidden, and warned about once the command is known: only doctor and slurm gres read it, and
  // each names its own replacement.
  std::string old_dev_dir;
  app.add_option("--dev-root", old_dev_dir, "")->group("");

  bool json = false;
  auto* devices = app.add_subcommand("devices", "list this node's GPUs, MIG devices and topology");
  devices->add_flag("--json", json, "JSON instead of a table");
  std::chrono::milliseconds nvml_deadline{2000};
  auto deadline_flag = [&](CLI::App* cmd) {
    const kgpu::cli::DurationFlagSpec range{.min = std::chrono::milliseconds(1), .max = std::chrono::minutes(10)};
    kgpu::cli::AddDurationOption(cmd, "--nvml-deadline", &nvml_deadline,
                                 "a GPU whose NVML calls take longer is reported hung instead of waited for", range);
    kgpu::cli::DurationFlagSpec old = range;
    old.bare_unit = "ms";
    kgpu::cli::AddDeprecatedDurationOption(cmd, "kgpu " + cmd->get_name(), "--nvml-deadline-ms", "--nvml-deadline",
                                           &nvml_deadline, old);
  };
  deadline_flag(devices);
  devices->add_option("--kubelet-dir", node.kubelet_dir, "device-plugin directory (the plugin's health state)")
      ->envname("KGPU_KUBELET_DIR")
      ->capture_default_str();
  auto* doctor =
      app.add_subcommand("doctor", "check why nvidia.com/gpu is or is not usable on this node (exit 1 on FAIL)");
  doctor->add_flag("--json", json, "JSON instead of text");
  deadline_flag(doctor);
  doctor->add_option("--kubelet-dir", node.kubelet_dir, "device-plugin directory (plugin sockets)")
      ->envname("KGPU_KUBELET_DIR")
      ->capture_default_str();
  doctor->add_option("--kubeconfig", node.kubeconfig, "also check the Node object through this kubeconfig");
  doctor->add_option("--context", node.kube_context, "kubeconfig context for --kubeconfig");
  doctor->add_flag("--in-cluster", node.in_cluster, "also check the Node object with the pod's service account");
  doctor->add_option("--node-name", node.node_name, "this node's Node name (default: the host name)")
      ->envname("NODE_NAME");
  std::string doctor_dev_root;
  doctor
      ->add_option("--dev-root", doctor_dev_root,
                   "root above dev/ where this process sees the host's device nodes: /dev/nvidia* are checked "
                   "under it (/host in a pod that mounts the host's /dev at /host/dev; default /)")
      ->envname("KGPU_DOCTOR_DEV_ROOT");
  doctor->add_option("--mps-root", node.mps_root, "MPS root directory")->envname("MPS_ROOT")->capture_default_str();
  doctor->add_option("--mps-control", node.mps_control, "nvidia-cuda-mps-control binary")
      ->envname("MPS_CONTROL")
      ->capture_default_str();
  std::chrono::seconds health_duration{0};
  auto* health = app.add_subcommand("health", "watch GPU health (NVML events, probes, hung calls)");
  kgpu::cli::AddDurationOption(health, "--duration", &health_duration, "stop after this long (0s: until SIGINT)",
                               {.bare_unit = "s"});
  health->add_option("--kubelet-dir", node.kubelet_dir, "device-plugin directory (the plugin's health state)")
      ->envname("KGPU_KUBELET_DIR")
      ->capture_default_str();
  std::chrono::milliseconds probe_interval{1000};
  kgpu::cli::AddDurationOption(health, "--probe-interval", &probe_interval, "liveness probe period",
                               {.min = std::chrono::milliseconds(10)});
  kgpu::cli::AddDeprecatedDurationOption(health, "kgpu health", "--probe-interval-ms", "--probe-interval",
                                         &probe_interval, {.bare_unit = "ms", .min = std::chrono::milliseconds(10)});
  // The device plugin's health.recoverAfter and the exporter's --health-recover-after: the same
  // default, the same spelling (a Go duration, or never).
  std::optional<std::chrono::milliseconds> recover_after = kgpu::gpu::kDefaultRecoverAfter;
  health
      ->add_option_function<std::string>(
          "--recover-after",
          [&](const std::string& v) {
            if (v == "never") {
              recover_after.reset();
              return;
            }
            auto d = kgpu::cli::ParseDurationFlag("--recover-after", v, {}, std::chrono::milliseconds(1));
            if (!d.ok()) throw CLI::ValidationError("--recover-after", std::string(d.status().message()));
            recover_after = std::chrono::duration_cast<std::chrono::milliseconds>(*d);
          },
          "a faulty device turns healthy again this long after its last fault, checked by a probe (never: it "
          "stays unhealthy); the device plugin's health.recoverAfter")
      ->type_name("DURATION|never")
      ->default_str(kgpu::FormatGoDuration(kgpu::gpu::kDefaultRecoverAfter));
  kgpu::cli::AddDeprecatedOption(
      health, "kgpu health", "--recover-after-ms", "--recover-after", [&](const std::string& v) {
        int64_t ms = 0;
        if (!absl::SimpleAtoi(v, &ms) || ms < -1 || ms > 86400000) {
          throw CLI::ValidationError("--recover-after-ms", "'" + v + "': milliseconds, -1 to 86400000");
        }
        if (ms < 0) {
          recover_after.reset();
        } else {
          recover_after = std::chrono::milliseconds(ms);
        }
      });
  auto* version = app.add_subcommand("version", "print the version");
  kgpu::cli::DevicePluginFlags dp_flags;
  auto* device_plugin = app.add_subcommand(
      "device-plugin", "serve GPUs to kubelet (Device Plugin API v1beta1); NVIDIA's flags and config");
  kgpu::cli::AddDevicePluginFlags(device_plugin, &dp_flags);
  kgpu::cli::AddShareFlags(device_plugin, &dp_flags);
  kgpu::cli::ExporterFlags exp_flags;
  auto* exporter =
      app.add_subcommand("exporter", "dcgm-exporter-compatible GPU metrics on :9400/metrics, with per-pod attribution");
  kgpu::cli::AddExporterFlags(exporter, &exp_flags);
  auto* node_cmd =
      app.add_subcommand("node", "device plugin and exporter in one process (one NVML session, one inventory)");
  kgpu::cli::AddDevicePluginFlags(node_cmd, &dp_flags);
  kgpu::cli::AddShareFlags(node_cmd, &dp_flags);
  kgpu::cli::AddExporterFlags(node_cmd, &exp_flags);
  // One socket, two names (the plugin's and dcgm-exporter's): either sets it for both halves.
  node_cmd->get_option("--pod-resources-kubelet-socket")
      ->description("the same socket as --pod-resources-socket (dcgm-exporter's name for it)");
  kgpu::cli::NodeLabelsFlags publish_flags;  // --publish-labels: the node agent labels its Node
  kgpu::cli::AddPublishLabelsFlags(device_plugin, &publish_flags);
  kgpu::cli::AddPublishLabelsFlags(node_cmd, &publish_flags);

  kgpu::cli::NodeLabelsFlags labels_flags;
  auto* node_labels = app.add_subcommand(
      "node-labels", "GPU Feature Discovery labels and the GPU inventory annotation on this node's Node object");
  kgpu::cli::AddDevicePluginFlags(node_labels, &dp_flags, kgpu::cli::PluginFlags::kDescribe);
  kgpu::cli::AddNodeLabelsFlags(node_labels, &labels_flags);

  std::string template_format = "yaml";
  auto* node_template = app.add_subcommand(
      "node-template", "what a node like this one advertises, for an autoscaler node group that scales from zero");
  kgpu::cli::AddDevicePluginFlags(node_template, &dp_flags, kgpu::cli::PluginFlags::kDescribe);
  node_template->add_option("--format", template_format, "yaml, aws (ASG node-template tags) or json")
      ->check(CLI::IsMember({"yaml", "aws", "json"}))
      ->capture_default_str();

  kgpu::cli::ExtenderFlags extender_flags;
  auto* extender = app.add_subcommand(
      "extender", "kube-scheduler extender for GPU shares, whole GPUs and MIG (filter, prioritize, bind, preempt)");
  kgpu::cli::AddExtenderFlags(extender, &extender_flags);

  kgpu::extender::WebhookOptions webhook_options;
  auto* webhook = app.add_subcommand(
      "webhook", "admission webhook for GPU pods: defaults, validation, HAMi name translation, schedulerName");
  kgpu::cli::AddWebhookFlags(webhook, &webhook_options);

  kgpu::cli::MigFlags mig_flags;
  auto* mig = app.add_subcommand("mig", "MIG layouts: show them, apply one (refused while a GPU is in use)");
  auto [mig_show, mig_apply] = kgpu::cli::AddMigCommands(mig, &mig_flags);

  kgpu::cli::SimFlags sim_flags;
  auto* sim = app.add_subcommand(
      "sim", "replay a GPU cluster trace through the placement policies (allocation at 100-130% demand)");
  kgpu::cli::AddSimFlags(sim, &sim_flags);
  auto* slurm = app.add_subcommand("slurm", "Slurm configuration from this node's inventory");
  slurm->require_subcommand(1);
  kgpu::cli::SlurmGresFlags gres_flags;
  auto* slurm_gres = kgpu::cli::AddSlurmGresCommand(slurm, &gres_flags);
  kgpu::cli::AddDevicePluginFlags(slurm_gres, &dp_flags, kgpu::cli::PluginFlags::kDescribe);
  kgpu::cli::DraFlags dra_flags;
  // (not a structured binding: clang before 16 cannot capture one in the lambdas below)
  const auto dra_commands = kgpu::cli::AddDraCommands(&app, &dra_flags, &dp_flags);
  CLI::App* dra = dra_commands.first;
  CLI::App* dra_slices = dra_commands.second;
  kgpu::cli::QuotaFlags quota_flags;
  auto quota = kgpu::cli::AddQuotaCommands(&app, &quota_flags);
  kgpu::cli::SlurmBridgeFlags bridge_flags;
  auto bridge = kgpu::cli::AddSlurmBridgeCommands(&app, &bridge_flags);

  // Exit codes, the same for every subcommand (README "Exit codes"): 0 success; 1 bad input (a
  // config or counters file, a flag value the node cannot honour) or a failure; 2 usage: the
  // command line cannot be parsed (unknown subcommand or option, a missing or malformed argument).
  // dcgm-exporter's Go-style flags (-collectors, -rbmn) and a link named dcgm-exporter become
  // what CLI11 reads (kgpu::cli::GoStyleFlags); every other command line is left as it is.
  // The reference of every command's options (docs/cli.md), from this table.
  if (argc == 2 && std::string_view(argv[1]) == "--cli-reference") {
    std::cout << kgpu::cli::CliReference(app);
    return 0;
  }
  const std::vector<std::string> args = kgpu::cli::GoStyleFlags(app, argc, argv);
  std::vector<const char*> arg_ptrs;
  for (const std::string& a : args) arg_ptrs.push_back(a.c_str());
  try {
    app.parse(static_cast<int>(arg_ptrs.size()), arg_ptrs.data());
  } catch (const CLI::ParseError& e) {
    if (e.get_exit_code() != 0) {
      if (const std::string message = UnknownCommandMessage(app, args, e); !message.empty()) {
        std::cerr << message << "\n";
        return 2;
      }
    }
    return app.exit(e) == 0 ? 0 : 2;  // --help and --version print and succeed
  }
  if (!kgpu::SetLogLevel(log_level)) {
    std::cerr << "kgpu: --log-level: unknown level '" << log_level
              << "' (use trace, debug, info, warn, error or off)\n";
    return 2;
  }
  // The command table: every runnable command, how it takes signals, and what runs it. The
  // commands' names, help and flags are declared above, next to the flags' storage.
  // The /dev directory of the deprecated global --dev-root or KGPU_DEV_ROOT, for the commands that
  // read it (doctor, slurm gres) when their own --dev-root is not given.
  auto legacy_dev_dir = [&](const std::string& cmd, const std::string& use) -> std::string {
    if (!old_dev_dir.empty()) {
      std::cerr << kgpu::cli::DeprecationWarning(
                       cmd, "the global --dev-root (the /dev directory)",
                       kgpu::Cat(cmd,
                                 " --dev-root, the root above dev/ (NVIDIA_DEV_ROOT's meaning: --dev-root /host for "
                                 "/host/dev/nvidia0)"))
                << "\n";
      return old_dev_dir;
    }
    const char* env = std::getenv("KGPU_DEV_ROOT");
    if (env == nullptr || *env == '\0') return "";
    std::cerr << kgpu::cli::DeprecationWarning(cmd, "KGPU_DEV_ROOT (the /dev directory)", use) << "\n";
    return env;
  };
  const std::vector<Command> commands = {
      {version, Signals::kDefault,
       [] {
         std::cout << "kgpu " KGPU_VERSION " (commit " KGPU_GIT_COMMIT ")\n";
         return 0;
       }},
      {devices, Signals::kDefault,
       [&] {
         node.nvml_deadline = nvml_deadline;
         return kgpu::cli::RunDevices(node, json, std::cout);
       }},
      {doctor, Signals::kDefault,
       [&] {
         node.nvml_deadline = nvml_deadline;
         node.dev_dir = !doctor_dev_root.empty()
                            ? kgpu::UnderRoot(doctor_dev_root, "/dev")
                            : legacy_dev_dir("kgpu doctor",
                                             "KGPU_DOCTOR_DEV_ROOT, the root above dev/ (/host for "
                                             "/host/dev/nvidia0)");
         return kgpu::cli::RunDoctor(node, json, std::cout);
       }},
      {health, Signals::kStopFlag,
       [&] { return kgpu::cli::RunHealth(node, health_duration, probe_interval, recover_after, &g_stop, std::cout); }},
      {slurm_gres, Signals::kDefault,
       [&] {
         node.dev_dir = legacy_dev_dir("kgpu slurm gres", "NVIDIA_DEV_ROOT, the root above dev/");
         return kgpu::cli::RunSlurmGres(node, dp_flags, gres_flags, std::cout);
       }},
      {dra_slices, Signals::kDefault,
       [&] { return kgpu::cli::RunDraSlices(node, dp_flags, dra_flags, std::cout, std::cerr); }},
      {dra, Signals::kStopFlagServer, [&] { return kgpu::cli::RunDra(node, dp_flags, dra_flags, &g_stop, std::cerr); }},
      {bridge.status, Signals::kDefault, [&] { return kgpu::cli::RunSlurmBridgeStatus(bridge_flags, std::cout); }},
      {bridge.reclaim, Signals::kDefault, [&] { return kgpu::cli::RunSlurmBridgeReclaim(bridge_flags, std::cout); }},
      {bridge.hook, Signals::kDefault, [&] { return kgpu::cli::RunSlurmBridgeHook(bridge_flags, std::cout); }},
      {bridge.run, Signals::kStopFlagServer,
       [&] { return kgpu::cli::RunSlurmBridge(bridge_flags, &g_stop, std::cout); }},
      {quota.plan, Signals::kDefault, [&] { return kgpu::cli::RunQuotaPlan(quota_flags, std::cout, std::cerr); }},
      {quota.show, Signals::kDefault, [&] { return kgpu::cli::RunQuota(quota_flags, std::cout, std::cerr); }},
      {mig_show, Signals::kDefault, [&] { return kgpu::cli::RunMigShow(node, mig_flags, std::cout); }},
      {mig_apply, Signals::kDefault, [&] { return kgpu::cli::RunMigApply(node, mig_flags, std::cout); }},
      {sim, Signals::kDefault, [&] { return kgpu::cli::RunSim(sim_flags, std::cout, std::cerr); }},
      {device_plugin, Signals::kNodeDaemon, [&] { return kgpu::cli::RunDevicePlugin(node, dp_flags, publish_flags); }},
      {exporter, Signals::kNodeDaemon, [&] { return kgpu::cli::RunExporter(node, exp_flags); }},
      {node_cmd, Signals::kNodeDaemon,
       [&] {
         const bool plugins = node_cmd->count("--pod-resources-socket") > 0;
         const bool exporters = node_cmd->count("--pod-resources-kubelet-socket") > 0;
         if (plugins && exporters && dp_flags.shares.pod_resources_socket != exp_flags.pod_resources_socket) {
           std::cerr << "kgpu node: --pod-resources-socket and --pod-resources-kubelet-socket name one socket "
                        "(kubelet's PodResources) and were given two paths: give one\n";
           return 2;
         }
         if (exporters) {
           dp_flags.shares.pod_resources_socket = exp_flags.pod_resources_socket;
         } else {
           exp_flags.pod_resources_socket = dp_flags.shares.pod_resources_socket;
         }
         return kgpu::cli::RunNode(node, dp_flags, exp_flags, publish_flags);
       }},
      {node_template, Signals::kDefault,
       [&] { return kgpu::cli::RunNodeTemplate(node, dp_flags, template_format, std::cout); }},
      {node_labels, Signals::kStopFlag,
       [&] { return kgpu::cli::RunNodeLabels(node, dp_flags, labels_flags, &g_stop, std::cout); }},
      {extender, Signals::kStopFlagServer, [&] { return kgpu::cli::RunExtender(extender_flags, &g_stop, std::cerr); }},
      {webhook, Signals::kStopFlagServer, [&] { return kgpu::cli::RunWebhook(webhook_options, &g_stop, std::cerr); }},
  };
  for (const Command& c : commands) {
    if (!c.app->parsed()) continue;
    if (!old_dev_dir.empty() && c.app != doctor && c.app != slurm_gres) {
      // Read by no other command: say so, rather than point at a flag the command may not have.
      std::string name = c.app->get_name();
      for (const CLI::App* p = c.app->get_parent(); p != nullptr; p = p->get_parent()) {
        name = (p->get_parent() == nullptr ? std::string("kgpu") : p->get_name()) + " " + name;
      }
      std::cerr << name << ": the global --dev-root (the /dev directory) is deprecated and not read by this command"
                << (c.app->get_option_no_throw("--dev-root") != nullptr
                        ? kgpu::Cat("; use ", name, " --dev-root, the root above dev/")
                        : std::string(", which reads no device nodes: drop it"))
                << "\n";
    }
    TakeSignals(c.signals);
    return c.run();
  }
  return 2;
}

}  // namespace

int main(int argc, char** argv) {
  try {
    return Main(argc, argv);
  } catch (const std::exception& e) {
    std::cerr << "kgpu: fatal: " << e.what() << "\n";
    return 1;
  }
}
