// SPDX-License-Identifier: Apache-2.0
#include "core/analysis/sweep_stats.h"

#include <algorithm>
#include <cmath>
#include <map>
#include <tuple>

namespace batchlens::analysis {

Interval wilson_interval(int k, int n) {
  if (n <= 0) {
    return {0.0, 1.0};
  }
  constexpr double kZ = 1.959963984540054;
  const double nn = n;
  const double p = k / nn;
  const double z2 = kZ * kZ;
  const double centre = (p + z2 / (2 * nn)) / (1 + z2 / nn);
  const double half = kZ * std::sqrt(p * (1 - p) / nn + z2 / (4 * nn * nn)) / (1 + z2 / nn);
  return {std::max(0.0, centre - half), std::min(1.0, centre + half)};
}

std::vector<SweepRow> rows_where(const SweepSpec& spec, const std::vector<SweepRow>& rows,
                                 int companions, std::int64_t row) {
  const std::vector<SweepItem> items = sweep_items(spec);
  std::vector<SweepRow> out;
  for (const SweepRow& r : rows) {
    if (r.item < 0 || static_cast<std::size_t>(r.item) >= items.size()) {
      continue;
    }
    const SweepItem& item = items[static_cast<std::size_t>(r.item)];
    if ((companions < 0 || item.companions == companions) && (row < 0 || item.row == row)) {
      out.push_back(r);
    }
  }
  return out;
}

std::string companions_label(const SweepSpec& spec, int companions) {
  if (companions < 0 || static_cast<std::size_t>(companions) >= spec.companion_sets.size()) {
    return {};
  }
  const std::size_t n = spec.companion_sets[static_cast<std::size_t>(companions)].size();
  if (n == 0) {
    return "identical rows";
  }
  return "companions " + std::to_string(companions + 1) + " (" + std::to_string(n) +
         (n == 1 ? " prompt)" : " prompts)");
}

std::vector<SweepStats> sweep_stats(const SweepSpec& spec, const std::vector<SweepRow>& rows,
                                    const SweepGrouping& grouping) {
  const std::vector<SweepItem> items = sweep_items(spec);
  using Key = std::tuple<bool, int, int, std::int64_t, experiment::RunGroup>;
  std::map<Key, std::vector<const SweepRow*>> by;
  for (const SweepRow& r : rows) {
    if (r.item < 0 || static_cast<std::size_t>(r.item) >= items.size()) {
      continue;
    }
    const SweepItem& item = items[static_cast<std::size_t>(r.item)];
    by[{r.group != experiment::RunGroup::Main, r.batch_size,
        grouping.companions ? item.companions : -1, grouping.row ? item.row : -1, r.group}]
        .push_back(&r);
  }
  std::vector<SweepStats> out;
  for (const auto& [key, group] : by) {
    SweepStats s;
    s.group = std::get<4>(key);
    s.batch_size = std::get<1>(key);
    s.companions = std::get<2>(key);
    s.row = std::get<3>(key);
    s.n = static_cast<int>(group.size());
    std::vector<std::int64_t> tokens;
    for (const SweepRow* r : group) {
      s.text_changed += r->text_changed ? 1 : 0;
      s.stop_changed += r->stop_changed ? 1 : 0;
      s.steps_changed += r->steps_changed ? 1 : 0;
      tokens.push_back(r->tokens_changed);
      if (r->first_step >= 1) {
        ++s.diverged;
        ++s.first_steps[{r->first_canvas, r->first_step}];
        ++s.first_families[r->first_families.empty() ? "(sampler only)" : r->first_families];
      }
    }
    std::sort(tokens.begin(), tokens.end());
    const std::size_t m = tokens.size();
    s.tokens_changed_median =
        m == 0 ? 0.0
               : (m % 2 == 1 ? static_cast<double>(tokens[m / 2])
                             : (static_cast<double>(tokens[m / 2 - 1]) + tokens[m / 2]) / 2.0);
    s.tokens_changed_max = m == 0 ? 0 : tokens.back();
    s.changed_ci = wilson_interval(s.text_changed, s.n);
    out.push_back(std::move(s));
  }
  return out;  // the map's order: main before workaround, then batch size, companions, row
}

}  // namespace batchlens::analysis
