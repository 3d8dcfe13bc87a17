#include "common/web_config.h"

#include <algorithm>
#include <cctype>
#include <cerrno>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <optional>
#include <random>
#include <set>
#include <sstream>
#include <system_error>
#include <tuple>

#include <crypt.h>
#include <dlfcn.h>
#include <httplib.h>
#include <openssl/evp.h>
#include <openssl/hmac.h>
#include <openssl/ssl.h>
#include <sys/stat.h>
#include <unistd.h>

#include "absl/status/status.h"
#include "common/duration.h"
#include "common/strings.h"
#include "common/yaml_util.h"

namespace kgpu::web {
namespace {

// A bcrypt hash (cost 10) of a password nobody has: an unknown user is checked against it, so
// that the answer takes as long as for a known user (exporter-toolkit does the same).
constexpr char kNoSuchUserHash[] = "$2b$10$0TDJ.r8HlFB4Xo60eviN9uxkETUbB3Z9ENaqnpSEKbGUFxpj/4f7y";

// The basic auth cache's HMAC key: random, drawn once per gate, so its entries say nothing about
// the passwords to whoever reads the process's memory later.
std::string RandomKey() {
  std::random_device device;
  std::string key(32, '\0');
  for (size_t i = 0; i < key.size(); i += 4) {
    const uint32_t word = device();
    for (size_t j = 0; j < 4; ++j) key[i + j] = static_cast<char>((word >> (8 * j)) & 0xff);
  }
  return key;
}

bool ConstantTimeEqual(const std::array<unsigned char, 32>& a, const std::array<unsigned char, 32>& b) {
  unsigned char diff = 0;
  for (size_t i = 0; i < a.size(); ++i) diff |= static_cast<unsigned char>(a[i] ^ b[i]);
  return diff == 0;
}

// The headers exporter-toolkit lets a web config add, with the values it accepts (empty: any).
const std::map<std::string, std::vector<std::string>>& AllowedHeaders() {
  static const std::map<std::string, std::vector<std::string>> allowed = {
      {"Strict-Transport-Security", {}},
      {"X-Content-Type-Options", {"nosniff"}},
      {"X-Frame-Options", {"deny", "sameorigin"}},
      {"X-XSS-Protection", {}},
      {"Content-Security-Policy", {}},
  };
  return allowed;
}

// Go's crypto/tls names (tls.CipherSuites()) -> OpenSSL's. The TLS 1.3 suites map to "": Go does
// not let them be configured either (cipher_suites applies to TLS 1.2 and below).
const std::map<std::string, std::string>& Ciphers() {
  static const std::map<std::string, std::string> ciphers = {
      {"TLS_RSA_WITH_AES_128_CBC_SHA", "AES128-SHA"},
      {"TLS_RSA_WITH_AES_256_CBC_SHA", "AES256-SHA"},
      {"TLS_RSA_WITH_AES_128_GCM_SHA256", "AES128-GCM-SHA256"},
      {"TLS_RSA_WITH_AES_256_GCM_SHA384", "AES256-GCM-SHA384"},
      {"TLS_AES_128_GCM_SHA256", ""},
      {"TLS_AES_256_GCM_SHA384", ""},
      {"TLS_CHACHA20_POLY1305_SHA256", ""},
      {"TLS_ECDHE_ECDSA_WITH_AES_128_CBC_SHA", "ECDHE-ECDSA-AES128-SHA"},
      {"TLS_ECDHE_ECDSA_WITH_AES_256_CBC_SHA", "ECDHE-ECDSA-AES256-SHA"},
      {"TLS_ECDHE_RSA_WITH_AES_128_CBC_SHA", "ECDHE-RSA-AES128-SHA"},
      {"TLS_ECDHE_RSA_WITH_AES_256_CBC_SHA", "ECDHE-RSA-AES256-SHA"},
      {"TLS_ECDHE_ECDSA_WITH_AES_128_GCM_SHA256", "ECDHE-ECDSA-AES128-GCM-SHA256"},
      {"TLS_ECDHE_ECDSA_WITH_AES_256_GCM_SHA384", "ECDHE-ECDSA-AES256-GCM-SHA384"},
      {"TLS_ECDHE_RSA_WITH_AES_128_GCM_SHA256", "ECDHE-RSA-AES128-GCM-SHA256"},
      {"TLS_ECDHE_RSA_WITH_AES_256_GCM_SHA384", "ECDHE-RSA-AES256-GCM-SHA384"},
      {"TLS_ECDHE_RSA_WITH_CHACHA20_POLY1305_SHA256", "ECDHE-RSA-CHACHA20-POLY1305"},
      {"TLS_ECDHE_ECDSA_WITH_CHACHA20_POLY1305_SHA256", "ECDHE-ECDSA-CHACHA20-POLY1305"},
  };
  return ciphers;
}

const std::map<std::string, std::string>& Curves() {
  static const std::map<std::string, std::string> curves = {
      {"CurveP256", "P-256"}, {"CurveP384", "P-384"}, {"CurveP521", "P-521"}, {"X25519", "X25519"}};
  return curves;
}

const std::map<std::string, int>& Versions() {
  static const std::map<std::string, int> versions = {
      {"TLS10", TLS1_VERSION}, {"TLS11", TLS1_1_VERSION}, {"TLS12", TLS1_2_VERSION}, {"TLS13", TLS1_3_VERSION}};
  return versions;
}

const std::set<std::string> kAuthTypes = {"NoClientCert",      "RequestClientCert",       "RequireAnyClientCert",
                                          "RequireClientCert", "VerifyClientCertIfGiven", "RequireAndVerifyClientCert"};

template <typename Map>
std::string Names(const Map& m) {
  std::vector<std::string> names;
  for (const auto& kv : m) names.push_back(kv.first);
  return Join(names, ", ");
}

// exporter-toolkit's config_util.JoinDir: a relative path is relative to the config's directory.
std::string JoinDir(std::string_view base_dir, const std::string& path) {
  if (path.empty() || path.front() == '/' || base_dir.empty()) return path;
  return (std::filesystem::path(base_dir) / path).lexically_normal().string();
}

// A bcrypt hash as Go's bcrypt.Cost accepts one: $2$, $2a$, $2b$, $2x$ or $2y$, a two-digit cost
// 04-31, then 53 characters of bcrypt's base64.
bool IsBcrypt(std::string_view h) {
  if (h.size() < 4 || h[0] != '$' || h[1] != '2') return false;
  size_t at = 2;
  if (h[at] != '$') {
    if (std::string_view("abxy").find(h[at]) == std::string_view::npos) return false;
    ++at;
  }
  if (h.size() != at + 1 + 2 + 1 + 53 || h[at] != '$' || h[at + 3] != '$') return false;
  if (!std::isdigit(static_cast<unsigned char>(h[at + 1])) || !std::isdigit(static_cast<unsigned char>(h[at + 2])))
    return false;
  const int cost = (h[at + 1] - '0') * 10 + (h[at + 2] - '0');
  if (cost < 4 || cost > 31) return false;
  return std::all_of(h.begin() + static_cast<std::ptrdiff_t>(at + 4), h.end(), [](char c) {
    return (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || (c >= '0' && c <= '9') || c == '.' || c == '/';
  });
}

// RFC 4648 base64 with padding, as Go's base64.StdEncoding (r.BasicAuth).
std::optional<std::string> DecodeBase64(std::string_view in) {
  if (in.size() % 4 != 0) return std::nullopt;
  auto value = [](char c) -> int {
    if (c >= 'A' && c <= 'Z') return c - 'A';
    if (c >= 'a' && c <= 'z') return c - 'a' + 26;
    if (c >= '0' && c <= '9') return c - '0' + 52;
    if (c == '+') return 62;
    if (c == '/') return 63;
    return -1;
  };
  std::string out;
  for (size_t i = 0; i < in.size(); i += 4) {
    int v[4];
    int pad = 0;
    for (int k = 0; k < 4; ++k) {
      const char c = in[i + static_cast<size_t>(k)];
      if (c == '=' && i + 4 == in.size() && k >= 2) {
        v[k] = 0;
        ++pad;
        continue;
      }
      if (pad > 0) return std::nullopt;  // data after '='
      v[k] = value(c);
      if (v[k] < 0) return std::nullopt;
    }
    const uint32_t n = (static_cast<uint32_t>(v[0]) << 18) | (static_cast<uint32_t>(v[1]) << 12) |
                       (static_cast<uint32_t>(v[2]) << 6) | static_cast<uint32_t>(v[3]);
    out.push_back(static_cast<char>((n >> 16) & 0xff));
    if (pad < 2) out.push_back(static_cast<char>((n >> 8) & 0xff));
    if (pad < 1) out.push_back(static_cast<char>(n & 0xff));
  }
  return out;
}

bool ConstantTimeEqual(std::string_view a, std::string_view b) {
  if (a.size() != b.size()) return false;
  unsigned char diff = 0;
  for (size_t i = 0; i < a.size(); ++i) diff |= static_cast<unsigned char>(a[i] ^ b[i]);
  return diff == 0;
}

absl::StatusOr<std::string> ScalarString(std::string_view origin, const YAML::Node& node, std::string_view what) {
  if (!node.IsScalar()) return yaml::At(origin, node.Mark(), Cat(what, " must be a string"));
  return node.Scalar();
}

absl::StatusOr<std::vector<std::string>> StringList(std::string_view origin, const YAML::Node& node,
                                                    std::string_view what) {
  std::vector<std::string> out;
  if (node.IsNull()) return out;
  if (!node.IsSequence()) return yaml::At(origin, node.Mark(), Cat(what, " must be a list of strings"));
  for (const auto& item : node) {
    auto s = ScalarString(origin, item, Cat("each entry of ", what));
    if (!s.ok()) return s.status();
    out.push_back(*s);
  }
  return out;
}

absl::Status ParseTls(std::string_view origin, std::string_view base_dir, const YAML::Node& node, TlsConfig& t) {
  if (!node || node.IsNull()) return absl::OkStatus();  // absent (a zombie node: test it first) or empty
  if (auto st = yaml::CheckKeys(origin, node, "tls_server_config",
                                {"cert", "key", "client_ca", "cert_file", "key_file", "client_auth_type",
                                 "client_ca_file", "client_allowed_sans", "min_version", "max_version", "cipher_suites",
                                 "prefer_server_cipher_suites", "curve_preferences"});
      !st.ok())
    return st;
  auto str = [&](const char* key, std::string& out) -> absl::Status {
    const YAML::Node v = node[key];
    if (!v || v.IsNull()) return absl::OkStatus();
    auto s = ScalarString(origin, v, Cat("tls_server_config.", key));
    if (!s.ok()) return s.status();
    out = *s;
    return absl::OkStatus();
  };
  std::string auth;
  for (auto [key, out] :
       std::initializer_list<std::pair<const char*, std::string*>>{{"cert", &t.cert_pem},
                                                                   {"key", &t.key_pem},
                                                                   {"client_ca", &t.client_ca_pem},
                                                                   {"cert_file", &t.cert_file},
                                                                   {"key_file", &t.key_file},
                                                                   {"client_ca_file", &t.client_ca_file},
                                                                   {"client_auth_type", &auth}}) {
    if (auto st = str(key, *out); !st.ok()) return st;
  }
  t.enabled = !t.cert_pem.empty() || !t.key_pem.empty() || !t.client_ca_pem.empty() || !t.cert_file.empty() ||
              !t.key_file.empty() || !t.client_ca_file.empty() || !auth.empty();
  const YAML::Mark mark = node.Mark();
  if (!auth.empty()) {
    if (kAuthTypes.count(auth) == 0) {
      return yaml::At(
          origin, node["client_auth_type"].Mark(),
          Cat("tls_server_config.client_auth_type: unknown policy '", auth, "' (use ", Join(kAuthTypes, ", "), ")"));
    }
    t.client_auth_type = auth == "RequireClientCert" ? "RequireAnyClientCert" : auth;
  }
  if (t.enabled) {
    if (t.cert_file.empty() && t.cert_pem.empty())
      return yaml::At(origin, mark, "tls_server_config: missing one of cert or cert_file");
    if (t.key_file.empty() && t.key_pem.empty())
      return yaml::At(origin, mark, "tls_server_config: missing one of key or key_file");
    for (auto [file, pem, name] :
         std::initializer_list<std::tuple<const std::string*, const std::string*, const char*>>{
             {&t.cert_file, &t.cert_pem, "cert"},
             {&t.key_file, &t.key_pem, "key"},
             {&t.client_ca_file, &t.client_ca_pem, "client_ca"}}) {
      if (!file->empty() && !pem->empty())
        return yaml::At(origin, mark, Cat("tls_server_config: give ", name, " or ", name, "_file, not both"));
    }
  }
  const bool has_ca = !t.client_ca_file.empty() || !t.client_ca_pem.empty();
  if (has_ca && t.client_auth_type == "NoClientCert") {
    return yaml::At(origin, mark,
                    "tls_server_config: a client CA is configured without a client_auth_type (set "
                    "client_auth_type: RequireAndVerifyClientCert to require client certificates signed by it)");
  }
  if (!has_ca &&
      (t.client_auth_type == "VerifyClientCertIfGiven" || t.client_auth_type == "RequireAndVerifyClientCert")) {
    return yaml::At(origin, mark,
                    Cat("tls_server_config: client_auth_type ", t.client_auth_type,
                        " verifies client certificates against client_ca_file (or client_ca): give one"));
  }
  if (const YAML::Node sans = node["client_allowed_sans"]; sans && !sans.IsNull()) {
    return yaml::At(origin, sans.Mark(),
                    "tls_server_config.client_allowed_sans is not supported by kgpu (it does not match client "
                    "certificate SANs): use client_auth_type RequireAndVerifyClientCert with a client_ca_file "
                    "that signs only the allowed clients");
  }
  for (auto [key, out] : std::initializer_list<std::pair<const char*, int*>>{{"min_version", &t.min_version},
                                                                             {"max_version", &t.max_version}}) {
    const YAML::Node v = node[key];
    if (!v || v.IsNull()) continue;
    auto s = ScalarString(origin, v, Cat("tls_server_config.", key));
    if (!s.ok()) return s.status();
    const auto it = Versions().find(*s);
    if (it == Versions().end()) {
      return yaml::At(origin, v.Mark(),
                      Cat("tls_server_config.", key, ": unknown TLS version '", *s, "' (use ", Names(Versions()), ")"));
    }
    *out = it->second;
  }
  if (t.min_version > t.max_version) {
    return yaml::At(origin, mark, "tls_server_config: min_version is above max_version");
  }
  if (const YAML::Node v = node["cipher_suites"]; v) {
    auto names = StringList(origin, v, "tls_server_config.cipher_suites");
    if (!names.ok()) return names.status();
    for (size_t i = 0; i < names->size(); ++i) {
      const auto it = Ciphers().find((*names)[i]);
      if (it == Ciphers().end()) {
        return yaml::At(origin, v[i].Mark(),
                        Cat("tls_server_config.cipher_suites: unknown cipher '", (*names)[i],
                            "' (Go's names: ", Names(Ciphers()), ")"));
      }
      if (!it->second.empty()) t.ciphers.push_back(it->second);
    }
  }
  if (const YAML::Node v = node["curve_preferences"]; v) {
    auto names = StringList(origin, v, "tls_server_config.curve_preferences");
    if (!names.ok()) return names.status();
    for (size_t i = 0; i < names->size(); ++i) {
      const auto it = Curves().find((*names)[i]);
      if (it == Curves().end()) {
        return yaml::At(
            origin, v[i].Mark(),
            Cat("tls_server_config.curve_preferences: unknown curve '", (*names)[i], "' (use ", Names(Curves()), ")"));
      }
      t.curves.push_back(it->second);
    }
  }
  if (const YAML::Node v = node["prefer_server_cipher_suites"]; v && !v.IsNull()) {
    auto b = yaml::Scalar<bool>(origin, v, "tls_server_config.prefer_server_cipher_suites");
    if (!b.ok()) return b.status();
  }
  t.cert_file = JoinDir(base_dir, t.cert_file);
  t.key_file = JoinDir(base_dir, t.key_file);
  t.client_ca_file = JoinDir(base_dir, t.client_ca_file);
  return absl::OkStatus();
}

// libssl's functions, from the libssl.so.3 already loaded with libcpp-httplib (see the header).
struct Ssl {
  long (*ctx_ctrl)(SSL_CTX*, int, long, void*) = nullptr;
  int (*set_cipher_list)(SSL_CTX*, const char*) = nullptr;
  void (*set_verify)(SSL_CTX*, int, SSL_verify_cb) = nullptr;
  int (*set_session_id_context)(SSL_CTX*, const unsigned char*, unsigned int) = nullptr;
  X509* (*get0_peer_certificate)(const SSL*) = nullptr;
};

std::optional<Ssl> LoadSsl() {
  void* lib = dlopen("libssl.so.3", RTLD_NOW | RTLD_NOLOAD);
  if (lib == nullptr) return std::nullopt;
  Ssl s;
  s.ctx_ctrl = reinterpret_cast<decltype(s.ctx_ctrl)>(dlsym(lib, "SSL_CTX_ctrl"));
  s.set_cipher_list = reinterpret_cast<decltype(s.set_cipher_list)>(dlsym(lib, "SSL_CTX_set_cipher_list"));
  s.set_verify = reinterpret_cast<decltype(s.set_verify)>(dlsym(lib, "SSL_CTX_set_verify"));
  s.set_session_id_context =
      reinterpret_cast<decltype(s.set_session_id_context)>(dlsym(lib, "SSL_CTX_set_session_id_context"));
  s.get0_peer_certificate =
      reinterpret_cast<decltype(s.get0_peer_certificate)>(dlsym(lib, "SSL_get0_peer_certificate"));
  dlclose(lib);  // NOLOAD took a reference to a library httplib keeps loaded
  if (!s.ctx_ctrl || !s.set_cipher_list || !s.set_verify || !s.set_session_id_context || !s.get0_peer_certificate)
    return std::nullopt;
  return s;
}

// RequestClientCert and RequireAnyClientCert take any certificate, as Go's policies of those names.
int AcceptAnyCertificate(int /*preverify_ok*/, X509_STORE_CTX* /*ctx*/) {
  return 1;
}

// A private file holding inline PEM (cert, key, client_ca) for httplib, which takes file names;
// removed once the server has read it.
class TempPem {
 public:
  ~TempPem() {
    if (!path_.empty()) ::unlink(path_.c_str());
  }
  absl::StatusOr<std::string> Write(const std::string& pem) {
    std::string templ = (std::filesystem::temp_directory_path() / "kgpu-web-XXXXXX").string();
    const int fd = ::mkstemp(templ.data());  // mode 0600
    if (fd < 0) {
      return absl::FailedPreconditionError(
          Cat("cannot write an inline certificate to a temporary file: ", std::strerror(errno)));
    }
    path_ = templ;
    size_t done = 0;
    while (done < pem.size()) {
      const ssize_t n = ::write(fd, pem.data() + done, pem.size() - done);
      if (n < 0 && errno == EINTR) continue;
      if (n <= 0) {
        ::close(fd);
        return absl::FailedPreconditionError(Cat("cannot write ", path_, ": ", std::strerror(errno)));
      }
      done += static_cast<size_t>(n);
    }
    ::close(fd);
    return path_;
  }

 private:
  std::string path_;
};

}  // namespace

absl::StatusOr<WebConfig> ParseWebConfig(std::string_view text, std::string_view origin, std::string_view base_dir) {
  WebConfig c;
  c.origin = std::string(origin);
  auto loaded = yaml::Load(text, origin);
  if (!loaded.ok()) return loaded.status();
  const YAML::Node& doc = *loaded;                 // const: looking a key up must not add it
  if (!doc.IsDefined() || doc.IsNull()) return c;  // an empty file: plain HTTP, no users
  if (auto st = yaml::CheckKeys(origin, doc, "the web config",
                                {"tls_server_config", "http_server_config", "basic_auth_users", "rate_limit"});
      !st.ok())
    return st;
  if (auto st = ParseTls(origin, base_dir, doc["tls_server_config"], c.tls); !st.ok()) return st;

  if (const YAML::Node http = doc["http_server_config"]; http && !http.IsNull()) {
    if (auto st = yaml::CheckKeys(origin, http, "http_server_config", {"http2", "headers"}); !st.ok()) return st;
    if (const YAML::Node h2 = http["http2"]; h2 && !h2.IsNull()) {
      auto b = yaml::Scalar<bool>(origin, h2, "http_server_config.http2");
      if (!b.ok()) return b.status();
    }
    if (const YAML::Node headers = http["headers"]; headers && !headers.IsNull()) {
      if (!headers.IsMap()) return yaml::At(origin, headers.Mark(), "http_server_config.headers must be a mapping");
      for (const auto& kv : headers) {
        if (!kv.first.IsScalar()) return yaml::At(origin, kv.first.Mark(), "a header name must be a string");
        const std::string name = kv.first.Scalar();
        const auto allowed = AllowedHeaders().find(name);
        if (allowed == AllowedHeaders().end()) {
          return yaml::At(origin, kv.first.Mark(),
                          Cat("http_server_config.headers: HTTP header '", name,
                              "' can not be configured (allowed: ", Names(AllowedHeaders()), ")"));
        }
        auto value = ScalarString(origin, kv.second, Cat("http_server_config.headers.", name));
        if (!value.ok()) return value.status();
        const auto& values = allowed->second;
        if (!values.empty() && std::find(values.begin(), values.end(), *value) == values.end()) {
          return yaml::At(
              origin, kv.second.Mark(),
              Cat("http_server_config.headers.", name, ": '", *value, "' is not one of ", Join(values, ", ")));
        }
        if (!value->empty()) c.headers.emplace_back(name, *value);  // blank: unset
      }
    }
  }

  if (const YAML::Node users = doc["basic_auth_users"]; users && !users.IsNull()) {
    if (!users.IsMap()) {
      return yaml::At(origin, users.Mark(), "basic_auth_users must be a mapping of user name to bcrypt hash");
    }
    for (const auto& kv : users) {
      if (!kv.first.IsScalar()) return yaml::At(origin, kv.first.Mark(), "a basic_auth_users key must be a user name");
      const std::string user = kv.first.Scalar();
      // The hash is a secret: never echoed.
      if (!kv.second.IsScalar() || !IsBcrypt(kv.second.Scalar())) {
        return yaml::At(origin, kv.second.Mark(),
                        Cat("basic_auth_users.", user,
                            ": not a bcrypt hash ($2y$<cost>$ and 53 characters; make one with "
                            "htpasswd -nBC 10 \"\" | tr -d ':\\n')"));
      }
      c.users[user] = kv.second.Scalar();
    }
  }

  if (const YAML::Node rl = doc["rate_limit"]; rl && !rl.IsNull()) {
    if (auto st = yaml::CheckKeys(origin, rl, "rate_limit", {"interval", "burst"}); !st.ok()) return st;
    if (const YAML::Node v = rl["interval"]; v && !v.IsNull()) {
      auto s = ScalarString(origin, v, "rate_limit.interval");
      if (!s.ok()) return s.status();
      auto d = ParseGoDuration("", *s);
      if (!d.ok()) return yaml::At(origin, v.Mark(), Cat("rate_limit.interval: ", d.status().message()));
      if (d->count() < 0) return yaml::At(origin, v.Mark(), "rate_limit.interval must not be negative");
      c.rate_interval = *d;
    }
    if (const YAML::Node v = rl["burst"]; v && !v.IsNull()) {
      auto b = yaml::ScalarIn<int>(origin, v, "rate_limit.burst", 0, 1000000);
      if (!b.ok()) return b.status();
      c.rate_burst = *b;
    }
  }
  return c;
}

absl::StatusOr<WebConfig> LoadWebConfig(const std::string& path) {
  std::error_code ec;
  if (std::filesystem::is_directory(path, ec)) {
    return absl::FailedPreconditionError(Cat(path, ": is a directory, not a web config file"));
  }
  std::ifstream in(path);
  if (!in) {
    return absl::FailedPreconditionError(Cat(path, ": cannot read the web config: ", std::strerror(errno)));
  }
  std::stringstream text;
  text << in.rdbuf();
  const std::string dir = std::filesystem::absolute(path, ec).parent_path().string();
  return ParseWebConfig(text.str(), path, dir);
}

bool BcryptMatches(const std::string& hash, std::string_view password) {
  if (password.find('\0') != std::string_view::npos) return false;
  // struct crypt_data is 32 KiB: on the heap, zeroed as crypt_rn wants it before first use.
  auto data = std::make_unique<crypt_data>();
  std::memset(data.get(), 0, sizeof(crypt_data));
  const std::string phrase(password);
  const char* out = crypt_rn(phrase.c_str(), hash.c_str(), data.get(), static_cast<int>(sizeof(crypt_data)));
  // crypt_rn returns null or a string starting with '*' on failure (an unsupported setting).
  if (out == nullptr || out[0] == '*') return false;
  return ConstantTimeEqual(out, hash);
}

namespace {

// libcrypto's SHA-256 and HMAC (OpenSSL 3), from the libcrypto.so.3 libcpp-httplib brings in
// (through libssl): kgpu links no crypto library, as for libssl above. Loaded once; null when
// the library or a symbol is missing.
struct Crypto {
  decltype(&::EVP_sha256) sha256 = nullptr;
  decltype(&::EVP_Digest) digest = nullptr;
  decltype(&::HMAC) hmac = nullptr;
};

const Crypto* LoadCrypto() {
  static const Crypto* const crypto = []() -> const Crypto* {
    void* lib = dlopen("libcrypto.so.3", RTLD_NOW);  // kept open: the pointers live as long as the process
    if (lib == nullptr) return nullptr;
    auto c = std::make_unique<Crypto>();
    c->sha256 = reinterpret_cast<decltype(c->sha256)>(dlsym(lib, "EVP_sha256"));
    c->digest = reinterpret_cast<decltype(c->digest)>(dlsym(lib, "EVP_Digest"));
    c->hmac = reinterpret_cast<decltype(c->hmac)>(dlsym(lib, "HMAC"));
    if (!c->sha256 || !c->digest || !c->hmac) return nullptr;
    return c.release();
  }();
  return crypto;
}

}  // namespace

std::optional<std::array<unsigned char, 32>> Sha256(std::string_view data) {
  const Crypto* c = LoadCrypto();
  std::array<unsigned char, 32> out{};
  unsigned int size = 0;
  if (c == nullptr || c->digest(data.data(), data.size(), out.data(), &size, c->sha256(), nullptr) != 1 ||
      size != out.size()) {
    return std::nullopt;
  }
  return out;
}

std::optional<std::array<unsigned char, 32>> HmacSha256(std::string_view key, std::string_view data) {
  const Crypto* c = LoadCrypto();
  std::array<unsigned char, 32> out{};
  unsigned int size = 0;
  if (c == nullptr ||
      c->hmac(c->sha256(), key.data(), static_cast<int>(key.size()),
              reinterpret_cast<const unsigned char*>(data.data()), data.size(), out.data(), &size) == nullptr ||
      size != out.size()) {
    return std::nullopt;
  }
  return out;
}

Gate::Gate(WebConfig config)
    : config_(std::move(config)),
      cache_key_(RandomKey()),
      tokens_(config_.rate_burst),
      refilled_(std::chrono::steady_clock::now()) {}

size_t Gate::cached() const {
  std::lock_guard<std::mutex> lock(mu_);
  return cache_.size();
}

Verdict Gate::Admit(std::string_view authorization) {
  if (config_.rate_interval.count() > 0) {
    std::lock_guard<std::mutex> lock(mu_);
    // A token bucket as Go's rate.NewLimiter(rate.Every(interval), burst): one token per interval,
    // at most `burst` of them (a burst of 0 admits nothing, as Go's).
    const auto now = std::chrono::steady_clock::now();
    const double elapsed = std::chrono::duration<double>(now - refilled_).count();
    const double per_token = std::chrono::duration<double>(config_.rate_interval).count();
    tokens_ = std::min<double>(config_.rate_burst, tokens_ + elapsed / per_token);
    refilled_ = now;
    if (tokens_ < 1) return {429, {}, "Too Many Requests\n"};
    tokens_ -= 1;
  }
  if (config_.users.empty()) return {};
  // "Basic base64(user:password)", the scheme case-insensitive (Go's Request.BasicAuth).
  constexpr std::string_view kPrefix = "basic ";
  Outcome outcome = Outcome::kInvalid;
  if (authorization.size() > kPrefix.size()) {
    std::string scheme(authorization.substr(0, kPrefix.size()));
    std::transform(scheme.begin(), scheme.end(), scheme.begin(), [](unsigned char ch) { return std::tolower(ch); });
    if (scheme == kPrefix) {
      if (auto decoded = DecodeBase64(authorization.substr(kPrefix.size()))) {
        const size_t colon = decoded->find(':');
        if (colon != std::string::npos) {
          outcome = Check(std::string_view(*decoded).substr(0, colon), std::string_view(*decoded).substr(colon + 1));
        }
      }
    }
  }
  if (outcome == Outcome::kValid) return {};
  if (outcome == Outcome::kBusy) {
    return {429, {{"Retry-After", "1"}}, "Too Many Requests: another password is being checked\n"};
  }
  return {401, {{"WWW-Authenticate", "Basic"}}, "Unauthorized\n"};
}

Gate::Outcome Gate::Check(std::string_view user, std::string_view password) {
  // Without libcrypto there is no cache key: every request is checked with bcrypt.
  const auto digest = HmacSha256(cache_key_, Cat(user, '\0', password));
  if (digest) {
    std::lock_guard<std::mutex> lock(mu_);
    // Every entry compared, each in constant time: neither the time nor the order says which matched.
    CacheEntry* hit = nullptr;
    for (CacheEntry& entry : cache_) {
      if (ConstantTimeEqual(entry.digest, *digest)) hit = &entry;
    }
    if (hit != nullptr) {
      hit->used = ++uses_;
      return Outcome::kValid;
    }
  }
  const auto known = config_.users.find(std::string(user));
  const bool valid_user = known != config_.users.end();
  bool matches = false;
  {
    // One bcrypt at a time, and none waited for: a second request that needs one now is answered
    // 429 rather than holding an HTTP worker behind the first (the exporter has two workers).
    std::unique_lock<std::mutex> lock(bcrypt_mu_, std::try_to_lock);
    if (!lock.owns_lock()) return Outcome::kBusy;
    matches = BcryptMatches(valid_user ? known->second : std::string(kNoSuchUserHash), password);
  }
  // Only successes are cached: a failure is not asked again by a scraper, and caching failures
  // would let distinct wrong passwords push the valid entry out.
  if (!valid_user || !matches) return Outcome::kInvalid;
  if (!digest) return Outcome::kValid;
  std::lock_guard<std::mutex> lock(mu_);
  for (const CacheEntry& entry : cache_) {
    if (ConstantTimeEqual(entry.digest, *digest)) return Outcome::kValid;  // another request added it meanwhile
  }
  if (cache_.size() >= kCacheSize) {
    // The least recently used entry makes room (a bound: there are few users, and scrapers repeat).
    auto oldest = std::min_element(cache_.begin(), cache_.end(),
                                   [](const CacheEntry& a, const CacheEntry& b) { return a.used < b.used; });
    cache_.erase(oldest);
  }
  cache_.push_back({*digest, ++uses_});
  return Outcome::kValid;
}

absl::StatusOr<std::unique_ptr<httplib::Server>> MakeServer(const WebConfig* config) {
  if (config == nullptr || !config->tls.enabled) return std::make_unique<httplib::Server>();
  const TlsConfig& t = config->tls;
  const std::string& origin = config->origin;
  TempPem cert_tmp, key_tmp, ca_tmp;
  std::string cert = t.cert_file, key = t.key_file, ca = t.client_ca_file;
  for (auto [file, pem, tmp] : std::initializer_list<std::tuple<std::string*, const std::string*, TempPem*>>{
           {&cert, &t.cert_pem, &cert_tmp}, {&key, &t.key_pem, &key_tmp}, {&ca, &t.client_ca_pem, &ca_tmp}}) {
    if (!file->empty() || pem->empty()) continue;
    auto path = tmp->Write(*pem);
    if (!path.ok()) return absl::FailedPreconditionError(Cat(origin, ": tls_server_config: ", path.status().message()));
    *file = *path;
  }
  if (!ca.empty()) {
    std::error_code ec;
    if (!std::filesystem::is_regular_file(ca, ec)) {
      return absl::FailedPreconditionError(
          Cat(origin, ": tls_server_config.client_ca_file ", t.client_ca_file, ": no such file"));
    }
  }
  const std::string& auth = t.client_auth_type;
  const bool verify = auth == "VerifyClientCertIfGiven" || auth == "RequireAndVerifyClientCert";
  // With a CA file httplib verifies client certificates (SSL_VERIFY_PEER|FAIL_IF_NO_PEER_CERT:
  // RequireAndVerifyClientCert); the other policies are set on its SSL_CTX below.
  auto ssl =
      std::make_unique<httplib::SSLServer>(cert.c_str(), key.c_str(), verify && !ca.empty() ? ca.c_str() : nullptr);
  if (!ssl->is_valid()) {
    return absl::FailedPreconditionError(Cat(origin, ": tls_server_config: cannot load the certificate (",
                                             t.cert_file.empty() ? std::string("cert") : t.cert_file, ") and key (",
                                             t.key_file.empty() ? std::string("key") : t.key_file,
                                             "): each must be PEM, the key unencrypted and the certificate's own"));
  }
  SSL_CTX* ctx = ssl->ssl_context();
  const auto lib = LoadSsl();
  if (ctx == nullptr || !lib) {
    return absl::FailedPreconditionError(
        Cat(origin,
            ": tls_server_config: cannot reach OpenSSL (libssl.so.3) to apply min_version, max_version, "
            "cipher_suites, curve_preferences and client_auth_type"));
  }
  if (lib->ctx_ctrl(ctx, SSL_CTRL_SET_MIN_PROTO_VERSION, t.min_version, nullptr) != 1 ||
      lib->ctx_ctrl(ctx, SSL_CTRL_SET_MAX_PROTO_VERSION, t.max_version, nullptr) != 1) {
    return absl::FailedPreconditionError(Cat(origin, ": tls_server_config: OpenSSL refused min_version/max_version"));
  }
  if (!t.ciphers.empty() && lib->set_cipher_list(ctx, Join(t.ciphers, ":").c_str()) != 1) {
    return absl::FailedPreconditionError(
        Cat(origin, ": tls_server_config.cipher_suites: OpenSSL supports none of them here"));
  }
  if (!t.curves.empty()) {
    std::string groups = Join(t.curves, ":");
    if (lib->ctx_ctrl(ctx, SSL_CTRL_SET_GROUPS_LIST, 0, groups.data()) != 1) {
      return absl::FailedPreconditionError(
          Cat(origin, ": tls_server_config.curve_preferences: OpenSSL supports none of them here"));
    }
  }
  int mode = SSL_VERIFY_NONE;
  SSL_verify_cb callback = nullptr;
  if (auth == "RequestClientCert") {
    mode = SSL_VERIFY_PEER;
    callback = AcceptAnyCertificate;
  } else if (auth == "RequireAnyClientCert") {
    mode = SSL_VERIFY_PEER | SSL_VERIFY_FAIL_IF_NO_PEER_CERT;
    callback = AcceptAnyCertificate;
  } else if (auth == "VerifyClientCertIfGiven") {
    mode = SSL_VERIFY_PEER;
  } else if (auth == "RequireAndVerifyClientCert") {
    mode = SSL_VERIFY_PEER | SSL_VERIFY_FAIL_IF_NO_PEER_CERT;
  }
  if (mode != SSL_VERIFY_NONE) {
    lib->set_verify(ctx, mode, callback);
    // A server that asks for client certificates must name its session context, or OpenSSL
    // refuses every session a client tries to resume.
    static constexpr unsigned char kSessionContext[] = "kgpu";
    lib->set_session_id_context(ctx, kSessionContext, sizeof kSessionContext - 1);
  }
  return std::unique_ptr<httplib::Server>(std::move(ssl));
}

bool PresentedClientCertificate(const httplib::Request& req) {
  if (req.ssl == nullptr) return false;
  static const std::optional<Ssl> lib = LoadSsl();  // loaded with the SSLServer that made req
  return lib && lib->get0_peer_certificate(req.ssl) != nullptr;
}

}  // namespace kgpu::web
