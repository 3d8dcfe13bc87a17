// The admission webhook's pure parts: exact JSONPatches for defaults, HAMi translation and
// schedulerName; exact denial messages naming the field and their reason codes; the
// AdmissionReview envelope. And the server's /metrics after real requests over HTTP.
#include "extender/webhook.h"

#include <chrono>
#include <cstdlib>
#include <regex>
#include <set>
#include <sstream>
#include <utility>

#include <gtest/gtest.h>

#include "absl/strings/escaping.h"
#include "testing/raw_http.h"

namespace kgpu::extender {
namespace {
using json = nlohmann::json;

json Pod(json containers, json annotations = nullptr) {
  json pod = {{"apiVersion", "v1"},
              {"kind", "Pod"},
              {"metadata", {{"name", "p"}, {"namespace", "team-a"}}},
              {"spec", {{"containers", std::move(containers)}}}};
  if (!annotations.is_null()) pod["metadata"]["annotations"] = std::move(annotations);
  return pod;
}
json Container(const std::string& name, json limits, json requests = nullptr) {
  json c = {{"name", name}, {"image", "cuda"}, {"resources", {{"limits", std::move(limits)}}}};
  if (!requests.is_null()) c["resources"]["requests"] = std::move(requests);
  return c;
}

TEST(WebhookMutate, MemoryWithoutSharesGetsOneShareAndProportionalCores) {
  WebhookOptions o;
  o.smallest_gpu_memory_mib = 40960;
  const json pod = Pod({Container("main", {{"kgpu.io/gpu-memory", "10240"}, {"cpu", "1"}}, {{"cpu", "1"}})});
  const Decision d = MutatePod(pod, o);
  ASSERT_TRUE(d.allowed) << d.message;
  const json want = json::parse(R"([{"op":"add","path":"/spec/containers/0/resources","value":{
    "limits":{"cpu":"1","kgpu.io/gpu":"1","kgpu.io/gpu-memory":"10240","kgpu.io/gpu-cores":"25"},
    "requests":{"cpu":"1","kgpu.io/gpu":"1","kgpu.io/gpu-memory":"10240","kgpu.io/gpu-cores":"25"}}}])");
  EXPECT_EQ(d.patch, want) << d.patch.dump();
}

TEST(WebhookMutate, NoCoresDefaultWithoutInventoryAndNothingForACompletePod) {
  WebhookOptions o;
  const json pod = Pod({Container("main", {{"kgpu.io/gpu-memory", "8k"}})});
  const Decision d = MutatePod(pod, o);
  const json want = json::parse(R"([{"op":"add","path":"/spec/containers/0/resources","value":{
    "limits":{"kgpu.io/gpu":"1","kgpu.io/gpu-memory":"8000"}}}])");
  EXPECT_EQ(d.patch, want) << d.patch.dump();
  // Applying the patch gives a pod the webhook leaves alone.
  EXPECT_EQ(MutatePod(pod.patch(d.patch), o).patch, json::array());
}

TEST(WebhookMutate, RequestAloneIsPromotedToALimit) {
  const json pod = Pod({Container("main", json::object(), {{"kgpu.io/gpu", 2}, {"kgpu.io/gpu-memory", "8k"}})});
  const Decision d = MutatePod(pod, {});
  const json want = json::parse(R"([{"op":"add","path":"/spec/containers/0/resources","value":{
    "limits":{"kgpu.io/gpu":"2","kgpu.io/gpu-memory":"8000"},
    "requests":{"kgpu.io/gpu":"2","kgpu.io/gpu-memory":"8000"}}}])");
  EXPECT_EQ(d.patch, want) << d.patch.dump();
}

