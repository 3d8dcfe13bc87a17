#include "k8s/config.h"

#include <algorithm>
#include <charconv>
#include <cstdlib>
#include <filesystem>
#include <map>
#include <optional>
#include <set>

#include <nlohmann/json.hpp>

#include "common/files.h"
#include "common/listen_address.h"
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

// A YAML node as JSON (the cluster's exec extension, passed on to the plugin): plain scalars keep
// their YAML type (true, 3, 1.5, null), quoted ones are strings. Deeper than 64 levels (an alias
// that contains itself) is cut off as null.
nlohmann::json YamlToJson(const YAML::Node& n, int depth = 0) {
  if (depth > 64) return nullptr;
  switch (n.Type()) {
    case YAML::NodeType::Map: {
      nlohmann::json o = nlohmann::json::object();
      for (const auto& kv : n) o[kv.first.Scalar()] = YamlToJson(kv.second, depth + 1);
      return o;
    }
    case YAML::NodeType::Sequence: {
      nlohmann::json a = nlohmann::json::array();
      for (const auto& item : n) a.push_back(YamlToJson(item, depth + 1));
      return a;
    }
    case YAML::NodeType::Scalar: {
      const std::string& v = n.Scalar();
      if (n.Tag() == "!") return v;  // quoted
      if (v == "true" || v == "True" || v == "TRUE") return true;
      if (v == "false" || v == "False" || v == "FALSE") return false;
      if (v == "null" || v == "Null" || v == "NULL" || v == "~" || v.empty()) return nullptr;
      int64_t i = 0;
      if (auto [ptr, ec] = std::from_chars(v.data(), v.data() + v.size(), i);
          ec == std::errc() && ptr == v.data() + v.size()) {
        return i;
      }
      char* end = nullptr;
      const double d = std::strtod(v.c_str(), &end);
      if (end == v.c_str() + v.size() && v.find_first_of("0123456789") != std::string::npos) return d;
      return v;
    }
    default:
      return nullptr;
  }
}

constexpr char kExecV1[] = "client.authentication.k8s.io/v1";
constexpr char kExecV1beta1[] = "client.authentication.k8s.io/v1beta1";
constexpr char kExecExtension[] = "client.authentication.k8s.io/exec";

