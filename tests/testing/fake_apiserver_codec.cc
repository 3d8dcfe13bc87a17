// Codecs of the API server stand-in: the Kubernetes protobuf envelope kubectl's generator
// commands send, YAML documents to JSON for preloading, and the self-signed TLS certificate.
#include <cstdint>
#include <ctime>
#include <functional>
#include <initializer_list>
#include <map>
#include <memory>

#include <openssl/evp.h>
#include <openssl/pem.h>
#include <openssl/x509.h>
#include <openssl/x509v3.h>
#include <yaml-cpp/yaml.h>

#include "common/strings.h"
#include "common/yaml_util.h"
#include "testing/fake_apiserver.h"

namespace kgpu::testing {
namespace {
using json = nlohmann::json;

// Protobuf wire format reader over one message.
class Wire {
 public:
  explicit Wire(std::string_view b) : b_(b) {}
  bool Done() const { return p_ >= b_.size(); }
  bool Varint(uint64_t& v) {
    v = 0;
    for (int shift = 0; shift < 64; shift += 7) {
      if (p_ >= b_.size()) return false;
      const uint8_t c = static_cast<uint8_t>(b_[p_++]);
      v |= static_cast<uint64_t>(c & 0x7f) << shift;
      if (!(c & 0x80)) return true;
    }
    return false;
  }
  // Next field: number, wire type, and for length-delimited the bytes.
  bool Next(uint32_t& field, uint32_t& type, std::string_view& bytes, uint64_t& value) {
    uint64_t key;
    if (!Varint(key)) return false;
    field = static_cast<uint32_t>(key >> 3);
    type = static_cast<uint32_t>(key & 7);
    switch (type) {
      case 0:
        return Varint(value);
      case 1:
        if (p_ + 8 > b_.size()) return false;
        p_ += 8;
        return true;
      case 2: {
        uint64_t len;
        if (!Varint(len) || len > b_.size() - p_) return false;
        bytes = b_.substr(p_, len);
        p_ += len;
        return true;
      }
      case 5:
        if (p_ + 4 > b_.size()) return false;
        p_ += 4;
        return true;
      default:
        return false;
    }
  }

