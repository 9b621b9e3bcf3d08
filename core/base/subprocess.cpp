// SPDX-License-Identifier: Apache-2.0
#include "core/base/subprocess.h"

#include <cerrno>
#include <chrono>
#include <csignal>
#include <cstring>

#include <fcntl.h>
#include <poll.h>
#include <spawn.h>
#include <sys/wait.h>
#include <unistd.h>

namespace batchlens::base {

namespace {

constexpr std::size_t kMaxOut = std::size_t{16} << 20;
constexpr std::size_t kMaxErrTail = std::size_t{64} << 10;

// A file descriptor closed once.
class Fd {
 public:
  Fd() = default;
  explicit Fd(int fd) : fd_(fd) {}
  Fd(const Fd&) = delete;
  Fd& operator=(const Fd&) = delete;
  Fd(Fd&&) = delete;
  Fd& operator=(Fd&&) = delete;
  ~Fd() { reset(); }
  int get() const { return fd_; }
  void reset(int fd = -1) {
    if (fd_ >= 0) {
      ::close(fd_);
    }
    fd_ = fd;
  }

 private:
  int fd_ = -1;
};

// A pipe: [0] read end, [1] write end, both close-on-exec in this process.
bool make_pipe(Fd& read_end, Fd& write_end) {
  int fds[2] = {-1, -1};
  if (::pipe2(fds, O_CLOEXEC) != 0) {
    return false;
  }
  read_end.reset(fds[0]);
  write_end.reset(fds[1]);
  return true;
}

// SIGPIPE ignored while a child runs (writing its stdin after it exited gives EPIPE instead).
class IgnoreSigpipe {
 public:
  IgnoreSigpipe() {
    struct sigaction ignore {};
    ignore.sa_handler = SIG_IGN;
    ::sigaction(SIGPIPE, &ignore, &old_);
  }
  IgnoreSigpipe(const IgnoreSigpipe&) = delete;
  IgnoreSigpipe& operator=(const IgnoreSigpipe&) = delete;
  IgnoreSigpipe(IgnoreSigpipe&&) = delete;
  IgnoreSigpipe& operator=(IgnoreSigpipe&&) = delete;
  ~IgnoreSigpipe() { ::sigaction(SIGPIPE, &old_, nullptr); }

