// SPDX-License-Identifier: Apache-2.0
// The front door for untrusted input: files that travel between people (experiment files,
// checkpoints, tokenizers, policies) and the JSON and text inside them. Every reader in core goes
// through these checks before it reads (docs/reliability.md).
#pragma once

#include <cstddef>
#include <cstdint>
#include <filesystem>
#include <optional>
#include <string>
#include <string_view>

#include <nlohmann/json_fwd.hpp>

#include "core/base/error.h"

namespace batchlens::base {

/// Deepest nesting of arrays and objects accepted in any JSON BatchLens reads. Real configs,
/// tokenizers and policies nest at most 6 deep.
inline constexpr int kMaxJsonDepth = 64;
/// Largest JSON or text file read whole (tokenizer.json of a 262k vocabulary is about 35 MB).
inline constexpr std::uint64_t kMaxTextFileBytes = std::uint64_t{1} << 30;

/// What a file of this `st_mode` is, for messages: "a folder", "a FIFO (named pipe)", "a device",
/// "a socket" or "not a regular file".
const char* file_kind(unsigned mode);

/// Checks that `path` names a regular file (after symlinks) without opening it, so a FIFO, a
/// device, a socket or a directory is refused instead of blocking a read. `what` names the file
/// in messages ("tokenizer.json"). Errors: FileNotFound; FileUnrecognised (not a regular file).
Result<std::uint64_t> check_input_file(const std::filesystem::path& path, std::string_view what);

/// Reads a regular file whole, refusing special files (check_input_file), files over `max_bytes`
/// and files that change kind between the check and the open (opened O_NONBLOCK, checked with
/// fstat). Errors: FileNotFound, FileUnrecognised, InvalidArgument (too large), IoFailed.
Result<std::string> read_input_file(const std::filesystem::path& path, std::string_view what,
                                    std::uint64_t max_bytes = kMaxTextFileBytes);

/// Nesting depth of the JSON text (arrays and objects, strings skipped), stopping as soon as it
/// exceeds `limit`: linear time, constant stack. Returns > limit when the text nests deeper.
int json_depth(std::string_view text, int limit);

/// Parses untrusted JSON: depth checked first (kMaxJsonDepth), then parsed without exceptions.
/// Errors: `code` (default InvalidArgument) with `what`, the reason and, for syntax errors, the
/// byte offset. Messages never echo the input.
Result<nlohmann::json> parse_json(std::string_view text, std::string_view what,
                                  ErrorCode code = ErrorCode::InvalidArgument,
                                  int max_depth = kMaxJsonDepth);

/// Byte offset of the first byte that is not part of a well-formed UTF-8 sequence (overlongs,
/// surrogates and code points above U+10FFFF refused), or nullopt when all of `text` is valid.
std::optional<std::size_t> first_invalid_utf8(std::string_view text);

/// InvalidArgument naming `what` and the byte offset when `text` is not valid UTF-8.
Result<void> check_utf8(std::string_view text, std::string_view what);

/// JSON text of `j` that never throws: invalid UTF-8 in strings is replaced by U+FFFD.
std::string dump_json_lossy(const nlohmann::json& j, int indent = -1);

}  // namespace batchlens::base
