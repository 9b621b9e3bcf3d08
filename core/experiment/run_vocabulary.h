// SPDX-License-Identifier: Apache-2.0
// The result vocabulary: run groups, run roles and comparison kinds as enums, and the ids of runs
// and comparisons, built and recognised here only. Their text ("main", "row0", "wa.b4") exists
// at the file and JSON edge, where name() writes it and parse_*() reads it; files are unchanged.
#pragma once

#include <cstdint>
#include <string>
#include <string_view>

#include "core/base/error.h"

namespace batchlens::experiment {

/// The runs with the spec's policy, and the same again with its workaround (ids prefixed "wa.").
enum class RunGroup : std::uint8_t { Main, Workaround };
/// "main" / "workaround".
const char* name(RunGroup group);
/// The group of a name; InvalidArgument naming the accepted ones otherwise. Never throws.
base::Result<RunGroup> parse_run_group(std::string_view text);

/// Row 0 against the reference's row 0, or (lockstep) a batched run's rows 1.. against its own
/// row 0 (aggregates only).
enum class ComparisonKind : std::uint8_t { Row0, Rows };
/// "row0" / "rows".
const char* name(ComparisonKind kind);
/// The kind of a name; InvalidArgument naming the accepted ones otherwise. Never throws.
base::Result<ComparisonKind> parse_comparison_kind(std::string_view text);

/// parse_run_group / parse_comparison_kind chosen by the type of `tag`, for the schema's readers.
base::Result<RunGroup> enum_from_name(RunGroup tag, std::string_view text);
base::Result<ComparisonKind> enum_from_name(ComparisonKind tag, std::string_view text);

/// What a run is within its group: the B=1 reference, a B=1 repeat of it (the noise floor), or
/// a batched run.
enum class RunRole : std::uint8_t { Reference, Repeat, Batched };
/// "reference" / "repeat" / "batched".
const char* name(RunRole role);

/// A run's id: "ref", "repeat<n>" (n = 1, 2, ...), "b<n>" (n = its batch size), prefixed "wa."
/// in the workaround group.
std::string run_id(RunGroup group, RunRole role, std::int64_t n = 0);
/// The group of a run id (its "wa." prefix).
RunGroup group_of_run(std::string_view id);
/// The role of a run id; ids not made by run_id (a damaged file's) count as Batched.
RunRole role_of_run(std::string_view id);
/// The B=1 reference run of a group: "ref" or "wa.ref".
std::string reference_run(RunGroup group);
/// The B=1 reference of the group `run` belongs to.
std::string reference_run_of(std::string_view run);

/// A comparison's id: "<reference>__<run>" for Row0, "<run>.rows" for Rows.
std::string comparison_id(ComparisonKind kind, std::string_view reference, std::string_view run);
/// The noise floor's comparison: the main group's reference against its first B=1 repeat.
std::string noise_floor_comparison();
/// The group of a comparison id (its "wa." prefix).
RunGroup group_of_comparison(std::string_view id);
/// The workaround group's counterpart of a main group's row-0 comparison id ("ref__b2" ->
/// "wa.ref__wa.b2"); "" for ids of the workaround group or of another kind.
std::string workaround_counterpart(std::string_view comparison);

}  // namespace batchlens::experiment
