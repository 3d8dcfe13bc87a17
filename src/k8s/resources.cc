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

std::optional<double> ParseRfc3339(std::string_view t) {
  std::tm tm{};
  int y = 0, mo = 0, d = 0, h = 0, mi = 0, s = 0;
  char tail[32] = {0};
  const std::string str(t.substr(0, 40));
  if (std::sscanf(str.c_str(), "%4d-%2d-%2dT%2d:%2d:%2d%31s", &y, &mo, &d, &h, &mi, &s, tail) < 6) return std::nullopt;
  tm.tm_year = y - 1900;
  tm.tm_mon = mo - 1;
  tm.tm_mday = d;
  tm.tm_hour = h;
  tm.tm_min = mi;
  tm.tm_sec = s;
  double frac = 0;
  if (tail[0] == '.')
    frac = std::atof(Cat("0", std::string_view(tail).substr(0, std::string_view(tail).find('Z'))).c_str());
  return static_cast<double>(timegm(&tm)) + frac;
}

}  // namespace kgpu::k8s
