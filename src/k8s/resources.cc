#include "k8s/resources.h"

#include <cctype>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <ctime>

#include "common/strings.h"

namespace kgpu::k8s {

std::string Resource::GroupVersion() const {
  return group.empty() ? std::string(version) : Cat(group, "/", version);
}

std::string Resource::Prefix() const {
  return group.empty() ? Cat("/api/", version) : Cat("/apis/", group, "/", version);
}

std::string Resource::Path(std::string_view ns, std::string_view name, std::string_view subresource) const {
  std::string p = Prefix();
  if (namespaced && !ns.empty()) p += Cat("/namespaces/", ns);
  p += Cat("/", plural);
  if (!name.empty()) p += Cat("/", name);
  if (!subresource.empty()) p += Cat("/", subresource);
  return p;
}

const std::vector<Resource>& Resources() {
  static const std::vector<Resource> r = {
      {"", "v1", "pods", "Pod", true, {"po"}, {"status", "binding", "eviction"}},
      {"", "v1", "nodes", "Node", false, {"no"}, {"status"}},
      {"", "v1", "namespaces", "Namespace", false, {"ns"}, {"status"}},
      {"", "v1", "events", "Event", true, {"ev"}, {}},
      {"", "v1", "resourcequotas", "ResourceQuota", true, {"quota"}, {"status"}},
      {"", "v1", "limitranges", "LimitRange", true, {"limits"}, {}},
      {"", "v1", "configmaps", "ConfigMap", true, {"cm"}, {}},
      {"events.k8s.io", "v1", "events", "Event", true, {"ev"}, {}},
      {"policy", "v1", "poddisruptionbudgets", "PodDisruptionBudget", true, {"pdb"}, {"status"}},
      {"coordination.k8s.io", "v1", "leases", "Lease", true, {}, {}},
      // Dynamic Resource Allocation, GA in 1.34 (k8s.io/api resource/v1, register.go).
      {"resource.k8s.io", "v1", "deviceclasses", "DeviceClass", false, {}, {}, 34},
      {"resource.k8s.io", "v1", "resourceslices", "ResourceSlice", false, {}, {}, 34},
      {"resource.k8s.io", "v1", "resourceclaims", "ResourceClaim", true, {}, {"status"}, 34},
      {"resource.k8s.io", "v1", "resourceclaimtemplates", "ResourceClaimTemplate", true, {}, {}, 34},
  };
  return r;
}

const Resource* FindResource(std::string_view name) {
  for (const auto& r : Resources()) {
    if (r.plural == name || r.kind == name) return &r;
    for (auto s : r.short_names) {
      if (s == name) return &r;
    }
  }
  return nullptr;
}

std::string UrlEncode(std::string_view s) {
  static constexpr char kHex[] = "0123456789ABCDEF";
  std::string out;
  for (unsigned char c : s) {
    if (std::isalnum(c) || c == '-' || c == '_' || c == '.' || c == '~') {
      out.push_back(static_cast<char>(c));
    } else {
      out.push_back('%');
      out.push_back(kHex[c >> 4]);
      out.push_back(kHex[c & 15]);
    }
  }
  return out;
}

namespace {
std::string Format(bool micro) {
  const auto now = std::chrono::system_clock::now();
  const std::time_t t = std::chrono::system_clock::to_time_t(now);
  std::tm tm{};
  gmtime_r(&t, &tm);
  char buf[64];
  std::strftime(buf, sizeof buf, "%Y-%m-%dT%H:%M:%S", &tm);
  if (!micro) return Cat(buf, "Z");
  const auto us = std::chrono::duration_cast<std::chrono::microseconds>(now.time_since_epoch()).count() % 1000000;
  char frac[16];
  std::snprintf(frac, sizeof frac, ".%06lld", static_cast<long long>(us));
  return Cat(buf, frac, "Z");
}
}  // namespace

std::string NowRfc3339() {
  return Format(false);
}
std::string NowMicroTime() {
  return Format(true);
}

namespace {
std::optional<int> Digits(std::string_view s, size_t pos, size_t n) {
  if (pos + n > s.size()) return std::nullopt;
  int v = 0;
  for (size_t i = pos; i < pos + n; ++i) {
    if (s[i] < '0' || s[i] > '9') return std::nullopt;
    v = v * 10 + (s[i] - '0');
  }
  return v;
}
}  // namespace

std::optional<std::chrono::system_clock::time_point> ParseRfc3339Time(std::string_view t) {
  // 2006-01-02T15:04:05[.999999999](Z|+07:00)
  const auto y = Digits(t, 0, 4), mo = Digits(t, 5, 2), d = Digits(t, 8, 2), h = Digits(t, 11, 2),
             mi = Digits(t, 14, 2), s = Digits(t, 17, 2);
  if (!y || !mo || !d || !h || !mi || !s || t[4] != '-' || t[7] != '-' || (t[10] != 'T' && t[10] != 't') ||
      t[13] != ':' || t[16] != ':') {
    return std::nullopt;
  }
  if (*mo < 1 || *mo > 12 || *d < 1 || *d > 31 || *h > 23 || *mi > 59 || *s > 60) return std::nullopt;
  size_t pos = 19;
  int64_t nanos = 0;
  if (pos < t.size() && t[pos] == '.') {
    ++pos;
    int digits = 0;
    while (pos < t.size() && t[pos] >= '0' && t[pos] <= '9') {
      if (digits < 9) {
        nanos = nanos * 10 + (t[pos] - '0');
        ++digits;
      }
      ++pos;
    }
    if (digits == 0) return std::nullopt;
    for (; digits < 9; ++digits) nanos *= 10;
  }
  int offset_s = 0;
  if (pos < t.size() && (t[pos] == 'Z' || t[pos] == 'z')) {
    ++pos;
  } else if (pos < t.size() && (t[pos] == '+' || t[pos] == '-')) {
    const auto oh = Digits(t, pos + 1, 2), om = Digits(t, pos + 4, 2);
    if (!oh || !om || pos + 3 >= t.size() || t[pos + 3] != ':') return std::nullopt;
    offset_s = (*oh * 3600 + *om * 60) * (t[pos] == '-' ? -1 : 1);
    pos += 6;
  } else {
    return std::nullopt;
  }
  if (pos != t.size()) return std::nullopt;
  std::tm tm{};
  tm.tm_year = *y - 1900;
  tm.tm_mon = *mo - 1;
  tm.tm_mday = *d;
  tm.tm_hour = *h;
  tm.tm_min = *mi;
  tm.tm_sec = *s;
  const time_t secs = ::timegm(&tm) - offset_s;
  // system_clock counts nanoseconds: it ends in 2262. A later expiry (plugins write year 9999 for
  // "never") is the end of time.
  using std::chrono::system_clock;
  if (secs >=
      std::chrono::duration_cast<std::chrono::seconds>(system_clock::time_point::max().time_since_epoch()).count()) {
    return system_clock::time_point::max();
  }
  return std::chrono::system_clock::from_time_t(secs) +
         std::chrono::duration_cast<std::chrono::system_clock::duration>(std::chrono::nanoseconds(nanos));
}

std::optional<double> ParseRfc3339(std::string_view t) {
  const auto tp = ParseRfc3339Time(t);
  if (!tp) return std::nullopt;
  return std::chrono::duration<double>(tp->time_since_epoch()).count();
}

const nlohmann::json& Field(const nlohmann::json& j, std::string_view key) {
  static const nlohmann::json kEmpty = nlohmann::json::object();
  if (!j.is_object()) return kEmpty;
  const auto it = j.find(key);
  return it == j.end() || it->is_null() ? kEmpty : *it;
}

}  // namespace kgpu::k8s
