// SPDX-License-Identifier: Apache-2.0
// End-to-end test of the batchlens GUI binary on Qt's offscreen platform.
#include <array>
#include <cstdio>
#include <filesystem>
#include <fstream>

#include <gtest/gtest.h>

#include "tests/support/process.h"

namespace batchlens {
namespace {

// Width and height from a PNG's IHDR chunk (big-endian at offsets 16 and 20).
std::pair<int, int> png_size(const std::filesystem::path& path) {
  std::ifstream in(path, std::ios::binary);
  std::array<unsigned char, 24> head{};
  in.read(reinterpret_cast<char*>(head.data()), head.size());
  if (!in || head[1] != 'P' || head[2] != 'N' || head[3] != 'G') {
    return {0, 0};
  }
  const auto be32 = [&head](int o) {
    return (head[o] << 24) | (head[o + 1] << 16) | (head[o + 2] << 8) | head[o + 3];
  };
  return {be32(16), be32(20)};
}

TEST(Gui, StartsAndRendersItsMainWindow) {
  const auto png = std::filesystem::temp_directory_path() / "batchlens_gui_test.png";
  std::filesystem::remove(png);
  const auto r = testing::run_process({BL_GUI_PATH, "--screenshot", png.string()});
  ASSERT_EQ(r.exit_code, 0) << r.err;
  const auto [w, h] = png_size(png);
  EXPECT_GE(w, 800);
  EXPECT_GE(h, 500);
  std::filesystem::remove(png);
}

TEST(Gui, OpensTheFileGivenOnTheCommandLine) {
  const auto png = std::filesystem::temp_directory_path() / "batchlens_gui_file.png";
  std::filesystem::remove(png);
  const std::string sample = std::string(BL_SOURCE_DIR) + "/resources/samples/mid-h200-free.h5";
  const auto r =
      testing::run_process({BL_GUI_PATH, "--tab", "1", "--tap", "layer.out", "--comparison",
                            "ref__b4", "--screenshot", png.string(), sample});
  ASSERT_EQ(r.exit_code, 0) << r.err;
  EXPECT_GE(png_size(png).first, 800);
  std::filesystem::remove(png);
}

TEST(Gui, ADamagedFileGivesAnErrorNotACrash) {
  const auto png = std::filesystem::temp_directory_path() / "batchlens_gui_damaged.png";
  const auto bad = std::filesystem::temp_directory_path() / "batchlens_gui_damaged.h5";
  std::ofstream(bad) << "this is not an experiment file\n";
  std::filesystem::remove(png);
  // --screenshot also fires after an error dialog: the process must get there and exit 0.
  const auto r = testing::run_process({BL_GUI_PATH, "--screenshot", png.string(), bad.string()});
  ASSERT_EQ(r.exit_code, 0) << r.err;
  EXPECT_GE(png_size(png).first, 800);
  std::filesystem::remove(png);
  std::filesystem::remove(bad);
}

TEST(Gui, HelpNamesTheProgram) {
  const auto r = testing::run_process({BL_GUI_PATH, "--help"});
  ASSERT_EQ(r.exit_code, 0) << r.err;
  EXPECT_NE(r.out.find("batch size"), std::string::npos) << r.out;
}

}  // namespace
}  // namespace batchlens
