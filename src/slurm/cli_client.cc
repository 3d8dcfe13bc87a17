#include <cctype>

#include "absl/strings/ascii.h"
#include "absl/strings/str_split.h"
#include "common/process.h"
#include "common/strings.h"
#include "slurm/client.h"

namespace kgpu::slurm {

absl::Status ValidateNodeName(const std::string& name) {
  if (name.empty() || name.size() > 255) return absl::InvalidArgumentError("Slurm node name is empty or too long");
  for (char c : name) {
    const unsigned char u = static_cast<unsigned char>(c);
    if (!std::isalnum(u) && c != '-' && c != '_' && c != '.') {
      return absl::InvalidArgumentError(
          Cat("Slurm node name '", Printable(name), "' has a character other than letters, digits, '-', '_', '.'"));
    }
  }
  return absl::OkStatus();
}

absl::Status NotDrainedByOthers(const SlurmNode& n, const std::string& owned_prefix) {
  if (!n.Drain() || n.reason.rfind(owned_prefix, 0) == 0) return absl::OkStatus();
  return absl::FailedPreconditionError(
      Cat("node ", n.name, " is drained for '", Printable(n.reason), "' (not ours): left alone"));
}

std::string CliSlurmClient::Bin(const std::string& name) const {
  return options_.bin_dir.empty() ? name : options_.bin_dir + "/" + name;
}

absl::StatusOr<std::string> CliSlurmClient::Run(const std::vector<std::string>& argv, bool allow_invalid_state) {
  ++calls_;
  ProcessOptions po;
  po.timeout = options_.timeout;
  if (!options_.slurm_conf.empty()) po.env.emplace_back("SLURM_CONF", options_.slurm_conf);
  auto r = RunProcess(argv, po);
  if (!r.ok()) {
    ++failures_;
    return absl::UnavailableError(r.status().message());
  }
  if (r->timed_out) {
    ++failures_;
    return absl::UnavailableError(
        Cat(CommandLine(argv), ": no answer within ", options_.timeout.count(), " ms (slurmctld unreachable?)"));
  }
  if (r->exit_code != 0) {
    std::string err = r->err;
    while (!err.empty() && (err.back() == '\n' || err.back() == ' ')) err.pop_back();
    if (allow_invalid_state && err.find("Invalid node state specified") != std::string::npos) return r->out;
    ++failures_;
    // scontrol writes one message per line ("slurm_load_node error: ...\nUnable to contact slurm
    // controller ..."): one line here, the messages joined by "; ", never a literal \n.
    std::string joined;
    for (const auto& line : absl::StrSplit(err, '\n', absl::SkipWhitespace())) {
      if (!joined.empty()) joined += "; ";
      joined += std::string(absl::StripAsciiWhitespace(line));
    }
    const std::string msg = Cat(CommandLine(argv), ": exit ", r->exit_code, ": ", Printable(joined));
    if (err.find("Unable to contact slurm controller") != std::string::npos ||
        err.find("Socket timed out") != std::string::npos || err.find("Connection refused") != std::string::npos) {
      return absl::UnavailableError(msg);
    }
    if (err.find("not found") != std::string::npos || err.find("Invalid node name") != std::string::npos) {
      return absl::NotFoundError(msg);
    }
    return absl::InternalError(msg);
  }
  return r->out;
}

absl::StatusOr<std::vector<SlurmNode>> CliSlurmClient::Nodes() {
  auto out = Run({Bin("scontrol"), "-a", "-o", "show", "node"});
  if (!out.ok()) return out.status();
  return ParseScontrolNodes(*out);
}

absl::StatusOr<SlurmNode> CliSlurmClient::Node(const std::string& name) {
  if (auto s = ValidateNodeName(name); !s.ok()) return s;
  auto out = Run({Bin("scontrol"), "-a", "-o", "show", "node", name});
  if (!out.ok()) return out.status();
  auto nodes = ParseScontrolNodes(*out);
  if (!nodes.ok()) return nodes.status();
  for (auto& n : *nodes) {
    if (n.name == name) return std::move(n);
  }
  return absl::NotFoundError(Cat("Slurm has no node '", name, "'"));
}

absl::StatusOr<std::vector<SlurmJob>> CliSlurmClient::Jobs() {
  auto out = Run({Bin("squeue"), "-h", "-a", "-t", "PD,R,CG,CF,S,ST", "-o", kSqueueFormat});
  if (!out.ok()) return out.status();
  return ParseSqueue(*out);
}

absl::StatusOr<std::vector<SlurmJob>> CliSlurmClient::JobsOnNode(const std::string& node) {
  if (auto s = ValidateNodeName(node); !s.ok()) return s;
  auto out = Run({Bin("squeue"), "-h", "-a", "-w", node, "-t", "R,CG,CF,S,ST", "-o", kSqueueFormat});
  if (!out.ok()) return out.status();
  return ParseSqueue(*out);
}

absl::StatusOr<SlurmNode> SlurmClient::PowerDown(const std::string& node, const std::string&, const std::string&) {
  return absl::UnimplementedError(Cat("this Slurm backend cannot power node ", node, " down"));
}

absl::StatusOr<SlurmNode> SlurmClient::PowerUp(const std::string& node, const std::string&) {
  return absl::UnimplementedError(Cat("this Slurm backend cannot power node ", node, " up"));
}

absl::StatusOr<SlurmNode> CliSlurmClient::Drain(const std::string& node, const std::string& reason,
                                                const std::string& owned_prefix) {
  auto before = Node(node);
  if (!before.ok()) return before.status();
  if (auto s = NotDrainedByOthers(*before, owned_prefix); !s.ok()) return s;
  if (!(before->Drain() && before->reason == reason)) {
    auto w = Run({Bin("scontrol"), "update", Cat("NodeName=", node), "State=DRAIN", Cat("Reason=", reason)});
    if (!w.ok()) return w.status();
  }
  return Node(node);
}

absl::StatusOr<SlurmNode> CliSlurmClient::Undrain(const std::string& node, const std::string& owned_prefix) {
  auto before = Node(node);
  if (!before.ok()) return before.status();
  if (!before->Drain()) return before;
  if (auto s = NotDrainedByOthers(*before, owned_prefix); !s.ok()) return s;
  auto w = Run({Bin("scontrol"), "update", Cat("NodeName=", node), "State=UNDRAIN"}, /*allow_invalid_state=*/true);
  if (!w.ok()) return w.status();
  return Node(node);
}

absl::StatusOr<SlurmNode> CliSlurmClient::PowerDown(const std::string& node, const std::string& reason,
                                                    const std::string& owned_prefix) {
  auto before = Node(node);
  if (!before.ok()) return before.status();
  if (auto s = NotDrainedByOthers(*before, owned_prefix); !s.ok()) return s;
  if (before->PowerSaving() && before->reason == reason) return before;  // already asked (or done)
  // Slurm 22.05 answers "Invalid node state specified" when power saving is not configured
  // (no SuspendProgram/ResumeProgram, or SuspendTime=INFINITE) and still sets the reason: say so.
  auto w = Run({Bin("scontrol"), "update", Cat("NodeName=", node), "State=POWER_DOWN_ASAP", Cat("Reason=", reason)});
  if (!w.ok()) {
    if (w.status().message().find("Invalid node state specified") == std::string::npos) return w.status();
    return absl::FailedPreconditionError(
        Cat(w.status().message(),
            ": Slurm's power saving is off; --lend-via power-save needs SuspendProgram, "
            "ResumeProgram and a finite SuspendTime in slurm.conf (docs/slurm.md)"));
  }
  return Node(node);
}

absl::StatusOr<SlurmNode> CliSlurmClient::PowerUp(const std::string& node, const std::string& owned_prefix) {
  auto before = Node(node);
  if (!before.ok()) return before.status();
  if (!before->PoweredDown() || before->PowerUpRequested()) return before;  // asked already, or not powered down
  if (auto s = NotDrainedByOthers(*before, owned_prefix); !s.ok()) return s;
  auto w = Run({Bin("scontrol"), "update", Cat("NodeName=", node), "State=POWER_UP"});
  if (!w.ok()) return w.status();
  return Node(node);
}

}  // namespace kgpu::slurm