TEST(WebhookMutate, TranslatesHamiPerGpuNamesIntoTotalsAndAnnotations) {
  WebhookOptions o;
  o.scheduler_name = "kgpu-scheduler";
  json pod =
      Pod({Container("init-ok", {{"cpu", "1"}}),
           Container("train", {{"nvidia.com/gpu", "2"}, {"nvidia.com/gpumem", "3000"}, {"nvidia.com/gpucores", "30"}},
                     {{"nvidia.com/gpu", "2"}, {"memory", "1Gi"}})},
          {{"nvidia.com/use-gputype", "A100,H100"}, {"nvidia.com/nouse-gpuuuid", "GPU-bad"}});
  const Decision d = MutatePod(pod, o);
  ASSERT_TRUE(d.allowed) << d.message;
  const json want = json::parse(R"([
    {"op":"add","path":"/spec/containers/1/resources","value":{
      "limits":{"kgpu.io/gpu":"2","kgpu.io/gpu-memory":"6000","kgpu.io/gpu-cores":"60"},
      "requests":{"memory":"1Gi","kgpu.io/gpu":"2","kgpu.io/gpu-memory":"6000","kgpu.io/gpu-cores":"60"}}},
    {"op":"add","path":"/metadata/annotations/kgpu.io~1gpu-model","value":"A100,H100"},
    {"op":"add","path":"/metadata/annotations/kgpu.io~1gpu-uuid-deny","value":"GPU-bad"},
    {"op":"add","path":"/spec/schedulerName","value":"kgpu-scheduler"}])");
  EXPECT_EQ(d.patch, want) << d.patch.dump();
  EXPECT_TRUE(ValidatePod(pod.patch(d.patch), o).allowed);
}

TEST(WebhookMutate, GpuAloneIsHamiOnlyWithTheFlag) {
  const json pod = Pod({Container("main", {{"nvidia.com/gpu", "1"}})});
  EXPECT_EQ(MutatePod(pod, {}).patch, json::array());  // a whole GPU, as always
  WebhookOptions o;
  o.translate_hami = true;
  const json want = json::parse(R"([{"op":"add","path":"/spec/containers/0/resources","value":{
    "limits":{"kgpu.io/gpu":"1"}}}])");
  EXPECT_EQ(MutatePod(pod, o).patch, want) << MutatePod(pod, o).patch.dump();
}

TEST(WebhookMutate, MoreVgpusThanANodeHasAreRefused) {
  EXPECT_EQ(MutatePod(Pod({Container("main", {{"nvidia.com/gpu", "65"}, {"nvidia.com/gpumem", "1"}})}), {}).message,
            "spec.containers[0].resources.limits[nvidia.com/gpu]: 65 vGPUs is more GPUs than a node has (at most 64)");
}

TEST(WebhookMutate, MemoryPercentageNeedsTheSmallestGpu) {
  const json pod = Pod({Container("main", {{"nvidia.com/gpumem-percentage", "50"}})});
  const Decision no = MutatePod(pod, {});
  EXPECT_FALSE(no.allowed);
  EXPECT_EQ(no.message,
            "spec.containers[0].resources.limits[nvidia.com/gpumem-percentage]: cannot be translated without knowing "
            "the GPUs' memory (write nvidia.com/gpumem in MiB, or start kgpu webhook with --smallest-gpu-memory-mib)");
  WebhookOptions o;
  o.smallest_gpu_memory_mib = 81920;
  const json want = json::parse(R"([{"op":"add","path":"/spec/containers/0/resources","value":{
    "limits":{"kgpu.io/gpu":"1","kgpu.io/gpu-memory":"40960","kgpu.io/gpu-cores":"50"}}}])");
  EXPECT_EQ(MutatePod(pod, o).patch, want) << MutatePod(pod, o).patch.dump();
}

