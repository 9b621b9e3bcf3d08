// SPDX-License-Identifier: Apache-2.0
#include "core/analysis/sweep_stats.h"

#include <algorithm>
#include <cmath>

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

std::vector<SweepStats> sweep_stats(const std::vector<SweepRow>& rows) {
  std::map<std::pair<experiment::RunGroup, int>, std::vector<const SweepRow*>> by;
  for (const SweepRow& r : rows) {
    by[{r.group, r.batch_size}].push_back(&r);
  }
  std::vector<SweepStats> out;
  for (const auto& [key, group] : by) {
    SweepStats s;
    s.group = key.first;
    s.batch_size = key.second;
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
  // main before workaround, then by batch size
  std::stable_sort(out.begin(), out.end(), [](const SweepStats& a, const SweepStats& b) {
    return std::make_pair(a.group != experiment::RunGroup::Main, a.batch_size) <
           std::make_pair(b.group != experiment::RunGroup::Main, b.batch_size);
  });
  return out;
}

}  // namespace batchlens::analysis
