// SPDX-License-Identifier: Apache-2.0
// Files that appear complete or not at all: written to a temporary file beside the target,
// fsynced and renamed into place; removed when the writer fails or is destroyed uncommitted.
#pragma once

#include <cstddef>
#include <filesystem>
#include <string>
#include <string_view>

#include "core/base/error.h"

namespace batchlens::base {

/// A temporary file beside `target` (same directory, so the rename is atomic), renamed into
/// place by commit() and removed otherwise. Errors are ErrorException{IoFailed} naming the
/// target.
class AtomicFile {
 public:
  explicit AtomicFile(std::filesystem::path target);
  AtomicFile(const AtomicFile&) = delete;
  AtomicFile& operator=(const AtomicFile&) = delete;
  AtomicFile(AtomicFile&&) = delete;
  AtomicFile& operator=(AtomicFile&&) = delete;
  ~AtomicFile();

  /// Appends bytes.
  void write(const void* data, std::size_t size);
  /// fsync, close, rename into place, then fsync the directory so the rename is durable.
  void commit();
  /// The temporary path (for libraries that open files by name, e.g. HDF5).
  const std::filesystem::path& temp_path() const { return temp_; }

 private:
  [[noreturn]] void fail(const std::string& what, int err) const;

  std::filesystem::path target_;
  std::filesystem::path temp_;
  int fd_ = -1;
  bool committed_ = false;
};

/// Writes `text` to `path` through an AtomicFile. Never throws.
Result<void> write_file_atomic(const std::filesystem::path& path, std::string_view text);

/// strerror for `err`, thread-safe.
std::string errno_text(int err);

}  // namespace batchlens::base
