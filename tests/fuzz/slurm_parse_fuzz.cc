// Fuzz target for Slurm's CLI output parsers (src/slurm/parse.cc): `scontrol show node -o` records,
// the bridge's `squeue -o` format, hostlist expressions and Slurm timestamps, plus the lease
// annotation (src/slurm/lease.cc), all of which come from outside the process. Properties: nothing
// crashes; every error names what it parsed; an accepted node record has a name and a state whose
// base and flags rebuild it; a hostlist never expands past its limit; hostlist expansion agrees
// with the squeue parser's node lists; an accepted lease round-trips; a command line
// (--resume-command) that splits into words is written back by CommandLine as one that splits into
// the same words; slurmrestd's v0.0.39 answers (nodes, jobs, errors) either parse into nodes with a
// name and a state that starts with their base, and jobs that are pending or hold nodes, or name
// what was wrong.
#include <cstddef>
#include <cstdint>
#include <cstdlib>
#include <string>

#include "common/process.h"
#include "slurm/lease.h"
#include "slurm/parse.h"
#include "slurm/rest.h"

namespace {
void Expect(bool ok) {
  if (!ok) std::abort();
}
bool Starts(const absl::Status& s, const char* prefix) {
  return std::string(s.message()).rfind(prefix, 0) == 0;
}
}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  using namespace kgpu::slurm;
  const std::string text(reinterpret_cast<const char*>(data), size);

  auto nodes = ParseScontrolNodes(text);
  if (nodes.ok()) {
    for (const auto& n : *nodes) {
      Expect(!n.name.empty() && !n.state.empty());
      Expect(n.state.rfind(n.base, 0) == 0);
      for (const auto& f : n.flags) Expect(n.state.find("+" + f) != std::string::npos);
      (void)n.Busy();
      (void)n.Responding();
    }
  } else {
    Expect(Starts(nodes.status(), "scontrol show node -o: line "));
  }

  auto jobs = ParseSqueue(text);
  if (jobs.ok()) {
    for (const auto& j : *jobs) {
      Expect(!j.id.empty() && !j.state.empty());
      (void)j.Holding();
    }
  } else {
    Expect(Starts(jobs.status(), "squeue"));
  }

  // The first line as a hostlist (what %N, a pending reason's UnavailableNodes: and a
  // ResumeProgram's argument hold).
  const std::string first = text.substr(0, text.find('\n'));
  auto hosts = ExpandHostlist(first);
  if (hosts.ok()) {
    Expect(hosts->size() <= 100000);
    for (const auto& h : *hosts) Expect(!h.empty());
    // The same expression as squeue's node column expands the same way.
    if (first.find('|') == std::string::npos && first.find('\r') == std::string::npos &&
        (first.empty() || (first.back() != ' ' && first != "(null)" && first != "N/A"))) {
      auto one = ParseSqueue("1|RUNNING|" + first + "|1|None|N/A|batch|N/A|||N/A|(null)\n");
      Expect(one.ok() && one->size() == 1 && (*one)[0].nodes == *hosts);
    }
  } else {
    Expect(Starts(hosts.status(), "hostlist '"));
  }

  (void)ParseSlurmTime(first);

  auto words = kgpu::SplitCommandLine(text, "--resume-command");
  if (words.ok()) {
    Expect(!words->empty());
    auto again = kgpu::SplitCommandLine(kgpu::CommandLine(*words), "--resume-command");
    Expect(again.ok() && *again == *words);
  } else {
    Expect(Starts(words.status(), "--resume-command: "));
  }

  auto rest_nodes = ParseRestNodes(text);
  if (rest_nodes.ok()) {
    for (const auto& n : *rest_nodes) Expect(!n.name.empty() && !n.base.empty() && n.state.rfind(n.base, 0) == 0);
  } else {
    Expect(Starts(rest_nodes.status(), "slurmrestd nodes: "));
  }
  auto rest_jobs = ParseRestJobs(text);
  if (rest_jobs.ok()) {
    for (const auto& j : *rest_jobs) Expect(!j.id.empty() && (j.Pending() || j.Holding()));
  } else {
    Expect(Starts(rest_jobs.status(), "slurmrestd jobs: "));
  }
  bool controller_down = false;
  (void)RestErrors(text, &controller_down);

  auto lease = ParseLease(text);
  if (lease.ok()) {
    auto back = ParseLease(SerializeLease(*lease));
    Expect(back.ok());
    Expect(back->op == lease->op && back->phase == lease->phase && back->generation == lease->generation &&
           back->since == lease->since && back->why == lease->why && back->jobs_seen == lease->jobs_seen &&
           back->pods_evicted == lease->pods_evicted && back->admin_drained == lease->admin_drained &&
           back->prev_slurm_reason == lease->prev_slurm_reason && back->holder == lease->holder);
  } else {
    Expect(Starts(lease.status(), "annotation kgpu.io/slurm-lease: "));
  }
  return 0;
}
