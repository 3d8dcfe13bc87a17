#include "sched/trace.h"

#include <charconv>
#include <map>
#include <set>

#include "common/csv.h"
#include "common/strings.h"

namespace kgpu::sched {

namespace {

// Blanks around a field are not part of it (the trace's own files have none; hand-written ones do).
std::string_view Trim(std::string_view f) {
  while (!f.empty() && (f.back() == ' ' || f.back() == '\t')) f.remove_suffix(1);
  while (!f.empty() && (f.front() == ' ' || f.front() == '\t')) f.remove_prefix(1);
  return f;
}

std::string Printable(std::string_view s) {
  std::string out;
  for (char c : s.substr(0, 40)) {
    const auto u = static_cast<unsigned char>(c);
    if (u >= 0x20 && u < 0x7f) {
      out.push_back(c);
    } else {
      static const char* hex = "0123456789abcdef";
      out += "\\x";
      out.push_back(hex[u >> 4]);
      out.push_back(hex[u & 15]);
    }
  }
  if (s.size() > 40) out += "...";
  return out;
}

// The CSV as encoding/csv reads it (common/csv.h: quotes, "" and \r\n; a byte-order mark skipped),
// every row with the header's number of fields: a row with a field missing, or with a comma that
// should have been quoted, is an error naming its line rather than values read from the wrong
// columns.
CsvOptions TraceCsvOptions() {
  CsvOptions o;
  o.fields_per_record = 0;
  o.header = true;
  return o;
}

// Rows read one at a time from the reader (no copy of the text: traces run to 10^5 rows and more);
// fields by header name, blanks around them trimmed.
class Table {
 public:
  Table(std::string_view text, std::string_view source) : source_(source), reader_(text, source, TraceCsvOptions()) {}

  absl::Status Open(const std::vector<std::string>& required, std::string_view kind) {
    auto header = reader_.Next();
    if (!header.ok()) return header.status();
    if (!*header) {
      return absl::InvalidArgumentError(
          Cat(source_, ": empty; a ", kind, " CSV starts with the header ", Join(required, ",")));
    }
    line_ = reader_.line();
    for (size_t i = 0; i < reader_.size(); ++i) {
      const std::string h(Trim(reader_.field(i)));
      if (!h.empty()) columns_.emplace(h, i);
    }
    for (const auto& r : required) {
      if (!columns_.contains(r)) {
        return absl::InvalidArgumentError(Cat(source_, ":", line_, ": the header has no column '", r, "' (a ", kind,
                                              " CSV needs ", Join(required, ","), ")"));
      }
    }
    return absl::OkStatus();
  }
  bool Has(const std::string& col) const { return columns_.contains(col); }
  // The next row: true, false after the last one, or the reader's error ("<source>:<line>:<column>: ...").
  absl::StatusOr<bool> Next() {
    auto more = reader_.Next();
    if (!more.ok() || !*more) return more;
    line_ = reader_.line();
    fields_.clear();
    for (const std::string_view f : reader_.fields()) fields_.push_back(Trim(f));
    return true;
  }
  std::string_view Field(const std::string& col) const {
    auto it = columns_.find(col);
    if (it == columns_.end() || it->second >= fields_.size()) return {};
    return fields_[it->second];
  }
  absl::StatusOr<int64_t> Int(const std::string& col, int64_t max, bool empty_ok, int64_t empty_value) const {
    const auto f = Field(col);
    if (f.empty()) {
      if (empty_ok) return empty_value;
      return Error(col, "is empty (a non-negative integer is needed)");
    }
    int64_t v = 0;
    auto [p, ec] = std::from_chars(f.data(), f.data() + f.size(), v);
    if (ec != std::errc() || p != f.data() + f.size() || v < 0) {
      return Error(col, Cat("'", Printable(f), "' is not a non-negative integer"));
    }
    if (v > max) return Error(col, Cat(v, " is out of range (at most ", max, ")"));
    return v;
  }
  absl::Status Error(const std::string& col, const std::string& what) const {
    return absl::InvalidArgumentError(Cat(source_, ":", line_, ": column '", col, "': ", what));
  }
  int line() const { return line_; }
  const std::string& source() const { return source_; }

