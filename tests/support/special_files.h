// SPDX-License-Identifier: Apache-2.0
// Test helpers for readers of untrusted files: a FIFO in place of a file, and a check that a
// reader refuses it instead of blocking on it. Header-only.
#pragma once

#include <cerrno>
#include <chrono>
#include <filesystem>
#include <functional>
#include <future>
#include <string>
#include <thread>

#include <gtest/gtest.h>

#include "core/base/error.h"

#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

namespace batchlens::test {

/// Creates a FIFO (named pipe) at `path`, replacing whatever is there.
inline void make_fifo(const std::filesystem::path& path) {
  std::error_code ec;
  std::filesystem::remove_all(path, ec);
  ASSERT_EQ(::mkfifo(path.c_str(), 0600), 0) << "mkfifo " << path << ": errno " << errno;
}

/// Runs `read` (which opens `fifo`) on a thread and expects it to come back within a few seconds
/// with an error, not a value. Should it block, the FIFO's write end is opened and closed so that
/// the reader sees end-of-file and the test fails instead of hanging. Returns the error.
inline base::Error expect_refused_without_blocking(
    const std::filesystem::path& fifo, const std::function<base::Result<void>()>& read) {
  std::promise<base::Result<void>> promise;
  auto future = promise.get_future();
  std::thread reader([&] { promise.set_value(read()); });
  if (future.wait_for(std::chrono::seconds(10)) != std::future_status::ready) {
    ADD_FAILURE() << "reading " << fifo << " blocked on the FIFO";
    // Unblock the reader: with a reader waiting, a non-blocking open of the write end succeeds.
    for (int i = 0;
         i < 100 && future.wait_for(std::chrono::milliseconds(50)) != std::future_status::ready;
         ++i) {
      const int fd = ::open(fifo.c_str(), O_WRONLY | O_NONBLOCK | O_CLOEXEC);
      if (fd >= 0) {
        ::close(fd);
      }
    }
  }
  reader.join();
  const base::Result<void> result = future.get();
  if (result.ok()) {
    ADD_FAILURE() << "reading " << fifo << " succeeded";
    return {};
  }
  return result.error();
}

}  // namespace batchlens::test
