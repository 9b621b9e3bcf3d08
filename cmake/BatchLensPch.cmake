# SPDX-License-Identifier: Apache-2.0
# Precompiled headers (docs/build.md, issue #31): LibTorch's ATen/ATen.h, nlohmann/json and the
# standard headers take most of every heavy translation unit's compile time (safetensors.cpp:
# 13.9 s without, 8.1 s with). One precompiled header per target, or one shared by the test
# suites that compile with the same flags (bl_precompile(TARGET REUSE_FROM OTHER)). Only C++
# sources take it (the CUDA file never includes LibTorch). Switch off with -DBATCHLENS_PCH=OFF,
# e.g. to check that every file includes what it uses: clang-tidy parses without it
# (tools/tidy_cached.py drops the forced include).
option(BATCHLENS_PCH "Precompile the heavy third-party headers" ON)

set(BATCHLENS_PCH_HEADERS
    <algorithm> <cstdint> <functional> <map> <memory> <optional> <string> <vector>
    <ATen/ATen.h> <nlohmann/json.hpp>)

# bl_precompile(TARGET [HEADERS h...] [REUSE_FROM OTHER] [ONLY_WHERE_INCLUDED header])
# ONLY_WHERE_INCLUDED: sources that do not include `header` themselves compile without it (a
# light file pays 2 s to load the 300 MB precompiled header: base/error.cpp 1.0 s -> 3.1 s).
function(bl_precompile target)
  cmake_parse_arguments(ARG "" "REUSE_FROM;ONLY_WHERE_INCLUDED" "HEADERS" ${ARGN})
  if(NOT BATCHLENS_PCH)
    return()
  endif()
  if(ARG_ONLY_WHERE_INCLUDED)
    get_target_property(sources ${target} SOURCES)
    get_target_property(dir ${target} SOURCE_DIR)
    foreach(source IN LISTS sources)
      if(NOT IS_ABSOLUTE "${source}")
        set(source "${dir}/${source}")
      endif()
      set(text "")
      if(source MATCHES "\\.(cpp|cc)$" AND EXISTS "${source}")  # generated ones do not yet
        file(READ "${source}" text)
      endif()
      if(source MATCHES "\\.(cpp|cc)$")
        string(FIND "${text}" "#include ${ARG_ONLY_WHERE_INCLUDED}" at)
        if(at EQUAL -1)
          set_source_files_properties(${source} TARGET_DIRECTORY ${target} PROPERTIES
                                      SKIP_PRECOMPILE_HEADERS ON)
        endif()
      endif()
    endforeach()
  endif()
  if(ARG_REUSE_FROM)
    target_precompile_headers(${target} REUSE_FROM ${ARG_REUSE_FROM})
    return()
  endif()
  set(headers ${BATCHLENS_PCH_HEADERS} ${ARG_HEADERS})
  # C++ only; '>' inside a generator expression is spelled $<ANGLE-R>.
  list(TRANSFORM headers REPLACE "^<(.*)>$" "$<$<COMPILE_LANGUAGE:CXX>:<\\1$<ANGLE-R>>")
  target_precompile_headers(${target} PRIVATE ${headers})
endfunction()
