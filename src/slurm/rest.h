#pragma once
// The REST backend of SlurmClient: slurmrestd's OpenAPI v0.0.39 (Slurm 23.02 and later), the
// first release whose REST API can update a node (POST /slurm/v0.0.39/node/{name}). 22.05's
// v0.0.38 cannot, so on Debian 12's Slurm the CLI backend stays the one that drains.
//
// What it reads and writes (Slurm's openapi v0.0.39 and data_parser v0.0.39):
//  - GET  /slurm/v0.0.39/nodes, GET /slurm/v0.0.39/node/{name}: {"nodes": [...], "errors": [...]};
//    per node "name", "state" (an array: the base state first, then flags: ["IDLE","DRAIN"]),
//    "reason", "reason_set_by_user", "reason_changed_at" (unix seconds), "gres", "cpus",
//    "alloc_cpus", "partitions" (an array), "features" and "active_features" (comma-separated
//    strings). An unknown name is not a 404: no node and an error entry.
//  - GET  /slurm/v0.0.39/jobs: per job "job_id", "job_state" (one string), "nodes" (a hostlist),
//    "node_count" ({"set","infinite","number"}), "state_reason", "end_time" and "submit_time"
//    (unix seconds, 0 when unknown), "partition", and what the job asked for: "required_nodes" and
//    "excluded_nodes" (hostlists), "features" (the --constraint), "tres_per_node" ("gres:gpu:2").
//  - POST /slurm/v0.0.39/node/{name} with {"state": ["DRAIN"], "reason": "..."}: one state per
//    update (slurmrestd's parser keeps only the last of several), so POWER_DOWN_ASAP, which is
//    two flags (POWER_DOWN|POWER_DRAIN) that scontrol sets at once, is not offered: the
//    power-save lend needs the CLI backend.
//  - Errors: a handler's failure is HTTP 500 with {"errors": [{"error_number", "error",
//    "description", "source"}]}; 401 is a refused credential (plain text); 404 a path this
//    slurmrestd does not serve (an older Slurm).
// Every write is preceded by a read (the guard against a drain that is not ours) and followed by
// one (acting on what Slurm now says, never on a status code alone), as the CLI backend does.
//
// Thread-safety: RestSlurmClient may be used from any number of threads (one curl handle per
// call); the parsers are pure functions.

#include <atomic>
#include <chrono>
#include <string>
#include <string_view>
#include <vector>

#include "absl/status/statusor.h"
#include "slurm/client.h"
#include "slurm/parse.h"

namespace kgpu::slurm {

inline constexpr char kRestApiVersion[] = "v0.0.39";

// The "nodes" of a v0.0.39 nodes response; errors name what was wrong ("slurmrestd nodes: ...").
absl::StatusOr<std::vector<SlurmNode>> ParseRestNodes(std::string_view body);
// The "jobs" of a v0.0.39 jobs response, those that are pending or hold nodes (as the CLI
// backend's squeue -t PD,R,CG,CF,S,ST).
absl::StatusOr<std::vector<SlurmJob>> ParseRestJobs(std::string_view body);
// The response's "errors" as one message ("" when none); *controller_down when one of them says
// slurmctld cannot be reached.
std::string RestErrors(std::string_view body, bool* controller_down);

// --slurm-rest-url's forms: http://host:port, https://host:port, unix:/path.
absl::Status ValidateRestUrl(const std::string& url);

struct RestOptions {
  // http://host:6820, https://host:6820, or unix:/run/slurmrestd.sock (rest_auth/local: the
  // socket's peer credentials say who calls; no token).
  std::string url;
  std::string user;        // X-SLURM-USER-NAME (empty: not sent)
  std::string token;       // X-SLURM-USER-TOKEN, a JWT from `scontrol token` (empty: not sent)
  std::string token_file;  // read for each call when set (a rotated token is picked up)
  std::chrono::milliseconds timeout{10000};
};

class RestSlurmClient : public SlurmClient {
 public:
  explicit RestSlurmClient(RestOptions options) : options_(std::move(options)) {}

  absl::StatusOr<std::vector<SlurmNode>> Nodes() override;
  absl::StatusOr<SlurmNode> Node(const std::string& name) override;
  absl::StatusOr<std::vector<SlurmJob>> Jobs() override;
  absl::StatusOr<std::vector<SlurmJob>> JobsOnNode(const std::string& node) override;
  absl::StatusOr<SlurmNode> Drain(const std::string& node, const std::string& reason,
                                  const std::string& owned_prefix) override;
  absl::StatusOr<SlurmNode> Undrain(const std::string& node, const std::string& owned_prefix) override;
  absl::StatusOr<SlurmNode> PowerUp(const std::string& node, const std::string& owned_prefix) override;

  uint64_t Calls() const { return calls_; }
  uint64_t Failures() const { return failures_; }

 private:
  // One request; the body of a 200, else the error classified as client.h says.
  absl::StatusOr<std::string> Call(const std::string& method, const std::string& path, const std::string& body = "");
  // POST node/{name} {"state": [state], "reason": reason}.
  absl::Status Update(const std::string& node, const std::string& state, const std::string& reason);

  RestOptions options_;
  std::atomic<uint64_t> calls_{0}, failures_{0};
};

}  // namespace kgpu::slurm
