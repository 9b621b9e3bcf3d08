// SPDX-License-Identifier: Apache-2.0
// Where core's messages go: a LogSink the application installs (core itself never prints).
#pragma once

#include <string_view>

namespace batchlens::base {

enum class LogLevel { Debug, Info, Warning, Error };

/// Where core sends its messages; core itself never prints. Implementations must be
/// thread-safe: core may log from worker threads.
class LogSink {
 public:
  LogSink() = default;
  LogSink(const LogSink&) = delete;
  LogSink& operator=(const LogSink&) = delete;
  LogSink(LogSink&&) = delete;
  LogSink& operator=(LogSink&&) = delete;
  virtual ~LogSink() = default;

  /// Receives one message. Must not throw.
  virtual void log(LogLevel level, std::string_view message) = 0;
};

/// A sink that drops everything, for callers that do not care.
class NullLogSink final : public LogSink {
 public:
  void log(LogLevel /*level*/, std::string_view /*message*/) override {}
};

}  // namespace batchlens::base