 private:
  struct sigaction old_ {};
};

}  // namespace

Result<ChildOutcome> run_child(const ChildSpec& spec,
                               const std::function<void(const std::string&)>& on_err_line,
                               const std::function<bool()>& stop,
                               const std::function<void()>& on_stop, double grace_s) {
  if (spec.argv.empty()) {
    return Error{ErrorCode::InvalidArgument, "no program to run"};
  }
  const IgnoreSigpipe sigpipe;
  Fd in_r;
  Fd in_w;
  Fd out_r;
  Fd out_w;
  Fd err_r;
  Fd err_w;
  Fd file;
  if (!make_pipe(in_r, in_w) || !make_pipe(out_r, out_w) || !make_pipe(err_r, err_w)) {
    return Error{ErrorCode::IoFailed, std::string("pipe: ") + std::strerror(errno)};
  }
  if (!spec.stdout_file.empty()) {
    file.reset(::open(spec.stdout_file.c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0600));
    if (file.get() < 0) {
      return Error{ErrorCode::IoFailed,
                   "cannot write " + spec.stdout_file.string() + ": " + std::strerror(errno)};
    }
  }
  posix_spawn_file_actions_t actions;
  posix_spawn_file_actions_init(&actions);
  posix_spawn_file_actions_adddup2(&actions, in_r.get(), 0);
  posix_spawn_file_actions_adddup2(&actions, file.get() >= 0 ? file.get() : out_w.get(), 1);
  posix_spawn_file_actions_adddup2(&actions, err_w.get(), 2);
  std::vector<char*> argv;
  argv.reserve(spec.argv.size() + 1);
  for (const std::string& a : spec.argv) {
    argv.push_back(const_cast<char*>(
        a.c_str()));  // NOLINT(cppcoreguidelines-pro-type-const-cast): posix_spawn's signature
  }
  argv.push_back(nullptr);
  pid_t pid = -1;
  const int spawned = ::posix_spawnp(&pid, argv[0], &actions, nullptr, argv.data(), environ);
  posix_spawn_file_actions_destroy(&actions);
  if (spawned != 0) {
    return Error{ErrorCode::IoFailed,
                 "cannot start " + spec.argv[0] + ": " + std::strerror(spawned)};
  }
  in_r.reset();
  out_w.reset();
  err_w.reset();
  file.reset();
  ::fcntl(in_w.get(), F_SETFL, O_NONBLOCK);
  ChildOutcome outcome;
  std::size_t written = 0;
  if (spec.stdin_data.empty()) {
    in_w.reset();
  }
  std::string line;
  bool stopping = false;
  std::chrono::steady_clock::time_point stop_at;
  int signalled = 0;
  char buf[65536];
  while (out_r.get() >= 0 || err_r.get() >= 0) {
    pollfd fds[3];
    nfds_t n = 0;
    for (const Fd* f : {&out_r, &err_r}) {
      if (f->get() >= 0) {
        fds[n++] = {f->get(), POLLIN, 0};
      }
    }
    if (in_w.get() >= 0) {
      fds[n++] = {in_w.get(), POLLOUT, 0};
    }
    ::poll(fds, n, 100);
    for (nfds_t i = 0; i < n; ++i) {
      if (fds[i].revents == 0) {
        continue;
      }
      if (fds[i].fd == in_w.get()) {
        const ssize_t w =
            ::write(in_w.get(), spec.stdin_data.data() + written, spec.stdin_data.size() - written);
        if (w > 0) {
          written += static_cast<std::size_t>(w);
        }
        // Done, or the child closed its stdin.
        if ((w < 0 && errno != EAGAIN && errno != EINTR) || written == spec.stdin_data.size()) {
          in_w.reset();
        }
        continue;
      }
      const bool is_out = fds[i].fd == out_r.get();
      const ssize_t r = ::read(fds[i].fd, buf, sizeof buf);
      if (r <= 0) {
        if (r < 0 && (errno == EAGAIN || errno == EINTR)) {
          continue;
        }
        (is_out ? out_r : err_r).reset();
        continue;
      }
      if (is_out) {
        if (outcome.out.size() < kMaxOut) {
          outcome.out.append(buf, static_cast<std::size_t>(r));
        }
        continue;
      }
      outcome.err.append(buf, static_cast<std::size_t>(r));
      if (outcome.err.size() > 2 * kMaxErrTail) {
        outcome.err.erase(0, outcome.err.size() - kMaxErrTail);
      }
      line.append(buf, static_cast<std::size_t>(r));
      for (std::size_t nl = line.find('\n'); nl != std::string::npos; nl = line.find('\n')) {
        if (on_err_line) {
          on_err_line(line.substr(0, nl));
        }
        line.erase(0, nl + 1);
      }
    }
    if (!stopping && stop && stop()) {
      stopping = true;
      stop_at = std::chrono::steady_clock::now();
      if (on_stop) {
        on_stop();
      }
    }
    if (stopping && signalled < 2) {
      const double waited =
          std::chrono::duration<double>(std::chrono::steady_clock::now() - stop_at).count();
      if ((signalled == 0 && waited > grace_s) || (signalled == 1 && waited > grace_s + 5.0)) {
        ::kill(pid, signalled == 0 ? SIGTERM : SIGKILL);
        ++signalled;
      }
    }
  }
  if (!line.empty() && on_err_line) {
    on_err_line(line);
  }
  int status = 0;
  while (::waitpid(pid, &status, 0) < 0 && errno == EINTR) {
  }
  outcome.exit_code = WIFEXITED(status)     ? WEXITSTATUS(status)
                      : WIFSIGNALED(status) ? 128 + WTERMSIG(status)
                                            : -1;
  if (outcome.err.size() > kMaxErrTail) {
    outcome.err.erase(0, outcome.err.size() - kMaxErrTail);
  }
  return outcome;
}

}  // namespace batchlens::base
