// SPDX-License-Identifier: Apache-2.0
#include "core/base/atomic_file.h"

#include <array>
#include <atomic>
#include <cerrno>
#include <csignal>
#include <cstring>
#include <system_error>

#include <dirent.h>
#include <fcntl.h>
#include <sys/random.h>
#include <sys/stat.h>
#include <sys/syscall.h>
#include <unistd.h>

namespace batchlens::base {

namespace fs = std::filesystem;

std::string errno_text(int err) {
  return std::error_code(err, std::generic_category()).message();
}

// ---- the signal-cleanup registry ------------------------------------------------------------
// Fixed slots a signal handler can read without locks or allocation: a slot is claimed with a
// compare-exchange, its path written, then published with state 2 *before* the temporary is
// created, so a temporary is never on disk unregistered. The handler may run on any thread while
// others keep going, so it first sets g_dying (creators that see it stop before creating), waits
// for creations already past that check (`creator`: the thread creating the slot's temporary),
// then removes every published temporary, repeating a folder's removal while a writer is still
// putting files into it.

namespace {

constexpr int kSlots = 64;
constexpr std::size_t kPathMax = 4096;

struct Slot {
  std::atomic<int> state{0};     // 0 free, 1 being filled, 2 published
  std::atomic<long> creator{0};  // thread id while its temporary is being created, else 0
  bool dir = false;
  std::array<char, kPathMax> path{};
};

std::array<Slot, kSlots>& slots() {
  static std::array<Slot, kSlots> s;
  return s;
}

std::atomic<CancelToken*> g_signal_cancel{nullptr};
std::atomic<bool> g_handlers_installed{false};
std::atomic<bool> g_dying{false};

long thread_id() {
  return ::syscall(SYS_gettid);
}

// Waits for the signal handler to end the process (called by a creator that saw g_dying).
[[noreturn]] void wait_for_exit() {
  for (;;) {
    ::pause();
  }
}

int register_temp(const fs::path& p, bool dir) {
  const std::string& s = p.native();
  if (s.size() >= kPathMax) {
    return -1;  // not cleaned on a signal; still removed by the destructor or the next writer
  }
  if (g_dying.load()) {
    wait_for_exit();
  }
  for (int i = 0; i < kSlots; ++i) {
    Slot& slot = slots()[static_cast<std::size_t>(i)];
    int expected = 0;
    if (slot.state.compare_exchange_strong(expected, 1)) {
      slot.dir = dir;
      std::memcpy(slot.path.data(), s.c_str(), s.size() + 1);
      slot.creator.store(thread_id());
      slot.state.store(2);
      return i;
    }
  }
  return -1;
}

// Ends the creation of slot i's temporary (it exists now, or its creation failed).
void created_temp(int i) {
  if (i >= 0) {
    slots()[static_cast<std::size_t>(i)].creator.store(0);
  }
}

void unregister_temp(int i) {
  if (i >= 0) {
    slots()[static_cast<std::size_t>(i)].state.store(0);
  }
}

// Async-signal-safe removal of a folder tree: raw getdents64 and unlinkat, no allocation.
struct LinuxDirent64 {
  ino64_t d_ino;
  off64_t d_off;
  unsigned short d_reclen;
  unsigned char d_type;
  char d_name[1];
};

void remove_tree_signal_safe(int parent_fd, const char* name, int depth) {
  if (::unlinkat(parent_fd, name, 0) == 0 || depth > 8) {
    return;
  }
  const int fd = ::openat(parent_fd, name, O_RDONLY | O_DIRECTORY | O_CLOEXEC | O_NOFOLLOW);
  if (fd < 0) {
    return;
  }
  alignas(8) char buf[4096];
  for (;;) {
    const long n = ::syscall(SYS_getdents64, fd, buf, sizeof(buf));
    if (n <= 0) {
      break;
    }
    for (long off = 0; off < n;) {
      const auto* e = reinterpret_cast<const LinuxDirent64*>(buf + off);
      off += e->d_reclen;
      if (std::strcmp(e->d_name, ".") == 0 || std::strcmp(e->d_name, "..") == 0) {
        continue;
      }
      remove_tree_signal_safe(fd, e->d_name, depth + 1);
    }
  }
  ::close(fd);
  ::unlinkat(parent_fd, name, AT_REMOVEDIR);
}

void sleep_briefly() {
  struct timespec ts {
    0, 100000
  };  // 0.1 ms
  ::nanosleep(&ts, nullptr);
}

extern "C" void on_terminating_signal(int sig) {
  const int saved = errno;
  bool writing = false;
  for (Slot& slot : slots()) {
    writing = writing || slot.state.load() == 2;
  }
  CancelToken* cancel = g_signal_cancel.load();
  if (sig == SIGINT && !writing && cancel != nullptr) {
    cancel->cancel();  // an atomic store
    errno = saved;
    return;
  }
  g_dying.store(true);
  const long self = thread_id();
  for (Slot& slot : slots()) {
    // Another thread between registering and creating finishes creating (at most ~2 s).
    for (int i = 0; i < 20000; ++i) {
      const long creator = slot.creator.load();
      if (slot.state.load() != 2 || creator == 0 || creator == self) {
        break;
      }
      sleep_briefly();
    }
  }
  for (Slot& slot : slots()) {
    for (int attempt = 0; attempt < 1000 && slot.state.load() == 2; ++attempt) {
      remove_tree_signal_safe(AT_FDCWD, slot.path.data(), 0);
      struct stat st {};
      if (::fstatat(AT_FDCWD, slot.path.data(), &st, AT_SYMLINK_NOFOLLOW) != 0 && errno == ENOENT) {
        break;
      }
    }
  }
  ::_exit(128 + sig);
}

bool process_alive(long pid) {
  if (pid <= 0) {
    return false;
  }
  return ::kill(static_cast<pid_t>(pid), 0) == 0 || errno == EPERM;
}

void fsync_dir(const fs::path& dir) {
  const int fd = ::open(dir.c_str(), O_RDONLY | O_DIRECTORY | O_CLOEXEC);
  if (fd >= 0) {
    ::fsync(fd);  // best effort: the data itself is already on disk
    ::close(fd);
  }
}

fs::path parent_or_dot(const fs::path& p) {
  return p.has_parent_path() ? p.parent_path() : fs::path(".");
}

std::string temp_prefix(const fs::path& target) {
  return target.filename().string() + ".tmp-";
}

// Creates `<target>.tmp-<pid>-XXXXXX` (a file opened for writing, or a folder) whose name is
// published to the signal-cleanup registry *before* it exists: a signal delivered to any thread
// at any moment leaves nothing behind (mkstemp followed by registering had a window in which
// SIGINT left the temporary). A name that exists already belongs to a dead process with our pid
// (an orphan) or to a collision, and is skipped.
struct Temp {
  fs::path path;
  int slot = -1;
  int fd = -1;
};

Temp create_temp(const fs::path& target, bool dir, int& err) {
  static constexpr char kAlphabet[] =
      "ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789";
  const std::string base = target.string() + ".tmp-" + std::to_string(::getpid()) + "-";
  err = EEXIST;
  for (int attempt = 0; attempt < 100; ++attempt) {
    std::array<unsigned char, 6> rnd{};
    if (::getrandom(rnd.data(), rnd.size(), 0) != static_cast<ssize_t>(rnd.size())) {
      const auto t = static_cast<unsigned>(::clock()) + static_cast<unsigned>(attempt) * 7919U;
      for (std::size_t i = 0; i < rnd.size(); ++i) {
        rnd[i] = static_cast<unsigned char>(t >> (i * 5U));
      }
    }
    std::string name = base;
    for (const unsigned char c : rnd) {
      name += kAlphabet[c % (sizeof(kAlphabet) - 1)];
    }
    Temp t;
    t.path = name;
    t.slot = register_temp(t.path, dir);
    if (g_dying.load()) {
      wait_for_exit();  // the handler is removing temporaries; do not make another
    }
    bool ok = false;
    if (dir) {
      ok = ::mkdir(name.c_str(), 0700) == 0;
    } else {
      t.fd = ::open(name.c_str(), O_RDWR | O_CREAT | O_EXCL | O_CLOEXEC, 0600);
      ok = t.fd >= 0;
    }
    err = errno;
    created_temp(t.slot);
    if (ok) {
      return t;
    }
    unregister_temp(t.slot);
    if (err != EEXIST) {
      break;
    }
  }
  return {};
}

}  // namespace

void install_signal_cleanup() {
  if (g_handlers_installed.exchange(true)) {
    return;
  }
  struct sigaction sa {};
  sa.sa_handler = on_terminating_signal;
  sigemptyset(&sa.sa_mask);
  sa.sa_flags = SA_RESTART;
  ::sigaction(SIGINT, &sa, nullptr);
  ::sigaction(SIGTERM, &sa, nullptr);
}

void set_signal_cancel(CancelToken* token) {
  g_signal_cancel.store(token);
}

int remove_orphaned_temps(const fs::path& target) {
  const std::string prefix = temp_prefix(target);
  int removed = 0;
  std::error_code ec;
  for (fs::directory_iterator it(parent_or_dot(target), ec), end; !ec && it != end;
       it.increment(ec)) {
    const std::string name = it->path().filename().string();
    if (name.compare(0, prefix.size(), prefix) != 0) {
      continue;
    }
    // <target>.tmp-<pid>-<anything>: the writer's pid decides whether it is still writing.
    const std::string rest = name.substr(prefix.size());
    const auto dash = rest.find('-');
    if (dash == 0 || dash == std::string::npos || rest.find_first_not_of("0123456789") != dash) {
      continue;
    }
    const long pid = std::strtol(rest.substr(0, dash).c_str(), nullptr, 10);
    if (process_alive(pid)) {
      continue;
    }
    std::error_code rm;
    if (fs::remove_all(it->path(), rm) > 0 && !rm) {
      ++removed;
    }
  }
  return removed;
}

// ---- AtomicFile ------------------------------------------------------------------------------

AtomicFile::AtomicFile(fs::path target) : target_(std::move(target)) {
  remove_orphaned_temps(target_);
  int err = 0;
  Temp t = create_temp(target_, false, err);
  if (t.fd < 0) {
    fail("cannot create a temporary file", err);
  }
  fd_ = t.fd;
  temp_ = std::move(t.path);
  slot_ = t.slot;
  // Created 0600; the result is as readable as any file the user writes.
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
  unregister_temp(slot_);
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
  unregister_temp(slot_);
  slot_ = -1;
  fsync_dir(parent_or_dot(target_));
}

void AtomicFile::fail(const std::string& what, int err) const {
  raise(ErrorCode::IoFailed, target_.string() + ": " + what + ": " + errno_text(err));
}

// ---- AtomicDir -------------------------------------------------------------------------------

AtomicDir::AtomicDir(fs::path target) : target_(std::move(target)) {
  remove_orphaned_temps(target_);
  int err = 0;
  Temp t = create_temp(target_, true, err);
  if (t.path.empty()) {
    raise(ErrorCode::IoFailed,
          target_.string() + ": cannot create a temporary folder: " + errno_text(err));
  }
  temp_ = std::move(t.path);
  slot_ = t.slot;
  ::chmod(temp_.c_str(), 0755);
}

AtomicDir::~AtomicDir() {
  if (!committed_ && !temp_.empty()) {
    std::error_code ec;
    fs::remove_all(temp_, ec);
  }
  unregister_temp(slot_);
}

void AtomicDir::commit() {
  std::error_code ec;
  for (fs::recursive_directory_iterator it(temp_, ec), end; !ec && it != end; it.increment(ec)) {
    if (!it->is_regular_file()) {
      continue;
    }
    const int fd = ::open(it->path().c_str(), O_RDONLY | O_CLOEXEC);
    if (fd < 0 || ::fsync(fd) != 0) {
      const int err = errno;
      if (fd >= 0) {
        ::close(fd);
      }
      raise(ErrorCode::IoFailed, it->path().string() + ": fsync failed: " + errno_text(err));
    }
    ::close(fd);
  }
  fsync_dir(temp_);
  if (fs::is_directory(target_, ec)) {
    if (!fs::is_empty(target_, ec) || ec) {
      raise(ErrorCode::IoFailed, target_.string() + " exists and is not an empty folder");
    }
    fs::remove(target_, ec);
  } else if (fs::exists(fs::symlink_status(target_, ec))) {
    raise(ErrorCode::IoFailed, target_.string() + " exists and is not a folder");
  }
  fs::rename(temp_, target_, ec);
  if (ec) {
    raise(ErrorCode::IoFailed, target_.string() + ": cannot move into place: " + ec.message());
  }
  committed_ = true;
  unregister_temp(slot_);
  slot_ = -1;
  fsync_dir(parent_or_dot(target_));
}

Result<void> write_file_atomic(const fs::path& path, std::string_view text) {
  return guarded([&] {
    AtomicFile out(path);
    out.write(text.data(), text.size());
    out.commit();
  });
}

}  // namespace batchlens::base
