// SPDX-License-Identifier: Apache-2.0
#include "ui/story_cache.h"

namespace batchlens::ui {

void StoryCache::follow(const std::shared_ptr<const experiment::ExperimentResult>& result) {
  if (result != result_) {
    clear();
    result_ = result;
  }
}

const analysis::Story& StoryCache::story(
    const std::shared_ptr<const experiment::ExperimentResult>& result, const std::string& id) {
  static const analysis::Story none;
  follow(result);
  if (result_ == nullptr) {
    return none;
  }
  auto it = stories_.find(id);
  if (it == stories_.end()) {
    it = stories_.emplace(id, analysis::build_story(*result_, id)).first;
    ++computed_;
  }
  return it->second;
}

const analysis::Growth& StoryCache::growth(
    const std::shared_ptr<const experiment::ExperimentResult>& result,
    const experiment::ComparisonResult& comparison) {
  static const analysis::Growth none;
  follow(result);
  if (result_ == nullptr) {
    return none;
  }
  auto it = growth_.find(comparison.id);
  if (it == growth_.end()) {
    it = growth_.emplace(comparison.id, analysis::growth(*result_, comparison)).first;
    ++computed_;
  }
  return it->second;
}

void StoryCache::clear() {
  result_.reset();
  stories_.clear();
  growth_.clear();
}

}  // namespace batchlens::ui