 private:
  std::string source_;
  CsvReader reader_;
  std::map<std::string, size_t> columns_;
  std::vector<std::string_view> fields_;  // into the reader's current record
  int line_ = 0;
};

constexpr int64_t kMaxCpu = int64_t{1} << 40;
constexpr int64_t kMaxGpus = 1024;

bool ValidName(std::string_view s) {
  for (char c : s) {
    const auto u = static_cast<unsigned char>(c);
    if (u < 0x21 || u > 0x7e || c == '|') return false;
  }
  return !s.empty();
}

}  // namespace

int64_t KnownGpuMemoryMib(std::string_view model) {
  static const std::map<std::string_view, int64_t> kMemory = {{"P100", 16384}, {"V100M16", 16384}, {"V100M32", 32768},
                                                              {"T4", 15360},   {"A10", 24576},     {"A100", 81920},
                                                              {"H100", 81920}, {"H200", 143771},   {"L4", 23034}};
  auto it = kMemory.find(model);
  return it == kMemory.end() ? 0 : it->second;
}

absl::StatusOr<std::vector<NodeSpec>> ParseNodesCsv(std::string_view text, std::string_view source) {
  Table t(text, source);
  if (auto open = t.Open({"sn", "cpu_milli", "memory_mib", "gpu", "model"}, "node"); !open.ok()) return open;
  std::vector<NodeSpec> out;
  std::set<std::string, std::less<>> names;
  while (true) {
    auto more = t.Next();
    if (!more.ok()) return more.status();
    if (!*more) break;
    NodeSpec n;
    n.name = std::string(t.Field("sn"));
    if (!ValidName(n.name)) return t.Error("sn", Cat("'", Printable(n.name), "' is not a node name"));
    if (!names.insert(n.name).second) return t.Error("sn", Cat("node ", n.name, " appears twice"));
    auto cpu = t.Int("cpu_milli", kMaxCpu, false, 0);
    if (!cpu.ok()) return cpu.status();
    auto mem = t.Int("memory_mib", kMaxCpu, false, 0);
    if (!mem.ok()) return mem.status();
    auto gpus = t.Int("gpu", kMaxGpus, true, 0);
    if (!gpus.ok()) return gpus.status();
    const std::string model(t.Field("model"));
    if (*gpus > 0 && !ValidName(model)) {
      return t.Error("model", Cat("'", Printable(model), "' is not a GPU model (a node with GPUs needs one)"));
    }
    n.cpu_milli = *cpu;
    n.memory_mib = *mem;
    for (int64_t g = 0; g < *gpus; ++g) {
      GpuSpec gs;
      gs.model = model;
      gs.memory_mib = KnownGpuMemoryMib(model);
      n.gpus.push_back(gs);
    }
    out.push_back(std::move(n));
  }
  if (out.empty()) return absl::InvalidArgumentError(Cat(source, ": no nodes after the header"));
  return out;
}

absl::StatusOr<std::vector<TracePod>> ParsePodsCsv(std::string_view text, std::string_view source) {
  Table t(text, source);
  if (auto open = t.Open({"name", "cpu_milli", "memory_mib", "num_gpu"}, "pod"); !open.ok()) return open;
  std::vector<TracePod> out;
  std::set<std::string, std::less<>> names;
  const bool has_milli = t.Has("gpu_milli");
  while (true) {
    auto more = t.Next();
    if (!more.ok()) return more.status();
    if (!*more) break;
    TracePod p;
    auto& q = p.request;
    q.name = std::string(t.Field("name"));
    if (!ValidName(q.name)) return t.Error("name", Cat("'", Printable(q.name), "' is not a pod name"));
    if (!names.insert(q.name).second) return t.Error("name", Cat("pod ", q.name, " appears twice"));
    auto cpu = t.Int("cpu_milli", kMaxCpu, false, 0);
    if (!cpu.ok()) return cpu.status();
    auto mem = t.Int("memory_mib", kMaxCpu, false, 0);
    if (!mem.ok()) return mem.status();
    auto num = t.Int("num_gpu", kMaxGpus, true, 0);
    if (!num.ok()) return num.status();
    auto milli = has_milli ? t.Int("gpu_milli", kMaxCpu, true, 0) : absl::StatusOr<int64_t>(0);
    if (!milli.ok()) return milli.status();
    q.cpu_milli = *cpu;
    q.memory_mib = *mem;
    q.num_gpus = static_cast<int>(*num);
    if (q.num_gpus > 0) {
      // Per GPU, capped at a whole GPU; absent (or 0) means whole GPUs; several GPUs are whole.
      int64_t m = *milli;
      if (m <= 0 || m > kMilli || q.num_gpus > 1) m = kMilli;
      q.gpu_milli = static_cast<int>(m);
    }
    p.gpu_spec = std::string(t.Field("gpu_spec"));
    size_t start = 0;
    while (start <= p.gpu_spec.size() && !p.gpu_spec.empty()) {
      const size_t bar = p.gpu_spec.find('|', start);
      std::string m = p.gpu_spec.substr(start, bar == std::string::npos ? std::string::npos : bar - start);
      if (!m.empty()) {
        if (!ValidName(m)) return t.Error("gpu_spec", Cat("'", Printable(m), "' is not a GPU model"));
        q.allowed_models.push_back(m);
      }
      if (bar == std::string::npos) break;
      start = bar + 1;
    }
    if (t.Has("creation_time")) {
      auto c = t.Int("creation_time", kMaxCpu, true, -1);
      if (!c.ok()) return c.status();
      p.creation = *c;
    }
    if (t.Has("deletion_time")) {
      auto d = t.Int("deletion_time", kMaxCpu, true, -1);
      if (!d.ok()) return d.status();
      p.deletion = *d;
    }
    out.push_back(std::move(p));
  }
  if (out.empty()) return absl::InvalidArgumentError(Cat(source, ": no pods after the header"));
  return out;
}

}  // namespace kgpu::sched