TEST(WebhookMutate, KeepsAnotherSchedulerAndOurOwnAnnotations) {
  WebhookOptions o;
  o.scheduler_name = "kgpu-scheduler";
  json pod =
      Pod({Container("main", {{"nvidia.com/gpumem", "1000"}})},
          {{"nvidia.com/use-gputype", "H100"}, {"kgpu.io/gpu-model", "A100"}, {"nvidia.com/use-gpuuuid", "GPU-1"}});
  pod["spec"]["schedulerName"] = "volcano";
  const Decision d = MutatePod(pod, o);
  const json want = json::parse(R"([{"op":"add","path":"/spec/containers/0/resources","value":{
    "limits":{"kgpu.io/gpu":"1","kgpu.io/gpu-memory":"1000"}}},
    {"op":"add","path":"/metadata/annotations/kgpu.io~1gpu-uuid","value":"GPU-1"}])");
  EXPECT_EQ(d.patch, want) << d.patch.dump();
}

// HAMi's pods name hami-scheduler: once HAMi is removed nothing schedules them, so the name is
// replaced (by --scheduler-name, else default-scheduler, which kgpu extends) and the client warned.
TEST(WebhookMutate, HamisSchedulerNameIsReplacedWithAWarning) {
  json pod = Pod({Container("main", {{"nvidia.com/gpu", "1"}, {"nvidia.com/gpumem", "1000"}})});
  pod["spec"]["schedulerName"] = "hami-scheduler";
  WebhookOptions o;
  o.scheduler_name = "kgpu-scheduler";
  Decision d = MutatePod(pod, o);
  ASSERT_TRUE(d.allowed) << d.message;
  EXPECT_EQ(d.patch.back(), json::parse(R"({"op":"add","path":"/spec/schedulerName","value":"kgpu-scheduler"})"));
  ASSERT_EQ(d.warnings.size(), 1u);
  EXPECT_EQ(d.warnings[0],
            "kgpu webhook: spec.schedulerName hami-scheduler replaced by kgpu-scheduler (no hami-scheduler runs once "
            "HAMi is removed, and the pod would stay Pending; --replace-scheduler-names \"\" keeps it)");
  // Without --scheduler-name: kube-scheduler's default, which runs the kgpu extender.
  d = MutatePod(pod, {});
  EXPECT_EQ(d.patch.back(), json::parse(R"({"op":"add","path":"/spec/schedulerName","value":"default-scheduler"})"));
  EXPECT_EQ(d.warnings.size(), 1u);
  // The list emptied: kept, no warning. A pod without GPUs: never touched.
  o.replace_scheduler_names.clear();
  d = MutatePod(pod, o);
  for (const auto& op : d.patch) EXPECT_NE(op["path"], "/spec/schedulerName") << d.patch.dump();
  EXPECT_TRUE(d.warnings.empty());
  json plain = Pod({Container("main", {{"cpu", "1"}})});
  plain["spec"]["schedulerName"] = "hami-scheduler";
  EXPECT_EQ(MutatePod(plain, {}).patch, json::array());
  // The AdmissionReview carries the warning (AdmissionResponse.warnings; kubectl prints it).
  const json review = {{"apiVersion", "admission.k8s.io/v1"},
                       {"kind", "AdmissionReview"},
                       {"request",
                        {{"uid", "u1"},
                         {"kind", {{"group", ""}, {"version", "v1"}, {"kind", "Pod"}}},
                         {"operation", "CREATE"},
                         {"object", pod}}}};
  auto out = Review(review.dump(), true, {});
  ASSERT_TRUE(out.ok()) << out.status();
  EXPECT_EQ((*out)["response"]["warnings"], json::array({MutatePod(pod, {}).warnings[0]})) << out->dump();
}

TEST(WebhookMutate, TranslatesAnnotationsOnlyWhenThePodHasThem) {
  json pod = Pod({Container("main", {{"nvidia.com/gpumem", "1000"}})});
  EXPECT_EQ(MutatePod(pod, {}).patch.size(), 1u);  // no HAMi annotation: only the resources
  json with = Pod({Container("main", {{"nvidia.com/gpumem", "1000"}})}, {{"nvidia.com/nouse-gputype", "T4"}});
  const Decision d = MutatePod(with, {});
  ASSERT_EQ(d.patch.size(), 2u);
  EXPECT_EQ(d.patch[1],
            json::parse(R"({"op":"add","path":"/metadata/annotations/kgpu.io~1gpu-model-deny","value":"T4"})"));
  EXPECT_EQ(with.patch(d.patch)["metadata"]["annotations"]["kgpu.io/gpu-model-deny"], "T4");
}

