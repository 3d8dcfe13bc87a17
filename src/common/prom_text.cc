#include "common/prom_text.h"

#include <charconv>
#include <cmath>

namespace kgpu::prom {

void AppendLabelValue(std::string& out, std::string_view v) {
  for (char c : v) {
    if (c == '\\') {
      out += "\\\\";
    } else if (c == '"') {
      out += "\\\"";
    } else if (c == '\n') {
      out += "\\n";
    } else {
      out += c;
    }
  }
}

std::string FormatLabels(const Labels& labels) {
  if (labels.empty()) return "";
  std::string out = "{";
  for (size_t i = 0; i < labels.size(); ++i) {
    if (i > 0) out += ',';
    out += labels[i].first;
    out += "=\"";
    AppendLabelValue(out, labels[i].second);
    out += '"';
  }
  return out + "}";
}

std::string FormatNumber(double v) {
  if (std::isnan(v)) return "NaN";
  if (std::isinf(v)) return v > 0 ? "+Inf" : "-Inf";
  char buf[64];
  // Whole numbers up to 2^53 as integers (counters read "12", not "1.2e+01").
  if (v == std::floor(v) && std::fabs(v) < 9007199254740992.0) {
    const auto r = std::to_chars(buf, buf + sizeof buf, static_cast<long long>(v));
    return std::string(buf, r.ptr);
  }
  const auto r = std::to_chars(buf, buf + sizeof buf, v);  // shortest round-trip
  return std::string(buf, r.ptr);
}

void AppendHeader(std::string& out, std::string_view name, std::string_view type, std::string_view help) {
  out += "# HELP ";
  out += name;
  out += ' ';
  for (char c : help) {
    if (c == '\\') {
      out += "\\\\";
    } else if (c == '\n') {
      out += "\\n";
    } else {
      out += c;
    }
  }
  out += "\n# TYPE ";
  out += name;
  out += ' ';
  out += type;
  out += '\n';
}

void MetricsRegistry::Declare(const std::string& name, Type type, const std::string& help,
                              std::vector<double> buckets) {
  std::lock_guard lock(mu_);
  Family& f = families_[name];
  f.type = type;
  f.help = help;
  f.declared = true;
  f.buckets = std::move(buckets);
}

void MetricsRegistry::Add(const std::string& name, const Labels& labels, double n) {
  std::lock_guard lock(mu_);
  families_[name].values[labels] += n;
}

void MetricsRegistry::Set(const std::string& name, const Labels& labels, double v) {
  std::lock_guard lock(mu_);
  families_[name].values[labels] = v;
}

void MetricsRegistry::Observe(const std::string& name, const Labels& labels, double v) {
  std::lock_guard lock(mu_);
  Family& f = families_[name];
  Histogram& h = f.histograms[labels];
  h.counts.resize(f.buckets.size());
  for (size_t i = 0; i < f.buckets.size(); ++i) {
    if (v <= f.buckets[i]) ++h.counts[i];
  }
  ++h.count;
  h.sum += v;
}

double MetricsRegistry::Get(const std::string& name, const Labels& labels) const {
  std::lock_guard lock(mu_);
  const auto f = families_.find(name);
  if (f == families_.end()) return 0;
  const auto v = f->second.values.find(labels);
  return v == f->second.values.end() ? 0 : v->second;
}

std::string MetricsRegistry::Text() const {
  std::lock_guard lock(mu_);
  std::string out;
  for (const auto& [name, f] : families_) {
    if (!f.declared) {
      AppendHeader(out, name, "untyped", "(kgpu: this family was never declared)");
    } else {
      AppendHeader(out, name,
                   f.type == Type::kCounter     ? "counter"
                   : f.type == Type::kHistogram ? "histogram"
                                                : "gauge",
                   f.help);
    }
    for (const auto& [labels, v] : f.values) {
      out += name;
      out += FormatLabels(labels);
      out += ' ';
      out += FormatNumber(v);
      out += '\n';
    }
    for (const auto& [labels, h] : f.histograms) {
      auto sample = [&](const char* suffix, const Labels& l, const std::string& v) {
        out += name;
        out += suffix;
        out += FormatLabels(l);
        out += ' ';
        out += v;
        out += '\n';
      };
      for (size_t i = 0; i < f.buckets.size(); ++i) {
        Labels l = labels;
        l.emplace_back("le", FormatNumber(f.buckets[i]));
        sample("_bucket", l, std::to_string(i < h.counts.size() ? h.counts[i] : 0));
      }
      Labels inf = labels;
      inf.emplace_back("le", "+Inf");
      sample("_bucket", inf, std::to_string(h.count));
      sample("_sum", labels, FormatNumber(h.sum));
      sample("_count", labels, std::to_string(h.count));
    }
  }
  return out;
}

}  // namespace kgpu::prom
