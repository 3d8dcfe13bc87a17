#pragma once
// `kgpu quota` (per namespace: used vs hard of every GPU resource in its ResourceQuotas, and
// GPU-equivalents, one unit across whole GPUs, MIG and shares) and `kgpu quota plan --shares
// team-a=50,...` (ResourceQuota manifests that divide the cluster's GPU inventory). The arithmetic
// is src/extender/quota.h; docs/quota.md describes both commands.
//
// Exit codes: 0; 1 bad input (a --shares or --name value that cannot be used, a -n namespace that
// does not exist, no inventory to plan from, the API unreachable); 2 usage (CLI11, and a -n that
// cannot be a namespace name: not a lowercase RFC 1123 label).
//
// Thread-safety: set-up code and one-shot commands, single-threaded.

#include <optional>
#include <ostream>
#include <string>
#include <vector>

#include <CLI/CLI.hpp>
#include <nlohmann/json.hpp>

#include "extender/quota.h"

namespace kgpu::cli {

struct QuotaFlags {
  std::string kubeconfig, context;
  bool in_cluster = false;
  std::string ns;  // kgpu quota: one namespace; empty: all
  bool json = false;
  bool quiet = false;        // --quiet: no progress line
  std::string shares;        // plan: "team-a=50,team-b=30"
  std::string name = "gpu";  // plan: the ResourceQuotas' name
};

struct QuotaCommands {
  CLI::App* show = nullptr;  // kgpu quota
  CLI::App* plan = nullptr;  // kgpu quota plan
};
QuotaCommands AddQuotaCommands(CLI::App* app, QuotaFlags* flags);
int RunQuota(const QuotaFlags& flags, std::ostream& out, std::ostream& err);
int RunQuotaPlan(const QuotaFlags& flags, std::ostream& out, std::ostream& err);

// The report, from a ResourceQuotaList and the inventory (for tests and the command).
struct QuotaResourceRow {
  std::string resource;  // "requests.nvidia.com/gpu"
  int64_t used = 0, hard = 0;
  std::optional<double> eq_used, eq_hard;
};
struct QuotaEntry {
  std::string name;
  bool scoped = false;  // spec.scopes or spec.scopeSelector: counts only the pods it selects
  std::vector<QuotaResourceRow> rows;
};
struct NamespaceQuota {
  std::string ns;
  std::vector<QuotaEntry> quotas;
  double eq_used = 0, eq_hard = 0;  // over the namespace's resources (see docs/quota.md)
};
struct QuotaReport {
  extender::ClusterGpus cluster;
  std::vector<NamespaceQuota> namespaces;
  std::vector<std::string> notes;
};
QuotaReport BuildQuotaReport(const nlohmann::json& quota_list, const extender::ClusterGpus& cluster);
void PrintQuotaTable(const QuotaReport& r, std::ostream& out);
nlohmann::json QuotaReportJson(const QuotaReport& r);
// The plan as YAML: a comment saying what was divided and how, then one ResourceQuota per team.
std::string PlanYaml(const extender::ClusterGpus& cluster, const std::vector<extender::PlannedQuota>& plan,
                     const std::string& name);

}  // namespace kgpu::cli
