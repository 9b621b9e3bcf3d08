// SPDX-License-Identifier: Apache-2.0
// Whether the tests run under AddressSanitizer (the asan preset of scripts/run-tests.sh): some
// tests skip what it cannot do (let a huge malloc fail) or take a smaller size where the large
// one only repeats the same code many times over at its 10-50x cost.
#pragma once

namespace batchlens::testing {

#if defined(__SANITIZE_ADDRESS__)
inline constexpr bool kAddressSanitizer = true;
#elif defined(__has_feature)
#if __has_feature(address_sanitizer)
inline constexpr bool kAddressSanitizer = true;
#else
inline constexpr bool kAddressSanitizer = false;
#endif
#else
inline constexpr bool kAddressSanitizer = false;
#endif

}  // namespace batchlens::testing