TEST(WebhookValidate, MessagesNameTheFieldAndTheFix) {
  WebhookOptions o;
  o.largest_gpu_memory_mib = 81920;
  auto msg = [&](const json& pod) { return ValidatePod(pod, o).message; };
  EXPECT_EQ(msg(Pod({Container("a", {{"cpu", "1"}}), Container("b", {{"nvidia.com/gpu", "1"}, {"kgpu.io/gpu", "1"}})})),
            "spec.containers[1].resources.limits[kgpu.io/gpu]: asked together with nvidia.com/gpu in one container "
            "(keep nvidia.com/gpu for whole GPUs or kgpu.io/gpu for shares, not both)");
  EXPECT_EQ(msg(Pod({Container("a", {{"kgpu.io/gpu", "2"}, {"kgpu.io/gpu-cores", "300"}})})),
            "spec.containers[0].resources.limits[kgpu.io/gpu-cores]: 300 over 2 shares is 150% of one GPU per share "
            "(at most 100 per share: lower it or ask for more kgpu.io/gpu)");
  EXPECT_EQ(msg(Pod({Container("a", {{"kgpu.io/gpu", "1"}, {"kgpu.io/gpu-memory", "100000"}})})),
            "spec.containers[0].resources.limits[kgpu.io/gpu-memory]: 100000 MiB over 1 shares is 100000 MiB per GPU, "
            "more than the largest GPU in the cluster has (81920 MiB): ask for more kgpu.io/gpu or less memory");
  json priv = Pod({Container("a", {{"kgpu.io/gpu", "1"}, {"kgpu.io/gpu-memory", "1000"}})});
  priv["spec"]["containers"][0]["securityContext"] = {{"privileged", true}};
  EXPECT_EQ(msg(priv),
            "spec.containers[0].securityContext.privileged: a privileged container sees every GPU, so its share cannot "
            "be enforced (drop privileged, or ask for whole GPUs with nvidia.com/gpu)");
  EXPECT_EQ(msg(Pod({Container("a", {{"kgpu.io/gpu", "1"}}, {{"kgpu.io/gpu", "2"}})})),
            "spec.containers[0].resources.requests[kgpu.io/gpu]: 2 must equal limits[kgpu.io/gpu] (1): extended "
            "resources cannot be overcommitted");
  EXPECT_EQ(msg(Pod({Container("a", json::object(), {{"kgpu.io/gpu-memory", "1000"}})})),
            "spec.containers[0].resources.requests[kgpu.io/gpu-memory]: a request without a limit (set "
            "limits[kgpu.io/gpu-memory] to the same value: extended resources need a limit)");
  EXPECT_EQ(msg(Pod({Container("a", {{"kgpu.io/gpu-memory", "0.5"}})})),
            "spec.containers[0].resources.limits[kgpu.io/gpu-memory]: \"0.5\" must be a whole number >= 0 (extended "
            "resources cannot be fractional)");
  // What the request model refuses comes through with its own message.
  EXPECT_EQ(
      msg(Pod({Container("a", {{"kgpu.io/gpu", "2"}, {"kgpu.io/gpu-memory", "1001"}})})),
      "container a: kgpu.io/gpu-memory 1001 does not split evenly over 2 shares (use a multiple of 2, e.g. 1000)");
  EXPECT_TRUE(ValidatePod(Pod({Container("a", {{"kgpu.io/gpu", "2"}, {"kgpu.io/gpu-memory", "81920"}})}), o).allowed);
  EXPECT_TRUE(ValidatePod(Pod({Container("a", {{"nvidia.com/gpu", "8"}})}), o).allowed);
}

