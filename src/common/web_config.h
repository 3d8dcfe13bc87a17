#pragma once
// Prometheus exporter-toolkit's web configuration file (--web-config-file of dcgm-exporter and
// of every Prometheus exporter;
// https://github.com/prometheus/exporter-toolkit/blob/master/docs/web-configuration.md): TLS, client
// certificates, HTTP basic auth with bcrypt hashes, extra response headers and a rate limit, for
// kgpu's HTTP servers (the exporter's /metrics).
//
//   tls_server_config:            # any of these keys turns HTTPS on
//     cert_file: tls.crt          # or cert: <PEM>; relative paths: to the config file's directory
//     key_file: tls.key           # or key: <PEM>
//     client_auth_type: RequireAndVerifyClientCert   # NoClientCert (default), RequestClientCert,
//     client_ca_file: ca.crt      # RequireAnyClientCert, VerifyClientCertIfGiven; or client_ca: <PEM>
//     min_version: TLS12          # TLS10..TLS13 (default TLS12); max_version (default TLS13)
//     cipher_suites: [TLS_ECDHE_RSA_WITH_AES_128_GCM_SHA256]   # Go's names, TLS <= 1.2
//     curve_preferences: [X25519, CurveP256]
//     prefer_server_cipher_suites: true                        # accepted; Go ignores it too
//   http_server_config:
//     http2: true                 # accepted; kgpu serves HTTP/1.1
//     headers: {X-Frame-Options: deny}   # the five headers exporter-toolkit allows
//   basic_auth_users:             # user: bcrypt hash ($2y$/$2b$/$2a$); every path needs one
//     alice: $2y$10$...
//   rate_limit: {interval: 1s, burst: 10}   # 429 beyond it
//
// As exporter-toolkit (yaml.UnmarshalStrict) an unknown key is an error; every error names the
// file, line and column. client_allowed_sans is refused (kgpu does not match client certificate
// SANs): use RequireAndVerifyClientCert with a CA that signs only the allowed clients. Unlike
// exporter-toolkit, which re-reads the file on every request, the file and its certificates are read
// at start: restart the exporter to rotate them.
//
// Basic auth verifies with crypt_rn(3) of libcrypt (libxcrypt: $2a$, $2b$, $2y$), compares in
// constant time, checks an unknown user against a fixed hash so that timing does not reveal which
// users exist, and caches recent successes, as exporter-toolkit does (a bcrypt costs ~70 ms at
// cost 10). The cache holds no password: an entry is HMAC-SHA-256 of "<user>\0<password>" under a
// key drawn at start, looked up by a constant-time comparison with every entry. Failures are never
// cached (distinct wrong passwords cannot push the valid entry out), the least recently used entry
// makes room for a new one, and one bcrypt runs at a time: a request that would need a second one
// meanwhile is answered 429 at once instead of holding an HTTP worker (the exporter has two), so
// a flood of wrong passwords leaves the other worker to the scrapes the cache answers.
//
// TLS settings beyond the certificate, key and client CA (versions, ciphers, curves, the client
// certificate policies other than RequireAndVerifyClientCert) are applied to the server's SSL_CTX
// through libssl's functions looked up in the already loaded libssl.so.3: the kgpu executable
// loads libcpp-httplib (and with it OpenSSL) only when it serves HTTP (src/cli/lazy_lib.h).
//
// Thread-safety: ParseWebConfig/LoadWebConfig/BcryptMatches are pure; Gate::Admit may be called
// from any thread; MakeServer from the thread that starts the server.

#include <array>
#include <chrono>
#include <cstdint>
#include <map>
#include <memory>
#include <mutex>
#include <optional>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include "absl/status/statusor.h"

namespace httplib {
class Server;
struct Request;
}  // namespace httplib

