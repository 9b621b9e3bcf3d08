// SPDX-License-Identifier: Apache-2.0
// How core reports failure: error codes, Error and Result<T> (no exceptions across the API),
// raise/take/guarded to move between exceptions inside core and results at its edge.
#pragma once

#include <exception>
#include <optional>
#include <string>
#include <type_traits>
#include <utility>
#include <variant>

namespace batchlens::base {

/// Why an operation failed. Stable: the CLI maps these to exit codes and the UI to dialogs.
enum class ErrorCode {
  InvalidArgument,          ///< a caller-supplied value is out of range or malformed
  FileNotFound,             ///< a path does not exist or cannot be opened
  FileUnrecognised,         ///< the file is not of the expected kind
  FileIncompatibleVersion,  ///< the file's schema major version cannot be read by this build
  FileCorrupted,            ///< the file is of the expected kind but damaged or truncated
  IoFailed,                 ///< reading or writing failed (disk full, permissions, HDF5 error)
  OutOfMemory,              ///< host or device allocation failed
  DeviceUnavailable,        ///< the requested device (e.g. cuda:1) does not exist here
  Cancelled,                ///< the user cancelled the operation
  Internal,                 ///< a bug: an exception nobody expected
};

/// Human-readable name of an error code, e.g. "FileCorrupted".
const char* to_string(ErrorCode code);

/// An error with its own message text. Value type; copying is cheap enough for error paths.
struct Error {
  ErrorCode code = ErrorCode::Internal;
  std::string message;
};

/// Throws std::logic_error naming the error: value() was called on a failed Result.
[[noreturn]] void throw_bad_access(const Error& error);

/// Holds either a T or an Error. Returned by every core function that ui or app call.
/// Never throws on construction; value() on an error result is a programming error (it throws
/// std::logic_error).

template <class T>
class [[nodiscard]] Result {
 public:
  Result(T value) : state_(std::in_place_index<0>, std::move(value)) {}      // NOLINT: implicit
  Result(Error error) : state_(std::in_place_index<1>, std::move(error)) {}  // NOLINT: implicit

  bool ok() const { return state_.index() == 0; }
  explicit operator bool() const { return ok(); }

  const T& value() const& { return checked_value(); }
  T& value() & { return const_cast<T&>(checked_value()); }
  T&& value() && { return std::move(const_cast<T&>(checked_value())); }

  const Error& error() const& { return std::get<1>(state_); }

 private:
  const T& checked_value() const {
    if (state_.index() != 0) {
      throw_bad_access(std::get<1>(state_));
    }
    return std::get<0>(state_);
  }
  std::variant<T, Error> state_;
};

/// Result of an operation that yields nothing on success.
template <>
class [[nodiscard]] Result<void> {
 public:
  Result() = default;
  Result(Error error) : error_(std::move(error)) {}  // NOLINT: implicit

  bool ok() const { return !error_.has_value(); }
  explicit operator bool() const { return ok(); }
  const Error& error() const { return *error_; }

 private:
  std::optional<Error> error_;
};

/// Shorthand for a successful Result<void>.
inline Result<void> ok_result() {
  return {};
}

/// Exception carrying an Error through code that throws (inside core only).
class ErrorException : public std::exception {
 public:
  explicit ErrorException(Error error) : error_(std::move(error)) {}
  ErrorException(ErrorCode code, std::string message) : error_{code, std::move(message)} {}
  const char* what() const noexcept override { return error_.message.c_str(); }
  const Error& error() const { return error_; }

 private:
  Error error_;
};

/// Throws ErrorException{code, message}. For core code that reports through exceptions.
[[noreturn]] void raise(ErrorCode code, std::string message);

/// raise(ErrorCode::FileCorrupted, what): what every file reader reports for bad content.
[[noreturn]] void corrupt(std::string what);

/// The value of `r`, or throws its Error as ErrorException: the inverse of guarded(), for core
/// code inside a guarded() block that calls Result-returning functions.
template <class T>
T take(Result<T> r) {
  if (!r.ok()) {
    throw ErrorException(r.error());
  }
  return std::move(r).value();
}
/// take() of a Result<void>: throws its Error as ErrorException, if any.
inline void take(const Result<void>& r) {
  if (!r.ok()) {
    throw ErrorException(r.error());
  }
}

/// Maps the exception in flight (call only inside a catch block) to an Error:
/// ErrorException keeps its Error, c10 out-of-memory and std::bad_alloc become OutOfMemory,
/// HDF5 exceptions IoFailed, std::invalid_argument InvalidArgument, anything else Internal.
Error error_from_current_exception();

namespace detail {
template <class T>
struct IsResult : std::false_type {};
template <class T>
struct IsResult<Result<T>> : std::true_type {};
}  // namespace detail

/// Runs f() and returns its value as a Result, mapping any exception to an Error.
/// Never throws. f may return void, a value, or a Result (which is passed through).
template <class F>
auto guarded(F&& f) {
  using R = std::invoke_result_t<F>;
  if constexpr (std::is_void_v<R>) {
    try {
      std::forward<F>(f)();
      return Result<void>{};
    } catch (...) {
      return Result<void>{error_from_current_exception()};
    }
  } else {
    using Out = std::conditional_t<detail::IsResult<R>::value, R, Result<R>>;
    try {
      return Out{std::forward<F>(f)()};
    } catch (...) {
      return Out{error_from_current_exception()};
    }
  }
}

}  // namespace batchlens::base