TEST(WebhookReview, EnvelopeEchoesUidAndCarriesABase64Patch) {
  const json pod = Pod({Container("main", {{"kgpu.io/gpu-memory", "1000"}})});
  const json review = {{"apiVersion", "admission.k8s.io/v1"},
                       {"kind", "AdmissionReview"},
                       {"request",
                        {{"uid", "705ab4f5-6393-11e8-b7cc-42010a800002"},
                         {"kind", {{"group", ""}, {"version", "v1"}, {"kind", "Pod"}}},
                         {"operation", "CREATE"},
                         {"object", pod}}}};
  auto out = Review(review.dump(), true, {});
  ASSERT_TRUE(out.ok()) << out.status();
  const json& r = (*out)["response"];
  EXPECT_EQ((*out)["kind"], "AdmissionReview");
  EXPECT_EQ((*out)["apiVersion"], "admission.k8s.io/v1");
  EXPECT_EQ(r["uid"], "705ab4f5-6393-11e8-b7cc-42010a800002");
  EXPECT_EQ(r["allowed"], true);
  EXPECT_EQ(r["patchType"], "JSONPatch");
  std::string patch;
  ASSERT_TRUE(absl::Base64Unescape(r["patch"].get<std::string>(), &patch));
  EXPECT_EQ(json::parse(patch), MutatePod(pod, {}).patch);

  json bad = review;
  bad["request"]["object"]["spec"]["containers"][0]["resources"]["limits"]["nvidia.com/gpu"] = "1";
  bad["request"]["object"]["spec"]["containers"][0]["resources"]["limits"]["kgpu.io/gpu"] = "1";
  auto denied = Review(bad.dump(), false, {});
  ASSERT_TRUE(denied.ok());
  EXPECT_EQ((*denied)["response"]["allowed"], false);
  EXPECT_EQ((*denied)["response"]["status"]["code"], 403);
  EXPECT_NE((*denied)["response"]["status"]["message"].get<std::string>().find("spec.containers[0]"),
            std::string::npos);
  EXPECT_FALSE((*denied)["response"].contains("patch"));

  EXPECT_EQ(Review("{", true, {}).status().message(), "the body is not a JSON object (expected an AdmissionReview)");
  EXPECT_EQ(Review(R"({"request":{}})", true, {}).status().message(),
            "AdmissionReview request.uid missing or not a string");
  EXPECT_EQ(Review(R"({"kind":"AdmissionReview"})", true, {}).status().message(),
            "AdmissionReview without a request object (the API server sends request)");
  // Not a pod: allowed untouched.
  auto other = Review(R"({"request":{"uid":"u","kind":{"kind":"Service"},"object":{}}})", true, {});
  ASSERT_TRUE(other.ok());
  EXPECT_EQ((*other)["response"], json::parse(R"({"uid":"u","allowed":true})"));
}

TEST(WebhookValidate, ReasonCodesFollowTheMessages) {
  WebhookOptions o;
  o.largest_gpu_memory_mib = 81920;
  json pod = Pod({Container("a", {{"kgpu.io/gpu", "2"}, {"kgpu.io/gpu-cores", "300"}})});
  pod["spec"]["containers"][0]["securityContext"] = {{"privileged", true}};
  const Decision d = ValidatePod(pod, o);
  EXPECT_EQ(d.reasons, (std::vector<std::string>{"cores_over_100", "privileged_share"})) << d.message;
  EXPECT_EQ(ValidatePod(Pod({Container("a", {{"kgpu.io/gpu", "2"}, {"kgpu.io/gpu-memory", "1001"}})}), o).reasons,
            std::vector<std::string>{"request_model"});
  EXPECT_EQ(ValidatePod(Pod({Container("a", {{"kgpu.io/gpu", "1"}}, {{"kgpu.io/gpu", "2"}})}), o).reasons,
            std::vector<std::string>{"request_not_limit"});
  EXPECT_EQ(MutatePod(Pod({Container("a", {{"nvidia.com/gpumem-percentage", "50"}})}), {}).reasons,
            std::vector<std::string>{"gpu_memory_unknown"});
  // Allowed: no codes.
  EXPECT_TRUE(ValidatePod(Pod({Container("a", {{"nvidia.com/gpu", "8"}})}), o).reasons.empty());
  EXPECT_TRUE(MutatePod(Pod({Container("a", {{"kgpu.io/gpu-memory", "1000"}})}), {}).reasons.empty());
}

