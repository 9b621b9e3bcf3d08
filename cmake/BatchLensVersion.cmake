# SPDX-License-Identifier: Apache-2.0
# The git hash of the source tree, for --version and experiment-file provenance.
# A tree copied without .git (GPU servers) can pass the hash in BATCHLENS_GIT_HASH.
set(BATCHLENS_GIT_HASH "unknown")
if(DEFINED ENV{BATCHLENS_GIT_HASH})
  set(BATCHLENS_GIT_HASH "$ENV{BATCHLENS_GIT_HASH}")
endif()
find_package(Git QUIET)
if(GIT_FOUND AND EXISTS "${PROJECT_SOURCE_DIR}/.git")
  execute_process(COMMAND "${GIT_EXECUTABLE}" rev-parse --short=12 HEAD
                  WORKING_DIRECTORY "${PROJECT_SOURCE_DIR}"
                  OUTPUT_VARIABLE _bl_hash OUTPUT_STRIP_TRAILING_WHITESPACE
                  ERROR_QUIET RESULT_VARIABLE _bl_rc)
  if(_bl_rc EQUAL 0 AND _bl_hash)
    set(BATCHLENS_GIT_HASH "${_bl_hash}")
  endif()
endif()
