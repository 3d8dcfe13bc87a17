#include "cli/slurm_cmd.h"

#include <algorithm>
#include <iostream>
#include <memory>

#include <fcntl.h>
#include <unistd.h>

#include "common/files.h"
#include "common/http_listen.h"
#include "common/strings.h"
#include "slurm/client.h"
#include "slurm/gres.h"

namespace kgpu::cli {

CLI::App* AddSlurmGresCommand(CLI::App* slurm, SlurmGresFlags* f) {
  auto* gres = slurm->add_subcommand(
      "gres", "print gres.conf lines and the slurm.conf NodeName line for this node, from its GPU inventory");
  gres->add_option("--node-name", f->node_name, "Slurm NodeName (default: the host name)")->envname("NODE_NAME");
  gres->add_option("--mig-minors", f->mig_minors, "the driver's MIG capability minors (for MultipleFiles=)")
      ->capture_default_str();
  gres->add_option(
      "--mps-count", f->mps_count,
      "Name=mps Count= per GPU (default: 100 when the config's sharing strategy is MPS, else no mps lines)");
  gres->add_option("--gpu-type", f->gpu_type,
                   "Type= for whole GPUs (default: the NVML name as AutoDetect=nvml names it)");
  gres->add_flag("--no-cores", f->no_cores, "leave out Cores= (NUMA affinity from sysfs)");
  gres->add_flag("--no-links", f->no_links, "leave out Links= (NVLink lanes)");
  gres->add_option("--cpus", f->cpus, "CPUs= for the slurm.conf node line (default: left out)");
  gres->add_option("--real-memory", f->real_memory, "RealMemory= MiB for the slurm.conf node line (default: left out)");
  gres->add_option("--output", f->output, "gres (gres.conf lines), node (slurm.conf line) or both")
      ->check(CLI::IsMember({"gres", "node", "both"}))
      ->capture_default_str();
  gres->add_option("--write-gres-conf", f->write_gres_conf, "also write the gres.conf lines to this file (atomically)");
  return gres;
}

int RunSlurmGres(const NodeOptions& node, const DevicePluginFlags& dp, const SlurmGresFlags& flags, std::ostream& out) {
  auto cs = OpenConfiguredSession(node, dp);
  if (!cs.ok()) {
    out << "kgpu slurm gres: " << cs.status().message() << "\n";
    return 1;
  }
  const gpu::Inventory& inventory = *cs->session.inventory;
  slurm::GresOptions go;
  go.node_name = flags.node_name;
  if (go.node_name.empty()) {
    char host[256] = {};
    ::gethostname(host, sizeof(host) - 1);
    go.node_name = host;
    if (const auto dot = go.node_name.find('.'); dot != std::string::npos) go.node_name.resize(dot);
  }
  if (auto s = slurm::ValidateNodeName(go.node_name); !s.ok()) {
    out << "kgpu slurm gres: --node-name: " << s.message() << "\n";
    return 1;
  }
  // The device plugin's NVIDIA_DEV_ROOT (flag, env or config file) names the root above dev/; the
  // deprecated global --dev-root, the /dev directory itself.
  go.dev_dir = cs->config.dev_root.empty() && !node.dev_dir.empty() ? node.dev_dir : cs->config.HostDevPath("/dev");
  go.sysfs_root = node.sysfs_root;
  go.cores = !flags.no_cores;
  go.links = !flags.no_links;
  go.type_override = flags.gpu_type;
  go.cpus = flags.cpus;
  go.real_memory_mib = flags.real_memory;
  if (flags.mps_count >= 0) {
    go.mps_count_per_gpu = static_cast<unsigned>(flags.mps_count);
  } else if (cs->config.sharing.strategy == deviceplugin::SharingStrategy::kMps) {
    go.mps_count_per_gpu = 100;
  }
  const bool any_mig =
      std::any_of(inventory.gpus().begin(), inventory.gpus().end(), [](const gpu::Gpu& g) { return g.mig_enabled; });
  if (any_mig) {
    auto text = ReadInputFile(flags.mig_minors, "MIG minors file", "check --mig-minors");
    if (!text.ok()) {
      out << "kgpu slurm gres: " << text.status().message() << "\n";
      return 1;
    }
    auto minors = gpu::ParseMigMinors(*text, flags.mig_minors);
    if (!minors.ok()) {
      out << "kgpu slurm gres: " << minors.status().message() << "\n";
      return 1;
    }
    go.mig_minors = std::move(*minors);
  }
  auto r = slurm::RenderGres(inventory, go);
  if (!r.ok()) {
    out << "kgpu slurm gres: " << r.status().message() << "\n";
    return 1;
  }
  for (const auto& w : r->warnings) std::cerr << "kgpu slurm gres: warning: " << w << "\n";
  if (!flags.write_gres_conf.empty()) {
    if (auto st = WriteFileAtomically(flags.write_gres_conf, r->gres_conf); !st.ok()) {
      out << "kgpu slurm gres: " << st.message() << " (check --write-gres-conf)\n";
      return 1;
    }
  }
  if (flags.output == "gres" || flags.output == "both") out << r->gres_conf;
  if (flags.output == "node" || flags.output == "both") {
    if (flags.output == "both") out << "# slurm.conf (GresTypes must include " << Join(r->gres_types, ",") << "):\n";
    out << r->node_line << "\n";
  }
  return 0;
}

}  // namespace kgpu::cli

