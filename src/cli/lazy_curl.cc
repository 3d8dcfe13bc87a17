// The libcurl functions that kgpu calls (src/k8s/client.cc), defined in the kgpu executable and
// forwarded to libcurl.so.4, loaded on the first call (src/cli/lazy_lib.h says why). Without the
// library every call fails with CURLE_FAILED_INIT (curl_easy_init: nullptr), and
// curl_easy_strerror() of that code says which library is missing and which package has it, so
// the Kubernetes client's error message names the fix.

#include <cstdarg>

#include <curl/curl.h>

#include "cli/lazy_lib.h"

namespace {

kgpu::cli::lazy::Lib& Curl() {
  static kgpu::cli::lazy::Lib lib("libcurl.so.4", "libcurl4");
  return lib;
}

// The real function `name`, of the type of the declaration in <curl/curl.h>; nullptr when the
// library cannot be loaded.
#define KGPU_REAL(name) reinterpret_cast<decltype(&::name)>(Curl().Symbol(#name))

}  // namespace

extern "C" {

CURLcode curl_global_init(long flags) {
  static const auto real = KGPU_REAL(curl_global_init);
  return real != nullptr ? real(flags) : CURLE_FAILED_INIT;
}

CURL* curl_easy_init(void) {
  static const auto real = KGPU_REAL(curl_easy_init);
  return real != nullptr ? real() : nullptr;
}

void curl_easy_cleanup(CURL* curl) {
  static const auto real = KGPU_REAL(curl_easy_cleanup);
  if (real != nullptr && curl != nullptr) real(curl);
}

void curl_easy_reset(CURL* curl) {
  static const auto real = KGPU_REAL(curl_easy_reset);
  if (real != nullptr && curl != nullptr) real(curl);
}

CURLcode curl_easy_perform(CURL* curl) {
  static const auto real = KGPU_REAL(curl_easy_perform);
  return real != nullptr && curl != nullptr ? real(curl) : CURLE_FAILED_INIT;
}

// The signatures are libcurl's (an enum before the "..."), and so is va_start on that enum:
// libcurl's own curl_easy_setopt does the same (lib/setopt.c). Clang flags it because an enum
// undergoes promotion; both enums here are int-sized, passed in registers like an int.
#if defined(__clang__)
#pragma clang diagnostic push
#pragma clang diagnostic ignored "-Wvarargs"
#endif

// The third argument's type follows from the option's number, as in libcurl itself:
// CURLOPTTYPE_LONG, OBJECTPOINT (also STRINGPOINT, SLISTPOINT, CBPOINT), FUNCTIONPOINT, OFF_T,
// BLOB (a struct curl_blob*).
CURLcode curl_easy_setopt(CURL* curl, CURLoption option, ...) {
  static const auto real = KGPU_REAL(curl_easy_setopt);
  if (real == nullptr || curl == nullptr) return CURLE_FAILED_INIT;
  va_list ap;
  va_start(ap, option);
  CURLcode rc;
  const int o = static_cast<int>(option);
  if (o < CURLOPTTYPE_OBJECTPOINT) {
    rc = real(curl, option, va_arg(ap, long));
  } else if (o < CURLOPTTYPE_FUNCTIONPOINT) {
    rc = real(curl, option, va_arg(ap, void*));
  } else if (o < CURLOPTTYPE_OFF_T) {
    rc = real(curl, option, va_arg(ap, void (*)()));
  } else if (o < CURLOPTTYPE_BLOB) {
    rc = real(curl, option, va_arg(ap, curl_off_t));
  } else {
    rc = real(curl, option, va_arg(ap, struct curl_blob*));
  }
  va_end(ap);
  return rc;
}

// Every CURLINFO takes a pointer to where the value goes.
CURLcode curl_easy_getinfo(CURL* curl, CURLINFO info, ...) {
  static const auto real = KGPU_REAL(curl_easy_getinfo);
  if (real == nullptr || curl == nullptr) return CURLE_FAILED_INIT;
  va_list ap;
  va_start(ap, info);
  const CURLcode rc = real(curl, info, va_arg(ap, void*));
  va_end(ap);
  return rc;
}

#if defined(__clang__)
#pragma clang diagnostic pop
#endif

const char* curl_easy_strerror(CURLcode code) {
  static const auto real = KGPU_REAL(curl_easy_strerror);
  if (real == nullptr) return Curl().Error().c_str();
  return real(code);
}

struct curl_slist* curl_slist_append(struct curl_slist* list, const char* s) {
  static const auto real = KGPU_REAL(curl_slist_append);
  return real != nullptr ? real(list, s) : nullptr;
}

void curl_slist_free_all(struct curl_slist* list) {
  static const auto real = KGPU_REAL(curl_slist_free_all);
  if (real != nullptr) real(list);
}

}  // extern "C"