// users[].user.exec, validated as clientcmd's validateAuthInfo does (its messages, with kgpu's
// file and field in front). `cluster` gives the exec extension (provideClusterInfo's config).
absl::StatusOr<std::optional<ExecConfig>> ParseExec(const Entry& user, const Entry& cluster) {
  const YAML::Node n = user.body["exec"];
  if (!n || n.IsNull()) return std::optional<ExecConfig>();
  const Entry e{n, Cat(user.where, ".exec"), user.origin, user.base_dir};
  if (!n.IsMap()) return Err(e, "", "must be a mapping (command, args, env, apiVersion, interactiveMode, ...)");
  if (auto s = kgpu::yaml::CheckKeys(
          e.origin, n, e.where,
          {"command", "args", "env", "apiVersion", "installHint", "provideClusterInfo", "interactiveMode"});
      !s.ok()) {
    return s;
  }
  ExecConfig x;
  x.where = Cat(e.origin, ": ", e.where);
  auto command = Str(e, "command");
  if (!command.ok()) return command.status();
  if (command->empty()) return Err(e, "command", "must be specified to use an exec authentication plugin");
  x.command = *command;
  // client-go (clientcmd ResolvePaths): a relative command that contains a path separator is
  // relative to the kubeconfig's directory; a bare name is looked up in PATH when it runs.
  if (x.command.find('/') != std::string::npos && !fs::path(x.command).is_absolute()) {
    std::error_code ec;
    const fs::path base = e.base_dir.empty() ? fs::path(".") : fs::path(e.base_dir);
    const fs::path full = fs::absolute(base / x.command, ec);
    x.command = (ec ? base / x.command : full).lexically_normal().string();
  }
  auto api_version = Str(e, "apiVersion");
  if (!api_version.ok()) return api_version.status();
  if (api_version->empty()) {
    return Err(e, "apiVersion",
               Cat("must be specified to use an exec authentication plugin (", kExecV1, " or ", kExecV1beta1, ")"));
  }
  if (*api_version != kExecV1 && *api_version != kExecV1beta1) {
    return Err(e, "apiVersion",
               Cat("exec plugin: invalid apiVersion \"", *api_version, "\" (kgpu, as client-go, speaks ", kExecV1,
                   " and ", kExecV1beta1, ")"));
  }
  x.api_version = *api_version;
  if (const YAML::Node args = n["args"]; args && !args.IsNull()) {
    if (!args.IsSequence()) return Err(e, "args", "must be a list of strings");
    for (size_t i = 0; i < args.size(); ++i) {
      auto v = kgpu::yaml::Scalar<std::string>(e.origin, args[i], Cat(e.where, ".args[", i, "]"));
      if (!v.ok()) return v.status();
      x.args.push_back(*v);
    }
  }
  if (const YAML::Node env = n["env"]; env && !env.IsNull()) {
    if (!env.IsSequence()) return Err(e, "env", "must be a list of {name, value}");
    for (size_t i = 0; i < env.size(); ++i) {
      const YAML::Node item = env[i];
      const std::string at = Cat(e.where, ".env[", i, "]");
      if (!item.IsMap()) return kgpu::yaml::At(e.origin, item.Mark(), Cat(at, " must be a mapping {name, value}"));
      if (auto s = kgpu::yaml::CheckKeys(e.origin, item, at, {"name", "value"}); !s.ok()) return s;
      const Entry ie{item, at, e.origin, e.base_dir};
      auto name = Str(ie, "name");
      auto value = Str(ie, "value");
      if (!name.ok()) return name.status();
      if (!value.ok()) return value.status();
      if (name->empty())
        return Err(ie, "name", "env variable name must be specified to use an exec authentication plugin");
      x.env.emplace_back(*name, *value);
    }
  }
  auto hint = Str(e, "installHint");
  if (!hint.ok()) return hint.status();
  x.install_hint = *hint;
  if (const YAML::Node p = n["provideClusterInfo"]; p && !p.IsNull()) {
    auto v = kgpu::yaml::Scalar<bool>(e.origin, p, Cat(e.where, ".provideClusterInfo"));
    if (!v.ok()) return v.status();
    x.provide_cluster_info = *v;
  }
  auto mode = Str(e, "interactiveMode");
  if (!mode.ok()) return mode.status();
  x.interactive_mode = *mode;
  if (x.interactive_mode.empty()) {
    // clientcmd's defaults: IfAvailable for v1beta1; v1 must say whether it wants stdin.
    if (x.api_version == kExecV1) {
      return Err(e, "interactiveMode",
                 Cat("must be specified to use an exec authentication plugin with ", kExecV1,
                     " (Never, IfAvailable or Always)"));
    }
    x.interactive_mode = "IfAvailable";
  }
  if (x.interactive_mode != "Never" && x.interactive_mode != "IfAvailable" && x.interactive_mode != "Always") {
    return Err(e, "interactiveMode",
               Cat("invalid interactiveMode \"", x.interactive_mode, "\" (Never, IfAvailable or Always)"));
  }
  if (const YAML::Node exts = cluster.body["extensions"]; exts && exts.IsSequence()) {
    for (size_t i = 0; i < exts.size(); ++i) {
      const YAML::Node ext = exts[i];
      if (ext.IsMap() && ext["name"] && ext["name"].IsScalar() && ext["name"].Scalar() == kExecExtension &&
          ext["extension"]) {
        x.cluster_config_json = YamlToJson(ext["extension"]).dump();
      }
    }
  }
  return std::optional<ExecConfig>(std::move(x));
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
  if (const YAML::Node n = cluster.body["disable-compression"]; n && !n.IsNull()) {
    auto v = kgpu::yaml::Scalar<bool>(cluster.origin, n, Cat(cluster.where, ".disable-compression"));
    if (!v.ok()) return v.status();
    c.disable_compression = *v;
  }

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
    for (const char* unsupported : {"auth-provider", "username", "as"}) {
      if (user.body[unsupported]) {
        return Err(user, unsupported,
                   "is not supported by kgpu; use a bearer token, tokenFile, a client certificate and key, or an exec "
                   "credential plugin");
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
    auto exec = ParseExec(user, cluster);
    if (!exec.ok()) return exec.status();
    c.exec = std::move(*exec);
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

namespace {

// Where kubectl looks when no --kubeconfig is given: KUBECONFIG's files (split on ':', empty
// entries dropped, duplicates removed, order kept), else ~/.kube/config.
struct Search {
  std::vector<std::string> files;
  bool from_env = false;
  std::string env_value;  // KUBECONFIG as set
  bool no_home = false;   // neither KUBECONFIG nor HOME is set
};

Search KubeconfigSearch() {
  Search s;
  if (const char* env = std::getenv("KUBECONFIG"); env && *env) {
    s.from_env = true;
    s.env_value = env;
    std::string_view list(env);
    size_t start = 0;
    while (start <= list.size()) {
      const size_t colon = list.find(':', start);
      std::string part(list.substr(start, colon == std::string_view::npos ? std::string_view::npos : colon - start));
      if (!part.empty() && std::find(s.files.begin(), s.files.end(), part) == s.files.end()) s.files.push_back(part);
      if (colon == std::string_view::npos) break;
      start = colon + 1;
    }
  } else if (const char* home = std::getenv("HOME"); home && *home) {
    s.files.push_back(Cat(home, "/.kube/config"));
  } else {
    s.no_home = true;
  }
  return s;
}

bool Exists(const std::string& path) {
  std::error_code ec;
  return fs::exists(path, ec);
}

// Empty when in-cluster configuration is possible (client-go's inClusterClientConfig.Possible:
// host, port and the token file), else why not.
std::string InClusterUnavailable(std::string_view sa_dir) {
  const char* host = std::getenv("KUBERNETES_SERVICE_HOST");
  const char* port = std::getenv("KUBERNETES_SERVICE_PORT");
  if (!host || !*host || !port || !*port) {
    return "not in a pod: KUBERNETES_SERVICE_HOST and KUBERNETES_SERVICE_PORT are not set";
  }
  const std::string token = Cat(sa_dir, "/token");
  std::error_code ec;
  if (!fs::is_regular_file(token, ec)) {
    return Cat("KUBERNETES_SERVICE_HOST is set but there is no service account token at ", token,
               " (automountServiceAccountToken: false?)");
  }
  return "";
}

// The one message of every command that finds no configuration at all: where it looked, in
// kubectl's order, and how to point it at a cluster.
absl::Status NoConfigError(const Search& s, std::string_view context, std::string_view sa_dir) {
  std::string looked;
  if (s.from_env) {
    looked =
        Cat("KUBECONFIG=", s.env_value, " (", s.files.size() == 1 ? "no such file" : "none of these files exists", ")");
  } else if (s.no_home) {
    looked = "KUBECONFIG (not set), ~/.kube/config (HOME is not set)";
  } else {
    looked = Cat("KUBECONFIG (not set), ", s.files.front(), " (does not exist)");
  }
  const std::string in_cluster = InClusterUnavailable(sa_dir);
  std::string why_not_in_cluster = in_cluster;
  if (why_not_in_cluster.empty()) {
    why_not_in_cluster =
        context.empty() ? "not tried: a kubeconfig was asked for" : Cat("not used with --context ", context);
  }
  looked += Cat(", the in-cluster service account (", why_not_in_cluster, ")");
  return absl::NotFoundError(Cat("no Kubernetes API server configured",
                                 context.empty() ? "" : Cat(" for --context ", context), ": looked at ", looked,
                                 "; pass --kubeconfig FILE, set KUBECONFIG=FILE[:FILE...] or create ~/.kube/config "
                                 "(as for kubectl), or run in a pod with a service account"));
}

}  // namespace

absl::StatusOr<Config> LoadKubeconfig(std::string_view explicit_path, std::string_view context) {
  Merged m;
  if (!explicit_path.empty()) {
    // --kubeconfig: that file only, and it must exist (client-go's ExplicitPath).
    const std::string f(explicit_path);
    auto text = ReadInputFile(f, "kubeconfig file", "check --kubeconfig");
    if (!text.ok()) return text.status();
    if (auto s = AddFile(m, *text, f, fs::path(f).parent_path().string()); !s.ok()) return s;
    return Build(m, context, f);
  }
  const Search search = KubeconfigSearch();
  std::vector<std::string> read;
  for (const auto& f : search.files) {
    if (!Exists(f)) continue;  // missing files are skipped, as kubectl does
    // A file that is there but cannot be read is an error (client-go: "error loading config file").
    auto text = ReadInputFile(f, "kubeconfig file", search.from_env ? "check KUBECONFIG" : "check ~/.kube/config");
    if (!text.ok()) return text.status();
    read.push_back(f);
    if (auto s = AddFile(m, *text, f, fs::path(f).parent_path().string()); !s.ok()) return s;
  }
  if (read.empty()) return NoConfigError(search, context, "/var/run/secrets/kubernetes.io/serviceaccount");
  return Build(m, context, read.front());
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
  c.server = Cat("https://", UrlHost(host), ":", port);
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

absl::StatusOr<Config> ConfigFromFlags(std::string_view kubeconfig, std::string_view context, bool in_cluster,
                                       std::string_view sa_dir) {
  if (in_cluster) {
    if (!kubeconfig.empty()) return absl::InvalidArgumentError("--in-cluster and --kubeconfig: give one of them");
    return InClusterConfig(sa_dir);
  }
  if (!kubeconfig.empty()) return LoadKubeconfig(kubeconfig, context);
  // kubectl's deferred loading: the kubeconfig files first; the service account only when there
  // is none (and no --context asks for a kubeconfig's context).
  const Search search = KubeconfigSearch();
  if (std::any_of(search.files.begin(), search.files.end(), Exists)) return LoadKubeconfig("", context);
  if (context.empty() && InClusterUnavailable(sa_dir).empty()) return InClusterConfig(sa_dir);
  return NoConfigError(search, context, sa_dir);
}

absl::StatusOr<Config> DefaultConfig(std::string_view explicit_path, std::string_view context) {
  return ConfigFromFlags(explicit_path, context, false);
}

}  // namespace kgpu::k8s
