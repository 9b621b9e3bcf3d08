// SPDX-License-Identifier: Apache-2.0
// Files and folders that appear complete or not at all: written to a temporary beside the target,
// fsynced and renamed into place; removed when the writer fails, is destroyed uncommitted, or the
// process gets SIGINT/SIGTERM while writing (install_signal_cleanup). A temporary orphaned by a
// SIGKILL is removed by the next writer of the same target.
#pragma once

#include <cstddef>
#include <filesystem>
#include <string>
#include <string_view>

#include "core/base/cancel.h"
#include "core/base/error.h"

namespace batchlens::base {

/// A temporary file beside `target` (same directory, so the rename is atomic), named
/// `<target>.tmp-<pid>-XXXXXX`, renamed into place by commit() and removed otherwise. Errors are
/// ErrorException{IoFailed} naming the target and the system's reason (ENOSPC: "No space left on
/// device").
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
  /// The temporary path (for libraries that open files by name, e.g. HDF5, which then write the
  /// same inode; commit() fsyncs it).
  const std::filesystem::path& temp_path() const { return temp_; }

 private:
  [[noreturn]] void fail(const std::string& what, int err) const;

  std::filesystem::path target_;
  std::filesystem::path temp_;
  int fd_ = -1;
  int slot_ = -1;  // in the signal-cleanup registry
  bool committed_ = false;
};

/// A temporary folder beside `target`, filled by the caller (flat or nested) and moved into place
/// by commit(): `target` must not exist or be an empty folder (then it is replaced). Removed with
/// its contents when not committed. Errors as AtomicFile.
class AtomicDir {
 public:
  explicit AtomicDir(std::filesystem::path target);
  AtomicDir(const AtomicDir&) = delete;
  AtomicDir& operator=(const AtomicDir&) = delete;
  AtomicDir(AtomicDir&&) = delete;
  AtomicDir& operator=(AtomicDir&&) = delete;
  ~AtomicDir();

  /// Where to write the folder's files.
  const std::filesystem::path& path() const { return temp_; }
  /// fsyncs every file in it, renames it into place, fsyncs the parent.
  void commit();

 private:
  std::filesystem::path target_;
  std::filesystem::path temp_;
  int slot_ = -1;
  bool committed_ = false;
};

/// Writes `text` to `path` through an AtomicFile. Never throws.
Result<void> write_file_atomic(const std::filesystem::path& path, std::string_view text);

/// Removes temporaries of `target` (`<target>.tmp-<pid>-*`, files or folders) left by processes
/// that no longer exist (a SIGKILL, a power cut). Temporaries of live processes are kept. Returns
/// how many were removed. Called by AtomicFile and AtomicDir; never throws.
int remove_orphaned_temps(const std::filesystem::path& target);

/// Installs SIGINT and SIGTERM handlers for the whole process: while a temporary of an AtomicFile
/// or AtomicDir exists, the signal removes it and exits with 128 + signal (130, 143); otherwise a
/// SIGINT cancels the token set with set_signal_cancel() if there is one, else exits 130, and a
/// SIGTERM exits 143. Idempotent. The CLI calls it first thing.
void install_signal_cleanup();

/// While non-null, SIGINT (outside a write) cancels this token instead of exiting. The caller
/// keeps the token alive until it sets nullptr again.
void set_signal_cancel(CancelToken* token);

/// strerror for `err`, thread-safe.
std::string errno_text(int err);

}  // namespace batchlens::base
