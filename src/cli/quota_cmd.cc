#include "cli/quota_cmd.h"

#include <algorithm>
#include <cctype>
#include <cstdio>
#include <iostream>
#include <map>
#include <optional>
#include <set>
#include <sstream>

#include "common/progress.h"
#include "common/strings.h"
#include "extender/inventory.h"
#include "extender/request.h"
#include "k8s/client.h"
#include "k8s/config.h"
#include "k8s/resources.h"

namespace kgpu::cli {
namespace {
using json = nlohmann::json;

void AddKubeFlags(CLI::App* app, QuotaFlags* f) {
  app->add_option("--kubeconfig", f->kubeconfig, k8s::kKubeconfigFlagHelp);
  app->add_option("--context", f->context, "kubeconfig context");
  app->add_flag("--in-cluster", f->in_cluster, "use the pod's service account");
}

std::string Eq(const std::optional<double>& v) {
  if (!v) return "-";
  char buf[32];
  std::snprintf(buf, sizeof buf, "%.2f", *v);
  return buf;
}

json EqJson(const std::optional<double>& v) {
  return v ? json(*v) : json(nullptr);
}

// Resource order in a quota: whole GPUs, MIG profiles, shares (count, memory, cores).
int Rank(const std::string& r) {
  const std::string_view u = std::string_view(r).substr(r.find('.') + 1);
  if (u == extender::kWholeGpu) return 0;
  if (u.rfind(extender::kMigPrefix, 0) == 0) return 1;
  if (u == extender::kShares) return 2;
  if (u == extender::kShareMemory) return 3;
  return 4;
}

absl::StatusOr<std::unique_ptr<k8s::Client>> Connect(const QuotaFlags& f) {
  auto cfg = k8s::ConfigFromFlags(f.kubeconfig, f.context, f.in_cluster);
  if (!cfg.ok()) return cfg.status();
  return k8s::Client::Create(*cfg);
}

// Every Node's inventory; nodes without one are skipped, unreadable ones are noted. Read in pages
// of 500 (a large cluster's Nodes are tens of MB), with progress on a terminal: nodes read of
// those the first page's remainingItemCount announces (kube-apiserver's; unknown without it).
absl::StatusOr<extender::ClusterGpus> ReadInventory(k8s::Client& client, const QuotaFlags& f, const char* what,
                                                    std::vector<std::string>& notes) {
  const std::string path = k8s::FindResource("nodes")->Path();
  std::vector<extender::NodeInfo> infos;
  auto add = [&](const json& items) {
    for (const auto& n : items) {
      auto info = extender::ParseNodeInventory(n);
      if (info.ok()) {
        infos.push_back(std::move(*info));
      } else if (!absl::IsNotFound(info.status())) {
        notes.push_back(Cat(info.status().message(), "; its GPUs are not counted"));
      }
    }
  };
  k8s::ListOptions lo;
  lo.limit = 500;
  std::optional<Progress> progress;
  std::string next;
  do {
    auto page = client.ListPage(path, lo, next);
    if (!page.ok() && !next.empty()) {
      // The continue token expired (410) or a later page failed: the whole list once more, at once.
      infos.clear();
      notes.clear();
      auto all = client.List(path);
      if (!all.ok()) return all.status();
      add(all->value("items", json::array()));
      break;
    }
    if (!page.ok()) return page.status();
    const json items = page->value("items", json::array());
    const json md = page->value("metadata", json::object());
    if (!progress) {
      const size_t total = items.size() + static_cast<size_t>(std::max<int64_t>(0, md.value("remainingItemCount", 0)));
      progress.emplace(std::cerr, ProgressWanted(STDERR_FILENO, f.quiet), Cat(what, ": reading Nodes"),
                       md.contains("remainingItemCount") ? total : 0, "nodes");
    }
    add(items);
    progress->Advance(items.size());
    next = md.value("continue", "");
  } while (!next.empty());
  return extender::SummarizeInventory(infos);
}

// -n is checked before anything is read: the apiserver lists the ResourceQuotas of a namespace that
// does not exist, or of a name no namespace can have, as an empty list, which reads as "no GPU quota
// there". Returns the exit code and writes the message for a name that cannot be a namespace (2).
int CheckNamespaceName(const std::string& ns, std::ostream& err) {
  if (ns.empty() || extender::IsDnsLabel(ns)) return 0;
  std::string lower = ns;
  std::transform(lower.begin(), lower.end(), lower.begin(),
                 [](unsigned char c) { return static_cast<char>(std::tolower(c)); });
  err << "kgpu quota: -n/--namespace: '" << Printable(ns)
      << "' is not a namespace name: a lowercase RFC 1123 label (at most 63 lowercase letters, digits and '-', "
         "starting and ending with a letter or digit)";
  if (extender::IsDnsLabel(lower)) err << "; did you mean '" << lower << "'?";
  err << "\n";
  return 2;
}

// Whether the namespace -n names exists (GET namespaces/<ns>). Not found is an error naming it, with
// the nearest namespace when the user may list them. A user who may not read Namespace objects (a
// namespace-scoped Role cannot grant it; kubectl get -n shows nothing either way, for the same
// reason) still gets the report: `unchecked` then says why the namespace could not be checked.
absl::Status CheckNamespaceExists(k8s::Client& client, const std::string& ns, std::string& unchecked) {
  const k8s::Resource& namespaces = *k8s::FindResource("namespaces");
  auto got = client.Get(namespaces.Path("", ns));
  if (got.ok()) return absl::OkStatus();
  if (absl::IsPermissionDenied(got.status())) {
    unchecked = Cat("namespace ", ns, " may not exist (it could not be checked: ", got.status().message(), ")");
    return absl::OkStatus();
  }
  if (!absl::IsNotFound(got.status())) return got.status();
  std::string hint = " (kubectl get namespaces lists them)";
  if (auto all = client.List(namespaces.Path()); all.ok()) {
    std::vector<std::string> names;
    for (const auto& n : all->value("items", json::array())) {
      names.push_back(n.value("metadata", json::object()).value("name", ""));
    }
    // One edit in a short name (team-a and team-b are one apart), two in a longer one.
    const std::string near = Nearest(ns, names, ns.size() >= 8 ? size_t{2} : size_t{1});
    if (!near.empty()) hint = Cat("; did you mean ", near, "?");
  }
  return absl::NotFoundError(Cat("-n/--namespace: namespace ", ns, " not found", hint));
}

std::string ReferenceLine(const extender::ClusterGpus& c) {
  std::string shares;
  if (c.share_ref_mib > 0) {
    shares = Cat("share memory / ", c.share_ref_mib, " MiB (", c.share_ref_model, " on node ", c.share_ref_node,
                 ", the smallest GPU serving shares", c.share_models > 1 ? Cat(", of ", c.share_models, " models") : "",
                 ")");
  } else {
    shares = "share memory: none (no GPU serves shares)";
  }
  return Cat("GPU-equivalents: whole GPU = 1; MIG = compute slices / the GPU's (7 on A100/H100/H200, 4 on A30); ",
             shares);
}

std::string CapacityLine(const extender::ClusterGpus& c) {
  int mig = 0;
  for (const auto& [p, n] : c.mig) mig += n;
  char eq[32];
  std::snprintf(eq, sizeof eq, "%.2f", extender::CapacityGpuEquivalents(c));
  std::string s =
      Cat("cluster: ", c.nodes, " nodes with a GPU inventory: ", c.whole, " whole GPUs, ", mig, " MIG instances, ",
          c.share_gpus, " GPUs serving shares (", c.share_memory_mib, " MiB) = ", eq, " GPU-equivalents");
  if (c.unhealthy > 0) s += Cat(" (", c.unhealthy, " unhealthy GPUs not counted)");
  return s;
}

}  // namespace

QuotaCommands AddQuotaCommands(CLI::App* app, QuotaFlags* f) {
  QuotaCommands q;
  q.show = app->add_subcommand(
      "quota", "GPU quota per namespace: used vs hard, in GPU-equivalents too; `quota plan` divides the cluster");
  q.show->require_subcommand(0, 1);
  AddKubeFlags(q.show, f);
  q.show->add_option("-n,--namespace", f->ns, "only this namespace (default: all)");
  q.show->add_flag("--json", f->json, "JSON instead of a table");
  q.show->add_flag("--quiet", f->quiet, "no progress line on a terminal while the Nodes are read");
  q.plan = q.show->add_subcommand(
      "plan", "print ResourceQuota manifests (YAML) that divide the cluster's GPU inventory by team percentages");
  AddKubeFlags(q.plan, f);
  q.plan->add_option("--shares", f->shares, "NAMESPACE=PERCENT,... e.g. team-a=50,team-b=30,team-c=20 (sum <= 100)")
      ->required();
  q.plan->add_option("--name", f->name, "name of the ResourceQuotas")->capture_default_str();
  q.plan->add_flag("--quiet", f->quiet, "no progress line on a terminal while the Nodes are read");
  return q;
}

QuotaReport BuildQuotaReport(const json& quota_list, const extender::ClusterGpus& cluster) {
  QuotaReport r;
  r.cluster = cluster;
  std::map<std::string, NamespaceQuota> by_ns;
  std::set<std::string> unknown_profiles;
  const json items = quota_list.value("items", json::array());
  for (const auto& q : items) {
    const json meta = q.value("metadata", json::object());
    const std::string ns = meta.value("namespace", ""), name = meta.value("name", "");
    const json spec = q.value("spec", json::object());
    const json status = q.value("status", json::object());
    // status.hard is what the quota controller enforces; before it ran, spec.hard.
    const json hard =
        status.contains("hard") && status["hard"].is_object() ? status["hard"] : spec.value("hard", json::object());
    const json used = status.value("used", json::object());
    QuotaEntry e;
    e.name = name;
    e.scoped = (spec.contains("scopes") && !spec["scopes"].empty()) || spec.contains("scopeSelector");
    for (auto it = hard.begin(); it != hard.end(); ++it) {
      const std::string& key = it.key();
      if (!extender::IsGpuResource(key)) continue;
      if (key.rfind("requests.", 0) != 0) {
        const std::string bare = key.rfind("limits.", 0) == 0 ? key.substr(7) : key;
        r.notes.push_back(Cat(ns, "/", name, ": ", key, " is accepted by the apiserver but never enforced for an ",
                              "extended resource (use requests.", bare, ")"));
        continue;
      }
      const std::string where = Cat("ResourceQuota ", ns, "/", name);
      auto h = extender::WholeQuantity(*it, Cat(where, " hard[", key, "]"));
      auto u = used.contains(key) ? extender::WholeQuantity(used[key], Cat(where, " used[", key, "]"))
                                  : absl::StatusOr<int64_t>(0);
      if (!h.ok() || !u.ok()) {
        r.notes.push_back(std::string((!h.ok() ? h.status() : u.status()).message()));
        continue;
      }
      const std::string unprefixed = key.substr(9);
      if (unprefixed.rfind(extender::kMigPrefix, 0) == 0 &&
          !cluster.mig.contains(unprefixed.substr(std::string_view(extender::kMigPrefix).size()))) {
        unknown_profiles.insert(unprefixed.substr(std::string_view(extender::kMigPrefix).size()));
      }
      e.rows.push_back(
          {key, *u, *h, extender::GpuEquivalents(key, *u, cluster), extender::GpuEquivalents(key, *h, cluster)});
    }
    std::stable_sort(e.rows.begin(), e.rows.end(), [](const QuotaResourceRow& a, const QuotaResourceRow& b) {
      return Rank(a.resource) != Rank(b.resource) ? Rank(a.resource) < Rank(b.resource) : a.resource < b.resource;
    });
    if (e.rows.empty()) continue;  // a quota without GPU resources
    auto& n = by_ns[ns];
    n.ns = ns;
    n.quotas.push_back(std::move(e));
  }
  for (auto& [ns, n] : by_ns) {
    // Per resource: used is the largest count among the quotas (an unscoped one counts every pod);
    // hard is the smallest hard of the unscoped quotas, or the sum of the scoped ones' when only
    // scoped quotas name it (each limits the pods it selects).
    struct Acc {
      int64_t used = 0, hard_unscoped = -1, hard_scoped = 0;
    };
    std::map<std::string, Acc> acc;
    for (const auto& q : n.quotas) {
      for (const auto& row : q.rows) {
        auto& a = acc[row.resource];
        a.used = std::max(a.used, row.used);
        if (q.scoped) {
          a.hard_scoped += row.hard;
        } else {
          a.hard_unscoped = a.hard_unscoped < 0 ? row.hard : std::min(a.hard_unscoped, row.hard);
        }
      }
    }
    for (const auto& [res, a] : acc) {
      const int64_t h = a.hard_unscoped >= 0 ? a.hard_unscoped : a.hard_scoped;
      n.eq_used += extender::GpuEquivalents(res, a.used, cluster).value_or(0);
      n.eq_hard += extender::GpuEquivalents(res, h, cluster).value_or(0);
    }
    r.namespaces.push_back(std::move(n));
  }
  for (const auto& p : unknown_profiles) {
    r.notes.push_back(Cat("MIG profile ", p, " is on no node's inventory: its GPU-equivalents assume a GPU of ",
                          extender::MigSlicesOf(cluster, p), " slices"));
  }
  return r;
}

void PrintQuotaTable(const QuotaReport& r, std::ostream& out) {
  std::vector<std::vector<std::string>> rows = {
      {"NAMESPACE", "QUOTA", "RESOURCE", "USED", "HARD", "GPU-EQ USED", "GPU-EQ HARD"}};
  for (const auto& n : r.namespaces) {
    for (const auto& q : n.quotas) {
      for (const auto& row : q.rows) {
        rows.push_back({n.ns, q.name + (q.scoped ? " (scoped)" : ""), row.resource, std::to_string(row.used),
                        std::to_string(row.hard), Eq(row.eq_used), Eq(row.eq_hard)});
      }
    }
    rows.push_back({n.ns, "(all)", "GPU-equivalents", "", "", Eq(n.eq_used), Eq(n.eq_hard)});
  }
  std::vector<size_t> width(rows[0].size(), 0);
  for (const auto& row : rows) {
    for (size_t i = 0; i < row.size(); ++i) width[i] = std::max(width[i], row[i].size());
  }
  out << ReferenceLine(r.cluster) << "\n";
  if (r.namespaces.empty()) {
    out << "no ResourceQuota names a GPU resource\n";
  } else {
    for (const auto& row : rows) {
      std::string line;
      for (size_t i = 0; i < row.size(); ++i) {
        line += row[i];
        if (i + 1 < row.size()) line += std::string(width[i] - row[i].size() + 2, ' ');
      }
      while (!line.empty() && line.back() == ' ') line.pop_back();
      out << line << "\n";
    }
  }
  out << CapacityLine(r.cluster) << "\n";
  for (const auto& note : r.notes) out << "note: " << note << "\n";
}

json QuotaReportJson(const QuotaReport& r) {
  const auto& c = r.cluster;
  json mig = json::object();
  for (const auto& [p, n] : c.mig) mig[p] = {{"instances", n}, {"slicesOfGpu", extender::MigSlicesOf(c, p)}};
  json out = {{"reference",
               {{"shareMemoryMiB", c.share_ref_mib},
                {"shareModel", c.share_ref_model},
                {"shareNode", c.share_ref_node},
                {"shareModels", c.share_models}}},
              {"capacity",
               {{"nodes", c.nodes},
                {"wholeGpus", c.whole},
                {"mig", mig},
                {"shareGpus", c.share_gpus},
                {"shareSlots", c.share_slots},
                {"shareMemoryMiB", c.share_memory_mib},
                {"shareCores", c.share_cores},
                {"unhealthyGpus", c.unhealthy},
                {"gpuEquivalents", extender::CapacityGpuEquivalents(c)}}},
              {"namespaces", json::array()},
              {"notes", r.notes}};
  for (const auto& n : r.namespaces) {
    json quotas = json::array();
    for (const auto& q : n.quotas) {
      json rows = json::array();
      for (const auto& row : q.rows) {
        rows.push_back({{"resource", row.resource},
                        {"used", row.used},
                        {"hard", row.hard},
                        {"gpuEquivalentsUsed", EqJson(row.eq_used)},
                        {"gpuEquivalentsHard", EqJson(row.eq_hard)}});
      }
      quotas.push_back({{"name", q.name}, {"scoped", q.scoped}, {"resources", rows}});
    }
    out["namespaces"].push_back({{"namespace", n.ns},
                                 {"quotas", quotas},
                                 {"gpuEquivalentsUsed", n.eq_used},
                                 {"gpuEquivalentsHard", n.eq_hard}});
  }
  return out;
}

std::string PlanYaml(const extender::ClusterGpus& c, const std::vector<extender::PlannedQuota>& plan,
                     const std::string& name) {
  std::ostringstream y;
  std::vector<std::string> migs, teams;
  for (const auto& [p, n] : c.mig) migs.push_back(Cat(n, "x ", p));
  int sum = 0;
  for (const auto& q : plan) {
    teams.push_back(Cat(q.ns, "=", q.percent));
    sum += q.percent;
  }
  y << "# kgpu quota plan " << Join(teams, ",") << "\n"
    << "# Divided: " << c.nodes << " nodes with a GPU inventory: " << c.whole << " whole GPUs; MIG "
    << (migs.empty() ? std::string("none") : Join(migs, ", ")) << "; " << c.share_gpus << " GPUs serving shares ("
    << c.share_slots << " shares, " << c.share_memory_mib << " MiB, " << c.share_cores << "% cores)";
  if (c.unhealthy > 0) y << "; " << c.unhealthy << " unhealthy GPUs not counted";
  y << ".\n"
    << "# Rounding: each namespace gets floor(total x percent / 100) of every resource, and what is left of\n"
    << "# floor(total x " << sum << " / 100) goes one unit each to the largest remainders: the quotas never add up\n"
    << "# to more than the cluster has. \"0\" closes a resource (one left out of a quota is unlimited).\n";
  if (sum < 100) y << "# " << 100 - sum << "% of the inventory is left to no namespace.\n";
  for (const auto& q : plan) {
    y << "---\napiVersion: v1\nkind: ResourceQuota\nmetadata:\n  name: " << name << "\n  namespace: " << q.ns
      << "\n  labels:\n    app.kubernetes.io/managed-by: kgpu-quota-plan\n  annotations:\n    kgpu.io/quota-share: \""
      << q.percent << "\"\nspec:\n  hard:\n";
    for (const auto& [res, v] : q.hard) y << "    " << res << ": \"" << v << "\"\n";
  }
  return y.str();
}

int RunQuota(const QuotaFlags& f, std::ostream& out, std::ostream& err) {
  if (const int code = CheckNamespaceName(f.ns, err); code != 0) return code;
  auto client = Connect(f);
  if (!client.ok()) {
    err << "kgpu quota: " << client.status().message() << "\n";
    return 1;
  }
  std::string unchecked;  // why -n's namespace could not be checked
  if (!f.ns.empty()) {
    if (auto st = CheckNamespaceExists(**client, f.ns, unchecked); !st.ok()) {
      err << "kgpu quota: " << st.message() << "\n";
      return 1;
    }
  }
  std::vector<std::string> notes;
  auto cluster = ReadInventory(**client, f, "kgpu quota", notes);
  if (!cluster.ok()) {
    err << "kgpu quota: " << cluster.status().message() << "\n";
    return 1;
  }
  auto quotas = (*client)->List(k8s::FindResource("resourcequotas")->Path(f.ns));
  if (!quotas.ok()) {
    err << "kgpu quota: " << quotas.status().message() << "\n";
    return 1;
  }
  QuotaReport r = BuildQuotaReport(*quotas, *cluster);
  r.notes.insert(r.notes.begin(), notes.begin(), notes.end());
  // A namespace with a GPU quota exists; an empty report of one that could not be checked says so.
  if (!unchecked.empty() && r.namespaces.empty()) r.notes.push_back(unchecked);
  if (f.json) {
    out << QuotaReportJson(r).dump(2) << "\n";
  } else {
    PrintQuotaTable(r, out);
  }
  return 0;
}

int RunQuotaPlan(const QuotaFlags& f, std::ostream& out, std::ostream& err) {
  auto teams = extender::ParseTeamShares(f.shares);
  if (!teams.ok()) {
    err << "kgpu quota plan: " << teams.status().message() << "\n";
    return 1;
  }
  if (auto t = extender::ParseTeamShares(Cat(f.name, "=0"), "--name"); !t.ok()) {
    err << "kgpu quota plan: --name: '" << Printable(f.name)
        << "' is not a ResourceQuota name (lowercase letters, digits and '-', e.g. gpu)\n";
    return 1;
  }
  auto client = Connect(f);
  if (!client.ok()) {
    err << "kgpu quota plan: " << client.status().message() << "\n";
    return 1;
  }
  std::vector<std::string> notes;
  auto cluster = ReadInventory(**client, f, "kgpu quota plan", notes);
  if (!cluster.ok()) {
    err << "kgpu quota plan: " << cluster.status().message() << "\n";
    return 1;
  }
  for (const auto& n : notes) err << "kgpu quota plan: warning: " << n << "\n";
  if (cluster->nodes == 0) {
    err << "kgpu quota plan: no Node carries the " << extender::kInventoryAnnotation
        << " annotation, so there is nothing to divide (run kgpu node-labels on the GPU nodes)\n";
    return 1;
  }
  out << PlanYaml(*cluster, extender::PlanQuotas(*cluster, *teams), f.name);
  return 0;
}

}  // namespace kgpu::cli
