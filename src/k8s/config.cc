#include "k8s/config.h"

#include <algorithm>
#include <cstdlib>
#include <filesystem>
#include <map>
#include <optional>

#include "common/files.h"
#include "common/strings.h"
#include "common/yaml_util.h"

namespace kgpu::k8s {
namespace {

namespace fs = std::filesystem;

absl::StatusOr<std::string> Base64Decode(std::string_view in) {
  static constexpr std::string_view kAlphabet = "ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789+/";
  std::string out;
  unsigned buf = 0;
  int bits = 0;
  size_t pad = 0;
  for (char c : in) {
    if (c == '\n' || c == '\r' || c == ' ') continue;
    if (c == '=') {
      ++pad;
      continue;
    }
    if (pad > 0) return absl::InvalidArgumentError("data after '=' padding");
    auto p = kAlphabet.find(c);
    if (p == std::string_view::npos) return absl::InvalidArgumentError(Cat("invalid base64 character '", c, "'"));
    buf = (buf << 6) | static_cast<unsigned>(p);
    bits += 6;
    if (bits >= 8) {
      bits -= 8;
      out.push_back(static_cast<char>((buf >> bits) & 0xff));
    }
  }
  if (pad > 2) return absl::InvalidArgumentError("too much '=' padding");
  return out;
}

// One named entry of clusters/users/contexts with the position it came from.
struct Entry {
  YAML::Node body;
  std::string where;   // `users[1] (name "alice").user`
  std::string origin;  // the file
  std::string base_dir;
};

struct Merged {
  std::map<std::string, Entry> clusters, users, contexts;
  std::optional<std::string> current_context;
  std::string current_context_origin;
};

absl::Status Err(const Entry& e, std::string_view field, std::string_view what) {
  return absl::InvalidArgumentError(Cat(e.origin, ": ", e.where, field.empty() ? "" : ".", field, ": ", what));
}

// Adds one document's entries, keeping the first definition of every name (client-go's merge:
// "the first file to set a particular map key wins").
absl::Status AddFile(Merged& m, std::string_view text, std::string_view origin, std::string_view base_dir) {
  auto doc = kgpu::yaml::Load(text, origin);
  if (!doc.ok()) return doc.status();
  if (doc->IsNull()) return absl::OkStatus();
  if (!doc->IsMap()) return kgpu::yaml::At(origin, doc->Mark(), "a kubeconfig must be a mapping");
  if (auto s = kgpu::yaml::CheckKeys(
          origin, *doc, "kubeconfig",
          {"apiVersion", "kind", "clusters", "users", "contexts", "current-context", "preferences", "extensions"});
      !s.ok()) {
    return s;
  }
  struct Section {
    const char* key;
    const char* inner;
    std::map<std::string, Entry>* into;
  };
  for (const Section& sec : {Section{"clusters", "cluster", &m.clusters}, Section{"users", "user", &m.users},
                             Section{"contexts", "context", &m.contexts}}) {
    const YAML::Node list = (*doc)[sec.key];
    if (!list || list.IsNull()) continue;
    if (!list.IsSequence()) return kgpu::yaml::At(origin, list.Mark(), Cat(sec.key, " must be a list"));
    for (size_t i = 0; i < list.size(); ++i) {
      const YAML::Node item = list[i];
      if (!item.IsMap()) return kgpu::yaml::At(origin, item.Mark(), Cat(sec.key, "[", i, "] must be a mapping"));
      if (auto s = kgpu::yaml::CheckKeys(origin, item, Cat(sec.key, "[", i, "]"), {"name", sec.inner, "extensions"});
          !s.ok()) {
        return s;
      }
      if (!item["name"]) return kgpu::yaml::At(origin, item.Mark(), Cat(sec.key, "[", i, "] has no name"));
      auto name = kgpu::yaml::Scalar<std::string>(origin, item["name"], Cat(sec.key, "[", i, "].name"));
      if (!name.ok()) return name.status();
      const YAML::Node body = item[sec.inner];
      if (body && !body.IsNull() && !body.IsMap()) {
        return kgpu::yaml::At(origin, body.Mark(), Cat(sec.key, "[", i, "].", sec.inner, " must be a mapping"));
      }
      if (!sec.into->contains(*name)) {
        sec.into->emplace(*name, Entry{body && body.IsMap() ? body : YAML::Node(YAML::NodeType::Map),
                                       Cat(sec.key, "[", i, "] (name \"", *name, "\").", sec.inner),
                                       std::string(origin), std::string(base_dir)});
      }
    }
  }
  if (const YAML::Node cc = (*doc)["current-context"]; cc && !cc.IsNull() && !m.current_context) {
    auto v = kgpu::yaml::Scalar<std::string>(origin, cc, "current-context");
    if (!v.ok()) return v.status();
    if (!v->empty()) {
      m.current_context = *v;
      m.current_context_origin = std::string(origin);
    }
  }
  return absl::OkStatus();
}

absl::StatusOr<std::string> Str(const Entry& e, std::string_view field) {
  const YAML::Node n = e.body[std::string(field)];
  if (!n || n.IsNull()) return std::string();
  if (!n.IsScalar()) return Err(e, field, "must be a single value");
  return n.Scalar();
}

std::string Resolve(const Entry& e, const std::string& path) {
  if (path.empty() || fs::path(path).is_absolute() || e.base_dir.empty()) return path;
  return (fs::path(e.base_dir) / path).string();
}

// "<field>" (a path) or "<field>-data" (base64): the bytes.
absl::StatusOr<std::string> FileOrData(const Entry& e, std::string_view field, std::string* path_out = nullptr) {
  auto data = Str(e, Cat(field, "-data"));
  if (!data.ok()) return data.status();
  if (!data->empty()) {
    auto decoded = Base64Decode(*data);
    if (!decoded.ok()) return Err(e, Cat(field, "-data"), Cat("not valid base64 (", decoded.status().message(), ")"));
    return *decoded;
  }
  auto path = Str(e, field);
  if (!path.ok()) return path.status();
  if (path->empty()) return std::string();
  const std::string full = Resolve(e, *path);
  if (path_out) *path_out = full;
  auto content = ReadFile(full);
  if (!content) return Err(e, field, Cat("cannot read ", full));
  return *content;
}

absl::StatusOr<Config> Build(const Merged& m, std::string_view context, std::string_view origin_for_errors) {
  std::string ctx_name(context);
  if (ctx_name.empty()) {
    if (!m.current_context) {
      return absl::InvalidArgumentError(Cat(origin_for_errors, ": current-context is not set; pass --context <name>"));
    }
    ctx_name = *m.current_context;
  }
  auto ci = m.contexts.find(ctx_name);
  if (ci == m.contexts.end()) {
    std::vector<std::string> names;
    for (const auto& [n, _] : m.contexts) names.push_back(n);
    return absl::NotFoundError(Cat(context.empty() ? m.current_context_origin : std::string(origin_for_errors),
                                   context.empty() ? ": current-context" : ": --context", ": context \"", ctx_name,
                                   "\" is not defined (contexts: ", names.empty() ? "none" : Join(names, ", "), ")"));
  }
  const Entry& ctx = ci->second;
  if (auto s = kgpu::yaml::CheckKeys(ctx.origin, ctx.body, ctx.where, {"cluster", "user", "namespace", "extensions"});
      !s.ok()) {
    return s;
  }
  auto cluster_name = Str(ctx, "cluster");
  auto user_name = Str(ctx, "user");
  auto ns = Str(ctx, "namespace");
  if (!cluster_name.ok()) return cluster_name.status();
  if (!user_name.ok()) return user_name.status();
  if (!ns.ok()) return ns.status();
  if (cluster_name->empty()) return Err(ctx, "cluster", "is not set");
  auto cl = m.clusters.find(*cluster_name);
  if (cl == m.clusters.end()) return Err(ctx, "cluster", Cat("cluster \"", *cluster_name, "\" is not defined"));
  const Entry& cluster = cl->second;

  Config c;
  c.origin = Cat("kubeconfig ", ctx.origin, ", context ", ctx_name);
  if (!ns->empty()) c.ns = *ns;
  if (auto s = kgpu::yaml::CheckKeys(
          cluster.origin, cluster.body, cluster.where,
          {"server", "certificate-authority", "certificate-authority-data", "insecure-skip-tls-verify",
           "tls-server-name", "proxy-url", "disable-compression", "extensions"});
      !s.ok()) {
    return s;
  }
  auto server = Str(cluster, "server");
  if (!server.ok()) return server.status();
  if (server->empty()) return Err(cluster, "server", "is not set");
  if (server->rfind("https://", 0) != 0 && server->rfind("http://", 0) != 0) {
    return Err(cluster, "server", Cat("'", *server, "' must start with https:// or http://"));
  }
  c.server = *server;
  while (!c.server.empty() && c.server.back() == '/') c.server.pop_back();
  auto proxy = Str(cluster, "proxy-url");
  if (!proxy.ok()) return proxy.status();
  if (!proxy->empty()) {
    return Err(cluster, "proxy-url",
               "proxies are not supported by kgpu; reach the API server directly (remove proxy-url)");
  }
  auto ca = FileOrData(cluster, "certificate-authority", &c.ca_file);
  if (!ca.ok()) return ca.status();
  c.ca_pem = *ca;
  if (const YAML::Node n = cluster.body["insecure-skip-tls-verify"]; n && !n.IsNull()) {
    auto v = kgpu::yaml::Scalar<bool>(cluster.origin, n, Cat(cluster.where, ".insecure-skip-tls-verify"));
    if (!v.ok()) return v.status();
    c.insecure_skip_tls_verify = *v;
  }
  if (c.insecure_skip_tls_verify && !c.ca_pem.empty()) {
    return Err(cluster, "insecure-skip-tls-verify",
               "cannot be set together with a certificate authority (remove one of them, as kubectl requires)");
  }
  auto sni = Str(cluster, "tls-server-name");
  if (!sni.ok()) return sni.status();
  c.tls_server_name = *sni;

  if (!user_name->empty()) {
    auto us = m.users.find(*user_name);
    if (us == m.users.end()) return Err(ctx, "user", Cat("user \"", *user_name, "\" is not defined"));
    const Entry& user = us->second;
    if (auto s = kgpu::yaml::CheckKeys(user.origin, user.body, user.where,
                                       {"token", "tokenFile", "client-certificate", "client-certificate-data",
                                        "client-key", "client-key-data", "exec", "auth-provider", "username",
                                        "password", "as", "as-groups", "as-uid", "as-user-extra", "extensions"});
        !s.ok()) {
      return s;
    }
    for (const char* unsupported : {"exec", "auth-provider", "username", "as"}) {
      if (user.body[unsupported]) {
        return Err(user, unsupported,
                   "is not supported by kgpu; use a bearer token, tokenFile or a client certificate and key");
      }
    }
    auto token = Str(user, "token");
    auto token_file = Str(user, "tokenFile");
    if (!token.ok()) return token.status();
    if (!token_file.ok()) return token_file.status();
    c.token = *token;
    if (!token_file->empty()) {
      c.token_file = Resolve(user, *token_file);
      if (!ReadFile(c.token_file)) return Err(user, "tokenFile", Cat("cannot read ", c.token_file));
    }
    auto cert = FileOrData(user, "client-certificate");
    if (!cert.ok()) return cert.status();
    auto key = FileOrData(user, "client-key");
    if (!key.ok()) return key.status();
    if (cert->empty() != key->empty()) {
      return Err(user, cert->empty() ? "client-certificate" : "client-key",
                 "a client certificate needs both client-certificate and client-key");
    }
    c.client_cert_pem = *cert;
    c.client_key_pem = *key;
  }
  return c;
}

}  // namespace

absl::StatusOr<Config> ParseKubeconfig(std::string_view text, std::string_view origin, std::string_view context,
                                       std::string_view base_dir) {
  Merged m;
  if (auto s = AddFile(m, text, origin, base_dir); !s.ok()) return s;
  return Build(m, context, origin);
}

absl::StatusOr<Config> LoadKubeconfig(std::string_view explicit_path, std::string_view context) {
  std::vector<std::string> files;
  bool must_exist = true;
  if (!explicit_path.empty()) {
    files.emplace_back(explicit_path);
  } else if (const char* env = std::getenv("KUBECONFIG"); env && *env) {
    // Missing files in KUBECONFIG are skipped, as kubectl does.
    must_exist = false;
    std::string_view list(env);
    size_t start = 0;
    while (start <= list.size()) {
      size_t colon = list.find(':', start);
      std::string part(list.substr(start, colon == std::string_view::npos ? std::string_view::npos : colon - start));
      if (!part.empty() && std::find(files.begin(), files.end(), part) == files.end()) files.push_back(part);
      if (colon == std::string_view::npos) break;
      start = colon + 1;
    }
  } else if (const char* home = std::getenv("HOME"); home && *home) {
    files.push_back(Cat(home, "/.kube/config"));
  }
  if (files.empty())
    return absl::NotFoundError("no kubeconfig: pass --kubeconfig, set KUBECONFIG or create ~/.kube/config");
  Merged m;
  size_t read = 0;
  for (const auto& f : files) {
    std::error_code ec;
    if (fs::is_directory(f, ec)) return absl::InvalidArgumentError(Cat(f, ": is a directory, not a kubeconfig file"));
    auto text = ReadFile(f);
    if (!text) {
      if (must_exist) return absl::NotFoundError(Cat(f, ": cannot read the kubeconfig file"));
      continue;
    }
    ++read;
    if (auto s = AddFile(m, *text, f, fs::path(f).parent_path().string()); !s.ok()) return s;
  }
  if (read == 0) return absl::NotFoundError(Cat("KUBECONFIG names no readable file (", Join(files, ":"), ")"));
  return Build(m, context, files.front());
}

absl::StatusOr<Config> InClusterConfig(std::string_view sa_dir) {
  const char* host = std::getenv("KUBERNETES_SERVICE_HOST");
  const char* port = std::getenv("KUBERNETES_SERVICE_PORT");
  if (!host || !*host || !port || !*port) {
    return absl::FailedPreconditionError(
        "not running in a cluster: KUBERNETES_SERVICE_HOST and KUBERNETES_SERVICE_PORT are not set (pass "
        "--kubeconfig)");
  }
  Config c;
  std::string h(host);
  if (h.find(':') != std::string::npos) h = Cat("[", h, "]");  // IPv6
  c.server = Cat("https://", h, ":", port);
  c.origin = Cat("in-cluster (", sa_dir, ")");
  c.token_file = Cat(sa_dir, "/token");
  if (!ReadFile(c.token_file)) return absl::NotFoundError(Cat(c.token_file, ": cannot read the service account token"));
  c.ca_file = Cat(sa_dir, "/ca.crt");
  auto ca = ReadFile(c.ca_file);
  if (!ca) return absl::NotFoundError(Cat(c.ca_file, ": cannot read the service account CA bundle"));
  c.ca_pem = *ca;
  if (auto ns = ReadFile(Cat(sa_dir, "/namespace")); ns) {
    std::string v = *ns;
    while (!v.empty() && (v.back() == '\n' || v.back() == ' ')) v.pop_back();
    if (!v.empty()) c.ns = v;
  }
  return c;
}

absl::StatusOr<Config> DefaultConfig(std::string_view explicit_path, std::string_view context) {
  const char* host = std::getenv("KUBERNETES_SERVICE_HOST");
  const char* kc = std::getenv("KUBECONFIG");
  if (explicit_path.empty() && context.empty() && host && *host && !(kc && *kc)) return InClusterConfig();
  return LoadKubeconfig(explicit_path, context);
}

absl::StatusOr<Config> ConfigFromFlags(std::string_view kubeconfig, std::string_view context, bool in_cluster) {
  if (in_cluster) {
    if (!kubeconfig.empty()) return absl::InvalidArgumentError("--in-cluster and --kubeconfig: give one of them");
    return InClusterConfig();
  }
  return DefaultConfig(kubeconfig, context);
}

}  // namespace kgpu::k8s
