# SPDX-License-Identifier: Apache-2.0
# Warnings and sanitizers for project code, carried by one INTERFACE target. Third-party headers
# come in through imported targets, whose include directories CMake marks SYSTEM.
add_library(batchlens_warnings INTERFACE)
add_library(BatchLens::warnings ALIAS batchlens_warnings)
if(CMAKE_CXX_COMPILER_ID MATCHES "GNU|Clang")
  target_compile_options(batchlens_warnings INTERFACE -Wall -Wextra -Wpedantic)
  if(BATCHLENS_WERROR)
    target_compile_options(batchlens_warnings INTERFACE -Werror)
  endif()
endif()

if(BATCHLENS_SANITIZE)
  string(REPLACE ";" "," _bl_san "${BATCHLENS_SANITIZE}")
  target_compile_options(batchlens_warnings INTERFACE -fsanitize=${_bl_san} -fno-omit-frame-pointer)
  target_link_options(batchlens_warnings INTERFACE -fsanitize=${_bl_san})
endif()