namespace kgpu::web {

struct TlsConfig {
  bool enabled = false;  // any TLS key given
  // Files (made absolute against the config file's directory) or inline PEM; one of each pair.
  std::string cert_file, key_file, client_ca_file;
  std::string cert_pem, key_pem, client_ca_pem;
  std::string client_auth_type = "NoClientCert";  // RequireClientCert is read as RequireAnyClientCert
  int min_version = 0x0303;                       // TLS1_2_VERSION
  int max_version = 0x0304;                       // TLS1_3_VERSION
  std::vector<std::string> ciphers;               // OpenSSL names of the TLS <= 1.2 suites asked for
  std::vector<std::string> curves;                // OpenSSL group names, in preference order
};

struct WebConfig {
  std::string origin;  // the file, for messages
  TlsConfig tls;
  std::vector<std::pair<std::string, std::string>> headers;  // added to every response
  std::map<std::string, std::string> users;                  // basic_auth_users: user -> bcrypt hash
  std::chrono::nanoseconds rate_interval{0};                 // rate_limit.interval; 0: no limit
  int rate_burst = 0;
};

// Parses a web config document; relative file names are resolved against `base_dir`. Errors
// read "<origin>:<line>:<column>: <what>" (secrets are never echoed).
absl::StatusOr<WebConfig> ParseWebConfig(std::string_view text, std::string_view origin, std::string_view base_dir);
// Reads and parses the file; its directory is the base of relative paths.
absl::StatusOr<WebConfig> LoadWebConfig(const std::string& path);

// Whether `password` hashes to `hash` (a crypt(3) setting such as a bcrypt hash), compared in
// constant time. False for a malformed hash or a password with a NUL byte.
bool BcryptMatches(const std::string& hash, std::string_view password);

// SHA-256 (FIPS 180-4) of `data`, and HMAC-SHA-256 (RFC 2104) of `data` under `key`: the basic auth
// cache's keys. OpenSSL's, from the libcrypto.so.3 that the lazily loaded httplib brings in (kgpu
// links no crypto library); nullopt when it cannot be loaded.
std::optional<std::array<unsigned char, 32>> Sha256(std::string_view data);
std::optional<std::array<unsigned char, 32>> HmacSha256(std::string_view key, std::string_view data);

// What a request gets from the gate: 200 (serve it), 401 with WWW-Authenticate, or 429.
struct Verdict {
  int status = 200;
  std::vector<std::pair<std::string, std::string>> headers;  // besides WebConfig::headers
  std::string body;
};

// The checks every request goes through, in exporter-toolkit's order: the rate limit, then basic
// auth when users are configured (for every path, /health included).
class Gate {
 public:
  explicit Gate(WebConfig config);
  Verdict Admit(std::string_view authorization_header);
  const std::vector<std::pair<std::string, std::string>>& headers() const { return config_.headers; }
  bool auth_required() const { return !config_.users.empty(); }
  // Credentials the cache holds now (tests: at most kCacheSize, never a failure).
  size_t cached() const;

  static constexpr size_t kCacheSize = 100;

 private:
  enum class Outcome { kValid, kInvalid, kBusy };
  Outcome Check(std::string_view user, std::string_view password);

  struct CacheEntry {
    std::array<unsigned char, 32> digest;  // HmacSha256(cache_key_, "<user>\0<password>")
    uint64_t used = 0;                     // uses_ at the last hit: the least recent one is evicted
  };

  const WebConfig config_;
  const std::string cache_key_;  // 32 random bytes, drawn when the gate is made
  mutable std::mutex mu_;        // the token bucket and the cache
  double tokens_ = 0;
  std::chrono::steady_clock::time_point refilled_;
  std::vector<CacheEntry> cache_;  // valid credentials only, at most kCacheSize
  uint64_t uses_ = 0;
  std::mutex bcrypt_mu_;  // held while a bcrypt runs (each costs tens of ms of CPU): tried, never waited for
};

// An httplib server as the config says: plain HTTP without TLS keys (or without a config), else an
// SSLServer with the certificate, the client certificate policy, versions, ciphers and curves.
// FailedPrecondition, naming the file and what to fix, when the certificates cannot be loaded.
absl::StatusOr<std::unique_ptr<httplib::Server>> MakeServer(const WebConfig* config);

// Whether the TLS client of this request presented a certificate. Under client_auth_type
// VerifyClientCertIfGiven that is one the client CA verified (an unverified one fails the
// handshake), so a server can leave some paths open (probes, /metrics) and refuse others.
// False over plain HTTP.
bool PresentedClientCertificate(const httplib::Request& req);

}  // namespace kgpu::web
