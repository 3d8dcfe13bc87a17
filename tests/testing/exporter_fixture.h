#pragma once
// Test helper: the exporter's Collector on a simulated node (SimGpus), with a counters CSV (the
// built-in default unless given) and the Hostname label "node-a"; and Family(), the sample lines
// of one metric family in a collection's text.
//
// Thread-safety: use from the test thread.

#include <sstream>
#include <string>
#include <vector>

#include <gtest/gtest.h>

#include "exporter/attribution.h"
#include "exporter/counters.h"
#include "exporter/exporter.h"
#include "testing/sim_gpus.h"

namespace kgpu::testing {

struct ExporterFixture : SimGpus {
  explicit ExporterFixture(const std::string& profile, const std::string& csv = exporter::DefaultCountersCsv())
      : SimGpus(profile) {
    auto c = exporter::ParseCounters(csv, "csv", nullptr);
    EXPECT_TRUE(c.ok()) << c.status();
    if (c.ok()) options.counters = *c;
    options.hostname = "node-a";
  }
  // One collection by a fresh Collector (pod attribution through `attributor` when given).
  std::string Collect(const exporter::PodAttributor* attributor = nullptr) {
    exporter::Collector collector(*lib, inv, options, attributor);
    return collector.Collect();
  }
  exporter::ExporterOptions options;
};

// All sample lines of one family ("name{...} value").
inline std::vector<std::string> Family(const std::string& text, const std::string& name) {
  std::vector<std::string> out;
  std::istringstream in(text);
  for (std::string line; std::getline(in, line);) {
    if (line.rfind(name + "{", 0) == 0) out.push_back(line);
  }
  return out;
}

}  // namespace kgpu::testing
