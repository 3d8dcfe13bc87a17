#include "testing/dra_cel.h"

#include <algorithm>
#include <array>
#include <cctype>
#include <regex>
#include <vector>

#include "common/strings.h"
#include "k8s/quantity.h"

namespace kgpu::testing {

using json = nlohmann::json;

namespace {

// ---- values

struct Value {
  enum class Kind { kBool, kInt, kString, kQuantity, kVersion, kDomains, kIds, kList, kDevice } kind = Kind::kBool;
  bool b = false;
  int64_t i = 0;  // int, or a quantity's milli-units
  std::string s;
  std::array<int64_t, 3> ver{};
  json map;               // kDomains: domain -> id -> raw; kIds: id -> raw
  bool capacity = false;  // the maps hold capacities ({value}) rather than attributes
  std::vector<Value> list;
  static Value Bool(bool v) {
    Value x;
    x.kind = Kind::kBool;
    x.b = v;
    return x;
  }
  static Value Int(int64_t v) {
    Value x;
    x.kind = Kind::kInt;
    x.i = v;
    return x;
  }
  static Value String(std::string v) {
    Value x;
    x.kind = Kind::kString;
    x.s = std::move(v);
    return x;
  }
};

const char* KindName(Value::Kind k) {
  switch (k) {
    case Value::Kind::kBool:
      return "bool";
    case Value::Kind::kInt:
      return "int";
    case Value::Kind::kString:
      return "string";
    case Value::Kind::kQuantity:
      return "quantity";
    case Value::Kind::kVersion:
      return "semver";
    case Value::Kind::kDomains:
    case Value::Kind::kIds:
      return "map";
    case Value::Kind::kList:
      return "list";
    case Value::Kind::kDevice:
      return "device";
  }
  return "?";
}

absl::StatusOr<Value> QuantityOf(const std::string& text) {
  const auto q = k8s::Quantity::Parse(text);
  if (!q) return absl::InvalidArgumentError(Cat("quantity(\"", text, "\"): not a quantity"));
  Value v;
  v.kind = Value::Kind::kQuantity;
  v.i = q->milli;
  return v;
}

absl::StatusOr<Value> VersionOf(const std::string& text) {
  Value v;
  v.kind = Value::Kind::kVersion;
  size_t pos = 0;
  for (int k = 0; k < 3; ++k) {
    size_t end = pos;
    while (end < text.size() && std::isdigit(static_cast<unsigned char>(text[end]))) ++end;
    if (end == pos) return absl::InvalidArgumentError(Cat("semver(\"", text, "\"): not a semantic version"));
    v.ver[static_cast<size_t>(k)] = std::stoll(text.substr(pos, end - pos));
    pos = end;
    if (k < 2) {
      if (pos >= text.size() || text[pos] != '.') {
        return absl::InvalidArgumentError(Cat("semver(\"", text, "\"): not a semantic version"));
      }
      ++pos;
    }
  }
  return v;
}

// An attribute ({"string": ...}) or a capacity ({"value": ...}) as a CEL value.
absl::StatusOr<Value> Leaf(const json& raw, bool capacity) {
  if (capacity) return QuantityOf(raw.value("value", ""));
  if (raw.contains("string")) return Value::String(raw["string"].get<std::string>());
  if (raw.contains("int")) return Value::Int(raw["int"].get<int64_t>());
  if (raw.contains("bool")) return Value::Bool(raw["bool"].get<bool>());
  if (raw.contains("version")) return VersionOf(raw["version"].get<std::string>());
  return absl::UnimplementedError(Cat("attribute value ", raw.dump(), " (list attributes are not supported)"));
}

// ---- syntax

struct Token {
  enum class Type { kIdent, kString, kInt, kSym, kEnd } type = Type::kEnd;
  std::string text;
};

absl::StatusOr<std::vector<Token>> Lex(std::string_view e) {
  std::vector<Token> out;
  size_t i = 0;
  while (i < e.size()) {
    const char c = e[i];
    if (std::isspace(static_cast<unsigned char>(c))) {
      ++i;
    } else if (std::isalpha(static_cast<unsigned char>(c)) || c == '_') {
      size_t j = i;
      while (j < e.size() && (std::isalnum(static_cast<unsigned char>(e[j])) || e[j] == '_')) ++j;
      out.push_back({Token::Type::kIdent, std::string(e.substr(i, j - i))});
      i = j;
    } else if (std::isdigit(static_cast<unsigned char>(c))) {
      size_t j = i;
      while (j < e.size() && std::isdigit(static_cast<unsigned char>(e[j]))) ++j;
      if (j < e.size() && (e[j] == '.' || e[j] == 'u')) {
        return absl::UnimplementedError(Cat("number '", e.substr(i, j - i + 1), "...' (only int literals)"));
      }
      out.push_back({Token::Type::kInt, std::string(e.substr(i, j - i))});
      i = j;
    } else if (c == '\'' || c == '"') {
      std::string s;
      size_t j = i + 1;
      while (j < e.size() && e[j] != c) {
        if (e[j] == '\\' && j + 1 < e.size()) {
          const char n = e[j + 1];
          s.push_back(n == 'n' ? '\n' : n == 't' ? '\t' : n);
          j += 2;
        } else {
          s.push_back(e[j++]);
        }
      }
      if (j >= e.size()) return absl::InvalidArgumentError("unterminated string literal");
      out.push_back({Token::Type::kString, s});
      i = j + 1;
    } else {
      static const char* kSyms[] = {"&&", "||", "==", "!=", "<=", ">=", "<", ">", "!", "(", ")", "[", "]", ".", ","};
      bool found = false;
      for (const char* sym : kSyms) {
        if (e.substr(i, std::string_view(sym).size()) == sym) {
          out.push_back({Token::Type::kSym, sym});
          i += std::string_view(sym).size();
          found = true;
          break;
        }
      }
      if (!found) return absl::UnimplementedError(Cat("operator '", std::string(1, c), "'"));
    }
  }
  out.push_back({Token::Type::kEnd, ""});
  return out;
}

struct Node {
  enum class Type { kLit, kIdent, kMember, kIndex, kCall, kMethod, kNot, kBinary, kList } type = Type::kLit;
  Value lit;
  std::string name;  // ident, member, function/method, binary operator
  std::vector<std::unique_ptr<Node>> kids;
};
using NodePtr = std::unique_ptr<Node>;

class Parser {
 public:
  explicit Parser(std::vector<Token> t) : t_(std::move(t)) {}
  absl::StatusOr<NodePtr> Parse() {
    auto n = Or();
    if (!n.ok()) return n;
    if (t_[p_].type != Token::Type::kEnd) return absl::InvalidArgumentError(Cat("unexpected '", t_[p_].text, "'"));
    return n;
  }

