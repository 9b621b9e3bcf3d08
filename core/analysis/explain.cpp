// SPDX-License-Identifier: Apache-2.0
#include "core/analysis/explain.h"

#include <algorithm>
#include <chrono>
#include <utility>

#include "core/analysis/causes.h"
#include "core/analysis/repro.h"
#include "core/setup/front_door.h"

namespace batchlens::analysis {

base::Result<experiment::ExperimentResult> run_and_explain(const experiment::ExperimentSpec& spec,
                                                           const Explain& explain,
                                                           const experiment::RunControl& control) {
  return base::guarded([&]() -> experiment::ExperimentResult {
    const setup::Session session = base::take(experiment::open_session_for(spec, control));
    experiment::ExperimentResult out =
        base::take(experiment::run_experiment(session, spec, control));
    out.timings.load_s = session.load_s;
    out.timings.prepare_s = session.prepare_s;
    const auto seconds_since = [](std::chrono::steady_clock::time_point t) {
      return std::chrono::duration<double>(std::chrono::steady_clock::now() - t).count();
    };
    if (explain.causes && spec.composition.mixed()) {
      const auto start = std::chrono::steady_clock::now();
      out.causes = base::take(find_causes(session, out, control));
      out.timings.causes_s = seconds_since(start);
    }
    if (explain.exact) {
      const bool diverged =
          std::any_of(out.comparisons.begin(), out.comparisons.end(),
                      [](const experiment::ComparisonResult& c) {
                        return c.kind == experiment::ComparisonKind::Row0 && c.first.found();
                      });
      if (diverged) {
        // An explanation that cannot be computed (out of memory for the fp64 copies) leaves
        // the experiment as it ran; only Cancel ends everything.
        const auto start = std::chrono::steady_clock::now();
        auto exact = exact_at_divergence(session, out, control);
        out.timings.exact_s = seconds_since(start);
        if (exact.ok()) {
          out.exact = std::move(exact).value();
        } else if (exact.error().code == base::ErrorCode::Cancelled) {
          throw base::ErrorException(exact.error());
        } else {
          out.exact.emplace();
          for (const experiment::ComparisonResult& c : out.comparisons) {
            if (c.kind == experiment::ComparisonKind::Row0 && c.first.found()) {
              experiment::ExactAtDivergence e;
              e.comparison = c.id;
              e.canvas = c.first.canvas;
              e.step = c.first.step;
              e.note = "not computed: " + exact.error().message;
              out.exact->comparisons.push_back(std::move(e));
            }
          }
        }
      }
    }
    return out;
  });
}

}  // namespace batchlens::analysis
