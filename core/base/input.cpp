// SPDX-License-Identifier: Apache-2.0
#include "core/base/input.h"

#include <cerrno>

#include <nlohmann/json.hpp>

#include "core/base/atomic_file.h"

#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

namespace batchlens::base {

const char* file_kind(unsigned mode) {
  if (S_ISDIR(mode)) {
    return "a folder";
  }
  if (S_ISFIFO(mode)) {
    return "a FIFO (named pipe)";
  }
  if (S_ISCHR(mode) || S_ISBLK(mode)) {
    return "a device";
  }
  if (S_ISSOCK(mode)) {
    return "a socket";
  }
  return "not a regular file";
}

namespace {

Error not_regular(const std::filesystem::path& path, std::string_view what, mode_t mode) {
  return {ErrorCode::FileUnrecognised, std::string(what) + " " + path.string() + " is " +
                                           file_kind(mode) + ", not a regular file"};
}

}  // namespace

Result<std::uint64_t> check_input_file(const std::filesystem::path& path, std::string_view what) {
  struct stat st {};
  if (::stat(path.c_str(), &st) != 0) {
    const int err = errno;
    return Error{err == ENOENT || err == ENOTDIR ? ErrorCode::FileNotFound : ErrorCode::IoFailed,
                 "cannot open " + std::string(what) + " " + path.string() + ": " + errno_text(err)};
  }
  if (!S_ISREG(st.st_mode)) {
    return not_regular(path, what, st.st_mode);
  }
  return static_cast<std::uint64_t>(st.st_size);
}

Result<std::string> read_input_file(const std::filesystem::path& path, std::string_view what,
                                    std::uint64_t max_bytes) {
  auto checked = check_input_file(path, what);
  if (!checked.ok()) {
    return checked.error();
  }
  const std::string name = std::string(what) + " " + path.string();
  // O_NONBLOCK: should the path have become a FIFO since the check, open does not wait for a
  // writer; fstat below refuses it.
  const int fd = ::open(path.c_str(), O_RDONLY | O_CLOEXEC | O_NONBLOCK | O_NOCTTY);
  if (fd < 0) {
    return Error{ErrorCode::FileNotFound, "cannot open " + name + ": " + errno_text(errno)};
  }
  struct Closer {
    int fd;
    Closer(const Closer&) = delete;
    Closer& operator=(const Closer&) = delete;
    Closer(Closer&&) = delete;
    Closer& operator=(Closer&&) = delete;
    ~Closer() { ::close(fd); }
  } closer{fd};
  struct stat st {};
  if (::fstat(fd, &st) != 0) {
    return Error{ErrorCode::IoFailed, "cannot stat " + name + ": " + errno_text(errno)};
  }
  if (!S_ISREG(st.st_mode)) {
    return not_regular(path, what, st.st_mode);
  }
  const auto size = static_cast<std::uint64_t>(st.st_size);
  if (size > max_bytes) {
    return Error{ErrorCode::InvalidArgument, name + " is " + std::to_string(size) +
                                                 " bytes; at most " + std::to_string(max_bytes) +
                                                 " are read"};
  }
  std::string out(static_cast<std::size_t>(size), '\0');
  std::size_t got = 0;
  while (got < out.size()) {
    const ssize_t n = ::read(fd, out.data() + got, out.size() - got);
    if (n < 0 && errno == EINTR) {
      continue;
    }
    if (n < 0) {
      return Error{ErrorCode::IoFailed, "cannot read " + name + ": " + errno_text(errno)};
    }
    if (n == 0) {
      out.resize(got);  // shrank while reading: take what is there
      break;
    }
    got += static_cast<std::size_t>(n);
  }
  return out;
}

int json_depth(std::string_view text, int limit) {
  int depth = 0;
  int deepest = 0;
  bool in_string = false;
  bool escaped = false;
  for (const char ch : text) {
    if (in_string) {
      if (escaped) {
        escaped = false;
      } else if (ch == '\\') {
        escaped = true;
      } else if (ch == '"') {
        in_string = false;
      }
      continue;
    }
    if (ch == '"') {
      in_string = true;
    } else if (ch == '[' || ch == '{') {
      if (++depth > deepest) {
        deepest = depth;
        if (deepest > limit) {
          return deepest;
        }
      }
    } else if ((ch == ']' || ch == '}') && depth > 0) {
      --depth;
    }
  }
  return deepest;
}

Result<nlohmann::json> parse_json(std::string_view text, std::string_view what, ErrorCode code,
                                  int max_depth) {
  if (json_depth(text, max_depth) > max_depth) {
    return Error{code, std::string(what) + " nests arrays/objects more than " +
                           std::to_string(max_depth) + " deep"};
  }
  try {
    return nlohmann::json::parse(text.begin(), text.end());
  } catch (const nlohmann::json::parse_error& e) {
    return Error{code,
                 std::string(what) + " is not valid JSON (byte " + std::to_string(e.byte) + ")"};
  } catch (const std::bad_alloc&) {
    return Error{ErrorCode::OutOfMemory, std::string(what) + ": out of memory while parsing"};
  } catch (const std::exception& e) {
    return Error{code, std::string(what) + " is not valid JSON"};
  }
}

std::optional<std::size_t> first_invalid_utf8(std::string_view text) {
  const auto* s = reinterpret_cast<const unsigned char*>(text.data());
  const std::size_t n = text.size();
  std::size_t i = 0;
  while (i < n) {
    const unsigned c = s[i];
    if (c < 0x80) {
      ++i;
      continue;
    }
    std::size_t len = 0;
    unsigned lo = 0x80;
    unsigned hi = 0xBF;  // allowed range of the second byte (RFC 3629 table)
    if (c >= 0xC2 && c <= 0xDF) {
      len = 2;
    } else if (c >= 0xE0 && c <= 0xEF) {
      len = 3;
      lo = c == 0xE0 ? 0xA0 : 0x80;
      hi = c == 0xED ? 0x9F : 0xBF;
    } else if (c >= 0xF0 && c <= 0xF4) {
      len = 4;
      lo = c == 0xF0 ? 0x90 : 0x80;
      hi = c == 0xF4 ? 0x8F : 0xBF;
    } else {
      return i;
    }
    if (i + len > n || s[i + 1] < lo || s[i + 1] > hi) {
      return i;
    }
    for (std::size_t k = 2; k < len; ++k) {
      if ((s[i + k] & 0xC0U) != 0x80U) {
        return i;
      }
    }
    i += len;
  }
  return std::nullopt;
}

Result<void> check_utf8(std::string_view text, std::string_view what) {
  if (const auto at = first_invalid_utf8(text)) {
    return Error{ErrorCode::InvalidArgument, std::string(what) + " is not valid UTF-8 (byte " +
                                                 std::to_string(*at) + " of " +
                                                 std::to_string(text.size()) + ")"};
  }
  return {};
}

std::string dump_json_lossy(const nlohmann::json& j, int indent) {
  return j.dump(indent, ' ', false, nlohmann::json::error_handler_t::replace);
}

}  // namespace batchlens::base
