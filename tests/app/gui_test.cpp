// SPDX-License-Identifier: Apache-2.0
// End-to-end test of the batchlens GUI binary on Qt's offscreen platform.
#include <array>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <iterator>
#include <string>

#include <gtest/gtest.h>

#include "tests/support/process.h"

#include <unistd.h>

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

// --export-report never mixes a report into a folder that holds files: refused before the
// experiment is read, the folder untouched.
TEST(Gui, ExportReportIntoANonEmptyFolderIsRefused) {
  namespace fs = std::filesystem;
  const fs::path dir =
      fs::temp_directory_path() / ("batchlens_gui_report_" + std::to_string(::getpid()));
  fs::remove_all(dir);
  fs::create_directories(dir / "report");
  std::ofstream(dir / "report" / "notes.txt") << "mine\n";
  const std::string sample = std::string(BL_SOURCE_DIR) + "/resources/samples/mid-h200-free.h5";
  const auto r =
      testing::run_process({BL_GUI_PATH, "--export-report", (dir / "report").string(), sample});
  EXPECT_EQ(r.exit_code, 2) << r.err;
  EXPECT_NE(r.err.find("not empty"), std::string::npos) << r.err;
  EXPECT_EQ(std::distance(fs::directory_iterator(dir / "report"), fs::directory_iterator{}), 1);
  EXPECT_EQ(std::distance(fs::directory_iterator(dir), fs::directory_iterator{}), 1)
      << "no temporary folder beside it";
  // A new folder gets the whole report, and nothing else is left beside it.
  const auto ok =
      testing::run_process({BL_GUI_PATH, "--export-report", (dir / "fresh").string(), sample});
  ASSERT_EQ(ok.exit_code, 0) << ok.err;
  EXPECT_EQ(std::distance(fs::directory_iterator(dir / "fresh"), fs::directory_iterator{}),
            8);  // figure.png, 5 views, summary.md, summary.json
  EXPECT_EQ(std::distance(fs::directory_iterator(dir), fs::directory_iterator{}), 2);
  fs::remove_all(dir);
}

// --export-report on a sweep file writes the sweep's report and exits; it waited forever for an
// experiment that never came (issue #32). A sweep file with bytes appended exits too.
TEST(Gui, ExportReportOfASweepFileWritesItAndExits) {
  namespace fs = std::filesystem;
  const fs::path dir =
      fs::temp_directory_path() / ("batchlens_gui_sweep_report_" + std::to_string(::getpid()));
  fs::remove_all(dir);
  fs::create_directories(dir);
  const std::string sample =
      std::string(BL_SOURCE_DIR) + "/resources/samples/h200-26b-a4b-sweep.h5";
  const auto r =
      testing::run_process({BL_GUI_PATH, "--export-report", (dir / "report").string(), sample});
  ASSERT_EQ(r.exit_code, 0) << r.err;
  for (const char* name : {"sweep.png", "summary.md", "summary.json"}) {
    EXPECT_TRUE(fs::exists(dir / "report" / name)) << name;
  }
  EXPECT_GE(png_size(dir / "report" / "sweep.png").first, 800);
  std::ifstream md(dir / "report" / "summary.md");
  const std::string text((std::istreambuf_iterator<char>(md)), std::istreambuf_iterator<char>());
  EXPECT_NE(text.find("sweep"), std::string::npos) << text;
  fs::copy_file(sample, dir / "appended.h5");
  std::ofstream(dir / "appended.h5", std::ios::app | std::ios::binary) << "trailing bytes";
  const auto appended = testing::run_process(
      {BL_GUI_PATH, "--export-report", (dir / "report2").string(), (dir / "appended.h5").string()});
  EXPECT_TRUE(appended.exit_code == 0 || appended.exit_code == 1) << appended.err;
  fs::remove_all(dir);
}

TEST(Gui, HelpNamesTheProgram) {
  const auto r = testing::run_process({BL_GUI_PATH, "--help"});
  ASSERT_EQ(r.exit_code, 0) << r.err;
  EXPECT_NE(r.out.find("batch size"), std::string::npos) << r.out;
}

// --help and --version print and exit on a machine without any display: no platform plugin,
// no DISPLAY (a GPU server, an ssh session), where a QApplication would abort.
TEST(Gui, HelpAndVersionNeedNoDisplay) {
  for (const char* option : {"--help", "--version"}) {
    const auto r = testing::run_process({"/usr/bin/env", "-u", "QT_QPA_PLATFORM", "-u", "DISPLAY",
                                         "-u", "WAYLAND_DISPLAY", BL_GUI_PATH, option});
    ASSERT_EQ(r.exit_code, 0) << option << ": " << r.err;
    EXPECT_NE(r.out.find(option == std::string("--help") ? "--screenshot" : "BatchLens"),
              std::string::npos)
        << option << ": " << r.out;
    EXPECT_EQ(r.err.find("could not connect to display"), std::string::npos) << r.err;
  }
}

}  // namespace
}  // namespace batchlens
