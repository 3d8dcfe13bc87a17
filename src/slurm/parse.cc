#include "slurm/parse.h"

#include <cctype>
#include <charconv>
#include <ctime>

#include "common/strings.h"

namespace kgpu::slurm {
namespace {

constexpr size_t kMaxHosts = 100000;

bool IsKeyStart(std::string_view token) {
  const auto eq = token.find('=');
  if (eq == std::string_view::npos || eq == 0) return false;
  for (size_t i = 0; i < eq; ++i) {
    const unsigned char c = static_cast<unsigned char>(token[i]);
    if (!std::isalnum(c) && c != '_') return false;
  }
  return std::isalpha(static_cast<unsigned char>(token[0])) != 0;
}

std::vector<std::string_view> SplitOn(std::string_view s, char sep) {
  std::vector<std::string_view> out;
  size_t start = 0;
  for (size_t i = 0; i <= s.size(); ++i) {
    if (i == s.size() || s[i] == sep) {
      out.push_back(s.substr(start, i - start));
      start = i + 1;
    }
  }
  return out;
}

int ToInt(std::string_view s) {
  int v = 0;
  std::from_chars(s.data(), s.data() + s.size(), v);
  return v;
}

// "", "(null)", "N/A": Slurm's ways of printing nothing.
bool NoValue(std::string_view s) {
  return s.empty() || s == "(null)" || s == "N/A";
}

// "a,b" -> {"a","b"}; nothing for NoValue.
std::set<std::string> CommaSet(std::string_view s) {
  std::set<std::string> out;
  if (NoValue(s)) return out;
  for (std::string_view part : SplitOn(s, ',')) {
    if (!part.empty()) out.insert(std::string(part));
  }
  return out;
}

}  // namespace

absl::StatusOr<std::vector<SlurmNode>> ParseScontrolNodes(std::string_view text) {
  std::vector<SlurmNode> nodes;
  size_t line_no = 0;
  for (std::string_view line : SplitOn(text, '\n')) {
    ++line_no;
    while (!line.empty() && (line.back() == '\r' || line.back() == ' ')) line.remove_suffix(1);
    if (line.empty()) continue;
    if (line.substr(0, 9) != "NodeName=") {
      return absl::InvalidArgumentError(Cat("scontrol show node -o: line ", line_no,
                                            " is not a node record (expected NodeName=...): '",
                                            Printable(std::string(line.substr(0, 80))), "'"));
    }
    SlurmNode n;
    // Reason= runs to the end of the line.
    std::string_view reason_part;
    if (const auto r = line.find(" Reason="); r != std::string_view::npos) {
      reason_part = line.substr(r + 8);
      line = line.substr(0, r);
    }
    std::string key, value;
    auto flush = [&] {
      if (key == "NodeName")
        n.name = value;
      else if (key == "State")
        n.state = value;
      else if (key == "Gres")
        n.gres = value;
      else if (key == "CPUAlloc")
        n.cpu_alloc = ToInt(value);
      else if (key == "CPUTot")
        n.cpu_total = ToInt(value);
      else if (key == "Partitions")
        n.partitions = CommaSet(value);
      else if (key == "AvailableFeatures" || key == "ActiveFeatures")
        n.features.merge(CommaSet(value));
      key.clear();
      value.clear();
    };
    for (std::string_view tok : SplitOn(line, ' ')) {
      if (tok.empty()) continue;
      if (IsKeyStart(tok)) {
        flush();
        const auto eq = tok.find('=');
        key = std::string(tok.substr(0, eq));
        value = std::string(tok.substr(eq + 1));
      } else if (!key.empty()) {
        value += ' ';
        value += tok;
      }
    }
    flush();
    if (n.name.empty() || n.state.empty()) {
      return absl::InvalidArgumentError(
          Cat("scontrol show node -o: line ", line_no, " has no ", n.name.empty() ? "NodeName" : "State", " value"));
    }
    const auto parts = SplitOn(n.state, '+');
    n.base = std::string(parts[0]);
    // 22.05 prints some states with a trailing marker ("IDLE*" in old releases); keep letters only.
    while (!n.base.empty() && !std::isalpha(static_cast<unsigned char>(n.base.back()))) n.base.pop_back();
    for (size_t i = 1; i < parts.size(); ++i) {
      if (!parts[i].empty()) n.flags.insert(std::string(parts[i]));
    }
    if (!reason_part.empty()) {
      std::string_view r = reason_part;
      if (r.back() == ']') {
        if (const auto open = r.rfind(" ["); open != std::string_view::npos) {
          const std::string_view who = r.substr(open + 2, r.size() - open - 3);
          if (const auto at = who.find('@'); at != std::string_view::npos) {
            n.reason_user = std::string(who.substr(0, at));
            n.reason_time = std::string(who.substr(at + 1));
          }
          r = r.substr(0, open);
        }
      }
      n.reason = std::string(r);
    }
    nodes.push_back(std::move(n));
  }
  return nodes;
}

std::optional<int64_t> ParseSlurmTime(std::string_view text) {
  if (text.size() < 19 || text[4] != '-' || text[10] != 'T') return std::nullopt;
  std::tm tm{};
  const std::string s(text.substr(0, 19));
  if (::strptime(s.c_str(), "%Y-%m-%dT%H:%M:%S", &tm) == nullptr) return std::nullopt;
  tm.tm_isdst = -1;
  const time_t t = ::mktime(&tm);
  if (t == static_cast<time_t>(-1)) return std::nullopt;
  return static_cast<int64_t>(t);
}

absl::StatusOr<std::vector<SlurmJob>> ParseSqueue(std::string_view text) {
  std::vector<SlurmJob> jobs;
  size_t line_no = 0;
  for (std::string_view line : SplitOn(text, '\n')) {
    ++line_no;
    while (!line.empty() && (line.back() == '\r' || line.back() == ' ')) line.remove_suffix(1);
    if (line.empty()) continue;
    auto f = SplitOn(line, '|');
    if (f.size() < kSqueueFields) {
      return absl::InvalidArgumentError(Cat("squeue -o '", kSqueueFormat, "': line ", line_no, " has ", f.size(),
                                            " fields, expected ", kSqueueFields, ": '",
                                            Printable(std::string(line.substr(0, 80))), "'"));
    }
    // %f, last, may hold '|' (an OR of features): the rest of the line.
    const std::string_view features = line.substr(static_cast<size_t>(f[kSqueueFields - 1].data() - line.data()));
    SlurmJob j;
    j.id = std::string(f[0]);
    j.state = std::string(f[1]);
    auto hostlist = [&](std::string_view field, std::vector<std::string>& to) -> absl::Status {
      if (NoValue(field)) return absl::OkStatus();
      auto hosts = ExpandHostlist(field);
      if (!hosts.ok()) {
        return absl::InvalidArgumentError(Cat("squeue: line ", line_no, ": ", hosts.status().message()));
      }
      to = std::move(*hosts);
      return absl::OkStatus();
    };
    for (const auto& [field, to] :
         {std::pair{f[2], &j.nodes}, std::pair{f[8], &j.required_nodes}, std::pair{f[9], &j.excluded_nodes}}) {
      if (auto st = hostlist(field, *to); !st.ok()) return st;
    }
    j.node_count = ToInt(f[3]);
    j.reason = std::string(f[4]);
    j.end_time = ParseSlurmTime(f[5]);
    j.partition = std::string(f[6]);
    j.submit_time = ParseSlurmTime(f[7]);
    if (!NoValue(f[10])) j.gres = std::string(f[10]);
    if (!NoValue(features)) j.features = std::string(features);
    if (j.id.empty() || j.state.empty()) {
      return absl::InvalidArgumentError(Cat("squeue: line ", line_no, " has no job id or state"));
    }
    jobs.push_back(std::move(j));
  }
  return jobs;
}

namespace {

bool PlainName(std::string_view s) {
  if (s.empty()) return false;
  for (char c : s) {
    const unsigned char u = static_cast<unsigned char>(c);
    if (!std::isalnum(u) && c != '_' && c != '-' && c != '.') return false;
  }
  return true;
}

// "8", "4K" (Slurm's suffixes: powers of 1024); nullopt when not a count.
std::optional<int64_t> GresCount(std::string_view s) {
  if (s.empty()) return std::nullopt;
  int64_t mult = 1;
  switch (s.back()) {
    case 'k':
    case 'K':
      mult = int64_t{1} << 10;
      break;
    case 'm':
    case 'M':
      mult = int64_t{1} << 20;
      break;
    case 'g':
    case 'G':
      mult = int64_t{1} << 30;
      break;
    case 't':
    case 'T':
      mult = int64_t{1} << 40;
      break;
    default:
      break;
  }
  if (mult != 1) s.remove_suffix(1);
  if (s.empty() || s.size() > 12) return std::nullopt;
  int64_t v = 0;
  const auto [end, ec] = std::from_chars(s.data(), s.data() + s.size(), v);
  if (ec != std::errc() || end != s.data() + s.size() || v < 0 || v > INT64_MAX / mult) return std::nullopt;
  return v * mult;
}

struct GresItem {
  std::string name, type;
  int64_t count = 1;
};

// One "name[:type][:count]" (count optional: 1), after any "gres:"/"gres/" prefix; '=' before the
// count as TRES strings write it. "no_consume" is a flag, not a type.
std::optional<GresItem> ParseGresItem(std::string_view item) {
  if (item.rfind("gres:", 0) == 0 || item.rfind("gres/", 0) == 0) item.remove_prefix(5);
  std::string text(item);
  std::replace(text.begin(), text.end(), '=', ':');
  std::vector<std::string_view> parts = SplitOn(text, ':');
  GresItem g;
  if (parts.empty() || parts[0].empty()) return std::nullopt;
  g.name = std::string(parts[0]);
  size_t last = parts.size();
  if (parts.size() > 1) {
    auto c = GresCount(parts.back());
    if (c) {
      g.count = *c;
      --last;
    }
  }
  for (size_t i = 1; i < last; ++i) {
    if (parts[i] == "no_consume") continue;
    if (parts[i].empty() || !g.type.empty()) return std::nullopt;
    g.type = std::string(parts[i]);
  }
  if (!PlainName(g.name) || (!g.type.empty() && !PlainName(g.type))) return std::nullopt;
  return g;
}

// Splits on ',' outside parentheses ("gpu:h100:4(S:0,1),mps:400").
std::vector<std::string_view> SplitTopLevel(std::string_view s) {
  std::vector<std::string_view> out;
  int depth = 0;
  size_t start = 0;
  for (size_t i = 0; i <= s.size(); ++i) {
    if (i < s.size() && s[i] == '(') ++depth;
    if (i < s.size() && s[i] == ')') --depth;
    if (i == s.size() || (s[i] == ',' && depth <= 0)) {
      out.push_back(s.substr(start, i - start));
      start = i + 1;
    }
  }
  return out;
}

}  // namespace

std::optional<bool> FeaturesMatch(std::string_view expr, const std::set<std::string>& features) {
  if (NoValue(expr)) return true;
  const bool any_of = expr.find('|') != std::string_view::npos;
  const bool all_of = expr.find('&') != std::string_view::npos || expr.find(',') != std::string_view::npos;
  if (any_of && all_of) return std::nullopt;  // precedence we do not model
  std::string text(expr);
  if (all_of) std::replace(text.begin(), text.end(), '&', ',');
  const char sep = any_of ? '|' : ',';
  bool have_any = false, have_all = true;
  for (std::string_view name : SplitOn(text, sep)) {
    // Brackets, counts (*N), parentheses, '!', and anything else that is no plain name.
    if (!PlainName(name)) return std::nullopt;
    const bool has = features.count(std::string(name)) > 0;
    have_any = have_any || has;
    have_all = have_all && has;
  }
  return any_of ? have_any : have_all;
}

std::optional<bool> GresFits(std::string_view request, std::string_view node_gres) {
  if (NoValue(request)) return true;
  std::vector<GresItem> have;
  if (!NoValue(node_gres)) {
    for (std::string_view item : SplitTopLevel(node_gres)) {
      if (const auto p = item.find('('); p != std::string_view::npos) item = item.substr(0, p);
      if (item.empty()) continue;
      auto g = ParseGresItem(item);
      if (!g) return std::nullopt;
      have.push_back(std::move(*g));
    }
  }
  for (std::string_view item : SplitTopLevel(request)) {
    if (item.empty()) continue;
    // tres_per_node holds GRES only; anything else ("license/x=1") is beyond us.
    if (item.rfind("gres", 0) == 0 && item.size() > 4 && item[4] != ':' && item[4] != '/') return std::nullopt;
    auto want = ParseGresItem(item);
    if (!want) return std::nullopt;
    int64_t got = 0;
    for (const auto& h : have) {
      if (h.name == want->name && (want->type.empty() || h.type == want->type)) got += h.count;
    }
    if (got < want->count) return false;
  }
  return true;
}

bool JobMayUse(const SlurmJob& job, const SlurmNode& node) {
  if (!job.partition.empty() && !node.partitions.empty()) {
    bool in = false;
    for (std::string_view p : SplitOn(job.partition, ',')) in = in || node.partitions.count(std::string(p)) > 0;
    if (!in) return false;
  }
  auto has = [&](const std::vector<std::string>& v) { return std::find(v.begin(), v.end(), node.name) != v.end(); };
  if (has(job.excluded_nodes)) return false;
  if (!job.required_nodes.empty() && !has(job.required_nodes)) return false;
  if (FeaturesMatch(job.features, node.features) == std::optional<bool>(false)) return false;
  if (GresFits(job.gres, node.gres) == std::optional<bool>(false)) return false;
  return true;
}

namespace {

// One item (no top-level commas): literal text and [ranges] groups, their product.
absl::Status ExpandItem(std::string_view expr, size_t offset, std::string_view item, std::vector<std::string>& out) {
  std::vector<std::string> acc = {""};
  size_t i = 0;
  while (i < item.size()) {
    if (item[i] == ']') {
      return absl::InvalidArgumentError(
          Cat("hostlist '", Printable(std::string(expr)), "': unmatched ']' at position ", offset + i + 1));
    }
    if (item[i] != '[') {
      const size_t next = item.find('[', i);
      const std::string_view lit = item.substr(i, next == std::string_view::npos ? std::string_view::npos : next - i);
      if (lit.find(']') != std::string_view::npos) {
        return absl::InvalidArgumentError(Cat("hostlist '", Printable(std::string(expr)),
                                              "': unmatched ']' at position ", offset + i + lit.find(']') + 1));
      }
      for (auto& a : acc) a += lit;
      i += lit.size();
      continue;
    }
    const size_t close = item.find(']', i);
    if (close == std::string_view::npos) {
      return absl::InvalidArgumentError(
          Cat("hostlist '", Printable(std::string(expr)), "': '[' at position ", offset + i + 1, " is not closed"));
    }
    const std::string_view body = item.substr(i + 1, close - i - 1);
    std::vector<std::string> suffixes;
    for (std::string_view r : SplitOn(body, ',')) {
      const auto dash = r.find('-');
      const std::string_view lo = r.substr(0, dash);
      const std::string_view hi = dash == std::string_view::npos ? lo : r.substr(dash + 1);
      auto digits = [](std::string_view s) {
        if (s.empty() || s.size() > 9) return false;
        for (char c : s) {
          if (!std::isdigit(static_cast<unsigned char>(c))) return false;
        }
        return true;
      };
      if (!digits(lo) || !digits(hi)) {
        return absl::InvalidArgumentError(Cat("hostlist '", Printable(std::string(expr)), "': range '",
                                              Printable(std::string(r)), "' at position ", offset + i + 2,
                                              " must be N or N-M with decimal numbers"));
      }
      const long a = std::stol(std::string(lo)), b = std::stol(std::string(hi));
      if (b < a) {
        return absl::InvalidArgumentError(Cat("hostlist '", Printable(std::string(expr)), "': range '",
                                              Printable(std::string(r)), "' goes backwards"));
      }
      if (static_cast<size_t>(b - a + 1) * acc.size() + suffixes.size() > kMaxHosts) {
        return absl::InvalidArgumentError(
            Cat("hostlist '", Printable(std::string(expr)), "': expands to more than ", kMaxHosts, " hosts"));
      }
      const int width = static_cast<int>(lo.size());
      for (long v = a; v <= b; ++v) {
        std::string num = std::to_string(v);
        if (static_cast<int>(num.size()) < width) num.insert(0, static_cast<size_t>(width) - num.size(), '0');
        suffixes.push_back(std::move(num));
      }
    }
    std::vector<std::string> next;
    if (acc.size() * suffixes.size() > kMaxHosts) {
      return absl::InvalidArgumentError(
          Cat("hostlist '", Printable(std::string(expr)), "': expands to more than ", kMaxHosts, " hosts"));
    }
    for (const auto& a : acc) {
      for (const auto& s : suffixes) next.push_back(a + s);
    }
    acc = std::move(next);
    i = close + 1;
  }
  for (auto& a : acc) {
    if (a.empty()) continue;
    if (out.size() >= kMaxHosts) {
      return absl::InvalidArgumentError(
          Cat("hostlist '", Printable(std::string(expr)), "': expands to more than ", kMaxHosts, " hosts"));
    }
    out.push_back(std::move(a));
  }
  return absl::OkStatus();
}

}  // namespace

absl::StatusOr<std::vector<std::string>> ExpandHostlist(std::string_view expr) {
  std::vector<std::string> out;
  int depth = 0;
  size_t start = 0;
  for (size_t i = 0; i <= expr.size(); ++i) {
    if (i < expr.size() && expr[i] == '[') ++depth;
    if (i < expr.size() && expr[i] == ']') --depth;
    if (i == expr.size() || (expr[i] == ',' && depth <= 0)) {
      std::string_view item = expr.substr(start, i - start);
      while (!item.empty() && item.front() == ' ') item.remove_prefix(1);
      while (!item.empty() && item.back() == ' ') item.remove_suffix(1);
      if (!item.empty()) {
        if (auto s = ExpandItem(expr, start, item, out); !s.ok()) return s;
      }
      start = i + 1;
      depth = 0;
    }
  }
  return out;
}

}  // namespace kgpu::slurm
