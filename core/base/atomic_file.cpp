// SPDX-License-Identifier: Apache-2.0
#include "core/base/atomic_file.h"

#include <cerrno>
#include <system_error>

#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

namespace batchlens::base {

namespace fs = std::filesystem;

std::string errno_text(int err) {
  return std::error_code(err, std::generic_category()).message();
}

AtomicFile::AtomicFile(fs::path target) : target_(std::move(target)) {
  std::string pattern = target_.string() + ".tmp-XXXXXX";
  fd_ = ::mkstemp(pattern.data());
  if (fd_ < 0) {
    fail("cannot create a temporary file", errno);
  }
  temp_ = pattern;
  // mkstemp creates 0600; the result is as readable as any file the user writes.
  if (::fchmod(fd_, 0644) != 0) {
    fail("cannot set permissions", errno);
  }
}

AtomicFile::~AtomicFile() {
  if (fd_ >= 0) {
    ::close(fd_);
  }
  if (!committed_ && !temp_.empty()) {
    ::unlink(temp_.c_str());
  }
}

void AtomicFile::write(const void* data, std::size_t size) {
  const auto* p = static_cast<const unsigned char*>(data);
  while (size > 0) {
    const ssize_t written = ::write(fd_, p, size);
    if (written < 0) {
      if (errno == EINTR) {
        continue;
      }
      fail("write failed", errno);
    }
    p += written;
    size -= static_cast<std::size_t>(written);
  }
}

void AtomicFile::commit() {
  if (::fsync(fd_) != 0) {
    fail("fsync failed", errno);
  }
  const int fd = fd_;
  fd_ = -1;
  if (::close(fd) != 0) {
    fail("close failed", errno);
  }
  std::error_code ec;
  fs::rename(temp_, target_, ec);
  if (ec) {
    raise(ErrorCode::IoFailed, target_.string() + ": cannot rename into place: " + ec.message());
  }
  committed_ = true;
  const fs::path dir = target_.has_parent_path() ? target_.parent_path() : fs::path(".");
  const int dir_fd = ::open(dir.c_str(), O_RDONLY | O_DIRECTORY | O_CLOEXEC);
  if (dir_fd >= 0) {
    ::fsync(dir_fd);  // best effort: the data itself is already on disk
    ::close(dir_fd);
  }
}

void AtomicFile::fail(const std::string& what, int err) const {
  raise(ErrorCode::IoFailed, target_.string() + ": " + what + ": " + errno_text(err));
}

Result<void> write_file_atomic(const fs::path& path, std::string_view text) {
  return guarded([&] {
    AtomicFile out(path);
    out.write(text.data(), text.size());
    out.commit();
  });
}

}  // namespace batchlens::base
