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
  if(BATCHLENS_WERROR)
    target_compile_options(batchlens_warnings INTERFACE -Werror)
  endif()
endif()

if(BATCHLENS_SANITIZE)
  string(REPLACE ";" "," _bl_san "${BATCHLENS_SANITIZE}")
  target_compile_options(batchlens_warnings INTERFACE -fsanitize=${_bl_san} -fno-omit-frame-pointer)
  target_link_options(batchlens_warnings INTERFACE -fsanitize=${_bl_san})
endif()
