// common/: the listen-address reader every kgpu server uses, and the Prometheus text writer.

#include <limits>
#include <string>

#include <gtest/gtest.h>

#include "common/backoff.h"
#include "common/duration.h"
#include "common/listen_address.h"
#include "common/prom_text.h"

namespace kgpu {
namespace {

TEST(ListenAddress, EveryFormGoAndDcgmExporterAccept) {
  struct Case {
    const char* value;
    const char* host;
    int port;
  };
  for (const Case& c : {Case{"0.0.0.0:9400", "0.0.0.0", 9400}, Case{":9400", "0.0.0.0", 9400},
                        Case{"9400", "0.0.0.0", 9400}, Case{"[::]:18889", "::", 18889}, Case{"[::1]:8443", "::1", 8443},
                        Case{"localhost:65535", "localhost", 65535}, Case{"127.0.0.1:0", "127.0.0.1", 0}}) {
    auto a = ParseListenAddress("--address", c.value);
    ASSERT_TRUE(a.ok()) << c.value << ": " << a.status();
    EXPECT_EQ(a->host, c.host) << c.value;
    EXPECT_EQ(a->port, c.port) << c.value;
  }
}

TEST(ListenAddress, UrlHostBracketsOnlyIpv6) {
  EXPECT_EQ(UrlHost("10.0.0.5"), "10.0.0.5");
  EXPECT_EQ(UrlHost("kgpu-extender.kgpu-system.svc"), "kgpu-extender.kgpu-system.svc");
  EXPECT_EQ(UrlHost("fd00::5"), "[fd00::5]");
  EXPECT_EQ(UrlHost("::1"), "[::1]");
}

TEST(ListenAddress, ImpossibleAddressesNameTheFlagAndTheForm) {
  struct Case {
    const char* value;
    const char* why;
  };
  for (const Case& c :
       {Case{":99999", "the port must be 1-65535"}, Case{":70000", "the port must be 1-65535"},
        Case{":-1", "the port must be 1-65535"}, Case{"host:", "the port is missing"}, Case{"", "the port is missing"},
        Case{"a:b", "the port is not a number"}, Case{"1.2.3.4:80x", "the port is not a number"},
        Case{"::1:80", "must be written in brackets"}, Case{"[::1:80", "is not closed with ]"},
        Case{"[::1]80", "the port after ]: is missing"}, Case{"[]:80", "empty IPv6 address"}}) {
    auto a = ParseListenAddress("-a/--address", c.value);
    ASSERT_FALSE(a.ok()) << c.value;
    EXPECT_TRUE(absl::IsInvalidArgument(a.status())) << a.status();
    const std::string m(a.status().message());
    EXPECT_EQ(m.rfind(std::string("-a/--address '") + c.value + "': ", 0), 0u) << m;
    EXPECT_NE(m.find(c.why), std::string::npos) << m;
    EXPECT_NE(m.find("e.g. 0.0.0.0:9400"), std::string::npos) << m;
  }
}

TEST(PromText, NumbersReadBackAsTheSameDouble) {
  EXPECT_EQ(prom::FormatNumber(0), "0");
  EXPECT_EQ(prom::FormatNumber(12), "12");
  EXPECT_EQ(prom::FormatNumber(-3), "-3");
  EXPECT_EQ(prom::FormatNumber(1e15), "1000000000000000");
  EXPECT_EQ(prom::FormatNumber(0.1), "0.1");
  EXPECT_EQ(prom::FormatNumber(0.00025), "0.00025");
  EXPECT_EQ(prom::FormatNumber(1234567.125), "1234567.125");  // "%g" printed 1.23457e+06
  EXPECT_EQ(prom::FormatNumber(1e300), "1e+300");
  EXPECT_EQ(prom::FormatNumber(std::numeric_limits<double>::infinity()), "+Inf");
  EXPECT_EQ(prom::FormatNumber(-std::numeric_limits<double>::infinity()), "-Inf");
  EXPECT_EQ(prom::FormatNumber(std::numeric_limits<double>::quiet_NaN()), "NaN");
  for (double v : {0.1, 1.0 / 3, 2.5e-7, 123456789.987654321}) {
    EXPECT_EQ(std::stod(prom::FormatNumber(v)), v) << prom::FormatNumber(v);
  }
}

TEST(PromText, LabelValuesAndHelpAreEscaped) {
  EXPECT_EQ(prom::FormatLabels({}), "");
  EXPECT_EQ(prom::FormatLabels({{"a", "x\"y"}, {"b", "back\\slash\nnew"}}), R"({a="x\"y",b="back\\slash\nnew"})");
  std::string out;
  prom::AppendHeader(out, "m", "gauge", "two\nlines \\ one");
  EXPECT_EQ(out, "# HELP m two\\nlines \\\\ one\n# TYPE m gauge\n");
}

TEST(PromText, TheRegistryWritesEveryFamilyWithHelpAndType) {
  using T = prom::MetricsRegistry::Type;
  prom::MetricsRegistry r;
  r.Declare("x_total", T::kCounter, "Things.");
  r.Declare("up", T::kGauge, "Up.");
  r.Declare("never_total", T::kCounter, "Declared, no sample yet.");
  r.Declare("lat_seconds", T::kHistogram, "Latency.", {0.001, 0.1});
  r.Add("x_total", {{"kind", "a"}});
  r.Add("x_total", {{"kind", "a"}}, 2);
  r.Add("x_total", {{"kind", "b\"q"}});
  r.Set("up", 1);
  r.Observe("lat_seconds", {{"verb", "filter"}}, 0.0009765625);  // 2^-10: sums exactly
  r.Observe("lat_seconds", {{"verb", "filter"}}, 0.0625);
  r.Observe("lat_seconds", {{"verb", "filter"}}, 3);
  EXPECT_EQ(r.Get("x_total", {{"kind", "a"}}), 3);
  EXPECT_EQ(r.Get("x_total", {{"kind", "zzz"}}), 0);
  EXPECT_EQ(r.Text(),
            "# HELP lat_seconds Latency.\n# TYPE lat_seconds histogram\n"
            "lat_seconds_bucket{verb=\"filter\",le=\"0.001\"} 1\n"
            "lat_seconds_bucket{verb=\"filter\",le=\"0.1\"} 2\n"
            "lat_seconds_bucket{verb=\"filter\",le=\"+Inf\"} 3\n"
            "lat_seconds_sum{verb=\"filter\"} 3.0634765625\n"
            "lat_seconds_count{verb=\"filter\"} 3\n"
            "# HELP never_total Declared, no sample yet.\n# TYPE never_total counter\n"
            "# HELP up Up.\n# TYPE up gauge\nup 1\n"
            "# HELP x_total Things.\n# TYPE x_total counter\n"
            "x_total{kind=\"a\"} 3\nx_total{kind=\"b\\\"q\"} 1\n");
}

TEST(Backoff, DoublesToItsCapWithJitterAndResets) {
  using std::chrono::milliseconds;
  Backoff plain(milliseconds(100), milliseconds(1000));
  EXPECT_EQ(plain.Next(), milliseconds(100));
  EXPECT_EQ(plain.Next(), milliseconds(200));
  EXPECT_EQ(plain.Next(), milliseconds(400));
  EXPECT_EQ(plain.Next(), milliseconds(800));
  EXPECT_EQ(plain.Next(), milliseconds(1000));
  EXPECT_EQ(plain.Next(), milliseconds(1000));
  plain.Reset();
  EXPECT_EQ(plain.current(), milliseconds(100));
  Backoff jittered(milliseconds(100), milliseconds(100000), 0.5);
  for (int i = 0; i < 8; ++i) {
    const milliseconds base = jittered.current();
    const milliseconds wait = jittered.Next();
    EXPECT_GE(wait, base);
    EXPECT_LE(wait, base * 3 / 2);
  }
}

TEST(Backoff, RetryAfterIsSecondsOnly) {
  using std::chrono::milliseconds;
  EXPECT_EQ(RetryAfter("3", std::chrono::seconds(10)), milliseconds(3000));
  EXPECT_EQ(RetryAfter(" 0 ", std::chrono::seconds(10)), milliseconds(0));
  EXPECT_EQ(RetryAfter("120", std::chrono::seconds(10)), milliseconds(10000));
  EXPECT_EQ(RetryAfter("", std::chrono::seconds(10)), std::nullopt);
  EXPECT_EQ(RetryAfter("-1", std::chrono::seconds(10)), std::nullopt);
  EXPECT_EQ(RetryAfter("Wed, 21 Oct 2015 07:28:00 GMT", std::chrono::seconds(10)), std::nullopt);
}

TEST(GoDuration, ReadsWhatGoWritesAndWritesItBack) {
  using std::chrono::nanoseconds;
  struct Case {
    const char* text;
    int64_t ns;
  };
  for (const Case& c : {Case{"0", 0}, Case{"0s", 0}, Case{"15s", 15'000'000'000}, Case{"2m", 120'000'000'000},
                        Case{"1h30m", 5'400'000'000'000}, Case{"1.5h", 5'400'000'000'000}, Case{"250ms", 250'000'000},
                        Case{"10us", 10'000}, Case{"10\xC2\xB5s", 10'000}, Case{"7ns", 7}, Case{"-1m", -60'000'000'000},
                        Case{"2h45m0.5s", 9'900'500'000'000}}) {
    auto d = ParseGoDuration("--x", c.text);
    ASSERT_TRUE(d.ok()) << c.text << ": " << d.status();
    EXPECT_EQ(d->count(), c.ns) << c.text;
  }
  EXPECT_EQ(FormatGoDuration(nanoseconds(0)), "0s");
  EXPECT_EQ(FormatGoDuration(nanoseconds(90'000'000'000)), "1m30s");
  EXPECT_EQ(FormatGoDuration(nanoseconds(3'600'000'000'000)), "1h0m0s");
  EXPECT_EQ(FormatGoDuration(nanoseconds(250'000'000)), "250ms");
  EXPECT_EQ(FormatGoDuration(nanoseconds(1'500'000'000)), "1.5s");
  for (const char* bad : {"", "5", "5x", "m", "1.2.3s", "s5", "5 s"}) {
    auto d = ParseGoDuration("--lease-duration", bad);
    ASSERT_FALSE(d.ok()) << bad;
    EXPECT_NE(std::string(d.status().message()).find("--lease-duration '"), std::string::npos) << d.status();
    EXPECT_NE(std::string(d.status().message()).find("such as 30s, 5m"), std::string::npos) << d.status();
  }
}

}  // namespace
}  // namespace kgpu