 private:
  bool Sym(const char* s) {
    if (t_[p_].type == Token::Type::kSym && t_[p_].text == s) {
      ++p_;
      return true;
    }
    return false;
  }
  static NodePtr Bin(std::string op, NodePtr a, NodePtr b) {
    auto n = std::make_unique<Node>();
    n->type = Node::Type::kBinary;
    n->name = std::move(op);
    n->kids.push_back(std::move(a));
    n->kids.push_back(std::move(b));
    return n;
  }
  absl::StatusOr<NodePtr> Or() {
    auto a = And();
    if (!a.ok()) return a;
    NodePtr n = std::move(*a);
    while (Sym("||")) {
      auto b = And();
      if (!b.ok()) return b;
      n = Bin("||", std::move(n), std::move(*b));
    }
    return n;
  }
  absl::StatusOr<NodePtr> And() {
    auto a = Rel();
    if (!a.ok()) return a;
    NodePtr n = std::move(*a);
    while (Sym("&&")) {
      auto b = Rel();
      if (!b.ok()) return b;
      n = Bin("&&", std::move(n), std::move(*b));
    }
    return n;
  }
  absl::StatusOr<NodePtr> Rel() {
    auto a = Unary();
    if (!a.ok()) return a;
    for (const char* op : {"==", "!=", "<=", ">=", "<", ">"}) {
      if (Sym(op)) {
        auto b = Unary();
        if (!b.ok()) return b;
        return Bin(op, std::move(*a), std::move(*b));
      }
    }
    if (t_[p_].type == Token::Type::kIdent && t_[p_].text == "in") {
      ++p_;
      auto b = Unary();
      if (!b.ok()) return b;
      return Bin("in", std::move(*a), std::move(*b));
    }
    if (t_[p_].type == Token::Type::kSym && (t_[p_].text == "+" || t_[p_].text == "-")) {
      return absl::UnimplementedError(Cat("arithmetic '", t_[p_].text, "'"));
    }
    return a;
  }
  absl::StatusOr<NodePtr> Unary() {
    if (Sym("!")) {
      auto a = Unary();
      if (!a.ok()) return a;
      auto n = std::make_unique<Node>();
      n->type = Node::Type::kNot;
      n->kids.push_back(std::move(*a));
      return n;
    }
    return Postfix();
  }
  absl::StatusOr<std::vector<NodePtr>> Args(const char* close) {
    std::vector<NodePtr> args;
    if (Sym(close)) return args;
    while (true) {
      auto a = Or();
      if (!a.ok()) return a.status();
      args.push_back(std::move(*a));
      if (Sym(close)) return args;
      if (!Sym(",")) return absl::InvalidArgumentError(Cat("expected ',' or '", close, "'"));
    }
  }
  absl::StatusOr<NodePtr> Postfix() {
    auto a = Primary();
    if (!a.ok()) return a;
    NodePtr n = std::move(*a);
    while (true) {
      if (Sym(".")) {
        if (t_[p_].type != Token::Type::kIdent) return absl::InvalidArgumentError("expected a name after '.'");
        std::string name = t_[p_++].text;
        auto m = std::make_unique<Node>();
        m->name = std::move(name);
        m->kids.push_back(std::move(n));
        if (Sym("(")) {
          static const char* kMethods[] = {"matches",       "startsWith", "endsWith",  "contains",
                                           "isGreaterThan", "isLessThan", "compareTo", "asInteger"};
          if (std::find(std::begin(kMethods), std::end(kMethods), m->name) == std::end(kMethods)) {
            return absl::UnimplementedError(Cat("method ", m->name, "()"));
          }
          auto args = Args(")");
          if (!args.ok()) return args.status();
          m->type = Node::Type::kMethod;
          for (auto& x : *args) m->kids.push_back(std::move(x));
        } else {
          m->type = Node::Type::kMember;
        }
        n = std::move(m);
      } else if (Sym("[")) {
        auto idx = Or();
        if (!idx.ok()) return idx;
        if (!Sym("]")) return absl::InvalidArgumentError("expected ']'");
        auto m = std::make_unique<Node>();
        m->type = Node::Type::kIndex;
        m->kids.push_back(std::move(n));
        m->kids.push_back(std::move(*idx));
        n = std::move(m);
      } else {
        return n;
      }
    }
  }
  absl::StatusOr<NodePtr> Primary() {
    const Token tok = t_[p_];
    auto n = std::make_unique<Node>();
    if (Sym("(")) {
      auto a = Or();
      if (!a.ok()) return a;
      if (!Sym(")")) return absl::InvalidArgumentError("expected ')'");
      return a;
    }
    if (Sym("[")) {
      auto args = Args("]");
      if (!args.ok()) return args.status();
      n->type = Node::Type::kList;
      n->kids = std::move(*args);
      return n;
    }
    ++p_;
    switch (tok.type) {
      case Token::Type::kString:
        n->lit = Value::String(tok.text);
        return n;
      case Token::Type::kInt:
        n->lit = Value::Int(std::stoll(tok.text));
        return n;
      case Token::Type::kIdent:
        if (tok.text == "true" || tok.text == "false") {
          n->lit = Value::Bool(tok.text == "true");
          return n;
        }
        if (Sym("(")) {
          static const char* kFunctions[] = {"has", "quantity", "semver", "size"};
          if (std::find(std::begin(kFunctions), std::end(kFunctions), tok.text) == std::end(kFunctions)) {
            return absl::UnimplementedError(Cat("function ", tok.text, "()"));
          }
          auto args = Args(")");
          if (!args.ok()) return args.status();
          if (args->size() != 1) return absl::InvalidArgumentError(Cat(tok.text, "() takes one argument"));
          n->type = Node::Type::kCall;
          n->name = tok.text;
          n->kids = std::move(*args);
          return n;
        }
        if (tok.text != "device") return absl::UnimplementedError(Cat("variable '", tok.text, "' (only device)"));
        n->type = Node::Type::kIdent;
        n->name = tok.text;
        return n;
      default:
        return absl::InvalidArgumentError(tok.text.empty() ? "unexpected end of expression"
                                                           : Cat("unexpected '", tok.text, "'"));
    }
  }
  std::vector<Token> t_;
  size_t p_ = 0;
};

// ---- evaluation

json Nest(const json& flat, const std::string& driver) {
  json out = json::object();
  if (!flat.is_object()) return out;
  for (auto it = flat.begin(); it != flat.end(); ++it) {
    const std::string& k = it.key();
    const size_t slash = k.find('/');
    const std::string domain = slash == std::string::npos ? driver : k.substr(0, slash);
    out[domain][slash == std::string::npos ? k : k.substr(slash + 1)] = it.value();
  }
  return out;
}

absl::StatusOr<Value> Eval(const Node& n, const CelDevice& d);

absl::StatusOr<Value> Lookup(const Value& base, const std::string& key) {
  if (base.kind == Value::Kind::kDevice) return absl::InternalError("device fields are resolved by Member");
  if (base.kind == Value::Kind::kDomains) {
    Value v;
    v.kind = Value::Kind::kIds;
    v.capacity = base.capacity;
    v.map = base.map.contains(key) ? base.map[key] : json::object();  // an unknown domain: empty
    return v;
  }
  if (base.kind == Value::Kind::kIds) {
    if (!base.map.contains(key)) return absl::NotFoundError(Cat("no such key: ", key));
    return Leaf(base.map[key], base.capacity);
  }
  return absl::InvalidArgumentError(Cat("no field '", key, "' on a ", KindName(base.kind)));
}

}  // namespace

class CelProgram {
 public:
  NodePtr root;
};

namespace {

absl::StatusOr<Value> Member(const CelDevice& d, const std::string& key, const Node& base_node) {
  if (base_node.type == Node::Type::kIdent) {  // device.<field>
    if (key == "driver") return Value::String(d.driver);
    if (key == "allowMultipleAllocations") return Value::Bool(d.device.value("allowMultipleAllocations", false));
    if (key == "attributes" || key == "capacity") {
      Value v;
      v.kind = Value::Kind::kDomains;
      v.capacity = key == "capacity";
      v.map = Nest(d.device.value(key, json::object()), d.driver);
      return v;
    }
    return absl::InvalidArgumentError(Cat("no field '", key, "' on device"));
  }
  auto base = Eval(base_node, d);
  if (!base.ok()) return base;
  return Lookup(*base, key);
}

int Compare(int64_t a, int64_t b) {
  return a < b ? -1 : a > b ? 1 : 0;
}

absl::StatusOr<Value> Method(const Node& n, const CelDevice& d) {
  auto self = Eval(*n.kids[0], d);
  if (!self.ok()) return self;
  std::vector<Value> args;
  for (size_t i = 1; i < n.kids.size(); ++i) {
    auto a = Eval(*n.kids[i], d);
    if (!a.ok()) return a;
    args.push_back(std::move(*a));
  }
  auto one = [&](Value::Kind k) -> absl::Status {
    if (args.size() != 1 || args[0].kind != k) {
      return absl::InvalidArgumentError(Cat(n.name, "() on a ", KindName(self->kind), " takes one ", KindName(k)));
    }
    return absl::OkStatus();
  };
  if (self->kind == Value::Kind::kString) {
    if (auto st = one(Value::Kind::kString); !st.ok()) return st;
    const std::string& s = self->s;
    const std::string& a = args[0].s;
    if (n.name == "matches") {
      try {
        return Value::Bool(std::regex_search(s, std::regex(a)));
      } catch (const std::regex_error&) {
        return absl::InvalidArgumentError(Cat("matches(): bad regular expression '", a, "'"));
      }
    }
    if (n.name == "startsWith") return Value::Bool(s.rfind(a, 0) == 0);
    if (n.name == "endsWith")
      return Value::Bool(s.size() >= a.size() && s.compare(s.size() - a.size(), a.size(), a) == 0);
    if (n.name == "contains") return Value::Bool(s.find(a) != std::string::npos);
  }
  if (self->kind == Value::Kind::kQuantity && n.name == "asInteger" && args.empty()) {
    return Value::Int(self->i / 1000);
  }
  if (self->kind == Value::Kind::kQuantity || self->kind == Value::Kind::kVersion) {
    if (auto st = one(self->kind); !st.ok()) return st;
    const int c = self->kind == Value::Kind::kQuantity
                      ? Compare(self->i, args[0].i)
                      : (self->ver[0] != args[0].ver[0]   ? Compare(self->ver[0], args[0].ver[0])
                         : self->ver[1] != args[0].ver[1] ? Compare(self->ver[1], args[0].ver[1])
                                                          : Compare(self->ver[2], args[0].ver[2]));
    if (n.name == "isGreaterThan") return Value::Bool(c > 0);
    if (n.name == "isLessThan") return Value::Bool(c < 0);
    if (n.name == "compareTo") return Value::Int(c);
  }
  return absl::UnimplementedError(Cat("method ", n.name, "() on a ", KindName(self->kind)));
}

bool Equal(const Value& a, const Value& b) {
  if (a.kind != b.kind) return false;
  switch (a.kind) {
    case Value::Kind::kBool:
      return a.b == b.b;
    case Value::Kind::kInt:
    case Value::Kind::kQuantity:
      return a.i == b.i;
    case Value::Kind::kString:
      return a.s == b.s;
    case Value::Kind::kVersion:
      return a.ver == b.ver;
    default:
      return false;
  }
}

absl::StatusOr<Value> Eval(const Node& n, const CelDevice& d) {
  switch (n.type) {
    case Node::Type::kLit:
      return n.lit;
    case Node::Type::kIdent: {
      Value v;
      v.kind = Value::Kind::kDevice;
      return v;
    }
    case Node::Type::kMember:
      return Member(d, n.name, *n.kids[0]);
    case Node::Type::kIndex: {
      auto key = Eval(*n.kids[1], d);
      if (!key.ok()) return key;
      if (key->kind != Value::Kind::kString) return absl::InvalidArgumentError("map keys are strings");
      return Member(d, key->s, *n.kids[0]);
    }
    case Node::Type::kList: {
      Value v;
      v.kind = Value::Kind::kList;
      for (const auto& k : n.kids) {
        auto x = Eval(*k, d);
        if (!x.ok()) return x;
        v.list.push_back(std::move(*x));
      }
      return v;
    }
    case Node::Type::kCall: {
      if (n.name == "has") {
        const Node& arg = *n.kids[0];
        if (arg.type != Node::Type::kMember && arg.type != Node::Type::kIndex) {
          return absl::InvalidArgumentError("has() takes a field selection");
        }
        auto v = Eval(arg, d);
        if (v.ok()) return Value::Bool(true);
        if (absl::IsNotFound(v.status())) return Value::Bool(false);
        return v.status();
      }
      auto a = Eval(*n.kids[0], d);
      if (!a.ok()) return a;
      if (n.name == "size") {
        if (a->kind == Value::Kind::kString) return Value::Int(static_cast<int64_t>(a->s.size()));
        if (a->kind == Value::Kind::kList) return Value::Int(static_cast<int64_t>(a->list.size()));
        return absl::InvalidArgumentError(Cat("size() of a ", KindName(a->kind)));
      }
      if (a->kind != Value::Kind::kString) return absl::InvalidArgumentError(Cat(n.name, "() takes a string"));
      return n.name == "quantity" ? QuantityOf(a->s) : VersionOf(a->s);
    }
    case Node::Type::kMethod:
      return Method(n, d);
    case Node::Type::kNot: {
      auto a = Eval(*n.kids[0], d);
      if (!a.ok()) return a;
      if (a->kind != Value::Kind::kBool) return absl::InvalidArgumentError(Cat("! of a ", KindName(a->kind)));
      return Value::Bool(!a->b);
    }
    case Node::Type::kBinary: {
      auto a = Eval(*n.kids[0], d);
      if (n.name == "&&" || n.name == "||") {
        const bool is_and = n.name == "&&";
        // CEL: false && error is false, true || error is true.
        if (a.ok() && a->kind == Value::Kind::kBool && a->b != is_and) return Value::Bool(!is_and);
        auto b = Eval(*n.kids[1], d);
        if (b.ok() && b->kind == Value::Kind::kBool && b->b != is_and) return Value::Bool(!is_and);
        if (!a.ok()) return a;
        if (!b.ok()) return b;
        if (a->kind != Value::Kind::kBool || b->kind != Value::Kind::kBool) {
          return absl::InvalidArgumentError(Cat(n.name, " of a ", KindName(a->kind), " and a ", KindName(b->kind)));
        }
        return Value::Bool(is_and);
      }
      if (!a.ok()) return a;
      auto b = Eval(*n.kids[1], d);
      if (!b.ok()) return b;
      if (n.name == "in") {
        if (b->kind != Value::Kind::kList) return absl::InvalidArgumentError("'in' needs a list on its right");
        for (const auto& x : b->list) {
          if (Equal(*a, x)) return Value::Bool(true);
        }
        return Value::Bool(false);
      }
      if (a->kind != b->kind) {
        return absl::InvalidArgumentError(
            Cat("no such overload: ", KindName(a->kind), " ", n.name, " ", KindName(b->kind)));
      }
      if (n.name == "==") return Value::Bool(Equal(*a, *b));
      if (n.name == "!=") return Value::Bool(!Equal(*a, *b));
      int c = 0;
      if (a->kind == Value::Kind::kInt) {
        c = Compare(a->i, b->i);
      } else if (a->kind == Value::Kind::kString) {
        c = a->s < b->s ? -1 : a->s > b->s ? 1 : 0;
      } else {
        return absl::InvalidArgumentError(Cat("no such overload: ", KindName(a->kind), " ", n.name));
      }
      if (n.name == "<") return Value::Bool(c < 0);
      if (n.name == "<=") return Value::Bool(c <= 0);
      if (n.name == ">") return Value::Bool(c > 0);
      return Value::Bool(c >= 0);
    }
  }
  return absl::InternalError("bad node");
}

}  // namespace

absl::StatusOr<std::shared_ptr<const CelProgram>> CompileCel(std::string_view expression) {
  if (expression.size() > 10 * 1024) return absl::InvalidArgumentError("expression longer than 10 KiB");
  auto tokens = Lex(expression);
  if (!tokens.ok()) {
    return absl::Status(tokens.status().code(),
                        Cat("CEL expression '", expression, "': unsupported: ", tokens.status().message()));
  }
  auto root = Parser(std::move(*tokens)).Parse();
  if (!root.ok()) {
    return absl::Status(root.status().code(), Cat("CEL expression '", expression,
                                                  "': ", absl::IsUnimplemented(root.status()) ? "unsupported: " : "",
                                                  root.status().message()));
  }
  auto p = std::make_shared<CelProgram>();
  p->root = std::move(*root);
  return std::shared_ptr<const CelProgram>(std::move(p));
}

absl::StatusOr<bool> EvalCel(const CelProgram& program, const CelDevice& device) {
  auto v = Eval(*program.root, device);
  if (!v.ok()) return v.status();
  if (v->kind != Value::Kind::kBool) {
    return absl::InvalidArgumentError(Cat("the expression is a ", KindName(v->kind), ", not a bool"));
  }
  return v->b;
}

}  // namespace kgpu::testing
