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
# Configure again when HEAD moves (a commit, a checkout), so --version and the files a build
# writes name the commit that was built, not the one that was configured. Only base/version.cpp
# sees the hash, so a commit recompiles one file.
if(EXISTS "${PROJECT_SOURCE_DIR}/.git/HEAD")
  set(_bl_git_deps "${PROJECT_SOURCE_DIR}/.git/HEAD")
  file(READ "${PROJECT_SOURCE_DIR}/.git/HEAD" _bl_head)
  if(_bl_head MATCHES "^ref: ([^\n]+)")
    if(EXISTS "${PROJECT_SOURCE_DIR}/.git/${CMAKE_MATCH_1}")
      list(APPEND _bl_git_deps "${PROJECT_SOURCE_DIR}/.git/${CMAKE_MATCH_1}")
    endif()
  endif()
  if(EXISTS "${PROJECT_SOURCE_DIR}/.git/packed-refs")
    list(APPEND _bl_git_deps "${PROJECT_SOURCE_DIR}/.git/packed-refs")
  endif()
  set_property(DIRECTORY "${PROJECT_SOURCE_DIR}" APPEND PROPERTY CMAKE_CONFIGURE_DEPENDS
               ${_bl_git_deps})
endif()
