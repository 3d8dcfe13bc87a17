// Fuzz target for exporter-toolkit's web config parser (src/common/web_config.cc), which reads
// --web-config-file. Properties: it never crashes or throws; every error is InvalidArgument and
// reads "fuzz-web.yml:<line>:<column>: <what>" with no raw control byte or broken UTF-8 (input is
// escaped); a well-formed bcrypt hash under basic_auth_users is never echoed in an error (the
// header's promise: secrets are not); an accepted config is coherent: TLS on has a certificate
// and a key, each from a file or inline and not both, file names resolved against the base
// directory, versions in order, headers from the allowed five, users with bcrypt hashes, a rate
// limit in range.
#include <cstddef>
#include <cstdint>
#include <cstdlib>
#include <functional>
#include <set>
#include <string>
#include <vector>

#include <yaml-cpp/yaml.h>

#include "absl/status/status.h"
#include "common/strings.h"
#include "common/web_config.h"

namespace {
void Expect(bool ok) {
  if (!ok) std::abort();
}

// "fuzz-web.yml:<line>:<column>: " with both numbers at least 1, then some text.
bool Positioned(const std::string& m) {
  size_t i = sizeof("fuzz-web.yml:") - 1;
  if (m.compare(0, i, "fuzz-web.yml:") != 0) return false;
  for (int part = 0; part < 2; ++part) {
    const size_t start = i;
    while (i < m.size() && m[i] >= '0' && m[i] <= '9') ++i;
    if (i == start || m[start] == '0' || i >= m.size() || m[i] != ':') return false;
    ++i;
  }
  return i + 1 < m.size() && m[i] == ' ';
}

// $2[abxy]$<2 digits>$<53 characters of bcrypt's base64>: no fixed text of a message has such a
// run, so finding one in a message means it was echoed from the input.
bool BcryptShaped(const std::string& h) {
  size_t at = 2;
  if (h.size() < 4 || h[0] != '$' || h[1] != '2') return false;
  if (h[at] != '$') ++at;
  if (h.size() != at + 57 || h[at] != '$' || h[at + 3] != '$') return false;
  for (size_t i = at + 4; i < h.size(); ++i) {
    const char c = h[i];
    if (!((c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || (c >= '0' && c <= '9') || c == '.' || c == '/'))
      return false;
  }
  return true;
}

// The bcrypt-shaped basic_auth_users values that no other scalar of the document (key or value,
// aliases included) contains: an error may quote any other scalar, never one of these.
std::vector<std::string> SecretHashes(const std::string& text) {
  std::vector<std::string> secrets;
  try {
    const YAML::Node doc = YAML::Load(text);
    if (!doc.IsMap()) return secrets;
    std::vector<std::string> scalars;
    // Aliases can make the node graph exponential, or a cycle (&a [*a]): past this many nodes the
    // document is not checked, rather than the walk running out of time or stack.
    size_t budget = 4096;
    std::function<bool(const YAML::Node&)> walk = [&](const YAML::Node& n) {
      if (budget == 0) return false;
      --budget;
      if (n.IsScalar()) {
        scalars.push_back(n.Scalar());
      } else if (n.IsSequence()) {
        for (const auto& item : n) {
          if (!walk(item)) return false;
        }
      } else if (n.IsMap()) {
        for (const auto& kv : n) {
          if (!walk(kv.first) || !walk(kv.second)) return false;
        }
      }
      return true;
    };
    if (!walk(doc)) return secrets;
    const YAML::Node users = doc["basic_auth_users"];
    if (!users || !users.IsMap()) return secrets;
    for (const auto& kv : users) {
      if (!kv.second.IsScalar() || !BcryptShaped(kv.second.Scalar())) continue;
      const std::string& h = kv.second.Scalar();
      size_t holders = 0;
      for (const auto& s : scalars) holders += s.find(h) != std::string::npos ? 1 : 0;
      if (holders == 1) secrets.push_back(h);
    }
  } catch (const YAML::Exception&) {
    // Not a document (the parser said so with a position); nothing to hold it to.
  }
  return secrets;
}
}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  const std::string text(reinterpret_cast<const char*>(data), size);
  // An absolute base directory that does not exist: parsing reads no file, and relative names
  // must come out absolute under it.
  auto c = kgpu::web::ParseWebConfig(text, "fuzz-web.yml", "/nonexistent-kgpu-fuzz");
  if (!c.ok()) {
    const std::string m(c.status().message());
    Expect(absl::IsInvalidArgument(c.status()));
    Expect(Positioned(m) && kgpu::Printable(m) == m);
    for (const auto& h : SecretHashes(text)) Expect(m.find(h) == std::string::npos);
    return 0;
  }
  Expect(c->origin == "fuzz-web.yml");
  const kgpu::web::TlsConfig& t = c->tls;
  if (t.enabled) {
    Expect(!t.cert_file.empty() || !t.cert_pem.empty());
    Expect(!t.key_file.empty() || !t.key_pem.empty());
    Expect(t.cert_file.empty() || t.cert_pem.empty());
    Expect(t.key_file.empty() || t.key_pem.empty());
    Expect(t.client_ca_file.empty() || t.client_ca_pem.empty());
  }
  for (const std::string* file : {&t.cert_file, &t.key_file, &t.client_ca_file}) {
    Expect(file->empty() || file->front() == '/');
  }
  Expect(0x0301 <= t.min_version && t.min_version <= t.max_version && t.max_version <= 0x0304);
  static const std::set<std::string> kPolicies = {"NoClientCert", "RequestClientCert", "RequireAnyClientCert",
                                                  "VerifyClientCertIfGiven", "RequireAndVerifyClientCert"};
  Expect(kPolicies.count(t.client_auth_type) == 1);
  const bool has_ca = !t.client_ca_file.empty() || !t.client_ca_pem.empty();
  // A client CA needs a policy that asks for certificates; a verifying policy needs a CA.
  const bool verifies =
      t.client_auth_type == "VerifyClientCertIfGiven" || t.client_auth_type == "RequireAndVerifyClientCert";
  Expect(has_ca ? t.client_auth_type != "NoClientCert" : !verifies);
  static const std::set<std::string> kHeaders = {"Strict-Transport-Security", "X-Content-Type-Options",
                                                 "X-Frame-Options", "X-XSS-Protection", "Content-Security-Policy"};
  for (const auto& [name, value] : c->headers) Expect(kHeaders.count(name) == 1 && !value.empty());
  for (const auto& kv : c->users) Expect(BcryptShaped(kv.second));
  Expect(c->rate_interval.count() >= 0);
  Expect(c->rate_burst >= 0 && c->rate_burst <= 1000000);
  return 0;
}
