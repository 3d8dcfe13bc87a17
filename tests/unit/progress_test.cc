// Progress lines of long commands (common/progress.h): the text, the estimate, drawing in place
// and clearing at the end, and nothing at all when disabled.
#include "common/progress.h"

#include <sstream>

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
