// SPDX-License-Identifier: Apache-2.0
// Prompt files (a sweep's prompts, an experiment's companions): text and JSON Lines parse, and
// hostile files are refused with their reason before any work (issues #19, #32, #35).
#include "core/setup/prompt.h"

#include <filesystem>
#include <fstream>
#include <string>
#include <vector>

#include <gtest/gtest.h>

#include <sys/stat.h>
#include <unistd.h>

namespace batchlens::setup {
namespace {

namespace fs = std::filesystem;

fs::path prompt_dir(const std::string& name) {
  const fs::path p =
      fs::path(::testing::TempDir()) / ("bl_prompt_" + name + "_" + std::to_string(::getpid()));
  fs::remove_all(p);
  return p;
}

TEST(PromptFile, TextAndJsonLinesParse) {
  const fs::path dir = prompt_dir("prompts");
  fs::create_directories(dir);
  std::ofstream(dir / "lines.txt") << "Write about Lisbon.\n\n  \nExplain tides.\r\n";
  auto lines = read_prompts(dir / "lines.txt");
  ASSERT_TRUE(lines.ok()) << lines.error().message;
  ASSERT_EQ(lines.value().size(), 2U);
  EXPECT_EQ(lines.value()[1].text, "Explain tides.");
  EXPECT_TRUE(lines.value()[1].chat_template);
  std::ofstream(dir / "p.jsonl") << R"({"prompt": "a"})"
                                 << "\n"
                                 << R"({"prompt_ids": [2, 105, 7], "chat_template": false})"
                                 << "\n";
  auto jsonl = read_prompts(dir / "p.jsonl");
  ASSERT_TRUE(jsonl.ok()) << jsonl.error().message;
  EXPECT_EQ(jsonl.value()[1].ids, (std::vector<std::int64_t>{2, 105, 7}));
  EXPECT_FALSE(jsonl.value()[1].chat_template);
  std::ofstream(dir / "bad.jsonl") << R"({"prompt": "a"})"
                                   << "\n"
                                   << R"({"text": 3})"
                                   << "\n";
  const auto bad = read_prompts(dir / "bad.jsonl");
  ASSERT_FALSE(bad.ok());
  EXPECT_NE(bad.error().message.find("line 2"), std::string::npos) << bad.error().message;
  std::ofstream(dir / "empty.txt") << "\n\n";
  EXPECT_FALSE(read_prompts(dir / "empty.txt").ok());
  EXPECT_FALSE(read_prompts(dir / "missing.txt").ok());
  fs::remove_all(dir);
}

TEST(PromptFile, JsonRoundTripsAndRefusesMistypedFields) {
  const Prompt p{"Explain tides.", false, {2, 105, 7}};
  const auto back = prompt_from_json(to_json(p), "spec");
  ASSERT_TRUE(back.ok()) << back.error().message;
  EXPECT_EQ(back.value().text, p.text);
  EXPECT_FALSE(back.value().chat_template);
  EXPECT_EQ(back.value().ids, p.ids);
  const auto bad = prompt_from_json({{"prompt", 3}, {"chat_template", true}}, "spec companion 2");
  ASSERT_FALSE(bad.ok());
  EXPECT_EQ(bad.error().code, base::ErrorCode::FileCorrupted);
  EXPECT_NE(bad.error().message.find("spec companion 2"), std::string::npos);
  EXPECT_FALSE(
      prompt_from_json({{"prompt", "a"}, {"chat_template", true}, {"prompt_ids", {1, "x"}}}, "spec")
          .ok());
}

// Prompt files from elsewhere (issue #32): invalid UTF-8, a 100 MB line, more than 100,000
// prompts, an empty file, a FIFO and a folder are each refused with their reason; 100,000 short
// prompts are read.
TEST(PromptFile, HostileFilesAreRefusedWithTheirReason) {
  const fs::path dir = prompt_dir("hostile");
  fs::create_directories(dir);
  const auto refused = [&](const std::string& name, const std::string& reason) {
    const auto r = read_prompts(dir / name);
    ASSERT_FALSE(r.ok()) << name;
    EXPECT_NE(r.error().message.find(reason), std::string::npos)
        << name << ": " << r.error().message;
  };
  std::ofstream(dir / "utf8.txt", std::ios::binary) << "fine\ncaf\xC3 broken\n";
  refused("utf8.txt", "line 2 is not valid UTF-8");
  {
    std::ofstream big(dir / "huge-line.txt", std::ios::binary);
    const std::string chunk(1 << 20, 'a');
    for (int i = 0; i < 100; ++i) {
      big << chunk;
    }
    big << "\n";
  }
  refused("huge-line.txt", "at most");
  {
    std::ofstream many(dir / "many.txt");
    for (int i = 0; i < 100001; ++i) {
      many << "p" << i << "\n";
    }
  }
  refused("many.txt", "more than 100000 prompts");
  {
    std::ofstream enough(dir / "enough.txt");
    for (int i = 0; i < 100000; ++i) {
      enough << "p" << i << "\n";
    }
  }
  const auto enough = read_prompts(dir / "enough.txt");
  ASSERT_TRUE(enough.ok()) << enough.error().message;
  EXPECT_EQ(enough.value().size(), 100000U);
  std::ofstream(dir / "empty.txt");
  EXPECT_FALSE(read_prompts(dir / "empty.txt").ok());
  ASSERT_EQ(::mkfifo((dir / "fifo").c_str(), 0600), 0);
  refused("fifo", "FIFO");
  fs::create_directories(dir / "folder");
  refused("folder", "folder");
  fs::remove_all(dir);
}

TEST(PromptFile, MessagesNameWhatTheFileIs) {
  const fs::path dir = prompt_dir("what");
  fs::create_directories(dir);
  std::ofstream(dir / "empty.txt") << "\n";
  const auto r = read_prompts(dir / "empty.txt", "companions file");
  ASSERT_FALSE(r.ok());
  EXPECT_NE(r.error().message.find("companions file"), std::string::npos) << r.error().message;
  fs::remove_all(dir);
}

}  // namespace
}  // namespace batchlens::setup
