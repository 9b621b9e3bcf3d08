# SPDX-License-Identifier: Apache-2.0
# Warnings and sanitizers for project code, carried by one INTERFACE target. Third-party headers
# come in through imported targets, whose include directories CMake marks SYSTEM.
add_library(batchlens_warnings INTERFACE)
add_library(BatchLens::warnings ALIAS batchlens_warnings)
if(CMAKE_CXX_COMPILER_ID MATCHES "GNU|Clang")
  target_compile_options(batchlens_warnings INTERFACE -Wall -Wextra -Wpedantic)
  # Debian's LibTorch 1.13 pulls in OpenCV and with it Qt 5 (libQt5Widgets) beside our Qt 6.
  # An executable exports the weak copies of inline Qt 6 functions that a loaded library
  # references by the same name (QByteArray::append), and Qt 5's static initialisers then run
  # Qt 6 code and crash before main. Hidden inline functions are never exported.
  target_compile_options(batchlens_warnings INTERFACE -fvisibility-inlines-hidden)
  if(CMAKE_CXX_COMPILER_ID STREQUAL "Clang")
    # The generated sources embed resources/ as raw string literals longer than the 65536
    # characters the standard guarantees; GCC and clang both accept them, clang warns.
    target_compile_options(batchlens_warnings INTERFACE -Wno-overlength-strings)
  endif()
  if(BATCHLENS_WERROR)
    target_compile_options(batchlens_warnings INTERFACE -Werror)
  endif()
endif()

if(BATCHLENS_SANITIZE)
  string(REPLACE ";" "," _bl_san "${BATCHLENS_SANITIZE}")
  # -fno-sanitize-recover: a UBSan finding aborts the process (as ASan's do), so a test or a
  # fuzz input that triggers one fails instead of printing a line nobody reads.
  target_compile_options(batchlens_warnings INTERFACE -fsanitize=${_bl_san}
                         -fno-sanitize-recover=all -fno-omit-frame-pointer)
  target_link_options(batchlens_warnings INTERFACE -fsanitize=${_bl_san})
endif()

# libFuzzer targets (tests/fuzz, docs/reliability.md). Project code is compiled with coverage
# instrumentation (-fsanitize=fuzzer-no-link) so the fuzz executables, linked with
# -fsanitize=fuzzer, reuse the same objects as the sanitizer tests; the tests themselves get
# libFuzzer's callbacks from the sanitizer runtime and run as usual.
option(BATCHLENS_FUZZ "Build the libFuzzer targets in tests/fuzz (clang only)" OFF)
if(BATCHLENS_FUZZ)
  if(NOT CMAKE_CXX_COMPILER_ID STREQUAL "Clang")
    message(FATAL_ERROR "BATCHLENS_FUZZ=ON needs clang (libFuzzer): configure with "
                        "CMAKE_CXX_COMPILER=clang++-14 (the asan preset does)")
  endif()
  target_compile_options(batchlens_warnings INTERFACE -fsanitize=fuzzer-no-link)
endif()
