#include "extender/webhook.h"

#include <algorithm>
#include <chrono>
#include <iterator>
#include <map>
#include <optional>
#include <set>

#include <httplib.h>

#include "absl/strings/escaping.h"
#include "common/http_compress.h"
#include "common/http_listen.h"
#include "common/log.h"
#include "common/strings.h"
#include "extender/inventory.h"
#include "extender/request.h"
#include "k8s/config.h"
#include "k8s/informer.h"
#include "k8s/resources.h"

namespace kgpu::extender {
namespace {
using json = nlohmann::json;

constexpr const char* kSections[] = {"initContainers", "containers"};
// HAMi's pod annotations -> ours.
constexpr std::pair<const char*, const char*> kHamiAnnotations[] = {
    {"nvidia.com/use-gputype", kAnnotationModels},
    {"nvidia.com/nouse-gputype", kAnnotationModelsDeny},
    {"nvidia.com/use-gpuuuid", kAnnotationUuids},
    {"nvidia.com/nouse-gpuuuid", kAnnotationUuidsDeny},
};

bool IsOurs(const std::string& name) {
  return name == kShares || name == kShareMemory || name == kShareCores;
}
bool IsHami(const std::string& name) {
  return name == kHamiMemory || name == kHamiMemoryPercent || name == kHamiCores;
}
bool IsGpu(const std::string& name) {
  return IsOurs(name) || IsHami(name) || name == kWholeGpu || name.rfind(kMigPrefix, 0) == 0;
}

// The GPU resources of one section (limits or requests) as whole numbers; unreadable ones left out.
std::map<std::string, int64_t> Section(const json& resources, const char* section) {
  std::map<std::string, int64_t> out;
  const auto it = resources.find(section);
  if (it == resources.end() || !it->is_object()) return out;
  for (auto r = it->begin(); r != it->end(); ++r) {
    if (!IsGpu(r.key())) continue;
    auto v = WholeQuantity(*r, r.key());
    if (v.ok()) out[r.key()] = *v;
  }
  return out;
}

const json& ObjectOr(const json& j, const char* key) {
  static const json kEmpty = json::object();
  const auto it = j.find(key);
  return it != j.end() && it->is_object() ? *it : kEmpty;
}

// A string member, "" when missing or of another type (json::value would throw).
std::string StringOr(const json& j, const char* key) {
  const auto it = j.find(key);
  return it != j.end() && it->is_string() ? it->get<std::string>() : std::string();
}

// a * b, or nullopt when it does not fit (values come from users: no signed overflow).
std::optional<int64_t> Mul(int64_t a, int64_t b) {
  int64_t out = 0;
  if (__builtin_mul_overflow(a, b, &out)) return std::nullopt;
  return out;
}

std::string Field(const char* section, size_t i) {
  return Cat("spec.", section, "[", i, "]");
}

}  // namespace

std::string PointerEscape(std::string_view segment) {
  std::string out;
  for (char c : segment) {
    if (c == '~')
      out += "~0";
    else if (c == '/')
      out += "~1";
    else
      out += c;
  }
  return out;
}

Decision MutatePod(const json& pod, const WebhookOptions& o) {
  Decision d;
  std::vector<std::string> denied;
  auto deny = [&](const char* code, std::string message) {
    d.reasons.emplace_back(code);
    denied.push_back(std::move(message));
  };
  if (!pod.is_object()) return d;
  const json& spec = ObjectOr(pod, "spec");
  bool translated = false, asks_gpu = false;
  for (const char* section : kSections) {
    const auto list = spec.find(section);
    if (list == spec.end() || !list->is_array()) continue;
    for (size_t i = 0; i < list->size(); ++i) {
      const json& c = (*list)[i];
      if (!c.is_object()) continue;
      const json& resources = ObjectOr(c, "resources");
      auto limits = Section(resources, "limits");
      const auto requests = Section(resources, "requests");
      for (const auto& [name, v] : requests) limits.emplace(name, v);  // a request alone: promoted to a limit
      if (limits.empty()) continue;
      asks_gpu = true;
      auto has = [&](const char* n) { return limits.count(n) > 0; };
      const bool ours = has(kShares) || has(kShareMemory) || has(kShareCores);
      const bool hami =
          has(kHamiMemory) || has(kHamiMemoryPercent) || has(kHamiCores) || (o.translate_hami && has(kWholeGpu));
      std::set<std::string> drop;
      if (hami && !ours) {
        const int64_t n = std::max<int64_t>(1, has(kWholeGpu) ? limits[kWholeGpu] : 1);
        const std::string lf = Field(section, i) + ".resources.limits[";
        auto total = [&](const char* name, std::optional<int64_t> v) {
          if (v) return *v;
          deny("too_large", Cat(lf, name, "]: ", limits[name], " per GPU over ", n, " vGPUs is too large (lower it)"));
          return int64_t{0};
        };
        if (n > 64) {
          deny("too_many_vgpus", Cat(lf, kWholeGpu, "]: ", n, " vGPUs is more GPUs than a node has (at most 64)"));
        } else {
          limits[kShares] = n;
          if (has(kHamiMemory)) {
            limits[kShareMemory] = total(kHamiMemory, Mul(limits[kHamiMemory], n));
          } else if (has(kHamiMemoryPercent)) {
            if (o.smallest_gpu_memory_mib <= 0) {
              deny("gpu_memory_unknown",
                   Cat(lf, kHamiMemoryPercent, "]: cannot be translated without knowing the GPUs' memory (write ",
                       kHamiMemory, " in MiB, or start kgpu webhook with --smallest-gpu-memory-mib)"));
            } else if (limits[kHamiMemoryPercent] > 100) {
              deny("memory_percentage_over_100",
                   Cat(lf, kHamiMemoryPercent, "]: ", limits[kHamiMemoryPercent], "% of a GPU's memory (at most 100)"));
            } else {
              auto per = Mul(limits[kHamiMemoryPercent], o.smallest_gpu_memory_mib);
              limits[kShareMemory] = total(kHamiMemoryPercent, per ? Mul(*per / 100, n) : per);
            }
          }
          if (has(kHamiCores)) limits[kShareCores] = total(kHamiCores, Mul(limits[kHamiCores], n));
        }
        for (const char* name : {kWholeGpu, kHamiMemory, kHamiMemoryPercent, kHamiCores}) {
          drop.insert(name);
          limits.erase(name);
        }
        translated = true;
      }
      if ((has(kShareMemory) || has(kShareCores)) && (!has(kShares) || limits[kShares] == 0)) limits[kShares] = 1;
      if (has(kShares) && limits[kShares] > 0 && !has(kShareCores) && has(kShareMemory) &&
          o.smallest_gpu_memory_mib > 0) {
        const int64_t shares = limits[kShares];
        const int64_t per_share = limits[kShareMemory] / shares;
        const auto scaled = Mul(per_share, 100);
        const int64_t per = per_share >= o.smallest_gpu_memory_mib || !scaled
                                ? 100
                                : std::max<int64_t>(1, *scaled / o.smallest_gpu_memory_mib);
        limits[kShareCores] = per * shares;
      }
      // The new resources: our names in limits and requests, equal; HAMi's gone; the rest kept.
      json next = resources;
      for (const char* sec : {"limits", "requests"}) {
        const bool present = next.contains(sec) && next[sec].is_object();
        json s = present ? next[sec] : json::object();
        // Limits always; requests only where the container has them (Kubernetes copies a limit
        // into a missing request).
        if (!present && std::string_view(sec) == "requests") continue;
        for (const auto& name : drop) s.erase(name);
        for (const auto& [name, v] : limits) {
          if (IsOurs(name)) s[name] = std::to_string(v);
        }
        if (present || !s.empty()) next[sec] = std::move(s);
      }
      if (next != resources) {
        d.patch.push_back({{"op", "add"}, {"path", Cat("/spec/", section, "/", i, "/resources")}, {"value", next}});
      }
    }
  }
  if (translated) {
    // HAMi's annotations live in metadata.annotations, so the object exists when there is one.
    const json& ann = ObjectOr(ObjectOr(pod, "metadata"), "annotations");
    for (const auto& [hami, ours] : kHamiAnnotations) {
      const auto it = ann.find(hami);
      if (it == ann.end() || !it->is_string() || ann.contains(ours)) continue;
      d.patch.push_back({{"op", "add"}, {"path", "/metadata/annotations/" + PointerEscape(ours)}, {"value", *it}});
    }
  }
  if (asks_gpu) {
    const std::string current = StringOr(spec, "schedulerName");
    const bool replace =
        !current.empty() && std::find(o.replace_scheduler_names.begin(), o.replace_scheduler_names.end(), current) !=
                                o.replace_scheduler_names.end();
    const std::string target = !o.scheduler_name.empty() ? o.scheduler_name : "default-scheduler";
    if (replace && current != target) {
      d.patch.push_back({{"op", "add"}, {"path", "/spec/schedulerName"}, {"value", target}});
      d.warnings.push_back(Cat("kgpu webhook: spec.schedulerName ", current, " replaced by ", target, " (no ", current,
                               " runs once HAMi is removed, and the pod would stay Pending; "
                               "--replace-scheduler-names \"\" keeps it)"));
    } else if (!o.scheduler_name.empty() && (current.empty() || current == "default-scheduler") &&
               current != o.scheduler_name) {
      d.patch.push_back({{"op", "add"}, {"path", "/spec/schedulerName"}, {"value", o.scheduler_name}});
    }
  }
  if (!denied.empty()) {
    d.allowed = false;
    d.message = Join(denied, "; ");
    d.patch = json::array();
  }
  return d;
}

Decision ValidatePod(const json& pod, const WebhookOptions& o) {
  Decision d;
  std::vector<std::string> denied;
  auto deny = [&](const char* code, std::string message) {
    d.reasons.emplace_back(code);
    denied.push_back(std::move(message));
  };
  if (!pod.is_object()) return d;
  const json& spec = ObjectOr(pod, "spec");
  for (const char* section : kSections) {
    const auto list = spec.find(section);
    if (list == spec.end() || !list->is_array()) continue;
    for (size_t i = 0; i < list->size(); ++i) {
      const json& c = (*list)[i];
      if (!c.is_object()) continue;
      const std::string f = Field(section, i);
      const json& resources = ObjectOr(c, "resources");
      const json& lim = ObjectOr(resources, "limits");
      const json& req = ObjectOr(resources, "requests");
      std::map<std::string, int64_t> limits;
      bool bad = false;
      for (auto it = lim.begin(); it != lim.end(); ++it) {
        if (!IsGpu(it.key())) continue;
        auto v = WholeQuantity(*it, Cat(f, ".resources.limits[", it.key(), "]"));
        if (!v.ok()) {
          deny("not_a_whole_number", std::string(v.status().message()));
          bad = true;
        } else {
          limits[it.key()] = *v;
        }
      }
      for (auto it = req.begin(); it != req.end(); ++it) {
        if (!IsGpu(it.key())) continue;
        const std::string field = Cat(f, ".resources.requests[", it.key(), "]");
        auto v = WholeQuantity(*it, field);
        if (!v.ok()) {
          deny("not_a_whole_number", std::string(v.status().message()));
          bad = true;
        } else if (!lim.contains(it.key())) {
          deny("request_without_limit", Cat(field, ": a request without a limit (set limits[", it.key(),
                                            "] to the same value: extended resources need a limit)"));
          bad = true;
        } else if (limits.count(it.key()) && limits[it.key()] != *v) {
          deny("request_not_limit", Cat(field, ": ", *v, " must equal limits[", it.key(), "] (", limits[it.key()],
                                        "): extended resources cannot be overcommitted"));
          bad = true;
        }
      }
      if (bad) continue;
      auto get = [&](const char* n) { return limits.count(n) ? limits[n] : int64_t{0}; };
      const int64_t whole = get(kWholeGpu), shares = get(kShares), memory = get(kShareMemory), cores = get(kShareCores);
      const std::string lf = f + ".resources.limits[";
      if (whole > 0 && shares > 0) {
        deny("whole_gpus_and_shares", Cat(lf, kShares, "]: asked together with ", kWholeGpu, " in one container (keep ",
                                          kWholeGpu, " for whole GPUs or ", kShares, " for shares, not both)"));
        continue;
      }
      const bool wants_share = shares > 0 || memory > 0 || cores > 0;
      if (wants_share && shares == 0) {
        deny("share_without_shares", Cat(lf, memory > 0 ? kShareMemory : kShareCores, "]: without ", kShares, " (add ",
                                         kShares, ": 1 to limits and requests)"));
        continue;
      }
      if (shares > 0 && cores / shares > 100) {
        deny("cores_over_100",
             Cat(lf, kShareCores, "]: ", cores, " over ", shares, " shares is ", cores / shares,
                 "% of one GPU per share (at most 100 per share: lower it or ask for more ", kShares, ")"));
      }
      if (shares > 0 && o.largest_gpu_memory_mib > 0 && memory / shares > o.largest_gpu_memory_mib) {
        deny("share_larger_than_gpu",
             Cat(lf, kShareMemory, "]: ", memory, " MiB over ", shares, " shares is ", memory / shares,
                 " MiB per GPU, more than the largest GPU in the cluster has (", o.largest_gpu_memory_mib,
                 " MiB): ask for more ", kShares, " or less memory"));
      }
      const json& sc = ObjectOr(c, "securityContext");
      if (wants_share && sc.contains("privileged") && sc["privileged"] == true) {
        deny("privileged_share", Cat(f,
                                     ".securityContext.privileged: a privileged container sees every GPU, so its "
                                     "share cannot be enforced (drop privileged, or ask for whole GPUs with ",
                                     kWholeGpu, ")"));
      }
    }
  }
  if (denied.empty()) {
    try {
      auto parsed = ParsePodRequest(pod);
      if (!parsed.ok()) deny("request_model", std::string(parsed.status().message()));
    } catch (const json::exception& e) {  // a member of the wrong type
      deny("not_a_pod", Cat("the pod does not decode as a Pod (", e.what(), ")"));
    }
  }
  if (!denied.empty()) {
    d.allowed = false;
    d.message = Join(denied, "; ");
  }
  return d;
}

absl::StatusOr<json> Review(std::string_view body, bool mutate, const WebhookOptions& o, ReviewOutcome* outcome) {
  json review = json::parse(body, nullptr, /*allow_exceptions=*/false);
  if (!review.is_object())
    return absl::InvalidArgumentError("the body is not a JSON object (expected an AdmissionReview)");
  const auto req = review.find("request");
  if (req == review.end() || !req->is_object()) {
    return absl::InvalidArgumentError("AdmissionReview without a request object (the API server sends request)");
  }
  const auto uid = req->find("uid");
  if (uid == req->end() || !uid->is_string())
    return absl::InvalidArgumentError("AdmissionReview request.uid missing or not a string");
  json response = {{"uid", *uid}, {"allowed", true}};
  const json& kind = ObjectOr(*req, "kind");
  const auto object = req->find("object");
  const bool pod = StringOr(kind, "kind") == "Pod";
  ReviewOutcome seen{pod ? "pods" : "other", "allowed", {}};
  if (pod && object != req->end() && object->is_object()) {
    Decision d = mutate ? MutatePod(*object, o) : ValidatePod(*object, o);
    if (!d.allowed) {
      response["allowed"] = false;
      response["status"] = {{"code", 403}, {"reason", "Forbidden"}, {"message", d.message}};
      seen.result = "denied";
      seen.reasons = std::move(d.reasons);
    } else if (!d.patch.empty()) {
      response["patchType"] = "JSONPatch";
      response["patch"] = absl::Base64Escape(d.patch.dump());
      seen.result = "patched";
    }
    if (d.allowed && !d.warnings.empty()) response["warnings"] = d.warnings;
  }
  if (outcome != nullptr) *outcome = std::move(seen);
  std::string api_version = "admission.k8s.io/v1";
  if (const auto v = review.find("apiVersion"); v != review.end() && v->is_string())
    api_version = v->get<std::string>();
  return json{{"apiVersion", api_version}, {"kind", "AdmissionReview"}, {"response", std::move(response)}};
}

Webhook::Webhook(WebhookOptions options) : opts_(std::move(options)) {
  using T = prom::MetricsRegistry::Type;
  metrics_.Declare("kgpu_webhook_requests_total", T::kCounter,
                   "AdmissionReviews answered, by operation (mutate, validate), result (allowed, patched, denied, "
                   "error: not an AdmissionReview, HTTP 400) and resource (pods, other, unknown for an error).");
  metrics_.Declare("kgpu_webhook_denials_total", T::kCounter,
                   "Denied AdmissionReviews by operation and reason code (a review refused for several reasons "
                   "counts once under each).");
  metrics_.Declare("kgpu_webhook_malformed_reviews_total", T::kCounter,
                   "Request bodies that are not an AdmissionReview (HTTP 400; the API server applies the "
                   "failurePolicy), by operation.");
  metrics_.Declare("kgpu_webhook_request_duration_seconds", T::kHistogram,
                   "Time to answer one AdmissionReview, by operation.", {std::begin(kBuckets), std::end(kBuckets)});
  metrics_.Declare("kgpu_webhook_gpu_memory_mib", T::kGauge,
                   "The GPU memory the webhook works with (bound: smallest, for the cores default and "
                   "gpumem-percentage; largest, for the share-size check), from the flags or the nodes' inventories; "
                   "0 while unknown.");
}
Webhook::~Webhook() {
  Stop();
}

namespace {
std::string InventoryOf(const json& node) {
  const auto meta = node.find("metadata");
  if (meta == node.end() || !meta->is_object()) return "";
  const auto ann = meta->find("annotations");
  if (ann == meta->end() || !ann->is_object()) return "";
  const auto inv = ann->find(kInventoryAnnotation);
  return inv != ann->end() && inv->is_string() ? inv->get<std::string>() : "";
}
}  // namespace

WebhookOptions Webhook::Effective() const {
  WebhookOptions o = opts_;
  std::lock_guard lock(sizes_mu_);
  if (o.smallest_gpu_memory_mib <= 0) o.smallest_gpu_memory_mib = smallest_;
  if (o.largest_gpu_memory_mib <= 0) o.largest_gpu_memory_mib = largest_;
  return o;
}

void Webhook::NodeChanged(const json& node, bool removed) {
  const std::string name = node.value("metadata", json::object()).value("name", "");
  std::optional<std::pair<int64_t, int64_t>> sizes;
  if (!removed) {
    auto info = ParseNodeInventory(node);
    if (info.ok()) {
      for (const auto& g : info->gpus) {
        if (g.slots <= 0 || g.memory_mib <= 0) continue;  // only GPUs that serve shares
        if (!sizes) sizes.emplace(g.memory_mib, g.memory_mib);
        sizes->first = std::min(sizes->first, g.memory_mib);
        sizes->second = std::max(sizes->second, g.memory_mib);
      }
    } else if (!absl::IsNotFound(info.status())) {
      // As the extender does: a broken inventory keeps the node's previous GPUs.
      Log("webhook")->warn("{} (the node keeps its previous GPUs in the share sizes)",
                           std::string(info.status().message()));
      return;
    }
  }
  std::lock_guard lock(sizes_mu_);
  if (sizes) {
    node_sizes_[name] = *sizes;
  } else {
    node_sizes_.erase(name);
  }
  int64_t lo = 0, hi = 0;
  for (const auto& [n, s] : node_sizes_) {
    lo = lo == 0 ? s.first : std::min(lo, s.first);
    hi = std::max(hi, s.second);
  }
  if (lo != smallest_ || hi != largest_) {
    Log("webhook")->info("GPUs serving shares in the cluster: smallest {} MiB, largest {} MiB ({} nodes)", lo, hi,
                         node_sizes_.size());
  }
  smallest_ = lo;
  largest_ = hi;
}

absl::Status Webhook::Start() {
  if (auto a = ParseListenAddress("--address", opts_.address); !a.ok()) return a.status();
  if (opts_.tls_cert_file.empty() || opts_.tls_key_file.empty()) {
    if (!opts_.insecure_http || !opts_.tls_cert_file.empty() || !opts_.tls_key_file.empty()) {
      return absl::InvalidArgumentError(
          "--tls-cert-file and --tls-key-file are required (the API server calls webhooks over HTTPS; "
          "--insecure-http serves plain HTTP for tests)");
    }
    http_ = std::make_unique<httplib::Server>();
  } else {
    auto ssl = std::make_unique<httplib::SSLServer>(opts_.tls_cert_file.c_str(), opts_.tls_key_file.c_str());
    if (!ssl->is_valid()) {
      // Bad input (a file that is missing or not PEM), not usage: exit 1, as every command's unreadable file.
      return absl::FailedPreconditionError(Cat("--tls-cert-file ", opts_.tls_cert_file, " / --tls-key-file ",
                                               opts_.tls_key_file,
                                               ": cannot load the certificate and key (PEM files; check both paths "
                                               "and that the key matches the certificate)"));
    }
    http_ = std::move(ssl);
  }
  const int threads = std::max(2, opts_.threads);
  http_->new_task_queue = [threads] { return new httplib::ThreadPool(static_cast<size_t>(threads)); };
  http_->set_payload_max_length(8u << 20);
  http_->set_keep_alive_timeout(1);  // as the extender's: an idle connection holds up Stop() this long
  // Headers and body go out in two send() calls: without TCP_NODELAY, Nagle and the API server's
  // delayed ACK add 40 ms to every review (the extender's server has the measurement).
  http_->set_tcp_nodelay(true);
  http_->set_keep_alive_max_count(1000);
  if (!opts_.kubeconfig.empty() || opts_.in_cluster) {
    // Declared only with the informer: without one these families would have no series ever.
    using T = prom::MetricsRegistry::Type;
    metrics_.Declare("kgpu_webhook_inventory_synced", T::kGauge,
                     "1 once the node informer has listed the nodes (until then sizes not given by a flag are "
                     "unknown).");
    metrics_.Declare("kgpu_webhook_inventory_nodes", T::kGauge,
                     "Nodes whose kgpu.io/gpu-inventory has GPUs that serve shares.");
    metrics_.Declare("kgpu_webhook_inventory_errors_total", T::kCounter,
                     "Failed lists and watches of the node informer (each retried after a backoff).");
    auto cfg = k8s::ConfigFromFlags(opts_.kubeconfig, opts_.context, opts_.in_cluster);
    if (!cfg.ok()) return cfg.status();  // a kubeconfig error: exit 1 as in every command
    auto client = k8s::Client::Create(*cfg);
    if (!client.ok()) return client.status();
    client_ = std::move(*client);
    k8s::InformerOptions no;
    no.path = k8s::FindResource("nodes")->Path("");
    nodes_ = std::make_unique<k8s::Informer>(*client_, no);
    nodes_->AddHandler({[this](const json& n) { NodeChanged(n, false); },
                        [this](const json& old_node, const json& n) {
                          // Status updates (heartbeats) leave the inventory as it was.
                          if (InventoryOf(old_node) != InventoryOf(n)) NodeChanged(n, false);
                        },
                        [this](const json& n) { NodeChanged(n, true); }});
    nodes_->Start();
  }
  auto handler = [this](bool mutate) {
    return [this, mutate](const httplib::Request& req, httplib::Response& res) {
      auto [status, body] = Handle(mutate, req.body);
      res.status = status;
      res.set_content(body, status == 200 ? "application/json" : "text/plain");
      // An AdmissionReview answer is small and on kube-apiserver's admission path: sent as it is,
      // though the apiserver's Go client asks for gzip (common/http_compress.h).
      AnswerUncompressed(req);
    };
  };
  http_->Post("/mutate", handler(true));
  http_->Post("/validate", handler(false));
  http_->Get("/healthz",
             [](const httplib::Request&, httplib::Response& res) { res.set_content("ok\n", "text/plain"); });
  // As the extender's: on the same listener (HTTPS when the webhook serves HTTPS), without
  // authentication, read-only. The page holds counts and sizes, nothing from the pods reviewed.
  http_->Get("/metrics", [this](const httplib::Request&, httplib::Response& res) {
    res.set_content(MetricsText(), "text/plain; version=0.0.4");
  });
  auto bound = BindListenAddress(*http_, "--address", opts_.address);
  if (!bound.ok()) return bound.status();
  port_ = *bound;
  http_thread_ = ListenOnThread(*http_);
  Log("webhook")->info("serving {} on {} (port {})", opts_.tls_cert_file.empty() ? "HTTP" : "HTTPS", opts_.address,
                       port_);
  return absl::OkStatus();
}

std::pair<int, std::string> Webhook::Handle(bool mutate, std::string_view body) {
  const auto t0 = std::chrono::steady_clock::now();
  const std::string op = mutate ? "mutate" : "validate";
  ReviewOutcome outcome;
  auto out = Review(body, mutate, Effective(), &outcome);
  std::pair<int, std::string> reply;
  if (!out.ok()) {
    Log("webhook")->warn("/{}: {}", op, std::string(out.status().message()));
    metrics_.Add("kgpu_webhook_malformed_reviews_total", {{"operation", op}});
    outcome.resource = "unknown";
    outcome.result = "error";
    reply = {400, std::string(out.status().message()) + "\n"};
  } else {
    reply = {200, out->dump()};
  }
  metrics_.Add("kgpu_webhook_requests_total",
               {{"operation", op}, {"result", outcome.result}, {"resource", outcome.resource}});
  // Each code once per review, whatever the number of containers it was found in.
  const std::set<std::string> reasons(outcome.reasons.begin(), outcome.reasons.end());
  for (const auto& reason : reasons)
    metrics_.Add("kgpu_webhook_denials_total", {{"operation", op}, {"reason", reason}});
  metrics_.Observe("kgpu_webhook_request_duration_seconds", {{"operation", op}},
                   std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count());
  return reply;
}

std::string Webhook::MetricsText() const {
  const WebhookOptions o = Effective();
  metrics_.Set("kgpu_webhook_gpu_memory_mib", {{"bound", "smallest"}}, static_cast<double>(o.smallest_gpu_memory_mib));
  metrics_.Set("kgpu_webhook_gpu_memory_mib", {{"bound", "largest"}}, static_cast<double>(o.largest_gpu_memory_mib));
  if (nodes_) {
    size_t nodes = 0;
    {
      std::lock_guard lock(sizes_mu_);
      nodes = node_sizes_.size();
    }
    metrics_.Set("kgpu_webhook_inventory_synced", nodes_->HasSynced() ? 1 : 0);
    metrics_.Set("kgpu_webhook_inventory_nodes", static_cast<double>(nodes));
    metrics_.Set("kgpu_webhook_inventory_errors_total", static_cast<double>(nodes_->stats().errors));
  }
  return metrics_.Text();
}

void Webhook::Stop() {
  if (http_) http_->stop();
  if (http_thread_.joinable()) http_thread_.join();
  if (nodes_) nodes_->Stop();
}

}  // namespace kgpu::extender
