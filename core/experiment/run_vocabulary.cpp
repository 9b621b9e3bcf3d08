// SPDX-License-Identifier: Apache-2.0
#include "core/experiment/run_vocabulary.h"

#include "core/base/named.h"

namespace batchlens::experiment {

namespace {

constexpr std::string_view kWorkaroundPrefix = "wa.";
constexpr std::string_view kReference = "ref";
constexpr std::string_view kRepeat = "repeat";
constexpr std::string_view kRowsSuffix = ".rows";
constexpr std::string_view kSeparator = "__";

bool starts_with(std::string_view s, std::string_view prefix) {
  return s.substr(0, prefix.size()) == prefix;
}

}  // namespace

const char* name(RunGroup group) {
  return group == RunGroup::Main ? "main" : "workaround";
}

base::Result<RunGroup> parse_run_group(std::string_view text) {
  return base::parse_named(text, {RunGroup::Main, RunGroup::Workaround}, &name, "run group");
}

const char* name(ComparisonKind kind) {
  return kind == ComparisonKind::Row0 ? "row0" : "rows";
}

base::Result<ComparisonKind> parse_comparison_kind(std::string_view text) {
  return base::parse_named(text, {ComparisonKind::Row0, ComparisonKind::Rows}, &name,
                           "comparison kind");
}

base::Result<RunGroup> enum_from_name(RunGroup /*tag*/, std::string_view text) {
  return parse_run_group(text);
}

base::Result<ComparisonKind> enum_from_name(ComparisonKind /*tag*/, std::string_view text) {
  return parse_comparison_kind(text);
}

const char* name(RunRole role) {
  switch (role) {
    case RunRole::Reference:
      return "reference";
    case RunRole::Repeat:
      return "repeat";
    case RunRole::Batched:
      break;
  }
  return "batched";
}

std::string run_id(RunGroup group, RunRole role, std::int64_t n) {
  std::string id(group == RunGroup::Workaround ? kWorkaroundPrefix : std::string_view());
  switch (role) {
    case RunRole::Reference:
      return id.append(kReference);
    case RunRole::Repeat:
      return id.append(kRepeat) + std::to_string(n);
    case RunRole::Batched:
      break;
  }
  return id + "b" + std::to_string(n);
}

RunGroup group_of_run(std::string_view id) {
  return starts_with(id, kWorkaroundPrefix) ? RunGroup::Workaround : RunGroup::Main;
}

RunRole role_of_run(std::string_view id) {
  if (group_of_run(id) == RunGroup::Workaround) {
    id.remove_prefix(kWorkaroundPrefix.size());
  }
  if (id == kReference) {
    return RunRole::Reference;
  }
  return starts_with(id, kRepeat) ? RunRole::Repeat : RunRole::Batched;
}

std::string reference_run(RunGroup group) {
  return run_id(group, RunRole::Reference);
}

std::string reference_run_of(std::string_view run) {
  return reference_run(group_of_run(run));
}

std::string comparison_id(ComparisonKind kind, std::string_view reference, std::string_view run) {
  if (kind == ComparisonKind::Rows) {
    return std::string(run).append(kRowsSuffix);
  }
  return std::string(reference).append(kSeparator).append(run);
}

std::string noise_floor_comparison() {
  return comparison_id(ComparisonKind::Row0, reference_run(RunGroup::Main),
                       run_id(RunGroup::Main, RunRole::Repeat, 1));
}

RunGroup group_of_comparison(std::string_view id) {
  return group_of_run(id);
}

std::string workaround_counterpart(std::string_view comparison) {
  const std::size_t sep = comparison.find(kSeparator);
  if (sep == std::string_view::npos || group_of_comparison(comparison) == RunGroup::Workaround) {
    return {};
  }
  return std::string(kWorkaroundPrefix)
      .append(comparison.substr(0, sep))
      .append(kSeparator)
      .append(kWorkaroundPrefix)
      .append(comparison.substr(sep + kSeparator.size()));
}

}  // namespace batchlens::experiment
