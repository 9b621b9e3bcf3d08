// SPDX-License-Identifier: Apache-2.0
#include "core/analysis/story.h"

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <limits>

namespace batchlens::analysis {

using experiment::ComparisonResult;
using experiment::Divergence;
using experiment::ExperimentResult;
using experiment::LastStepDiff;
using experiment::RunMode;
using experiment::RunResult;

namespace {

// "0.16 %", "12 %", "100 %".
std::string percent(double share) {
  const double v = 100.0 * share;
  char buf[32];
  if (v >= 10.0 || v == 0.0) {
    std::snprintf(buf, sizeof buf, "%.0f %%", v);
  } else if (v >= 1.0) {
    std::snprintf(buf, sizeof buf, "%.1f %%", v);
  } else {
    std::snprintf(buf, sizeof buf, "%.2g %%", v);
  }
  return buf;
}

std::string number(double v) {
  char buf[32];
  std::snprintf(buf, sizeof buf, "%.3g", v);
  return buf;
}

int tap_index(const ExperimentResult& r, const std::string& name) {
  for (std::size_t t = 0; t < r.taps.size(); ++t) {
    if (r.taps[t] == name) {
      return static_cast<int>(t);
    }
  }
  return -1;
}

bool compared_at(const ComparisonResult& c, std::int64_t tick) {
  return tick >= 0 && static_cast<std::uint64_t>(tick) < c.compared.size() &&
         c.compared[static_cast<std::size_t>(tick)] != 0;
}

// "canvas 1 · step 2" from a divergence's own fields.
std::string where(const Divergence& d) {
  return "canvas " + std::to_string(static_cast<std::int64_t>(d.canvas) + 1) + " · step " +
         std::to_string(d.step);
}

// Who is compared with whom, as the subject of the first clause.
std::string subject(const ExperimentResult& r, const ComparisonResult& c) {
  const RunResult* run = r.run(c.run);
  const std::string b = run != nullptr ? "B=" + std::to_string(run->batch_size) : c.run;
  const std::string prefix = experiment::group_of_run(c.id) == experiment::RunGroup::Workaround
                                 ? "With the workaround, "
                                 : "";
  if (c.kind == experiment::ComparisonKind::Rows) {
    return prefix + "Rows 1.. of " + b + " (vs its own row 0)";
  }
  if (run != nullptr && run->batch_size == 1) {
    return prefix + "The B=1 repeat";
  }
  // The row under test: row 0 unless a mixed batch holds the prompt elsewhere (issue #35).
  const std::string row = "ow " + std::to_string(r.spec.composition.row) + " of ";
  return prefix + (prefix.empty() ? "R" : "r") + row + b;
}

// Clause 1: where the comparison first differs.
StoryClause onset(const ExperimentResult& r, const ComparisonResult& c) {
  const Divergence& d = c.first;
  StoryClause clause;
  clause.view = StoryView::LayerStep;
  clause.tick = d.tick;
  clause.layer_slot = d.layer >= 0 ? d.layer : r.layers;
  clause.tap = d.tap;
  clause.position = d.position;
  std::string text = subject(r, c) + " first differs at " + where(d);
  if (d.tap == "tokens") {
    text += " in the sampler's decisions only (position " + std::to_string(d.position) + ")";
    clause.view = StoryView::TextDiff;
    clause.tap.clear();
  } else {
    text += " in " + (d.layer >= 0 ? "layer " + std::to_string(d.layer) + "'s " : std::string()) +
            tap_op_phrase(d.tap) + " (" + d.tap;
    const int t = tap_index(r, d.tap);
    const float* share = t >= 0 ? c.frac_differ.find({d.tick, clause.layer_slot, t}) : nullptr;
    if (share != nullptr) {
      text += ": " + percent(*share) + " of elements";
    }
    text += ", first at position " + std::to_string(d.position) + ")";
  }
  clause.text = std::move(text);
  return clause;
}

// Positions where any tap of any slot differs at a tick; -1 when the arrays cannot say.
std::int64_t positions_differing(const ExperimentResult& r, const ComparisonResult& c,
                                 std::int64_t tick) {
  const auto& pf = c.pos_frac_differ;  // [S, L+1, T, C]
  if (pf.shape.size() != 4 || r.canvas_length <= 0) {
    return -1;
  }
  std::int64_t count = 0;
  for (std::int64_t p = 0; p < r.canvas_length; ++p) {
    bool differs = false;
    for (std::int64_t s = 0; s <= r.layers && !differs; ++s) {
      for (std::int64_t t = 0; t < static_cast<std::int64_t>(r.taps.size()) && !differs; ++t) {
        const float* v = pf.find({tick, s, t, p});
        differs = v != nullptr && *v > 0.0F;
      }
    }
    count += differs ? 1 : 0;
  }
  return count;
}

// Clause 2: how far the difference spreads over the canvas.
bool spread(const ExperimentResult& r, const ComparisonResult& c, const RunResult& ref,
            StoryClause& out) {
  std::int64_t best = -1;
  int best_tick = -1;
  for (int tick = std::max(c.first.tick, 0); static_cast<std::size_t>(tick) < c.compared.size();
       ++tick) {
    if (!compared_at(c, tick)) {
      continue;
    }
    const std::int64_t n = positions_differing(r, c, tick);
    if (n > best) {
      best = n;
      best_tick = tick;
    }
    if (n == r.canvas_length) {
      break;
    }
  }
  if (best <= 0) {
    return false;
  }
  out.view = StoryView::Spread;
  out.tick = best_tick;
  out.layer_slot = c.first.layer >= 0 ? c.first.layer : r.layers;
  out.tap = c.first.tap == "tokens" ? std::string() : c.first.tap;
  const std::string at = tick_label(ref, best_tick);
  if (best == r.canvas_length) {
    out.text = best_tick == c.first.tick ? "every position at once" : "every position by " + at;
  } else {
    out.text =
        std::to_string(best) + " of " + std::to_string(r.canvas_length) + " positions by " + at;
  }
  return true;
}

// Clause 3: where the expert sets first flip, and how close the reference's router was there.
bool routing(const ComparisonResult& c, const RunResult& ref, StoryClause& out) {
  const auto& flips = c.routing_flips;  // [S, L, C]
  if (flips.shape.size() != 3 || flips.empty()) {
    return false;
  }
  for (std::int64_t tick = 0; tick < flips.shape[0]; ++tick) {
    int best_layer = -1;
    std::int64_t best = 0;
    for (std::int64_t l = 0; l < flips.shape[1]; ++l) {
      std::int64_t n = 0;
      for (std::int64_t p = 0; p < flips.shape[2]; ++p) {
        const std::uint8_t* f = flips.find({tick, l, p});
        n += f != nullptr && *f != 0 ? 1 : 0;
      }
      if (n > best) {
        best = n;
        best_layer = static_cast<int>(l);
      }
    }
    if (best_layer < 0) {
      continue;
    }
    double margin = std::numeric_limits<double>::infinity();
    for (std::int64_t p = 0; p < flips.shape[2]; ++p) {
      const std::uint8_t* f = flips.find({tick, best_layer, p});
      const float* m = c.router_margin.find({tick, best_layer, p});
      if (f != nullptr && *f != 0 && m != nullptr && std::isfinite(*m)) {
        margin = std::min(margin, static_cast<double>(*m));
      }
    }
    out.view = StoryView::Routing;
    out.tick = static_cast<int>(tick);
    out.layer_slot = best_layer;
    out.text = "expert set flips at " + std::to_string(best) + " of " +
               std::to_string(flips.shape[2]) + " positions in layer " +
               std::to_string(best_layer) + " at " + tick_label(ref, static_cast<int>(tick));
    if (std::isfinite(margin)) {
      out.text += " (smallest router margin " + number(margin) + ")";
    }
    return true;
  }
  out.view = StoryView::Routing;
  out.text = "no expert set ever flips";
  return true;
}

std::int64_t generated(const RunResult& a, const RunResult& b) {
  return static_cast<std::int64_t>(std::max(a.tokens.size(), b.tokens.size()));
}

// Clause 4: what happens to the text.
StoryClause tokens(const ExperimentResult& r, const ComparisonResult& c, const RunResult& ref,
                   const RunResult& run) {
  StoryClause clause;
  clause.view = StoryView::TextDiff;
  const std::string total = std::to_string(generated(ref, run));
  clause.text = c.tokens_changed == 0
                    ? "the text stays identical (0 of " + total + " tokens change)"
                    : std::to_string(c.tokens_changed) + " of " + total + " tokens change";
  if (c.stop_changed) {
    clause.text += ", the stop moves (position " + std::to_string(ref.stop_position) + " → " +
                   std::to_string(run.stop_position) + ")";
  }
  if (c.steps_changed) {
    clause.text += ", the steps per canvas change";
  }
  if (r.spec.mode == RunMode::Lockstep) {
    clause.text += " (lockstep: every run is put back on the reference's canvas each step)";
  }
  return clause;
}

// Clause 5: whether the workaround holds at every batch size.
bool workaround(const ExperimentResult& r, const ComparisonResult& c, StoryClause& out) {
  if (!r.spec.workaround || experiment::group_of_run(c.id) == experiment::RunGroup::Workaround) {
    return false;
  }
  std::vector<std::string> same;
  std::vector<std::string> differ;
  const ComparisonResult* first_bad = nullptr;
  for (const ComparisonResult& w : r.comparisons) {
    const RunResult* run = r.run(w.run);
    if (experiment::group_of_run(w.id) != experiment::RunGroup::Workaround ||
        w.kind != experiment::ComparisonKind::Row0 || run == nullptr || run->batch_size < 2) {
      continue;
    }
    const std::string b = std::to_string(run->batch_size);
    if (w.first.found()) {
      differ.push_back(b);
      first_bad = first_bad == nullptr ? &w : first_bad;
    } else {
      same.push_back(b);
    }
  }
  if (same.empty() && differ.empty()) {
    return false;
  }
  const auto join = [](const std::vector<std::string>& v) {
    std::string s;
    for (const std::string& b : v) {
      s += (s.empty() ? "B=" : ", ") + b;
    }
    return s;
  };
  out.view = StoryView::Overview;
  out.workaround = true;
  if (differ.empty() || first_bad == nullptr) {
    out.text = "with the workaround " + join(same) + " " + (same.size() == 1 ? "is" : "are") +
               " bitwise identical";
    return true;
  }
  out.text = "with the workaround " + join(differ) + " still " +
             (differ.size() == 1 ? "differs" : "differ") + " (first at " + where(first_bad->first) +
             ", " + first_bad->first.tap + ")";
  if (!same.empty()) {
    out.text += "; " + join(same) + " " + (same.size() == 1 ? "is" : "are") + " identical";
  }
  out.view = StoryView::LayerStep;
  out.tick = first_bad->first.tick;
  out.layer_slot = first_bad->first.layer >= 0 ? first_bad->first.layer : r.layers;
  out.tap = first_bad->first.tap == "tokens" ? std::string() : first_bad->first.tap;
  return true;
}

std::string why(const ExperimentResult& r, const ComparisonResult& c, const RunResult& ref,
                const RunResult& run) {
  if (!c.first.found() || c.kind != experiment::ComparisonKind::Row0) {
    return {};
  }
  const std::int64_t total = generated(ref, run);
  const LastStepDiff last = last_step_logit_diff(r, c);
  const bool have_logits = last.readable && tap_index(r, "logits") >= 0;
  if (c.tokens_changed == 0) {
    std::string s = "Numbers differ from " + where(c.first) +
                    " on, yet no token changes: a token changes only when a difference flips a "
                    "sampler decision (the argmax, the sampled token or its acceptance), and "
                    "these differences stay smaller than the gaps that decide.";
    if (r.spec.mode == RunMode::Lockstep) {
      s += " In lockstep every run is put back on the reference's canvas each step, so "
           "differences cannot compound.";
    }
    return s;
  }
  if (c.tokens_changed * 4 <= total) {
    std::string s = have_logits ? "At the last step " + percent(last.positions) +
                                      " of positions have different token scores, yet only "
                                : std::string("Only ");
    s += std::to_string(c.tokens_changed) + " of " + std::to_string(total) +
         " tokens change: a position's token changes only when a difference flips the argmax, "
         "the sampled token or its acceptance; most differences are far smaller than the gap "
         "between the top candidates.";
    return s;
  }
  return std::to_string(c.tokens_changed) + " of " + std::to_string(total) +
         " tokens change: once one accepted token differs, every later step conditions on a "
         "different canvas, so the runs follow different trajectories and the differences "
         "compound.";
}

}  // namespace

std::string Story::headline() const {
  std::string s;
  for (const StoryClause& c : clauses) {
    s += (s.empty() ? "" : " → ") + c.text;
  }
  return s.empty() ? s : s + ".";
}

std::string tick_label(const RunResult& run, int tick) {
  const int* canvas = tick >= 0 && static_cast<std::size_t>(tick) < run.tick_canvas.size()
                          ? &run.tick_canvas[static_cast<std::size_t>(tick)]
                          : nullptr;
  const int* step = tick >= 0 && static_cast<std::size_t>(tick) < run.tick_step.size()
                        ? &run.tick_step[static_cast<std::size_t>(tick)]
                        : nullptr;
  if (canvas == nullptr || step == nullptr || *canvas < 0 || *step < 0) {
    return "tick " + std::to_string(tick);
  }
  return "canvas " + std::to_string(static_cast<std::int64_t>(*canvas) + 1) + " · step " +
         std::to_string(*step);
}

std::string tap_op_phrase(const std::string& tap) {
  static const std::pair<const char*, const char*> phrases[] = {
      {"attn.q", "q projection"},
      {"attn.k", "k projection"},
      {"attn.v", "v projection"},
      {"attn.out", "attention"},
      {"attn.o_proj", "attention output projection"},
      {"mlp.out", "dense MLP"},
      {"router.scores", "router projection"},
      {"router.topk_ids", "expert choice"},
      {"router.topk_weights", "expert weights"},
      {"moe.out", "experts"},
      {"layer.out", "output"},
      {"selfcond.soft_embed", "the self-conditioning matmul"},
      {"selfcond.out", "the self-conditioning MLP"},
      {"logits", "the token scores (lm_head)"},
  };
  for (const auto& [name, phrase] : phrases) {
    if (tap == name) {
      return phrase;
    }
  }
  return tap;
}

Growth growth(const ExperimentResult& r, const ComparisonResult& c) {
  Growth g;
  const double nan = std::numeric_limits<double>::quiet_NaN();
  const auto& f = c.frac_differ;  // [S, L+1, T]
  for (std::size_t tick = 0; tick < c.compared.size(); ++tick) {
    const auto t = static_cast<std::int64_t>(tick);
    if (c.compared[tick] == 0) {
      g.positions.push_back(nan);
      g.elements.push_back(nan);
      continue;
    }
    const std::int64_t n = positions_differing(r, c, t);
    g.positions.push_back(n < 0 || r.canvas_length <= 0
                              ? nan
                              : static_cast<double>(n) / static_cast<double>(r.canvas_length));
    double most = nan;
    for (std::int64_t s = 0; s <= r.layers; ++s) {
      for (std::int64_t k = 0; k < static_cast<std::int64_t>(r.taps.size()); ++k) {
        const float* v = f.find({t, s, k});
        if (v != nullptr && !std::isnan(*v)) {
          most = std::isnan(most) ? *v : std::max(most, static_cast<double>(*v));
        }
      }
    }
    g.elements.push_back(most);
  }
  return g;
}

std::string headline_comparison(const ExperimentResult& r) {
  for (const ComparisonResult& c : r.comparisons) {
    if (c.kind == experiment::ComparisonKind::Row0 &&
        c.reference == experiment::reference_run(experiment::RunGroup::Main) && c.first.found()) {
      return c.id;
    }
  }
  return r.comparisons.empty() ? std::string() : r.comparisons.front().id;
}

// A mixed batch's causes (issue #35), when the re-runs told them apart: "caused by the
// positions (40 padding slots, positions shifted by 40)".
bool causes_clause(const ExperimentResult& r, const ComparisonResult& c, StoryClause& out) {
  if (!r.causes || r.causes->causes.empty() || !c.first.found() ||
      c.kind != experiment::ComparisonKind::Row0 ||
      experiment::group_of_run(c.id) != experiment::RunGroup::Main) {
    return false;
  }
  std::string names;
  for (const std::string& k : r.causes->causes) {
    names += (names.empty() ? "" : " and ") + std::string(k == "mask" ? "the padding" : "the " + k);
  }
  std::string layout;
  for (const experiment::RowLayout& row : r.causes->rows) {
    if (row.run == c.run && row.pad_slots > 0) {
      layout =
          " (" + std::to_string(row.pad_slots) + " padding slots" +
          (row.position_shift != 0 ? ", positions shifted by " + std::to_string(row.position_shift)
                                   : std::string()) +
          ")";
    }
  }
  out.view = StoryView::Overview;
  out.text = "caused by " + names + layout;
  return true;
}

Story build_story(const ExperimentResult& r, const std::string& comparison_id) {
  Story story;
  story.comparison = comparison_id;
  const ComparisonResult* c = r.comparison(comparison_id);
  const RunResult* ref = c != nullptr ? r.run(c->reference) : nullptr;
  const RunResult* run = c != nullptr ? r.run(c->run) : nullptr;
  if (c == nullptr || ref == nullptr || run == nullptr) {
    return story;
  }
  const ComparisonResult* floor = r.comparison(experiment::noise_floor_comparison());
  if (floor != nullptr && floor != c && floor->first.found() &&
      experiment::group_of_run(c->id) != experiment::RunGroup::Workaround) {
    StoryClause noise;
    noise.view = StoryView::Overview;
    noise.text = "The B=1 repeat already differs at " + where(floor->first) +
                 ": this engine is not deterministic here, so what follows includes that noise";
    story.clauses.push_back(std::move(noise));
  }
  if (!c->first.found()) {
    StoryClause same;
    same.view = StoryView::LayerStep;
    same.text = subject(r, *c) + " is bitwise identical to " +
                (c->kind == experiment::ComparisonKind::Rows ? std::string("its row 0")
                                                             : std::string("the B=1 reference")) +
                " at every compared step and tap";
    story.clauses.push_back(std::move(same));
  } else {
    story.clauses.push_back(onset(r, *c));
    StoryClause clause;
    if (causes_clause(r, *c, clause)) {
      story.clauses.push_back(clause);
    }
    clause = StoryClause{};
    if (spread(r, *c, *ref, clause)) {
      story.clauses.push_back(clause);
    }
    clause = StoryClause{};
    if (routing(*c, *ref, clause)) {
      story.clauses.push_back(clause);
    }
  }
  if (c->kind == experiment::ComparisonKind::Row0) {
    story.clauses.push_back(tokens(r, *c, *ref, *run));
  }
  StoryClause fix;
  if (workaround(r, *c, fix)) {
    story.clauses.push_back(fix);
  }
  story.why = why(r, *c, *ref, *run);
  return story;
}

}  // namespace batchlens::analysis
