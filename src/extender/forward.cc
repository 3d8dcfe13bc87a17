#include "extender/forward.h"

#include <curl/curl.h>

#include "common/strings.h"

namespace kgpu::extender {
namespace {

size_t Append(char* data, size_t size, size_t n, void* out) {
  static_cast<std::string*>(out)->append(data, size * n);
  return size * n;
}

}  // namespace

BindForwarder::BindForwarder(ForwardOptions options) : opts_(std::move(options)) {}

BindForwarder::~BindForwarder() {
  for (void* h : idle_) curl_easy_cleanup(static_cast<CURL*>(h));
}

absl::StatusOr<BindForwarder::Answer> BindForwarder::Post(const std::string& address, const std::string& path,
                                                          std::string_view body, const std::string& from) {
  CURL* c = nullptr;
  {
    std::lock_guard lock(mu_);
    if (!idle_.empty()) {
      c = static_cast<CURL*>(idle_.back());
      idle_.pop_back();
    }
  }
  if (c == nullptr) c = curl_easy_init();
  if (c == nullptr) return absl::UnavailableError("forwarding the bind: libcurl could not start a transfer");
  curl_easy_reset(c);
  const std::string url = Cat(opts_.insecure_http ? "http://" : "https://", address, path);
  Answer a;
  char err[CURL_ERROR_SIZE] = {0};
  curl_slist* headers = curl_slist_append(nullptr, "Content-Type: application/json");
  headers = curl_slist_append(headers, Cat(kForwardedHeader, ": ", from).c_str());
  curl_easy_setopt(c, CURLOPT_URL, url.c_str());
  curl_easy_setopt(c, CURLOPT_NOSIGNAL, 1L);
  curl_easy_setopt(c, CURLOPT_PROXY, "");
  curl_easy_setopt(c, CURLOPT_TIMEOUT_MS, opts_.timeout_ms);
  curl_easy_setopt(c, CURLOPT_CONNECTTIMEOUT_MS, std::min(opts_.timeout_ms, 3000L));
  curl_easy_setopt(c, CURLOPT_TCP_NODELAY, 1L);
  curl_easy_setopt(c, CURLOPT_ERRORBUFFER, err);
  curl_easy_setopt(c, CURLOPT_HTTPHEADER, headers);
  curl_easy_setopt(c, CURLOPT_POSTFIELDS, body.data());
  curl_easy_setopt(c, CURLOPT_POSTFIELDSIZE_LARGE, static_cast<curl_off_t>(body.size()));
  curl_easy_setopt(c, CURLOPT_WRITEFUNCTION, &Append);
  curl_easy_setopt(c, CURLOPT_WRITEDATA, &a.body);
  if (!opts_.insecure_http) {
    curl_easy_setopt(c, CURLOPT_SSLCERT, opts_.peer_cert_file.c_str());
    curl_easy_setopt(c, CURLOPT_SSLKEY, opts_.peer_key_file.c_str());
    // The leader is whoever presents the serving certificate this replica presents: it is the
    // only trust anchor (libcurl lets a non-CA certificate anchor a chain, X509_V_FLAG_PARTIAL_CHAIN),
    // and the address is a pod IP that certificate does not name, so no host name is checked.
    curl_easy_setopt(c, CURLOPT_CAINFO, opts_.leader_cert_file.c_str());
    curl_easy_setopt(c, CURLOPT_CAPATH, nullptr);
    curl_easy_setopt(c, CURLOPT_SSL_VERIFYPEER, 1L);
    curl_easy_setopt(c, CURLOPT_SSL_VERIFYHOST, 0L);
  }
  const CURLcode rc = curl_easy_perform(c);
  long code = 0;  // NOLINT(google-runtime-int): libcurl's type
  curl_easy_getinfo(c, CURLINFO_RESPONSE_CODE, &code);
  curl_slist_free_all(headers);
  curl_easy_setopt(c, CURLOPT_ERRORBUFFER, nullptr);
  {
    std::lock_guard lock(mu_);
    if (idle_.size() < 16) {
      idle_.push_back(c);
      c = nullptr;
    }
  }
  if (c != nullptr) curl_easy_cleanup(c);
  if (rc != CURLE_OK) {
    return absl::UnavailableError(Cat("forwarding the bind to the leader at ", address, ": ",
                                      err[0] != '\0' ? std::string(err) : std::string(curl_easy_strerror(rc))));
  }
  a.code = static_cast<int>(code);
  return a;
}

}  // namespace kgpu::extender
