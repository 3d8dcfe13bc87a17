#pragma once
// A thin Kubernetes API client over libcurl with JSON bodies (nlohmann::json): objects stay
// JSON end to end, so fields this code does not know survive a read-modify-write.
//
// Every request is rate limited (token bucket, Config::qps/burst, client-go's 5/10 defaults),
// has a timeout (Config::timeout; watches end at their timeoutSeconds plus a grace period, so a
// silently dead connection is noticed), sends `User-Agent: kgpu/<version>`, `Accept-Encoding:
// gzip` (not on watches; none with the kubeconfig's disable-compression) and the credentials:
// the bearer token (a token file is re-read when it changes, and once more after a 401, as
// projected service-account tokens rotate), the client certificate, or what the user's exec
// credential plugin returns (exec_credential.h: cached until its expiry; after a 401 it is run
// again and the request sent once more with the new credential, where client-go only lets the
// next request use it). Responses with Retry-After (429, 5xx) and GET failures on 5xx or
// transport errors are retried a few times with backoff; failed TLS verification and credential
// errors are not.
//
// TLS: the kubeconfig's tls-server-name is the name the server's certificate is checked against
// and the SNI sent, while the connection goes to the server URL's host (as client-go's
// tls.Config.ServerName). A failed check reads as kubectl's: "tls: failed to verify certificate:
// x509: certificate signed by unknown authority", "x509: certificate is valid for a, b, not c",
// "x509: certificate has expired or is not yet valid: current time T is after U", followed by
// which check failed and libcurl's own words.
//
// Errors: absl::Status whose message is "<METHOD> <url>: <the apiserver's Status message>";
// HttpStatus() gives the HTTP code (0 for transport errors) and Reason() the Status reason.
//
// Thread-safety: a Client may be used from any number of threads.

#include <atomic>
#include <chrono>
#include <functional>
#include <map>
#include <memory>
#include <mutex>
#include <optional>
#include <stop_token>
#include <string>
#include <string_view>
#include <vector>

#include <nlohmann/json.hpp>

#include "absl/status/statusor.h"
#include "k8s/config.h"
#include "k8s/resources.h"
#include "k8s/watch_decoder.h"

struct curl_slist;  // libcurl's (curl/curl.h)

namespace kgpu::k8s {

class ExecCredentialSource;

// The HTTP status of an error from this client (0 when none or a transport error).
int HttpStatus(const absl::Status& s);
// The Kubernetes Status reason ("Conflict", "NotFound", "AlreadyExists", "Expired", ...).
std::string Reason(const absl::Status& s);
inline bool IsApiNotFound(const absl::Status& s) {
  return HttpStatus(s) == 404;
}
inline bool IsApiConflict(const absl::Status& s) {
  return HttpStatus(s) == 409;
}
inline bool IsApiGone(const absl::Status& s) {
  return HttpStatus(s) == 410;
}

// Token bucket: `burst` tokens, refilled at `qps` per second. Wait() blocks until a token is
// available; qps <= 0 disables the limit.
class RateLimiter {
 public:
  RateLimiter(double qps, int burst);
  void Wait();
  // Tokens taken so far and the time spent waiting, for tests and metrics.
  uint64_t Taken() const { return taken_; }

 private:
  std::mutex mu_;
  double qps_;
  double burst_;
  double tokens_;
  std::chrono::steady_clock::time_point last_;
  std::atomic<uint64_t> taken_{0};
};

struct ListOptions {
  std::string label_selector;
  std::string field_selector;
  int64_t limit = 0;             // page size; 0 = unpaginated
  std::string resource_version;  // "" = most recent (quorum read), "0" = any
};

struct DeleteOptions {
  std::optional<int64_t> grace_period_seconds;
  std::string propagation_policy;  // "Foreground", "Background", "Orphan" or ""
  std::string precondition_uid;
  std::string precondition_resource_version;
};

struct WatchOptions {
  std::string resource_version;
  std::string label_selector;
  std::string field_selector;
  bool allow_bookmarks = true;
  // Server-side timeout of the watch; 0 = the server's default (a random 30-60 min). When set,
  // the client gives up too, a grace period later: a connection that died without a word (a
  // vanished peer, a NAT that forgot it) then ends the watch instead of hanging it for ever.
  int timeout_seconds = 0;
};

struct EvictOptions {
  std::chrono::milliseconds max_wait{60000};  // give up after this long of 429s
  std::chrono::milliseconds initial_backoff{200};
  std::chrono::milliseconds max_backoff{5000};
  // deleteOptions.preconditions.uid: only this pod, not a successor of the same name (409).
  std::string uid;
  std::stop_token stop;  // ends a backoff at once (Cancelled)
  // ?dryRun=All: the apiserver runs the PodDisruptionBudget check and evicts nothing. Asked once:
  // a 429 comes back as it is (the budget forbids it now), with no backoff.
  bool dry_run = false;
};

class Client {
 public:
  static absl::StatusOr<std::unique_ptr<Client>> Create(Config config);
  ~Client();
  Client(const Client&) = delete;
  Client& operator=(const Client&) = delete;

  const Config& config() const { return config_; }