json ReviewOf(const std::string& uid, const json& pod) {
  return {{"apiVersion", "admission.k8s.io/v1"},
          {"kind", "AdmissionReview"},
          {"request",
           {{"uid", uid},
            {"kind", {{"group", ""}, {"version", "v1"}, {"kind", "Pod"}}},
            {"resource", {{"group", ""}, {"version", "v1"}, {"resource", "pods"}}},
            {"operation", "CREATE"},
            {"object", pod}}}};
}

TEST(WebhookReview, OutcomeSaysWhatTheMetricsCount) {
  ReviewOutcome out;
  ASSERT_TRUE(
      Review(ReviewOf("u1", Pod({Container("a", {{"kgpu.io/gpu-memory", "1000"}})})).dump(), true, {}, &out).ok());
  EXPECT_EQ(out.resource, "pods");
  EXPECT_EQ(out.result, "patched");
  EXPECT_TRUE(out.reasons.empty());
  ASSERT_TRUE(Review(ReviewOf("u2", Pod({Container("a", {{"nvidia.com/gpu", "1"}})})).dump(), true, {}, &out).ok());
  EXPECT_EQ(out.result, "allowed");
  ASSERT_TRUE(Review(ReviewOf("u3", Pod({Container("a", {{"nvidia.com/gpu", "1"}, {"kgpu.io/gpu", "1"}})})).dump(),
                     false, {}, &out)
                  .ok());
  EXPECT_EQ(out.result, "denied");
  EXPECT_EQ(out.reasons, std::vector<std::string>{"whole_gpus_and_shares"});
  ASSERT_TRUE(Review(R"({"request":{"uid":"u","kind":{"kind":"Service"},"object":{}}})", true, {}, &out).ok());
  EXPECT_EQ(out.resource, "other");
  EXPECT_EQ(out.result, "allowed");
}

// One HTTP/1.1 request on a new connection to 127.0.0.1:port -> the status and the body (raw
// bytes: this test links kgpu_extender alone, whose HTTP library is a private dependency).
std::pair<int, std::string> Http(int port, const std::string& method, const std::string& path,
                                 const std::string& body = "") {
  testing::RawHttp http(port);
  if (!http.ok()) return {-1, "cannot connect"};
  std::string request = method + " " + path + " HTTP/1.1\r\nHost: 127.0.0.1\r\nConnection: close\r\n";
  if (method == "POST") {
    request += "Content-Type: application/json\r\nContent-Length: " + std::to_string(body.size()) + "\r\n";
  }
  if (!http.Send(request + "\r\n" + body)) return {-1, "cannot send"};
  // Connection: close: the response ends where the server closes (10 s at most).
  http.ReadFor(std::chrono::seconds(10));
  const std::string& response = http.received();
  const size_t end = response.find("\r\n\r\n");
  if (response.rfind("HTTP/1.1 ", 0) != 0 || end == std::string::npos) return {-1, response};
  return {std::atoi(response.c_str() + 9), response.substr(end + 4)};
}

