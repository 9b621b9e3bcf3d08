// SPDX-License-Identifier: Apache-2.0
#include "core/base/error.h"

#include <cstdint>
#include <new>
#include <stdexcept>
#include <string>

#include <ATen/ATen.h>
#include <gtest/gtest.h>

#include "tests/support/sanitizer.h"

namespace batchlens::base {
namespace {

TEST(Result, HoldsValueOrError) {
  Result<int> good = 42;
  ASSERT_TRUE(good.ok());
  EXPECT_EQ(good.value(), 42);

  Result<int> bad = Error{ErrorCode::FileCorrupted, "truncated"};
  ASSERT_FALSE(bad.ok());
  EXPECT_EQ(bad.error().code, ErrorCode::FileCorrupted);
  EXPECT_EQ(bad.error().message, "truncated");
  EXPECT_THROW((void)bad.value(), std::logic_error);
}

TEST(Guarded, PassesValuesAndResultsThrough) {
  auto plain = guarded([] { return std::string("ok"); });
  ASSERT_TRUE(plain.ok());
  EXPECT_EQ(plain.value(), "ok");

  auto nested = guarded([]() -> Result<int> { return Error{ErrorCode::Cancelled, "stop"}; });
  ASSERT_FALSE(nested.ok());
  EXPECT_EQ(nested.error().code, ErrorCode::Cancelled);

  auto nothing = guarded([] {});
  EXPECT_TRUE(nothing.ok());
}

TEST(Guarded, MapsExceptionsToCodes) {
  EXPECT_EQ(guarded([] { raise(ErrorCode::FileNotFound, "no such file: x"); }).error().code,
            ErrorCode::FileNotFound);
  EXPECT_EQ(guarded([] { throw std::bad_alloc(); }).error().code, ErrorCode::OutOfMemory);
  EXPECT_EQ(guarded([] { throw std::invalid_argument("bad"); }).error().code,
            ErrorCode::InvalidArgument);
  EXPECT_EQ(guarded([] { throw std::runtime_error("boom"); }).error().code, ErrorCode::Internal);
  EXPECT_EQ(guarded([] { throw 7; }).error().code, ErrorCode::Internal);
}

// A host allocation LibTorch's CPU allocator could not make (a memory limit: `ulimit -v` on a
// GPU server, issue #36) is out of memory, not an internal error; a real one, from a tensor
// larger than the address space allows.
TEST(Guarded, TheCpuAllocatorsFailureIsOutOfMemory) {
  if constexpr (::batchlens::testing::kAddressSanitizer) {
    GTEST_SKIP() << "AddressSanitizer ends the process on an allocation this large instead of "
                    "letting malloc fail";
  }
  const auto r = guarded(
      [] { (void)at::empty({std::int64_t{1} << 61}, at::TensorOptions().dtype(at::kByte)); });
  ASSERT_FALSE(r.ok());
  EXPECT_EQ(r.error().code, ErrorCode::OutOfMemory) << r.error().message;
  EXPECT_EQ(r.error().message.rfind("out of host memory: you tried to allocate ", 0), 0U)
      << r.error().message;
  EXPECT_EQ(r.error().message.find('\n'), std::string::npos) << r.error().message;
}

TEST(Guarded, MapsLibTorchErrorsWithoutBacktrace) {
  // A real LibTorch failure: multiplying incompatible shapes.
  const auto r = guarded([] { return at::matmul(at::ones({2, 3}), at::ones({4, 5})); });
  ASSERT_FALSE(r.ok());
  EXPECT_EQ(r.error().code, ErrorCode::Internal);
  EXPECT_NE(r.error().message.find("LibTorch"), std::string::npos);
  EXPECT_EQ(r.error().message.find('\n'), std::string::npos) << r.error().message;
}

TEST(ErrorCode, EveryCodeHasAName) {
  for (int c = 0; c <= static_cast<int>(ErrorCode::Internal); ++c) {
    EXPECT_STRNE(to_string(static_cast<ErrorCode>(c)), "Unknown");
  }
}

}  // namespace
}  // namespace batchlens::base
