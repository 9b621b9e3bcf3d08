// SPDX-License-Identifier: Apache-2.0
#include "tests/support/process.h"

#include <array>
#include <csignal>
#include <fstream>
#include <sstream>
#include <stdexcept>
#include <thread>

#include <fcntl.h>
#include <poll.h>
#include <sys/wait.h>
#include <unistd.h>

namespace batchlens::testing {

ProcessResult run_process(const std::vector<std::string>& argv) {
  std::array<int, 2> out_pipe{};
  std::array<int, 2> err_pipe{};
  if (pipe(out_pipe.data()) != 0 || pipe(err_pipe.data()) != 0) {
    throw std::runtime_error("pipe() failed");
  }
  const pid_t pid = fork();
  if (pid < 0) {
    throw std::runtime_error("fork() failed");
  }
  if (pid == 0) {
    dup2(out_pipe[1], STDOUT_FILENO);
    dup2(err_pipe[1], STDERR_FILENO);
    close(out_pipe[0]);
    close(err_pipe[0]);
    // Only the duplicates stay open: a daemon the child starts (tests/app/slurm_cluster.sh)
    // must not hold the pipes, or the read below would wait for it to exit.
    close(out_pipe[1]);
    close(err_pipe[1]);
    std::vector<char*> args;
    args.reserve(argv.size() + 1);
    for (const auto& a : argv) {
      args.push_back(const_cast<char*>(a.c_str()));
    }
    args.push_back(nullptr);
    execv(args[0], args.data());
    _exit(127);
  }
  close(out_pipe[1]);
  close(err_pipe[1]);
  ProcessResult result;
  std::array<pollfd, 2> fds{pollfd{out_pipe[0], POLLIN, 0}, pollfd{err_pipe[0], POLLIN, 0}};
  std::array<std::string*, 2> sinks{&result.out, &result.err};
  int open_fds = 2;
  std::array<char, 4096> buf{};
  while (open_fds > 0) {
    if (poll(fds.data(), fds.size(), -1) < 0) {
      break;
    }
    for (size_t i = 0; i < fds.size(); ++i) {
      if (fds[i].fd < 0 || (fds[i].revents & (POLLIN | POLLHUP)) == 0) {
        continue;
      }
      const ssize_t n = read(fds[i].fd, buf.data(), buf.size());
      if (n > 0) {
        sinks[i]->append(buf.data(), static_cast<size_t>(n));
      } else {
        close(fds[i].fd);
        fds[i].fd = -1;
        --open_fds;
      }
    }
  }
  int status = 0;
  waitpid(pid, &status, 0);
  if (WIFEXITED(status)) {
    result.exit_code = WEXITSTATUS(status);
  } else if (WIFSIGNALED(status)) {
    result.exit_code = 128 + WTERMSIG(status);
  }
  return result;
}

std::string slurp(const std::filesystem::path& p) {
  std::ifstream in(p, std::ios::binary);
  std::stringstream ss;
  ss << in.rdbuf();
  return ss.str();
}

namespace {

int decode_status(int st) {
  return WIFEXITED(st) ? WEXITSTATUS(st) : (WIFSIGNALED(st) ? 128 + WTERMSIG(st) : -1);
}

}  // namespace

Child::Child(const std::vector<std::string>& argv, const std::vector<std::string>& env,
             const std::filesystem::path& logs)
    : out_(logs / "stdout.txt"), err_(logs / "stderr.txt") {
  pid_ = ::fork();
  if (pid_ == 0) {
    const int o = ::open(out_.c_str(), O_WRONLY | O_CREAT | O_TRUNC, 0644);
    const int e = ::open(err_.c_str(), O_WRONLY | O_CREAT | O_TRUNC, 0644);
    ::dup2(o, STDOUT_FILENO);
    ::dup2(e, STDERR_FILENO);
    for (const auto& kv : env) {
      ::putenv(const_cast<char*>(kv.c_str()));
    }
    std::vector<char*> args;
    args.reserve(argv.size() + 1);
    for (const auto& a : argv) {
      args.push_back(const_cast<char*>(a.c_str()));
    }
    args.push_back(nullptr);
    ::execv(args[0], args.data());
    ::_exit(127);
  }
}

Child::~Child() {
  if (pid_ > 0 && status_ < 0) {
    ::kill(pid_, SIGKILL);
    ::waitpid(pid_, nullptr, 0);
  }
}

bool Child::running() {
  if (status_ >= 0) {
    return false;
  }
  int st = 0;
  if (::waitpid(pid_, &st, WNOHANG) == pid_) {
    status_ = decode_status(st);
    return false;
  }
  return true;
}

void Child::signal(int sig) const {
  ::kill(pid_, sig);
}

int Child::wait(std::chrono::seconds timeout) {
  const auto end = std::chrono::steady_clock::now() + timeout;
  while (running() && std::chrono::steady_clock::now() < end) {
    std::this_thread::sleep_for(std::chrono::milliseconds(20));
  }
  if (status_ < 0) {
    ::kill(pid_, SIGKILL);
    ::waitpid(pid_, nullptr, 0);
    status_ = -1;
    return -1;
  }
  return status_;
}

bool Child::wait_for_err(const std::string& text, std::chrono::seconds timeout) {
  const auto end = std::chrono::steady_clock::now() + timeout;
  while (running() && std::chrono::steady_clock::now() < end) {
    if (err().find(text) != std::string::npos) {
      return true;
    }
    std::this_thread::sleep_for(std::chrono::milliseconds(20));
  }
  return err().find(text) != std::string::npos;
}

}  // namespace batchlens::testing
