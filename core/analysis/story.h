// SPDX-License-Identifier: Apache-2.0
// The story of a comparison in one sentence: where row 0 first departs, how far it spreads,
// whether routing flips, how many tokens change and whether the workaround holds. Built from
// the result alone (never from text), shared by the GUI's headline, `batchlens-cli summary`
// and the exported reports. Torch-free.
//
// Numbering, everywhere a person reads it (GUI, CLI, reports, docs): canvases and denoising
// steps are counted from 1 ("canvas 1 · step 2"); layers and canvas positions are indices
// from 0, as in the checkpoint's keys (model.layers.0) and the tensors.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "core/experiment/experiment.h"

namespace batchlens::analysis {

/// The explorer view a clause of the story points at.
enum class StoryView { Overview, LayerStep, Spread, Routing, TextDiff, Kernels };

/// One clause and where it points: the view, and the cell to select there (-1 where none).
struct StoryClause {
  std::string text;
  StoryView view = StoryView::Overview;
  int tick = -1;        ///< the experiment's tick (index into the comparison's arrays)
  int layer_slot = -1;  ///< 0..L-1, or L for the per-step taps
  std::string tap;      ///< tap name to select, empty to keep the shown one
  std::int64_t position = -1;
  bool workaround = false;  ///< the clause is about the workaround's side
};

struct Story {
  std::string comparison;  ///< the comparison id it tells
  std::vector<StoryClause> clauses;
  /// Why many numeric differences can leave few tokens changed (or the reverse), for this
  /// result's numbers. Empty when nothing diverged.
  std::string why;
  /// The clauses joined with " → ".
  std::string headline() const;
};

/// "canvas 1 · step 2" for a tick of a run, from the run's own tick table; "tick N" where the
/// run did not step at that tick.
std::string tick_label(const experiment::RunResult& run, int tick);

/// "the self-conditioning matmul" for "selfcond.soft_embed": the op behind a tap, in words.
std::string tap_op_phrase(const std::string& tap);

/// The story of one comparison of `result` (null when there is none by that id). Every array
/// is read bounds-checked: a damaged result gives a shorter story, never a crash.
Story build_story(const experiment::ExperimentResult& result, const std::string& comparison_id);

/// How a comparison's difference grows, per tick of its arrays (NaN where it did not compare):
/// the share of canvas positions where any tap of any layer differs, and the largest share of
/// differing elements over the taps and layers.
struct Growth {
  std::vector<double> positions;
  std::vector<double> elements;
};
Growth growth(const experiment::ExperimentResult& result,
              const experiment::ComparisonResult& comparison);

/// The comparison a reader should see first: the first main row-0 comparison against the
/// reference that diverges, else the first comparison; empty without comparisons.
std::string headline_comparison(const experiment::ExperimentResult& result);

}  // namespace batchlens::analysis
