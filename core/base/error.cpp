// SPDX-License-Identifier: Apache-2.0
#include "core/base/error.h"

#include <new>
#include <stdexcept>

#include <H5Cpp.h>
#include <c10/util/Exception.h>

namespace batchlens::base {

const char* to_string(ErrorCode code) {
  switch (code) {
    case ErrorCode::InvalidArgument:
      return "InvalidArgument";
    case ErrorCode::FileNotFound:
      return "FileNotFound";
    case ErrorCode::FileUnrecognised:
      return "FileUnrecognised";
    case ErrorCode::FileIncompatibleVersion:
      return "FileIncompatibleVersion";
    case ErrorCode::FileCorrupted:
      return "FileCorrupted";
    case ErrorCode::IoFailed:
      return "IoFailed";
    case ErrorCode::OutOfMemory:
      return "OutOfMemory";
    case ErrorCode::DeviceUnavailable:
      return "DeviceUnavailable";
    case ErrorCode::Cancelled:
      return "Cancelled";
    case ErrorCode::Internal:
      return "Internal";
  }
  return "Unknown";
}

void throw_bad_access(const Error& error) {
  throw std::logic_error(std::string("Result::value() on an error result: ") +
                         to_string(error.code) + ": " + error.message);
}

void raise(ErrorCode code, std::string message) {
  throw ErrorException(code, std::move(message));
}

void corrupt(std::string what) {
  raise(ErrorCode::FileCorrupted, std::move(what));
}

namespace {

// c10 messages end with a long C++ backtrace; users want the first line.
std::string first_line(const std::string& text) {
  const auto pos = text.find('\n');
  return pos == std::string::npos ? text : text.substr(0, pos);
}

}  // namespace

Error error_from_current_exception() {
  try {
    throw;
  } catch (const ErrorException& e) {
    return e.error();
  } catch (const c10::OutOfMemoryError& e) {
    return {ErrorCode::OutOfMemory, "out of memory: " + first_line(e.what_without_backtrace())};
  } catch (const std::bad_alloc&) {
    return {ErrorCode::OutOfMemory, "out of host memory (std::bad_alloc)"};
  } catch (const c10::Error& e) {
    const std::string what = e.what_without_backtrace();
    // CUDA's allocator reports OOM through c10::Error in some versions.
    if (what.find("out of memory") != std::string::npos) {
      return {ErrorCode::OutOfMemory, first_line(what)};
    }
    // The CPU allocator's malloc failing (LibTorch's DefaultCPUAllocator, errno ENOMEM: a
    // memory limit or an exhausted host) is a c10::Error too.
    if (what.find("can't allocate memory") != std::string::npos) {
      std::string detail;
      const std::size_t tried = what.find("you tried to allocate");
      if (tried != std::string::npos) {
        detail = what.substr(tried);
        detail = ": " + detail.substr(0, detail.find('.'));
      }
      return {ErrorCode::OutOfMemory, "out of host memory" + detail};
    }
    return {ErrorCode::Internal, "LibTorch: " + first_line(what)};
  } catch (const H5::Exception& e) {
    return {ErrorCode::IoFailed, "HDF5: " + e.getDetailMsg()};
  } catch (const std::invalid_argument& e) {
    return {ErrorCode::InvalidArgument, e.what()};
  } catch (const std::exception& e) {
    return {ErrorCode::Internal, e.what()};
  } catch (...) {
    return {ErrorCode::Internal, "unknown exception"};
  }
}

}  // namespace batchlens::base
