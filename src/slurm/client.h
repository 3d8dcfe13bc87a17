#pragma once
// SlurmClient: what the bridge needs from Slurm, behind one interface, and the CLI backend that
// implements it for every Slurm release (the only one that can drain on 22.05, whose REST API
// has no node update): `scontrol`, `squeue` spawned without a shell, each with a deadline,
// machine-readable output, and every write followed by a re-read (never acting on an exit code
// alone: on 22.05 a RESUME right after a slurmctld restart fails and still clears DRAIN). The
// REST backend for Slurm >= 23.02 is in slurm/rest.h.
//
// Errors: Unavailable when slurmctld cannot be reached (the command timed out, or said "Unable
// to contact slurm controller") — callers freeze transitions on it; FailedPrecondition when a
// write is refused by our own guard (a drain reason that is not ours); NotFound for an unknown
// node; Internal for any other failure, with the command and its stderr.
//
// Thread-safety: CliSlurmClient may be used from any number of threads.

#include <atomic>
#include <chrono>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "slurm/parse.h"

namespace kgpu::slurm {

class SlurmClient {
 public:
  virtual ~SlurmClient() = default;
  SlurmClient() = default;
  SlurmClient(const SlurmClient&) = delete;
  SlurmClient& operator=(const SlurmClient&) = delete;

  virtual absl::StatusOr<std::vector<SlurmNode>> Nodes() = 0;
  virtual absl::StatusOr<SlurmNode> Node(const std::string& name) = 0;
  // Pending jobs and jobs holding nodes (running, completing, configuring, suspended).
  virtual absl::StatusOr<std::vector<SlurmJob>> Jobs() = 0;
  // Jobs holding `node` (squeue -w), the second half of the "is it empty" check.
  virtual absl::StatusOr<std::vector<SlurmJob>> JobsOnNode(const std::string& node) = 0;
  // DRAIN with `reason`, unless the node is already drained for a reason that does not start
  // with `owned_prefix` (FailedPrecondition: never overwrite a reason that is not ours).
  // Returns the node as re-read afterwards.
  virtual absl::StatusOr<SlurmNode> Drain(const std::string& node, const std::string& reason,
                                          const std::string& owned_prefix) = 0;
  // Clears DRAIN (State=UNDRAIN) when the reason starts with `owned_prefix`; a node that is not
  // drained is left as is; a foreign reason is FailedPrecondition. Returns the re-read node.
  virtual absl::StatusOr<SlurmNode> Undrain(const std::string& node, const std::string& owned_prefix) = 0;
  // The power-save lend (needs SuspendProgram/ResumeProgram in slurm.conf): State=POWER_DOWN_ASAP
  // with `reason` — Slurm drains the node, and once its jobs have ended runs SuspendProgram and
  // marks it POWERED_DOWN — with Drain's guard against a reason that is not ours. Returns the
  // re-read node. A backend that cannot (the default) answers Unimplemented.
  virtual absl::StatusOr<SlurmNode> PowerDown(const std::string& node, const std::string& reason,
                                              const std::string& owned_prefix);
  // State=POWER_UP on a POWERED_DOWN node: Slurm runs ResumeProgram and waits ResumeTimeout for
  // slurmd to register as rebooted. 22.05 clears the reason, even a drained node's, so a drain
  // that is not ours is FailedPrecondition. Returns the re-read node.
  virtual absl::StatusOr<SlurmNode> PowerUp(const std::string& node, const std::string& owned_prefix);
};

struct CliOptions {
  std::string bin_dir;     // where scontrol/squeue live; empty: PATH
  std::string slurm_conf;  // SLURM_CONF for the commands; empty: theirs
  std::chrono::milliseconds timeout{10000};
};

class CliSlurmClient : public SlurmClient {
 public:
  explicit CliSlurmClient(CliOptions options) : options_(std::move(options)) {}

  absl::StatusOr<std::vector<SlurmNode>> Nodes() override;
  absl::StatusOr<SlurmNode> Node(const std::string& name) override;
  absl::StatusOr<std::vector<SlurmJob>> Jobs() override;
  absl::StatusOr<std::vector<SlurmJob>> JobsOnNode(const std::string& node) override;
  absl::StatusOr<SlurmNode> Drain(const std::string& node, const std::string& reason,
                                  const std::string& owned_prefix) override;
  absl::StatusOr<SlurmNode> Undrain(const std::string& node, const std::string& owned_prefix) override;
  absl::StatusOr<SlurmNode> PowerDown(const std::string& node, const std::string& reason,
                                      const std::string& owned_prefix) override;
  absl::StatusOr<SlurmNode> PowerUp(const std::string& node, const std::string& owned_prefix) override;

  uint64_t Calls() const { return calls_; }
  uint64_t Failures() const { return failures_; }

 private:
  // Runs a Slurm command; non-zero exit is an error classified as above.
  absl::StatusOr<std::string> Run(const std::vector<std::string>& argv, bool allow_invalid_state = false);
  std::string Bin(const std::string& name) const;

  CliOptions options_;
  std::atomic<uint64_t> calls_{0}, failures_{0};
};

// The guard every write of the bridge keeps: FailedPrecondition when `n` is drained for a reason
// that does not start with `owned_prefix` (never overwrite or clear an admin's drain).
absl::Status NotDrainedByOthers(const SlurmNode& n, const std::string& owned_prefix);

// Node names must be plain Slurm node names (letters, digits, '-', '_', '.'): they go into
// command lines as one argument each, but "NodeName=<x>" must not smuggle a second key.
absl::Status ValidateNodeName(const std::string& name);

}  // namespace kgpu::slurm
