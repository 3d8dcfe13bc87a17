// Progress lines of long commands (common/progress.h): the text, the estimate, drawing in place
// and clearing at the end, and nothing at all when disabled.
#include "common/progress.h"

#include <sstream>
#include <string>
#include <thread>

#include <gtest/gtest.h>

namespace kgpu {
namespace {

using std::chrono::seconds;

TEST(ProgressLine, SaysDoneOfTotalElapsedAndAnEstimate) {
  EXPECT_EQ(ProgressLine("kgpu sim", 0, 20, "runs", seconds(3)), "kgpu sim: 0/20 runs, 3 s elapsed");
  EXPECT_EQ(ProgressLine("kgpu sim", 5, 20, "runs", seconds(30)),
            "kgpu sim: 5/20 runs, 30 s elapsed, about 1 m 30 s left");
  EXPECT_EQ(ProgressLine("kgpu sim", 20, 20, "runs", seconds(134)), "kgpu sim: 20/20 runs, 2 m 14 s elapsed");
  EXPECT_EQ(ProgressLine("x", 1, 2, "runs", seconds(4000)), "x: 1/2 runs, 1 h 6 m elapsed, about 1 h 6 m left");
  // A total not known in advance (a paged list without remainingItemCount): the count alone.
  EXPECT_EQ(ProgressLine("kgpu quota plan: reading Nodes", 1500, 0, "nodes", seconds(4)),
            "kgpu quota plan: reading Nodes: 1500 nodes, 4 s elapsed");
}

TEST(Progress, DrawsInPlaceAndClearsTheLineAtTheEnd) {
  std::ostringstream out;
  {
    Progress p(out, true, "kgpu sim", 4, "runs", std::chrono::milliseconds(10));
    p.Advance();
    std::this_thread::sleep_for(std::chrono::milliseconds(50));
    p.Advance(3);
    std::this_thread::sleep_for(std::chrono::milliseconds(50));
  }
  const std::string s = out.str();
  EXPECT_NE(s.find("\rkgpu sim: 1/4 runs"), std::string::npos) << s;
  EXPECT_NE(s.find("\rkgpu sim: 4/4 runs"), std::string::npos) << s;
  EXPECT_EQ(s.find('\n'), std::string::npos) << "one line, redrawn";
  // Ends with the line blanked and the cursor at its start.
  ASSERT_GE(s.size(), 2u);
  EXPECT_EQ(s.back(), '\r');
  EXPECT_EQ(s[s.size() - 2], ' ');
}

// A command's own lines, written while the progress line shows (one terminal, one stream here):
// the progress line is blanked before each and drawn again after, never mixed into it.
TEST(Progress, PrintedLinesAreNeverMixedIntoTheProgressLine) {
  std::ostringstream out;
  {
    Progress p(out, true, "kgpu mig apply", 2, "GPUs", std::chrono::hours(1));
    std::this_thread::sleep_for(std::chrono::milliseconds(20));  // the first draw is at start
    p.Advance();
    p.Print(out, "GPU 0: 7 x 1g.10gb -> 2 x 3g.40gb\n");
  }
  const std::string s = out.str();
  const std::string line = "GPU 0: 7 x 1g.10gb -> 2 x 3g.40gb\n";
  const size_t at = s.find(line);
  ASSERT_NE(at, std::string::npos) << s;
  // Before it: the progress line blanked ("\r", spaces, "\r"), or nothing drawn yet.
  if (at > 0) {
    EXPECT_EQ(s[at - 1], '\r') << s;
    EXPECT_EQ(s.substr(0, at).find_last_not_of(" \r"), s.substr(0, at).rfind("elapsed") + 6) << s;
  }
  // After it: drawn again with the new count, and cleared at the end.
  EXPECT_EQ(s.find("\rkgpu mig apply: 1/2 GPUs", at), at + line.size()) << s;
  EXPECT_EQ(s.back(), '\r');
  std::ostringstream plain;
  {
    Progress p(plain, false, "x", 1, "GPUs");
    p.Print(plain, "a line\n");
  }
  EXPECT_EQ(plain.str(), "a line\n");
}

TEST(Progress, DisabledWritesNothing) {
  std::ostringstream out;
  {
    Progress p(out, false, "kgpu sim", 4, "runs", std::chrono::milliseconds(1));
    p.Advance(4);
    std::this_thread::sleep_for(std::chrono::milliseconds(20));
  }
  EXPECT_EQ(out.str(), "");
  EXPECT_FALSE(ProgressWanted(-1, false));  // not a terminal
}

}  // namespace
}  // namespace kgpu