TEST(WebhookMetrics, PageCountsReviewsDenialsAndMalformedBodies) {
  WebhookOptions o;
  o.insecure_http = true;
  o.address = "127.0.0.1:0";
  o.smallest_gpu_memory_mib = 40960;
  Webhook hook(o);
  ASSERT_TRUE(hook.Start().ok());
  const int port = hook.port();

  const auto patched =
      Http(port, "POST", "/mutate", ReviewOf("m1", Pod({Container("a", {{"kgpu.io/gpu-memory", "10240"}})})).dump());
  ASSERT_EQ(patched.first, 200) << patched.second;
  EXPECT_EQ(json::parse(patched.second)["response"]["patchType"], "JSONPatch");
  const auto denied =
      Http(port, "POST", "/validate",
           ReviewOf("v1", Pod({Container("a", {{"nvidia.com/gpu", "1"}, {"kgpu.io/gpu", "1"}})})).dump());
  ASSERT_EQ(denied.first, 200) << denied.second;
  EXPECT_EQ(json::parse(denied.second)["response"]["allowed"], false);
  EXPECT_EQ(Http(port, "POST", "/validate", "{").first, 400);

  const auto page = Http(port, "GET", "/metrics");
  hook.Stop();
  ASSERT_EQ(page.first, 200) << page.second;
  const std::string& text = page.second;
  for (const char* line : {
           R"(kgpu_webhook_requests_total{operation="mutate",result="patched",resource="pods"} 1)",
           R"(kgpu_webhook_requests_total{operation="validate",result="denied",resource="pods"} 1)",
           R"(kgpu_webhook_requests_total{operation="validate",result="error",resource="unknown"} 1)",
           R"(kgpu_webhook_denials_total{operation="validate",reason="whole_gpus_and_shares"} 1)",
           R"(kgpu_webhook_malformed_reviews_total{operation="validate"} 1)",
           R"(kgpu_webhook_request_duration_seconds_bucket{operation="mutate",le="+Inf"} 1)",
           R"(kgpu_webhook_request_duration_seconds_count{operation="mutate"} 1)",
           R"(kgpu_webhook_request_duration_seconds_count{operation="validate"} 2)",
           R"(kgpu_webhook_gpu_memory_mib{bound="smallest"} 40960)",
           R"(kgpu_webhook_gpu_memory_mib{bound="largest"} 0)",
           "# TYPE kgpu_webhook_requests_total counter",
           "# TYPE kgpu_webhook_request_duration_seconds histogram",
       }) {
    EXPECT_NE(text.find(std::string(line) + "\n"), std::string::npos) << line << "\n" << text;
  }
  // Only the mutate request was allowed: no other series of requests_total, no mutate denials.
  EXPECT_EQ(text.find(R"(kgpu_webhook_requests_total{operation="mutate",result="denied")"), std::string::npos);
  EXPECT_EQ(text.find(R"(kgpu_webhook_denials_total{operation="mutate")"), std::string::npos);
  // Without --kubeconfig there is no informer, and no family about one.
  EXPECT_EQ(text.find("kgpu_webhook_inventory_"), std::string::npos) << text;
  // Every family on the page has HELP and TYPE.
  std::set<std::string> helped, typed, sampled;
  std::istringstream lines(text);
  const std::regex header(R"(# (HELP|TYPE) (\S+) .*)"), sample(R"(([a-zA-Z_:][a-zA-Z0-9_:]*)(\{.*\})? \S+)");
  for (std::string line; std::getline(lines, line);) {
    std::smatch m;
    if (std::regex_match(line, m, header)) {
      (m[1] == "HELP" ? helped : typed).insert(m[2].str());
    } else {
      ASSERT_TRUE(std::regex_match(line, m, sample)) << line;
      std::string family = m[1].str();
      for (const char* suffix : {"_bucket", "_sum", "_count"}) {
        const std::string s = suffix;
        if (!typed.count(family) && family.size() > s.size() &&
            family.compare(family.size() - s.size(), s.size(), s) == 0)
          family.resize(family.size() - s.size());
      }
      sampled.insert(family);
    }
  }
  for (const auto& family : sampled) {
    EXPECT_TRUE(helped.count(family) && typed.count(family)) << family;
    EXPECT_EQ(family.rfind("kgpu_webhook_", 0), 0u) << family;
  }
}

}  // namespace
}  // namespace kgpu::extender
