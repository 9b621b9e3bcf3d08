// SPDX-License-Identifier: Apache-2.0
// Shared pieces of the libFuzzer targets (docs/reliability.md, "Sanitizers and fuzzing").
// Every target hands the input to one reader; a returned error is a correct answer, only a
// crash, a sanitizer report, an exception that escapes a never-throws API or a timeout is a bug.
#pragma once

#include <cstddef>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <string>
#include <string_view>

#include <nlohmann/json.hpp>

#include <unistd.h>

namespace batchlens::fuzz {

/// The input as text.
inline std::string_view as_text(const std::uint8_t* data, std::size_t size) {
  return {reinterpret_cast<const char*>(data), size};
}

/// The input parsed as JSON without exceptions; a discarded value when it is not JSON.
inline nlohmann::json parse_json(const std::uint8_t* data, std::size_t size) {
  return nlohmann::json::parse(data, data + size, nullptr, /*allow_exceptions=*/false);
}

/// A file that holds the current input, for readers that take a path. One per process (libFuzzer
/// -jobs/-fork run several), in $TMPDIR or else /dev/shm (memory, no disk writes) or /tmp;
/// removed at exit.
class InputFile {
 public:
  explicit InputFile(const std::string& stem) {
    namespace fs = std::filesystem;
    fs::path dir = "/tmp";
    if (const char* tmp = std::getenv("TMPDIR"); tmp != nullptr && *tmp != '\0') {
      dir = tmp;
    } else if (std::error_code ec; fs::is_directory("/dev/shm", ec)) {
      dir = "/dev/shm";
    }
    path_ = dir / ("batchlens-fuzz-" + std::to_string(::getpid()) + "-" + stem);
  }
  InputFile(const InputFile&) = delete;
  InputFile& operator=(const InputFile&) = delete;
  InputFile(InputFile&&) = delete;
  InputFile& operator=(InputFile&&) = delete;
  ~InputFile() {
    std::error_code ec;
    std::filesystem::remove(path_, ec);
  }

  /// Replaces the file's bytes with the input; aborts when it cannot (not a finding).
  const std::filesystem::path& write(const std::uint8_t* data, std::size_t size) const {
    std::FILE* f = std::fopen(path_.c_str(), "wb");
    if (f == nullptr || (size > 0 && std::fwrite(data, 1, size, f) != size) ||
        std::fclose(f) != 0) {
      std::perror(path_.c_str());
      std::abort();
    }
    return path_;
  }

 private:
  std::filesystem::path path_;
};

}  // namespace batchlens::fuzz