 private:
  std::string_view b_;
  size_t p_ = 0;
};

using Fields = std::function<bool(uint32_t field, uint32_t type, std::string_view bytes, uint64_t value, json& out)>;

bool Decode(std::string_view msg, json& out, const Fields& f) {
  Wire w(msg);
  while (!w.Done()) {
    uint32_t field, type;
    std::string_view bytes;
    uint64_t value = 0;
    if (!w.Next(field, type, bytes, value)) return false;
    if (!f(field, type, bytes, value, out)) return false;
  }
  return true;
}

// map<string, string> entry (key = 1, value = 2); `value_message` decodes message values.
bool MapEntry(std::string_view bytes, json& map,
              const std::function<bool(std::string_view, json&)>& value_message = {}) {
  std::string key;
  json value = "";
  Wire w(bytes);
  while (!w.Done()) {
    uint32_t field, type;
    std::string_view b;
    uint64_t v = 0;
    if (!w.Next(field, type, b, v)) return false;
    if (field == 1 && type == 2) key = std::string(b);
    if (field == 2 && type == 2) {
      if (value_message) {
        if (!value_message(b, value)) return false;
      } else {
        value = std::string(b);
      }
    }
  }
  map[key] = value;
  return true;
}

// resource.Quantity: string string = 1.
bool QuantityMsg(std::string_view b, json& out) {
  return Decode(b, out, [](uint32_t f, uint32_t t, std::string_view bytes, uint64_t, json& o) {
    if (f == 1 && t == 2) o = std::string(bytes);
    return true;
  });
}

// intstr.IntOrString: type = 1 (0 int, 1 string), intVal = 2, strVal = 3.
bool IntOrString(std::string_view b, json& out) {
  int64_t kind = 0, iv = 0;
  std::string sv;
  json tmp;
  const bool ok = Decode(b, tmp, [&](uint32_t f, uint32_t t, std::string_view bytes, uint64_t v, json&) {
    if (f == 1 && t == 0) kind = static_cast<int64_t>(v);
    if (f == 2 && t == 0) iv = static_cast<int32_t>(v);
    if (f == 3 && t == 2) sv = std::string(bytes);
    return true;
  });
  out = kind == 1 ? json(sv) : json(iv);
  return ok;
}

// metav1.LabelSelector: matchLabels = 1 (map), matchExpressions = 2 {key 1, operator 2, values 3}.
bool LabelSelectorMsg(std::string_view b, json& out) {
  out = json::object();
  return Decode(b, out, [](uint32_t f, uint32_t t, std::string_view bytes, uint64_t, json& o) {
    if (f == 1 && t == 2) return MapEntry(bytes, o["matchLabels"]);
    if (f == 2 && t == 2) {
      json e = json::object();
      if (!Decode(bytes, e, [](uint32_t f2, uint32_t t2, std::string_view b2, uint64_t, json& x) {
            if (t2 != 2) return true;
            if (f2 == 1) x["key"] = std::string(b2);
            if (f2 == 2) x["operator"] = std::string(b2);
            if (f2 == 3) x["values"].push_back(std::string(b2));
            return true;
          })) {
        return false;
      }
      o["matchExpressions"].push_back(e);
    }
    return true;
  });
}

// metav1.ObjectMeta: name 1, generateName 2, namespace 3, labels 11, annotations 12, finalizers 14.
bool ObjectMeta(std::string_view b, json& out) {
  out = json::object();
  return Decode(b, out, [](uint32_t f, uint32_t t, std::string_view bytes, uint64_t, json& o) {
    if (t != 2) return true;
    switch (f) {
      case 1:
        o["name"] = std::string(bytes);
        break;
      case 2:
        o["generateName"] = std::string(bytes);
        break;
      case 3:
        o["namespace"] = std::string(bytes);
        break;
      case 11:
        return MapEntry(bytes, o["labels"]);
      case 12:
        return MapEntry(bytes, o["annotations"]);
      case 14:
        o["finalizers"].push_back(std::string(bytes));
        break;
      default:
        break;
    }
    return true;
  });
}

// The kinds (k8s.io/api generated.proto): metadata = 1 everywhere; spec = 2.
bool KindBody(const std::string& kind, std::string_view raw, json& obj) {
  return Decode(raw, obj, [&](uint32_t f, uint32_t t, std::string_view bytes, uint64_t v, json& o) {
    if (f == 1 && t == 2) return ObjectMeta(bytes, o["metadata"]);
    if (kind == "ConfigMap") {
      if (f == 2 && t == 2) return MapEntry(bytes, o["data"]);
      if (f == 3 && t == 2) return MapEntry(bytes, o["binaryData"]);  // bytes kept as given
      if (f == 4 && t == 0) o["immutable"] = v != 0;
      return true;
    }
    if (f != 2 || t != 2) return true;  // status is never sent by a create
    json& spec = o["spec"];
    spec = json::object();
    if (kind == "Namespace") {
      return Decode(bytes, spec, [](uint32_t f2, uint32_t t2, std::string_view b2, uint64_t, json& s) {
        if (f2 == 1 && t2 == 2) s["finalizers"].push_back(std::string(b2));
        return true;
      });
    }
    if (kind == "ResourceQuota") {
      // ResourceQuotaSpec: hard 1 (map<string, Quantity>), scopes 2, scopeSelector 3.
      return Decode(bytes, spec, [](uint32_t f2, uint32_t t2, std::string_view b2, uint64_t, json& s) {
        if (f2 == 1 && t2 == 2) return MapEntry(b2, s["hard"], QuantityMsg);
        if (f2 == 2 && t2 == 2) s["scopes"].push_back(std::string(b2));
        return true;
      });
    }
    if (kind == "PodDisruptionBudget") {
      // PodDisruptionBudgetSpec: minAvailable 1, selector 2, maxUnavailable 3, unhealthyPodEvictionPolicy 4.
      return Decode(bytes, spec, [](uint32_t f2, uint32_t t2, std::string_view b2, uint64_t, json& s) {
        if (t2 != 2) return true;
        if (f2 == 1) return IntOrString(b2, s["minAvailable"]);
        if (f2 == 2) return LabelSelectorMsg(b2, s["selector"]);
        if (f2 == 3) return IntOrString(b2, s["maxUnavailable"]);
        if (f2 == 4) s["unhealthyPodEvictionPolicy"] = std::string(b2);
        return true;
      });
    }
    return true;
  });
}

}  // namespace

absl::StatusOr<json> DecodeProtobufObject(const std::string& body) {
  static constexpr std::string_view kMagic("k8s\0", 4);
  if (body.size() < 4 || std::string_view(body).substr(0, 4) != kMagic) {
    return absl::InvalidArgumentError("protobuf body without the k8s\\0 envelope");
  }
  // runtime.Unknown: typeMeta 1 {apiVersion 1, kind 2}, raw 2, contentEncoding 3, contentType 4.
  json obj = json::object();
  std::string raw;
  const bool ok =
      Decode(std::string_view(body).substr(4), obj, [&](uint32_t f, uint32_t t, std::string_view b, uint64_t, json& o) {
        if (f == 1 && t == 2) {
          return Decode(b, o, [](uint32_t f2, uint32_t t2, std::string_view b2, uint64_t, json& x) {
            if (f2 == 1 && t2 == 2) x["apiVersion"] = std::string(b2);
            if (f2 == 2 && t2 == 2) x["kind"] = std::string(b2);
            return true;
          });
        }
        if (f == 2 && t == 2) raw = std::string(b);
        return true;
      });
  if (!ok) return absl::InvalidArgumentError("malformed protobuf envelope");
  const std::string kind = obj.value("kind", "");
  if (kind != "Namespace" && kind != "ResourceQuota" && kind != "PodDisruptionBudget" && kind != "ConfigMap") {
    return absl::InvalidArgumentError(
        Cat("protobuf bodies are decoded for Namespace, ResourceQuota, PodDisruptionBudget "
            "and ConfigMap only, not '",
            kind, "'; send JSON"));
  }
  if (!KindBody(kind, raw, obj)) return absl::InvalidArgumentError(Cat("malformed protobuf ", kind));
  return obj;
}

namespace {
json YamlToJson(const YAML::Node& n) {
  switch (n.Type()) {
    case YAML::NodeType::Map: {
      json o = json::object();
      for (const auto& kv : n) o[kv.first.Scalar()] = YamlToJson(kv.second);
      return o;
    }
    case YAML::NodeType::Sequence: {
      json a = json::array();
      for (const auto& e : n) a.push_back(YamlToJson(e));
      return a;
    }
    case YAML::NodeType::Scalar: {
      const std::string& s = n.Scalar();
      if (n.Tag() != "?") return s;  // quoted: a string
      if (s == "true" || s == "True") return true;
      if (s == "false" || s == "False") return false;
      if (s == "null" || s == "~") return nullptr;
      auto j = json::parse(s, nullptr, false);
      if (!j.is_discarded() && j.is_number()) return j;
      return s;
    }
    default:
      return nullptr;
  }
}
}  // namespace

absl::StatusOr<std::vector<json>> YamlDocumentsToJson(const std::string& text, const std::string& origin) {
  std::vector<json> out;
  try {
    for (const auto& doc : YAML::LoadAll(text)) {
      if (doc.IsNull()) continue;
      json j = YamlToJson(doc);
      if (j.value("kind", "").ends_with("List") && j.contains("items")) {
        for (auto& item : j["items"]) out.push_back(item);
      } else {
        out.push_back(std::move(j));
      }
    }
  } catch (const YAML::Exception& e) {
    return absl::InvalidArgumentError(Cat(origin, ":", e.mark.line + 1, ":", e.mark.column + 1, ": ", e.msg));
  }
  return out;
}

absl::Status GenerateSelfSigned(std::string& cert_pem, std::string& key_pem, const std::string& common_name,
                                const std::string& usage) {
  std::unique_ptr<EVP_PKEY, decltype(&EVP_PKEY_free)> key(EVP_EC_gen("P-256"), EVP_PKEY_free);
  if (!key) return absl::InternalError("cannot generate an EC key");
  std::unique_ptr<X509, decltype(&X509_free)> x(X509_new(), X509_free);
  X509_set_version(x.get(), 2);
  ASN1_INTEGER_set(X509_get_serialNumber(x.get()), static_cast<long>(time(nullptr)));
  X509_gmtime_adj(X509_getm_notBefore(x.get()), -3600);
  X509_gmtime_adj(X509_getm_notAfter(x.get()), 365L * 24 * 3600);
  X509_set_pubkey(x.get(), key.get());
  X509_NAME* name = X509_get_subject_name(x.get());
  X509_NAME_add_entry_by_txt(name, "CN", MBSTRING_ASC, reinterpret_cast<const unsigned char*>(common_name.c_str()), -1,
                             -1, 0);
  X509_set_issuer_name(x.get(), name);
  X509V3_CTX ctx;
  X509V3_set_ctx_nodb(&ctx);
  X509V3_set_ctx(&ctx, x.get(), x.get(), nullptr, nullptr, 0);
  for (auto [nid, value] :
       std::initializer_list<std::pair<int, const char*>>{{NID_subject_alt_name, "IP:127.0.0.1,DNS:localhost"},
                                                          {NID_basic_constraints, "critical,CA:TRUE"},
                                                          {NID_key_usage, "critical,digitalSignature,keyCertSign"},
                                                          {NID_ext_key_usage, usage.c_str()}}) {
    X509_EXTENSION* ext = X509V3_EXT_conf_nid(nullptr, &ctx, nid, value);
    if (!ext) return absl::InternalError("cannot build a certificate extension");
    X509_add_ext(x.get(), ext, -1);
    X509_EXTENSION_free(ext);
  }
  if (X509_sign(x.get(), key.get(), EVP_sha256()) == 0) return absl::InternalError("cannot sign the certificate");
  auto to_pem = [](const std::function<int(BIO*)>& write) {
    std::unique_ptr<BIO, decltype(&BIO_free)> bio(BIO_new(BIO_s_mem()), BIO_free);
    write(bio.get());
    char* data = nullptr;
    const long len = BIO_get_mem_data(bio.get(), &data);
    return std::string(data, static_cast<size_t>(len));
  };
  cert_pem = to_pem([&](BIO* b) { return PEM_write_bio_X509(b, x.get()); });
  key_pem =
      to_pem([&](BIO* b) { return PEM_write_bio_PrivateKey(b, key.get(), nullptr, nullptr, 0, nullptr, nullptr); });
  return absl::OkStatus();
}

}  // namespace kgpu::testing
