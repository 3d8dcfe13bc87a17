// Fuzz target for the Alibaba trace CSV reader (src/sched/trace.cc), which reads the node and pod
// lists a user hands to `kgpu sim`. The input is read as a node CSV and as a pod CSV; when it holds
// a line "%%", the text before it is the node CSV and the text after it the pod CSV. Properties:
// nothing crashes; every error names the source; an accepted list has unique valid names,
// non-negative figures, per-GPU milli in 1..1000 (whole GPUs for several), and survives a
// write-and-read round trip unchanged; and when both lists parse (and are small), scheduling every
// pod once with the default policy keeps every GPU within 0..1000 milli and every node within its
// CPU and memory.
#include <cstddef>
#include <cstdint>
#include <cstdlib>
#include <memory>
#include <set>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "common/csv.h"
#include "sched/engine.h"
#include "sched/policy.h"
#include "sched/trace.h"

namespace {

using namespace kgpu::sched;

void Expect(bool ok) {
  if (!ok) std::abort();
}

bool NamesSource(const absl::Status& s, const std::string& source) {
  return std::string(s.message()).rfind(source + ":", 0) == 0;
}

// Names and models may hold a comma or a quote (read from a quoted field): written back quoted.
std::string WriteNodes(const std::vector<NodeSpec>& nodes) {
  std::string out = "sn,cpu_milli,memory_mib,gpu,model\n";
  for (const auto& n : nodes) {
    const std::vector<std::string> row = {n.name, std::to_string(n.cpu_milli), std::to_string(n.memory_mib),
                                          std::to_string(n.gpus.size()), n.gpus.empty() ? "" : n.gpus[0].model};
    kgpu::AppendCsvRecord(out, row);
  }
  return out;
}

std::string WritePods(const std::vector<TracePod>& pods) {
  std::string out = "name,cpu_milli,memory_mib,num_gpu,gpu_milli,gpu_spec,creation_time,deletion_time\n";
  for (const auto& t : pods) {
    const auto& p = t.request;
    std::string spec;
    for (const auto& m : p.allowed_models) spec += (spec.empty() ? "" : "|") + m;
    const std::vector<std::string> row = {p.name,
                                          std::to_string(p.cpu_milli),
                                          std::to_string(p.memory_mib),
                                          std::to_string(p.num_gpus),
                                          std::to_string(p.gpu_milli),
                                          spec,
                                          t.creation < 0 ? "" : std::to_string(t.creation),
                                          t.deletion < 0 ? "" : std::to_string(t.deletion)};
    kgpu::AppendCsvRecord(out, row);
  }
  return out;
}

bool SameNodes(const std::vector<NodeSpec>& a, const std::vector<NodeSpec>& b) {
  if (a.size() != b.size()) return false;
  for (size_t i = 0; i < a.size(); ++i) {
    if (a[i].name != b[i].name || a[i].cpu_milli != b[i].cpu_milli || a[i].memory_mib != b[i].memory_mib ||
        a[i].gpus.size() != b[i].gpus.size()) {
      return false;
    }
    for (size_t g = 0; g < a[i].gpus.size(); ++g) {
      if (a[i].gpus[g].model != b[i].gpus[g].model || a[i].gpus[g].memory_mib != b[i].gpus[g].memory_mib) return false;
    }
  }
  return true;
}

bool SamePods(const std::vector<TracePod>& a, const std::vector<TracePod>& b) {
  if (a.size() != b.size()) return false;
  for (size_t i = 0; i < a.size(); ++i) {
    const auto &x = a[i].request, &y = b[i].request;
    if (x.name != y.name || x.cpu_milli != y.cpu_milli || x.memory_mib != y.memory_mib || x.num_gpus != y.num_gpus ||
        x.gpu_milli != y.gpu_milli || x.allowed_models != y.allowed_models || a[i].creation != b[i].creation ||
        a[i].deletion != b[i].deletion) {
      return false;
    }
  }
  return true;
}

void CheckNodes(const std::vector<NodeSpec>& nodes) {
  std::set<std::string> names;
  for (const auto& n : nodes) {
    Expect(!n.name.empty() && names.insert(n.name).second);
    Expect(n.cpu_milli >= 0 && n.memory_mib >= 0 && n.gpus.size() <= 1024 && n.max_pods == kDefaultMaxPods);
    for (const auto& g : n.gpus) Expect(!g.model.empty() && g.model == n.gpus[0].model && g.memory_mib >= 0);
  }
  auto back = ParseNodesCsv(WriteNodes(nodes), "round-trip.csv");
  Expect(back.ok() && SameNodes(nodes, *back));
}

void CheckPods(const std::vector<TracePod>& pods) {
  std::set<std::string> names;
  for (const auto& t : pods) {
    const auto& p = t.request;
    Expect(!p.name.empty() && names.insert(p.name).second);
    Expect(p.cpu_milli >= 0 && p.memory_mib >= 0 && p.num_gpus >= 0 && p.num_gpus <= 1024);
    if (p.num_gpus == 0) Expect(p.gpu_milli == 0);
    if (p.num_gpus > 0) Expect(p.gpu_milli >= 1 && p.gpu_milli <= kMilli);
    if (p.num_gpus > 1) Expect(p.gpu_milli == kMilli);
    for (const auto& m : p.allowed_models) Expect(!m.empty() && m.find('|') == std::string::npos);
    Expect(t.creation >= -1 && t.deletion >= -1);
  }
  auto back = ParsePodsCsv(WritePods(pods), "round-trip.csv");
  Expect(back.ok() && SamePods(pods, *back));
}

// Every pod once on the parsed nodes with the default policy: the engine's state stays within
// capacity, and a pod the reader accepted is never an invalid request.
void Schedule(const std::vector<NodeSpec>& nodes, const std::vector<TracePod>& pods) {
  size_t gpus = 0;
  for (const auto& n : nodes) gpus += n.gpus.size();
  if (gpus > 256 || nodes.size() > 64 || pods.size() > 256) return;
  auto policy = MakePolicy("ours", PolicyOptions{});
  Expect(policy.ok());
  Engine engine(std::move(*policy), 42);
  for (const auto& n : nodes) Expect(engine.AddNode(n).ok());
  for (const auto& t : pods) {
    auto p = engine.Schedule(t.request);
    Expect(p.ok() || p.status().code() == absl::StatusCode::kResourceExhausted);
  }
  const auto& c = engine.cluster();
  Expect(c.AllocatedGpuMilli() >= 0 && c.AllocatedGpuMilli() <= c.TotalGpuMilli());
  for (const auto& n : c.nodes()) {
    Expect(n.cpu_free >= 0 && n.cpu_free <= n.cpu_total && n.memory_free >= 0 && n.memory_free <= n.memory_total);
    for (const auto& g : n.gpus) Expect(g.free_milli >= 0 && g.free_milli <= kMilli);
  }
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  const std::string text(reinterpret_cast<const char*>(data), size);
  std::string node_text = text, pod_text = text;
  if (const auto sep = text.find("\n%%\n"); sep != std::string::npos) {
    node_text = text.substr(0, sep + 1);
    pod_text = text.substr(sep + 4);
  }
  auto nodes = ParseNodesCsv(node_text, "nodes.csv");
  if (nodes.ok()) {
    CheckNodes(*nodes);
  } else {
    Expect(nodes.status().code() == absl::StatusCode::kInvalidArgument && NamesSource(nodes.status(), "nodes.csv"));
  }
  auto pods = ParsePodsCsv(pod_text, "pods.csv");
  if (pods.ok()) {
    CheckPods(*pods);
  } else {
    Expect(pods.status().code() == absl::StatusCode::kInvalidArgument && NamesSource(pods.status(), "pods.csv"));
  }
  if (nodes.ok() && pods.ok()) Schedule(*nodes, *pods);
  return 0;
}
