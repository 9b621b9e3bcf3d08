// SPDX-License-Identifier: Apache-2.0
// run_child (issue #36): stdin in, stdout and stderr lines out, exit codes, stdout to a file, a
// program that does not exist, and stop() ending a child that would run on.
#include "core/base/subprocess.h"

#include <chrono>
#include <filesystem>
#include <fstream>
#include <sstream>
#include <string>
#include <vector>

#include <gtest/gtest.h>

#include <unistd.h>

namespace batchlens::base {
namespace {

TEST(Subprocess, PipesLinesExitCodesAndFiles) {
  std::vector<std::string> lines;
  const auto r =
      run_child({{"/bin/sh", "-c", "cat; echo one >&2; printf 'two' >&2; exit 3"}, "data in\n", {}},
                [&](const std::string& l) { lines.push_back(l); });
  ASSERT_TRUE(r.ok()) << r.error().message;
  EXPECT_EQ(r.value().exit_code, 3);
  EXPECT_EQ(r.value().out, "data in\n");
  EXPECT_EQ(lines, (std::vector<std::string>{"one", "two"}));  // the last line without '\n' too
  const std::filesystem::path file =
      std::filesystem::temp_directory_path() / ("bl_subprocess_" + std::to_string(::getpid()));
  const auto to_file = run_child({{"/bin/echo", "to a file"}, {}, file});
  ASSERT_TRUE(to_file.ok());
  EXPECT_EQ(to_file.value().exit_code, 0);
  EXPECT_TRUE(to_file.value().out.empty());
  std::ifstream in(file);
  std::stringstream s;
  s << in.rdbuf();
  EXPECT_EQ(s.str(), "to a file\n");
  std::filesystem::remove(file);
  const auto missing = run_child({{"/nonexistent/program"}, {}, {}});
  ASSERT_FALSE(missing.ok());
  EXPECT_EQ(missing.error().code, ErrorCode::IoFailed);
  EXPECT_NE(missing.error().message.find("/nonexistent/program"), std::string::npos);
  EXPECT_FALSE(run_child({{}, {}, {}}).ok());
}

TEST(Subprocess, StopRunsOnStopThenEndsTheChild) {
  int stops = 0;
  const auto start = std::chrono::steady_clock::now();
  const auto r = run_child(
      {{"/bin/sleep", "30"}, {}, {}}, {},
      [&] { return std::chrono::steady_clock::now() - start > std::chrono::milliseconds(200); },
      [&] { ++stops; }, /*grace_s=*/0.2);
  ASSERT_TRUE(r.ok());
  EXPECT_EQ(stops, 1);
  EXPECT_EQ(r.value().exit_code, 128 + 15);  // SIGTERM after the grace time
  EXPECT_LT(std::chrono::steady_clock::now() - start, std::chrono::seconds(10));
}

}  // namespace
}  // namespace batchlens::base
