#include "k8s/selector.h"

#include <cctype>

#include "common/strings.h"

namespace kgpu::k8s {
namespace {

std::string_view Trim(std::string_view s) {
  while (!s.empty() && std::isspace(static_cast<unsigned char>(s.front()))) s.remove_prefix(1);
  while (!s.empty() && std::isspace(static_cast<unsigned char>(s.back()))) s.remove_suffix(1);
  return s;
}

// Splits on commas outside parentheses.
std::vector<std::string_view> SplitTop(std::string_view s) {
  std::vector<std::string_view> out;
  int depth = 0;
  size_t start = 0;
  for (size_t i = 0; i < s.size(); ++i) {
    if (s[i] == '(') ++depth;
    if (s[i] == ')') --depth;
    if (s[i] == ',' && depth == 0) {
      out.push_back(s.substr(start, i - start));
      start = i + 1;
    }
  }
  out.push_back(s.substr(start));
  return out;
}

bool ValidKey(std::string_view k) {
  if (k.empty() || k.size() > 316) return false;
  for (char c : k) {
    if (!(std::isalnum(static_cast<unsigned char>(c)) || c == '-' || c == '_' || c == '.' || c == '/')) return false;
  }
  return true;
}

bool ValidValue(std::string_view v) {
  if (v.size() > 63) return false;
  for (char c : v) {
    if (!(std::isalnum(static_cast<unsigned char>(c)) || c == '-' || c == '_' || c == '.')) return false;
  }
  return true;
}

}  // namespace

absl::StatusOr<LabelSelector> LabelSelector::Parse(std::string_view text) {
  LabelSelector sel;
  if (Trim(text).empty()) return sel;
  for (std::string_view part : SplitTop(text)) {
    part = Trim(part);
    if (part.empty()) return absl::InvalidArgumentError(Cat("label selector '", text, "': empty requirement"));
    Requirement r;
    auto bad = [&](std::string_view why) {
      return absl::InvalidArgumentError(Cat("label selector '", text, "': ", why, " in '", part, "'"));
    };
    if (part.front() == '!') {
      r.key = std::string(Trim(part.substr(1)));
      r.op = Op::kNotExists;
    } else if (auto p = part.find("!="); p != std::string_view::npos) {
      r.key = std::string(Trim(part.substr(0, p)));
      r.op = Op::kNe;
      r.values.emplace_back(Trim(part.substr(p + 2)));
    } else if (auto q = part.find('='); q != std::string_view::npos) {
      r.key = std::string(Trim(part.substr(0, q)));
      r.op = Op::kEq;
      size_t vstart = q + 1;
      if (vstart < part.size() && part[vstart] == '=') ++vstart;
      r.values.emplace_back(Trim(part.substr(vstart)));
    } else if (auto open = part.find('('); open != std::string_view::npos) {
      if (part.back() != ')') return bad("missing ')'");
      std::string_view head = Trim(part.substr(0, open));
      auto sp = head.find_last_of(" \t");
      if (sp == std::string_view::npos) return bad("expected 'in' or 'notin'");
      std::string_view op = Trim(head.substr(sp + 1));
      r.key = std::string(Trim(head.substr(0, sp)));
      if (op == "in") {
        r.op = Op::kIn;
      } else if (op == "notin") {
        r.op = Op::kNotIn;
      } else {
        return bad(Cat("unknown operator '", op, "'"));
      }
      std::string_view list = part.substr(open + 1, part.size() - open - 2);
      for (std::string_view v : SplitTop(list)) r.values.emplace_back(Trim(v));
      if (r.values.empty() || (r.values.size() == 1 && r.values[0].empty())) return bad("empty value set");
    } else {
      r.key = std::string(part);
      r.op = Op::kExists;
    }
    if (!ValidKey(r.key)) return bad(Cat("invalid key '", r.key, "'"));
    for (const auto& v : r.values) {
      if (!ValidValue(v)) return bad(Cat("invalid value '", v, "'"));
    }
    sel.reqs_.push_back(std::move(r));
  }
  return sel;
}

absl::StatusOr<LabelSelector> LabelSelector::FromJson(const nlohmann::json& selector) {
  LabelSelector sel;
  if (!selector.is_object()) return sel;
  if (selector.contains("matchLabels") && selector["matchLabels"].is_object()) {
    for (auto it = selector["matchLabels"].begin(); it != selector["matchLabels"].end(); ++it) {
      if (!it->is_string()) return absl::InvalidArgumentError(Cat("matchLabels.", it.key(), " must be a string"));
      sel.reqs_.push_back({it.key(), Op::kEq, {it->get<std::string>()}});
    }
  }
  if (selector.contains("matchExpressions") && selector["matchExpressions"].is_array()) {
    for (const auto& e : selector["matchExpressions"]) {
      Requirement r;
      r.key = e.value("key", "");
      const std::string op = e.value("operator", "");
      if (op == "In") {
        r.op = Op::kIn;
      } else if (op == "NotIn") {
        r.op = Op::kNotIn;
      } else if (op == "Exists") {
        r.op = Op::kExists;
      } else if (op == "DoesNotExist") {
        r.op = Op::kNotExists;
      } else {
        return absl::InvalidArgumentError(Cat("matchExpressions: unknown operator '", op, "'"));
      }
      if (e.contains("values") && e["values"].is_array()) {
        for (const auto& v : e["values"]) {
          if (v.is_string()) r.values.push_back(v.get<std::string>());
        }
      }
      sel.reqs_.push_back(std::move(r));
    }
  }
  return sel;
}

std::optional<LabelSelector> BudgetSelector(const nlohmann::json& pdb) {
  if (!pdb.is_object() || !pdb.contains("spec") || !pdb["spec"].is_object() || !pdb["spec"].contains("selector")) {
    return std::nullopt;
  }
  auto sel = LabelSelector::FromJson(pdb["spec"]["selector"]);
  if (!sel.ok() || sel->Empty()) return std::nullopt;
  return *std::move(sel);
}

bool LabelSelector::Matches(const nlohmann::json& labels) const {
  for (const auto& r : reqs_) {
    const bool has = labels.is_object() && labels.contains(r.key) && labels[r.key].is_string();
    const std::string v = has ? labels[r.key].get<std::string>() : "";
    bool in = false;
    for (const auto& x : r.values) in = in || (has && x == v);
    switch (r.op) {
      case Op::kEq:
      case Op::kIn:
        if (!in) return false;
        break;
      case Op::kNe:
      case Op::kNotIn:
        if (in) return false;
        break;
      case Op::kExists:
        if (!has) return false;
        break;
      case Op::kNotExists:
        if (has) return false;
        break;
    }
  }
  return true;
}

std::string FieldValue(const nlohmann::json& object, std::string_view dotted_path) {
  const nlohmann::json* cur = &object;
  size_t start = 0;
  while (start <= dotted_path.size()) {
    size_t dot = dotted_path.find('.', start);
    std::string key(dotted_path.substr(start, dot == std::string_view::npos ? std::string_view::npos : dot - start));
    if (!cur->is_object() || !cur->contains(key)) return "";
    cur = &(*cur)[key];
    if (dot == std::string_view::npos) break;
    start = dot + 1;
  }
  if (cur->is_string()) return cur->get<std::string>();
  if (cur->is_boolean()) return cur->get<bool>() ? "true" : "false";
  if (cur->is_number()) return cur->dump();
  return "";
}

absl::StatusOr<FieldSelector> FieldSelector::Parse(std::string_view text) {
  FieldSelector sel;
  if (Trim(text).empty()) return sel;
  for (std::string_view part : SplitTop(text)) {
    part = Trim(part);
    Term t;
    if (auto p = part.find("!="); p != std::string_view::npos) {
      t.path = std::string(Trim(part.substr(0, p)));
      t.equal = false;
      t.value = std::string(Trim(part.substr(p + 2)));
    } else if (auto q = part.find('='); q != std::string_view::npos) {
      t.path = std::string(Trim(part.substr(0, q)));
      t.equal = true;
      size_t v = q + 1;
      if (v < part.size() && part[v] == '=') ++v;
      t.value = std::string(Trim(part.substr(v)));
    } else {
      return absl::InvalidArgumentError(
          Cat("field selector '", text, "': '", part, "' is not key=value or key!=value"));
    }
    if (t.path.empty()) return absl::InvalidArgumentError(Cat("field selector '", text, "': empty field name"));
    sel.terms_.push_back(std::move(t));
  }
  return sel;
}

bool FieldSelector::Matches(const nlohmann::json& object) const {
  for (const auto& t : terms_) {
    if ((FieldValue(object, t.path) == t.value) != t.equal) return false;
  }
  return true;
}

std::vector<std::string> FieldSelector::Fields() const {
  std::vector<std::string> out;
  for (const auto& t : terms_) out.push_back(t.path);
  return out;
}

void FieldSelector::Rename(std::string_view from, std::string_view to) {
  for (auto& t : terms_) {
    if (t.path == from) t.path = std::string(to);
  }
}

}  // namespace kgpu::k8s
