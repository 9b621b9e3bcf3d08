// SPDX-License-Identifier: Apache-2.0
// The story and the growth of a shown result's comparisons, computed once per (result,
// comparison): the Overview redraws on every selection change, and neither changes unless the
// result does.
#pragma once

#include <map>
#include <memory>
#include <string>

#include "core/analysis/story.h"

namespace batchlens::ui {

/// GUI thread only. Keeps the result its entries belong to, so that another result (even one
/// at the same address) never gets them.
class StoryCache {
 public:
  /// analysis::build_story of comparison `id` of `result`: computed the first time, then the
  /// same object until a call with another result drops every entry. An empty story without a
  /// result.
  const analysis::Story& story(const std::shared_ptr<const experiment::ExperimentResult>& result,
                               const std::string& id);
  /// analysis::growth of `comparison` (one of `result`'s), likewise.
  const analysis::Growth& growth(const std::shared_ptr<const experiment::ExperimentResult>& result,
                                 const experiment::ComparisonResult& comparison);
  /// Drops every entry and the result (a new document).
  void clear();
  /// How many stories and growths were computed so far.
  int computed() const { return computed_; }

 private:
  /// Drops the entries when `result` is not the one they belong to.
  void follow(const std::shared_ptr<const experiment::ExperimentResult>& result);

  std::shared_ptr<const experiment::ExperimentResult> result_;
  std::map<std::string, analysis::Story> stories_;
  std::map<std::string, analysis::Growth> growth_;
  int computed_ = 0;
};

}  // namespace batchlens::ui