  // Raw request: path includes the query. `body` empty sends none.
  struct Response {
    long status = 0;
    std::string body;
    std::string content_type;
    std::string retry_after;
    std::vector<std::string> warnings;  // Warning headers' texts (also logged)
  };
  absl::StatusOr<Response> Do(std::string_view method, const std::string& path_and_query, const std::string& body = "",
                              std::string_view content_type = "application/json");

  absl::StatusOr<nlohmann::json> Get(const std::string& path);
  // One page; the list's metadata.continue names the next.
  absl::StatusOr<nlohmann::json> ListPage(const std::string& path, const ListOptions& opts,
                                          const std::string& continue_token = "");
  // All pages joined into one list (items, metadata.resourceVersion of the first page). A 410
  // on a continue token (expired) restarts the list from the beginning once.
  absl::StatusOr<nlohmann::json> List(const std::string& path, const ListOptions& opts = {});
  absl::StatusOr<nlohmann::json> Create(const std::string& collection_path, const nlohmann::json& obj);
  // PUT with the object's metadata.resourceVersion (a stale one is a 409).
  absl::StatusOr<nlohmann::json> Update(const std::string& path, const nlohmann::json& obj);
  absl::StatusOr<nlohmann::json> Patch(const std::string& path, const nlohmann::json& patch,
                                       std::string_view content_type = "application/strategic-merge-patch+json");
  absl::StatusOr<nlohmann::json> Delete(const std::string& path, const DeleteOptions& opts = {});

  // Reads the object, lets `mutate` change it, writes it back; on 409 Conflict reads again and
  // repeats (client-go's retry.RetryOnConflict, DefaultRetry: 5 steps, 10 ms doubling with
  // jitter). `mutate` returning an error aborts. The path may end in /status.
  absl::StatusOr<nlohmann::json> UpdateWithRetry(const std::string& path,
                                                 const std::function<absl::Status(nlohmann::json&)>& mutate,
                                                 int attempts = 5);

  // pods/binding: sets spec.nodeName (409 when already bound). The apiserver merges the
  // Binding's metadata.annotations into the pod's in the same write (BindingREST
  // setPodHostAndAnnotations), and a non-empty `uid` is a precondition (409 when the pod was
  // re-created under the same name).
  struct BindOptions {
    std::string uid;
    std::map<std::string, std::string> annotations;
  };
  absl::Status Bind(std::string_view ns, std::string_view pod, std::string_view node, const BindOptions& opts);
  absl::Status Bind(std::string_view ns, std::string_view pod, std::string_view node) {
    return Bind(ns, pod, node, {});
  }
  // pods/eviction (policy/v1). 429 (a PodDisruptionBudget forbids it now) is retried with
  // backoff until opts.max_wait; 404 (already gone) counts as done.
  absl::Status Evict(std::string_view ns, std::string_view pod, const EvictOptions& opts = {});

  // Streams a watch; `on_event` gets every event and returns false to stop. Returns OK when
  // the server closes the stream (its timeout), or the error: an HTTP error to start the
  // watch, an ERROR event (its Status code is the HttpStatus: 410 means relist), a transport
  // error or a malformed stream. `stop` ends it promptly.
  absl::Status Watch(const std::string& collection_path, const WatchOptions& opts,
                     const std::function<bool(const WatchEvent&)>& on_event, std::stop_token stop = {});

  uint64_t RequestCount() const { return requests_; }

 private:
  explicit Client(Config config);
  struct Handle;
  std::unique_ptr<Handle> Acquire();
  void Release(std::unique_ptr<Handle> h);
  absl::StatusOr<Response> DoOnce(Handle& h, std::string_view method, const std::string& path_and_query,
                                  const std::string& body, std::string_view content_type);
  std::string Token(bool force_reread);
  absl::Status ApiError(std::string_view method, const std::string& path, const Response& r) const;
  absl::StatusOr<nlohmann::json> JsonOf(std::string_view method, const std::string& path, const Response& r) const;
  // Sets the options every request shares and its credentials. Returns the generation of the exec
  // plugin's credential it used (0: none), or the plugin's error.
  absl::StatusOr<uint64_t> SetCommon(Handle& h, const std::string& path_and_query, std::string_view method,
                                     std::vector<std::string>& headers, bool force_token);
  // A failed transfer as an error: TLS failures in kubectl's words plus the check that failed.
  absl::Status TransportError(Handle& h, int curl_code, std::string_view verb, const std::string& url) const;

  Config config_;
  RateLimiter limiter_;
  std::mutex mu_;
  std::vector<std::unique_ptr<Handle>> idle_;
  std::string token_;
  int64_t token_mtime_ = -1;
  std::atomic<uint64_t> requests_{0};
  // The user's exec credential plugin, when it gives this client a token or a certificate.
  std::shared_ptr<ExecCredentialSource> exec_;
  // The URL libcurl is given: config_.server, or with tls-server-name its host replaced by that
  // name (connect_to_ then sends the connection to the real host and host_header_ keeps the
  // server's own Host). Messages name config_.server.
  std::string curl_server_;
  std::string verify_host_;  // the name the certificate must match
  std::string host_header_;
  curl_slist* connect_to_ = nullptr;
};

// "kgpu/<version> (linux/amd64)".
std::string UserAgent();

}  // namespace kgpu::k8s
