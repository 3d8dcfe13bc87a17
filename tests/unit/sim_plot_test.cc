// kgpu sim's picture (cli/sim_cmd.h RenderSvg): where every policy draws the same diagonal the
// plot is one panel; where they part, a zoomed panel of that range follows, and the legend says
// how many GPUs each policy leaves unallocated at 130 % demand.
#include <gtest/gtest.h>

#include "cli/sim_cmd.h"

namespace kgpu::cli {
namespace {

// A run whose allocation follows demand up to `knee` %, then stays at `plateau`.
sched::ReplayResult Curve(const std::string& policy, int knee, double plateau) {
  sched::ReplayResult r;
  r.policy = policy;
  r.gpus = 1000;
  for (int x = 1; x <= 130; ++x) r.curve[x] = x <= knee ? x : plateau;
  return r;
}

TEST(SimPlot, AZoomedPanelWhereThePoliciesPartAndTheUnallocatedGpus) {
  std::vector<PolicyRuns> results = {{"bestfit", {Curve("bestfit", 92, 92)}}, {"ours", {Curve("ours", 96, 96.14)}}};
  const std::string svg = RenderSvg(results, 1000, false);
  EXPECT_EQ(svg.rfind("<svg xmlns=\"http://www.w3.org/2000/svg\" width=\"820\" height=\"1020\"", 0), 0U) << svg;
  EXPECT_NE(svg.find("clip-path=\"url(#area)\""), std::string::npos);
  EXPECT_NE(svg.find("clip-path=\"url(#zoom)\""), std::string::npos);
  // The curves part after 92 %: the zoom starts at 90 % (a multiple of 5 below), its floor the
  // whole percent at least half a point under the lowest curve there (92 %: 91 %).
  EXPECT_NE(svg.find(">Zoom: from 90% of demand, where the policies part</text>"), std::string::npos) << svg;
  EXPECT_NE(svg.find(">91%</text>"), std::string::npos) << svg;
  EXPECT_NE(svg.find(">bestfit (92.00% at 130%)</text>"), std::string::npos) << svg;
  EXPECT_NE(svg.find(">80.0 GPUs unallocated</text>"), std::string::npos) << svg;
  EXPECT_NE(svg.find(">ours (96.14% at 130%)</text>"), std::string::npos) << svg;
  EXPECT_NE(svg.find(">38.6 GPUs unallocated</text>"), std::string::npos) << svg;
}

TEST(SimPlot, OnePanelWhenThePoliciesDrawTheSameCurve) {
  std::vector<PolicyRuns> results = {{"a", {Curve("a", 95, 95)}}, {"b", {Curve("b", 95, 95)}}};
  const std::string svg = RenderSvg(results, 1000, false);
  EXPECT_EQ(svg.rfind("<svg xmlns=\"http://www.w3.org/2000/svg\" width=\"820\" height=\"520\"", 0), 0U) << svg;
  EXPECT_EQ(svg.find("url(#zoom)"), std::string::npos);
}

}  // namespace
}  // namespace kgpu::cli