// ---------------------------------------------------------------------------------------------
// kgpu slurm-bridge

#include <iomanip>
#include <sstream>
#include <thread>

#include <httplib.h>

#include "common/log.h"
#include "common/process.h"
#include "k8s/config.h"
#include "k8s/leader.h"
#include "k8s/patch.h"
#include "k8s/resources.h"
#include "slurm/bridge.h"
#include "slurm/rest.h"

namespace kgpu::cli {
namespace {

using std::chrono::hours;
using std::chrono::milliseconds;

void AddCommonBridgeFlags(CLI::App* c, SlurmBridgeFlags* f) {
  const std::string cmd = Cat("kgpu slurm-bridge ", c->get_name());
  c->add_option("--kubeconfig", f->kubeconfig, k8s::kKubeconfigFlagHelp);
  c->add_option("--context", f->context, "kubeconfig context");
  c->add_option("--slurm-bin-dir", f->slurm_bin_dir, "directory of scontrol and squeue (default: PATH)");
  c->add_option("--slurm-conf", f->slurm_conf, "SLURM_CONF for the Slurm commands")->envname("SLURM_CONF");
  AddDurationOption(c, "--slurm-timeout", &f->slurm_timeout, "deadline of each Slurm command or REST request",
                    {.min = milliseconds(1)});
  AddDeprecatedDurationOption(c, cmd, "--slurm-timeout-ms", "--slurm-timeout", &f->slurm_timeout,
                              {.bare_unit = "ms", .min = milliseconds(1)});
  c->add_option("--slurm-rest-url", f->slurm_rest_url,
                "talk to slurmrestd's REST API v0.0.39 (Slurm 23.02 or later) instead of running scontrol and squeue: "
                "http(s)://host:6820, or unix:/path/to/slurmrestd.sock (rest_auth/local)")
      ->envname("KGPU_SLURM_REST_URL");
  c->add_option("--slurm-rest-user", f->slurm_rest_user, "X-SLURM-USER-NAME for slurmrestd's rest_auth/jwt")
      ->envname("SLURM_USER_NAME");
  c->add_option("--slurm-rest-token-file", f->slurm_rest_token_file,
                "file holding the JWT (`scontrol token`), re-read for each request; or the token itself in $SLURM_JWT");
  c->add_option("--slurm-rest-token", f->slurm_rest_token, "")->envname("SLURM_JWT")->group("");
}

absl::StatusOr<std::unique_ptr<k8s::Client>> KubeClient(const SlurmBridgeFlags& f) {
  auto cfg = k8s::ConfigFromFlags(f.kubeconfig, f.context, false);
  if (!cfg.ok()) return cfg.status();
  cfg->qps = f.kube_qps;
  cfg->burst = static_cast<int>(std::max(10.0, f.kube_qps * 2));
  return k8s::Client::Create(*cfg);
}

// The REST backend when --slurm-rest-url is given, else the CLI one.
std::unique_ptr<slurm::SlurmClient> SlurmCli(const SlurmBridgeFlags& f) {
  if (!f.slurm_rest_url.empty()) {
    slurm::RestOptions o;
    o.url = f.slurm_rest_url;
    o.user = f.slurm_rest_user;
    o.token = f.slurm_rest_token;
    o.token_file = f.slurm_rest_token_file;
    o.timeout = f.slurm_timeout;
    return std::make_unique<slurm::RestSlurmClient>(o);
  }
  return std::make_unique<slurm::CliSlurmClient>(slurm::CliOptions{f.slurm_bin_dir, f.slurm_conf, f.slurm_timeout});
}

std::string Ago(int64_t since) {
  if (since <= 0) return "-";
  const int64_t d = static_cast<int64_t>(std::time(nullptr)) - since;
  if (d < 120) return Cat(d, "s");
  if (d < 7200) return Cat(d / 60, "m");
  return Cat(d / 3600, "h");
}

}  // namespace

SlurmBridgeCommands AddSlurmBridgeCommands(CLI::App* app, SlurmBridgeFlags* f) {
  auto* bridge = app->add_subcommand(
      "slurm-bridge", "lend GPU nodes between Slurm and Kubernetes on demand, never killing a Slurm job");
  bridge->require_subcommand(1);
  SlurmBridgeCommands c;
  c.run = bridge->add_subcommand("run", "the controller (one active replica through a Lease)");
  AddCommonBridgeFlags(c.run, f);
  c.run->add_option("--nodes", f->nodes, "node-name globs that may be lent (default: every node labelled kgpu.io/pool)")
      ->delimiter(',');
  c.run->add_option("--max-lent", f->max_lent, "at most this many nodes lent or being lent")->capture_default_str();
  c.run->add_option("--min-kept", f->min_kept, "Slurm keeps at least this many undrained nodes")->capture_default_str();
  const std::string cmd = "kgpu slurm-bridge run";
  // Durations in Go's form; a bare number counts seconds, as these flags took it before.
  const DurationFlagSpec secs{.bare_unit = "s"};
  AddDurationOption(c.run, "--lend-threshold", &f->lend_threshold,
                    "how long GPU pods must be unschedulable before a lend", secs);
  AddDurationOption(c.run, "--reclaim-threshold", &f->reclaim_threshold,
                    "how long a blocked Slurm job must be pending before a reclaim", secs);
  AddDurationOption(c.run, "--cooldown", &f->cooldown, "how long a node back with Slurm is not lent again", secs);
  AddDurationOption(c.run, "--lend-hysteresis", &f->lend_hysteresis,
                    "with no demand this long, a lend still draining is cancelled", secs);
  AddDurationOption(c.run, "--lend-duration", &f->lend_duration,
                    "the lease of a lent node ends this long after the lend (0: never)", secs);
  AddDurationOption(c.run, "--force-delete-after", &f->force_delete_after,
                    "reclaim: delete pods whose eviction PDBs still refuse after this long (0: never, the default)",
                    secs);
  AddDurationOption(c.run, "--interval", &f->interval, "reconcile period", {.min = milliseconds(1)});
  AddDurationOption(c.run, "--confirm-gap", &f->confirm_gap,
                    "a drained node must be empty on two reads this far apart");
  c.run->add_option("--gpu-resource", f->gpu_resources, "resource names (prefixes) that make a pod a GPU pod")
      ->capture_default_str();
  c.run->add_option("--kube-api-qps", f->kube_qps, "API requests per second (the client-side rate limit)")
      ->capture_default_str();
  AddDeprecatedOption(c.run, cmd, "--kube-qps", "--kube-api-qps", [f](const std::string& v) {
    try {
      f->kube_qps = std::stod(v);
    } catch (const std::exception&) {
      throw CLI::ValidationError("--kube-qps", "'" + v + "': a number of requests per second");
    }
  });
  c.run->add_flag("--dry-run", f->dry_run, "print the decisions and steps it would take; change nothing");
  c.run->add_flag("--once", f->once, "one reconcile, then exit (no leader election)");
  AddLeaderElectFlags(c.run, &f->leader, "only the Lease holder reconciles");
  c.run->add_option("--identity", f->identity, "this replica's identity (default: host name and pid)")
      ->envname("POD_NAME");
  c.run->add_option("--metrics-listen", f->metrics_listen, "serve /metrics and /healthz on host:port (default: off)");
  c.run
      ->add_option("--lend-via", f->lend_via,
                   "drain: the Slurm fence is DRAIN; power-save: State=POWER_DOWN_ASAP, and Slurm asks for the node "
                   "back through ResumeProgram (needs --resume-command and power saving in slurm.conf)")
      ->check(CLI::IsMember({"drain", "power-save"}))
      ->capture_default_str();
  c.run
      ->add_option(
          "--resume-command", f->resume_command,
          "power-save: run once Kubernetes is empty so that the node's slurmd registers as rebooted "
          "(slurmd -b); split into words as a shell would (quotes, backslashes), but no shell runs it; {node} replaced")
      ->envname("KGPU_RESUME_COMMAND");
  AddDurationOption(c.run, "--resume-retry", &f->resume_retry,
                    "power-save: how long before the resume command runs again", secs);
  AddDurationOption(c.run, "--resume-timeout", &f->resume_timeout,
                    "power-save: deadline of one run of the resume command", secs);
  // A test hook: accepted, never listed (CLI11 hides an option of the empty group).
  c.run->add_option("--crash-at", f->crash_at, "fault injection: exit with code 86 at this point (tests)")
      ->check(CLI::IsMember(slurm::kCrashPoints))
      ->group("");
  // The spellings before kube-scheduler's names and Go durations (one release), values in their
  // old units.
  AddDeprecatedDurationOption(c.run, cmd, "--interval-ms", "--interval", &f->interval,
                              {.bare_unit = "ms", .min = milliseconds(1)});
  AddDeprecatedDurationOption(c.run, cmd, "--confirm-gap-ms", "--confirm-gap", &f->confirm_gap, {.bare_unit = "ms"});
  AddDeprecatedFlag(c.run, cmd, "--no-leader-elect", "--leader-elect=false",
                    [f](std::int64_t count) { f->leader.enabled = count <= 0; });
  AddDeprecatedOption(c.run, cmd, "--leader-namespace", "--leader-elect-resource-namespace",
                      [f](const std::string& v) { f->leader.resource_namespace = v; });
  AddDeprecatedOption(c.run, cmd, "--leader-name", "--leader-elect-resource-name",
                      [f](const std::string& v) { f->leader.resource_name = v; });
  const DurationFlagSpec leader_ms{.bare_unit = "ms", .min = milliseconds(10), .max = hours(24)};
  AddDeprecatedDurationOption(c.run, cmd, "--lease-duration-ms", "--leader-elect-lease-duration",
                              &f->leader.lease_duration, leader_ms);
  AddDeprecatedDurationOption(c.run, cmd, "--renew-deadline-ms", "--leader-elect-renew-deadline",
                              &f->leader.renew_deadline, leader_ms);
  AddDeprecatedDurationOption(c.run, cmd, "--retry-period-ms", "--leader-elect-retry-period", &f->leader.retry_period,
                              leader_ms);
  c.status = bridge->add_subcommand("status", "each managed node's phase, owner, since when and why");
  AddCommonBridgeFlags(c.status, f);
  c.status->add_flag("--json", f->json, "JSON instead of a table");
  c.reclaim = bridge->add_subcommand("reclaim", "ask the controller to give lent nodes back to Slurm");
  AddCommonBridgeFlags(c.reclaim, f);
  c.reclaim
      ->add_option("nodes", f->reclaim_nodes, "node names or Slurm hostlists (n[1-3]), as a ResumeProgram gets them")
      ->required();
  c.reclaim->add_option("--reason", f->reclaim_reason, "who asks, recorded in the lease")->capture_default_str();
  c.hook = bridge->add_subcommand(
      "hook", "Slurm's SuspendProgram (hook suspend) and ResumeProgram (hook resume): wake the controller and exit");
  AddCommonBridgeFlags(c.hook, f);
  c.hook->add_option("event", f->hook_event, "suspend (the node is empty) or resume (Slurm wants it back)")
      ->check(CLI::IsMember({"suspend", "resume"}))
      ->required();
  c.hook->add_option("nodes", f->reclaim_nodes, "the hostlist Slurm passes (n[1-3])")->required();
  return c;
}

int RunSlurmBridge(const SlurmBridgeFlags& f, const volatile std::sig_atomic_t* stop, std::ostream& out) {
  auto log = Log("slurm");
  // Flags first: a bad one is reported before anything is contacted.
  if (f.leader.enabled && !f.once) {
    if (auto st = CheckLeaderElectFlags(f.leader); !st.ok()) {
      out << "kgpu slurm-bridge run: " << st.message() << "\n";
      return 2;
    }
  }
  std::vector<std::string> resume_command;
  if (!f.resume_command.empty()) {
    auto argv = SplitCommandLine(f.resume_command, "--resume-command");
    if (!argv.ok()) {
      out << "kgpu slurm-bridge run: " << argv.status().message() << "\n";
      return 2;
    }
    resume_command = std::move(*argv);
  }
  if (!f.slurm_rest_url.empty()) {
    if (auto v = slurm::ValidateRestUrl(f.slurm_rest_url); !v.ok()) {
      out << "kgpu slurm-bridge run: " << v.message() << "\n";
      return 2;
    }
  }
  if (f.lend_via == "power-save" && !f.slurm_rest_url.empty()) {
    out << "kgpu slurm-bridge run: --lend-via power-save needs the CLI backend (drop --slurm-rest-url): its fence is "
           "State=POWER_DOWN_ASAP, two flags (POWER_DOWN and POWER_DRAIN) that scontrol sets in one update and "
           "slurmrestd's v0.0.39 node update cannot\n";
    return 2;
  }
  if (f.lend_via == "power-save" && resume_command.empty()) {
    out << "kgpu slurm-bridge run: --lend-via power-save needs --resume-command: the command that makes a node's "
           "slurmd "
           "register as rebooted once Kubernetes has left it (a one-off restart with slurmd -b, e.g. 'ssh {node} "
           "/usr/local/sbin/slurmd-rejoin'); without it a job given the node would wait in CONFIGURING until "
           "ResumeTimeout\n";
    return 2;
  }
  auto client = KubeClient(f);
  if (!client.ok()) {
    out << "kgpu slurm-bridge run: " << client.status().message() << "\n";
    return 1;  // a configuration error (README's exit codes)
  }
  auto slurm_cli = SlurmCli(f);
  slurm::BridgeOptions o;
  o.identity = f.identity;
  if (o.identity.empty()) {
    char host[256] = {};
    ::gethostname(host, sizeof(host) - 1);
    o.identity = Cat(host, "-", ::getpid());
  }
  o.allowed = f.nodes;
  o.max_lent = f.max_lent;
  o.min_kept = f.min_kept;
  o.lend_threshold = f.lend_threshold;
  o.reclaim_threshold = f.reclaim_threshold;
  o.cooldown = f.cooldown;
  o.lend_hysteresis = f.lend_hysteresis;
  o.lend_duration = f.lend_duration;
  o.force_delete_after = f.force_delete_after;
  o.interval = f.interval;
  o.confirm_gap = f.confirm_gap;
  o.gpu_resources = f.gpu_resources;
  o.dry_run = f.dry_run;
  o.crash_at = f.crash_at;
  o.power_save = f.lend_via == "power-save";
  o.resume_command = std::move(resume_command);
  o.resume_retry = std::max(std::chrono::seconds(1), f.resume_retry);  // 0 reads as 1 s, as before
  o.resume_timeout = std::max(std::chrono::seconds(1), f.resume_timeout);
  k8s::EventRecorder events(**client, "kgpu-slurm-bridge", o.identity);
  slurm::Bridge bridge(*slurm_cli, **client, o, &events, &out);
  if (f.once) {
    const auto r = bridge.Reconcile();
    for (const auto& d : r.decisions) out << "decision: " << d << "\n";
    return r.k8s_ok && r.slurm_ok ? 0 : 1;
  }

  std::unique_ptr<httplib::Server> http;
  std::thread http_thread;
  if (!f.metrics_listen.empty()) {
    if (auto a = ParseListenAddress("--metrics-listen", f.metrics_listen); !a.ok()) {
      out << "kgpu slurm-bridge run: " << a.status().message() << "\n";
      return 2;
    }
    http = std::make_unique<httplib::Server>();
    http->Get("/metrics", [&](const httplib::Request&, httplib::Response& res) {
      res.set_content(bridge.Metrics(), "text/plain; version=0.0.4");
    });
    http->Get("/healthz",
              [](const httplib::Request&, httplib::Response& res) { res.set_content("ok\n", "text/plain"); });
    if (auto bound = BindListenAddress(*http, "--metrics-listen", f.metrics_listen); !bound.ok()) {
      out << "kgpu slurm-bridge run: " << bound.status().message() << "\n";
      return 1;
    } else {
      log->info("serving /metrics on {} (port {})", f.metrics_listen, *bound);
    }
    http_thread = ListenOnThread(*http);
  }

  std::stop_source stopper;
  std::jthread watcher([&](std::stop_token st) {
    while (!st.stop_requested() && !*stop) std::this_thread::sleep_for(std::chrono::milliseconds(50));
    stopper.request_stop();
  });
  log->info("slurm-bridge {} starting (dry-run {}, leader election {})", o.identity, f.dry_run, f.leader.enabled);
  // Watches wake the reconcile loop on events (a pending GPU pod, a reclaim request); the
  // interval remains the fallback and the truth.
  slurm::BridgeWatch events_watch(**client, bridge);
  events_watch.Start();
  if (!f.leader.enabled) {
    bridge.Run(stopper.get_token());
  } else {
    k8s::LeaderElectionConfig lc;
    lc.ns = f.leader.resource_namespace;
    lc.name = f.leader.resource_name;
    lc.identity = o.identity;
    lc.lease_duration = f.leader.lease_duration;
    lc.renew_deadline = f.leader.renew_deadline;
    lc.retry_period = f.leader.retry_period;
    lc.on_started_leading = [&](std::stop_token st) {
      log->info("{} leads: reconciling", o.identity);
      bridge.Run(st);
    };
    lc.on_stopped_leading = [&] { log->warn("{} stopped leading", o.identity); };
    lc.on_new_leader = [&](const std::string& who) { log->info("the leader is {}", who); };
    k8s::LeaderElector elector(**client, lc);
    while (!stopper.stop_requested()) elector.Run(stopper.get_token());
  }
  watcher.request_stop();
  events_watch.Stop();
  if (http) {
    http->stop();
    http_thread.join();
  }
  log->info("slurm-bridge stopped");
  return 0;
}

int RunSlurmBridgeStatus(const SlurmBridgeFlags& f, std::ostream& out) {
  auto client = KubeClient(f);
  if (!client.ok()) {
    out << "kgpu slurm-bridge status: " << client.status().message() << "\n";
    return 1;
  }
  auto slurm_cli = SlurmCli(f);
  k8s::ListOptions lo;
  lo.label_selector = slurm::kPoolLabel;
  auto nodes = (*client)->List(k8s::FindResource("nodes")->Path(), lo);
  if (!nodes.ok()) {
    out << "kgpu slurm-bridge status: the API server: " << nodes.status().message() << "\n";
    return 1;
  }
  auto snodes = slurm_cli->Nodes();
  std::map<std::string, slurm::SlurmNode> by_name;
  if (snodes.ok()) {
    for (auto& n : *snodes) by_name[n.name] = n;
  }
  nlohmann::json rows = nlohmann::json::array();
  // A Node's row with what Slurm says of the node of the same name, which is then no longer LOST.
  auto add_row = [&](nlohmann::json& r) {
    const std::string name = r["node"];
    if (const auto it = by_name.find(name); it != by_name.end()) {
      r["slurmState"] = it->second.state;
      r["slurmReason"] = it->second.reason;
      r["slurmFenced"] = it->second.Drain() || slurm::SlurmFencedByUs(it->second);
      by_name.erase(it);
    }
    rows.push_back(r);
  };
  for (const auto& n : slurm::Field(*nodes, "items")) {
    const std::string name = slurm::Field(n, "metadata").value("name", "");
    const std::string pool = slurm::Field(slurm::Field(n, "metadata"), "labels").value(slurm::kPoolLabel, "");
    if (pool != "slurm" && pool != "lent") {
      // Kubernetes' own pool (kgpu.io/pool=k8s, docs/slurm.md): the bridge never manages it.
      nlohmann::json r = {
          {"node", name},
          {"phase", "K8S_POOL"},
          {"owner", "k8s"},
          {"since", 0},
          {"generation", 0},
          {"op", ""},
          {"why", Cat(slurm::kPoolLabel, "=", pool, ": Kubernetes' own pool, not managed by the bridge")},
          {"k8sFenced", slurm::K8sFenced(n)},
          {"pool", pool},
          {"managed", false}};
      add_row(r);
      continue;
    }
    std::string err;
    const auto lease = slurm::LeaseOf(n, &err);
    nlohmann::json r = {{"node", name},
                        {"phase", slurm::PhaseName(lease.phase)},
                        {"owner", slurm::Owner(lease.phase)},
                        {"since", lease.since},
                        {"generation", lease.generation},
                        {"op", lease.op},
                        {"why", err.empty() ? lease.why : err},
                        {"k8sFenced", slurm::K8sFenced(n)},
                        {"pool", pool},
                        {"managed", true}};
    add_row(r);
  }
  // LOST (slurm/bridge.h): our drain on a Slurm node that no managed Node names.
  for (const auto& [name, sn] : by_name) {
    if (!slurm::SlurmFencedByUs(sn)) continue;
    rows.push_back({{"node", name},
                    {"phase", "LOST"},
                    {"owner", "none"},
                    {"since", 0},
                    {"generation", 0},
                    {"op", sn.reason.substr(std::string_view(slurm::kOwnedReasonPrefix).size())},
                    {"why", slurm::LostWhy(name, sn.reason)},
                    {"k8sFenced", false},
                    {"pool", ""},
                    {"managed", true},
                    {"slurmState", sn.state},
                    {"slurmReason", sn.reason},
                    {"slurmFenced", true}});
  }
  if (f.json) {
    out << nlohmann::json({{"slurmReachable", snodes.ok()},
                           {"slurmError", snodes.ok() ? "" : std::string(snodes.status().message())},
                           {"nodes", rows}})
               .dump(2)
        << "\n";
    return 0;
  }
  out << "Slurm: "
      << (snodes.ok() ? "reachable"
                      : Cat("UNREACHABLE (", snodes.status().message(), "): transitions that need it are frozen"))
      << "\n";
  out << std::left << std::setw(14) << "NODE" << std::setw(20) << "PHASE" << std::setw(11) << "OWNER" << std::setw(7)
      << "SINCE" << std::setw(16) << "SLURM" << std::setw(10) << "K8S-FENCE"
      << "WHY\n";
  for (const auto& r : rows) {
    std::string slurm_col = r.contains("slurmState") ? r["slurmState"].get<std::string>() : "?";
    out << std::left << std::setw(14) << r["node"].get<std::string>() << std::setw(20) << r["phase"].get<std::string>()
        << std::setw(11) << r["owner"].get<std::string>() << std::setw(7) << Ago(r["since"].get<int64_t>())
        << std::setw(16) << slurm_col << std::setw(10) << (r["k8sFenced"].get<bool>() ? "yes" : "no")
        << r["why"].get<std::string>();
    if (r.contains("slurmReason") && !r["slurmReason"].get<std::string>().empty()) {
      out << " [Slurm: " << r["slurmReason"].get<std::string>() << "]";
    }
    out << "\n";
  }
  return 0;
}

namespace {

// Sets annotation `key` to "<value> at <now>" on each node of the hostlists (a merge patch: no
// read-modify-write, nothing of the controller's overwritten). `cmd` names the command in errors.
int AnnotateNodes(const SlurmBridgeFlags& f, const std::string& cmd, const std::string& key, const std::string& value,
                  std::ostream& out) {
  auto client = KubeClient(f);
  if (!client.ok()) {
    out << cmd << ": " << client.status().message() << "\n";
    return 1;
  }
  std::vector<std::string> names;
  for (const auto& expr : f.reclaim_nodes) {
    auto hosts = slurm::ExpandHostlist(expr);
    if (!hosts.ok()) {
      out << cmd << ": " << hosts.status().message() << "\n";
      return 2;
    }
    names.insert(names.end(), hosts->begin(), hosts->end());
  }
  int rc = 0;
  for (const auto& name : names) {
    auto r = (*client)->Patch(k8s::FindResource("nodes")->Path("", name),
                              {{"metadata", {{"annotations", {{key, Cat(value, " at ", k8s::NowRfc3339())}}}}}},
                              k8s::kMergePatch);
    if (!r.ok()) {
      out << cmd << ": " << name << ": " << r.status().message() << "\n";
      rc = 1;
      continue;
    }
    const auto lease = slurm::LeaseOf(*r);
    out << name << ": " << (key == slurm::kReclaimAnnotation ? "reclaim requested" : "controller woken") << " (now "
        << slurm::PhaseName(lease.phase) << ")\n";
  }
  return rc;
}

}  // namespace

int RunSlurmBridgeReclaim(const SlurmBridgeFlags& f, std::ostream& out) {
  return AnnotateNodes(f, "kgpu slurm-bridge reclaim", slurm::kReclaimAnnotation, f.reclaim_reason, out);
}

int RunSlurmBridgeHook(const SlurmBridgeFlags& f, std::ostream& out) {
  // slurmctld may start its hooks with stdin/stdout/stderr closed: a socket opened now would take
  // one of those numbers and receive our log lines. Fill them with /dev/null first.
  for (int fd = ::open("/dev/null", O_RDWR); fd >= 0; fd = ::open("/dev/null", O_RDWR)) {
    if (fd > 2) {
      ::close(fd);
      break;
    }
  }
  if (f.hook_event == "resume") {
    return AnnotateNodes(f, "kgpu slurm-bridge hook resume", slurm::kReclaimAnnotation, slurm::kResumeProgramRequest,
                         out);
  }
  return AnnotateNodes(f, "kgpu slurm-bridge hook suspend", slurm::kSuspendedAnnotation, "SuspendProgram", out);
}

}  // namespace kgpu::cli
