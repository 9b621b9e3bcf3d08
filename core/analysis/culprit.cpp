// SPDX-License-Identifier: Apache-2.0
#include "core/analysis/culprit.h"

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <sstream>

#include "core/base/cancel.h"
#include "core/model/diffusion_gemma.h"
#include "core/model/tap_families.h"
#include "core/probe/tap_names.h"
#include "core/setup/front_door.h"
#include "core/setup/policy_cost.h"

namespace batchlens::analysis {

using experiment::ComparisonResult;
using experiment::CulpritCost;
using experiment::CulpritReport;
using experiment::CulpritTrial;
using experiment::ExperimentResult;
using experiment::ExperimentSpec;
using experiment::RunControl;
using experiment::RunMode;

namespace {

using Clock = std::chrono::steady_clock;
using ops::FamilySet;
using ops::OpFamily;

// One rule per family, in the order the families were added: the fix as a policy.
struct FixRule {
  OpFamily family;
  int first_layer = 0;
  int last_layer = -1;
};

ops::OpPolicy fix_policy(const std::vector<FixRule>& rules, ops::Strategy strategy) {
  ops::OpPolicy p;
  p.name = "culprit_fix";
  for (const FixRule& r : rules) {
    p.rules.push_back(
        ops::PolicyRule{ops::family_set({r.family}), r.first_layer, r.last_layer, strategy});
  }
  return p;
}

class Finder {
 public:
  Finder(const setup::Session& session, const ExperimentSpec& spec, const CulpritOptions& options,
         const RunControl& control)
      : session_(session), spec_(spec), options_(options), control_(control) {}

  CulpritReport run() {
    const auto start = Clock::now();
    search_start_ = start;
    report_.strategy = options_.strategy;
    const int layers = static_cast<int>(session_.model->config().text.num_hidden_layers);
    layers_ = layers;
    // The most trials the search can take (two baselines, one greedy trial per family, then
    // minimising every family twice (logits, then every tap), verify, confirm); lowered as soon
    // as the greedy set is known.
    std::vector<FixRule> all;
    all.reserve(ops::kOpFamilyCount);
    for (int f = 0; f < ops::kOpFamilyCount; ++f) {
      all.push_back(FixRule{static_cast<OpFamily>(f), 0, -1});
    }
    bound_ = 2 + ops::kOpFamilyCount + 2 * minimise_bound(all) + 2;

    // 1. The spec as it is, free. Then the trials run in lockstep (faster, and every tap of
    // every step compared on one canvas) if lockstep sees the divergence too: a divergence that
    // only the sampler makes (e.g. a random stream shared across the batch) shows in free mode
    // only, and then every trial runs free.
    TrialOutcome o = trial("baseline", {}, false);
    bool lockstep = false;
    if (!o.identical && options_.lockstep_trials) {
      const TrialOutcome locked = trial("baseline", {}, true);
      if (!locked.identical) {
        lockstep = true;
        o = locked;
      }
    }
    if (o.identical) {
      report_.verdict = "no divergence: row " + std::to_string(spec_.composition.row) +
                        " of every batch size is already bitwise B=1's";
      report_.wall_s = seconds_since(start);
      return report_;
    }
    report_.diverged = true;

    // 2. Greedy: add the families behind each new first divergence. With a horizon the search
    // trials watch its ticks too (the last one, identical, is otherwise a whole run); the
    // verify trial then checks the set on the whole generation, and should it fall short the
    // search goes on watching every tick.
    std::vector<FixRule> rules;
    FamilySet in_set;
    short_ = horizon() > 0;
    const bool short_greedy = short_;
    const bool grown = grow(rules, in_set, o, lockstep);
    short_ = false;
    if (!grown) {
      report_.wall_s = seconds_since(start);
      return report_;
    }

    // The set is known: at most minimising it (logits, then on every tap should the logits
    // miss a difference), verify and confirm are left.
    bound_ = static_cast<int>(report_.trials.size()) + 2 * minimise_bound(rules) + 2;

    // 3. Minimise and narrow, where only "identical or not" matters: the trials watch the
    // logits alone (every op's difference reaches them, and the sampler's decisions are
    // compared too), which keeps them light. The result is then verified on every tap; should
    // a difference hide from the logits, it is done again on every tap.
    // With fewer_trials the light trials also stop after a horizon of ticks: every op family
    // runs in every pass, so a fix that leaves one family's kernels differing shows within a few
    // ticks of where the trials so far diverged (step 2 is the first with self-conditioning);
    // later canvases and data-dependent kernels are left to the verify trial, which runs the
    // whole generation, and should it differ the heavy pass searches again without a horizon.
    std::vector<FixRule> greedy = rules;
    for (const bool light : {true, false}) {
      rules = greedy;
      light_ = light;
      const std::size_t before = report_.trials.size();
      minimise(rules, lockstep, layers);
      light_ = false;
      const bool tried = report_.trials.size() > before;  // a single family may need no trial
      if (!light || (!tried && !short_greedy) || trial("verify", rules, lockstep).identical) {
        break;
      }
      if (short_greedy) {
        // The greedy set itself was found watching the horizon: it may fall short. The heavy
        // pass searches on from it over every tick.
        rules = greedy;
        if (!grow(rules, in_set, trial("search", rules, lockstep), lockstep)) {
          report_.wall_s = seconds_since(start);
          return report_;
        }
        greedy = rules;
      }
    }
    report_.found = true;
    report_.fix = fix_policy(rules, options_.strategy);

    // 4. Confirm over the whole generation, trajectories free.
    report_.confirmed = trial("confirm", rules, false).identical;
    report_.verdict =
        report_.confirmed
            ? "minimal fix found and confirmed in free mode"
            : "the fix makes lockstep trials identical but free mode still diverges: a longer "
              "generation reaches ops the trials did not";
    measure_costs();
    report_.wall_s = seconds_since(start);
    return report_;
  }

 private:
  // The greedy search from outcome `o` of `rules`: adds the families behind each new first
  // divergence (every family left when those are fixed already) until a trial is identical.
  // False, with the verdict written, when no op-level fix exists.
  bool grow(std::vector<FixRule>& rules, FamilySet& in_set, TrialOutcome o, bool lockstep) {
    const FamilySet everything = FamilySet().set();
    while (!o.identical) {
      FamilySet add = model::families_behind(o.first.tap) & ~in_set;
      if (add.none()) {
        // The ops behind the tap are fixed already (or it has none): the divergence enters
        // upstream, e.g. through a prompt cache encoded at B. Try every family left.
        add = everything & ~in_set;
      }
      if (add.none()) {
        report_.verdict = "no op-level fix exists: with every op family " + strategy_word() +
                          " row " + std::to_string(spec_.composition.row) +
                          " still differs (first at " + o.where() +
                          "), so the divergence comes from outside the op layer";
        if (spec_.composition.mixed() &&
            spec_.composition.positions == generation::PositionMode::Shared) {
          // issue #35: beside other prompts the batch's layout is an input of its own.
          report_.verdict +=
              "; the batch holds other prompts, padded with shared positions: "
              "run again with per_row positions to see whether they are the cause";
        }
        return false;
      }
      added_.emplace_back();
      for (int f = 0; f < ops::kOpFamilyCount; ++f) {
        if (add.test(static_cast<std::size_t>(f))) {
          rules.push_back(FixRule{static_cast<OpFamily>(f), 0, -1});
          added_.back().push_back(static_cast<OpFamily>(f));
        }
      }
      in_set |= add;
      o = trial("search", rules, lockstep);
    }
    return true;
  }

  // 1-minimal: drop each family in turn, keep it dropped while the result stays identical; then
  // each per-layer family's layer range: the latest first layer, then the earliest last layer,
  // that keep it identical (binary search; a range that fixes it contains the layers that matter).
  void minimise(std::vector<FixRule>& rules, bool lockstep, int layers) {
    // The rules of the families in `kept`, in their order.
    const auto rules_of = [&rules](const std::vector<OpFamily>& kept) {
      std::vector<FixRule> subset;
      for (const FixRule& r : rules) {
        if (std::find(kept.begin(), kept.end(), r.family) != kept.end()) {
          subset.push_back(r);
        }
      }
      return subset;
    };
    const auto keeps_identical = [&](const std::vector<OpFamily>& kept) {
      return trial("minimise", rules_of(kept), lockstep).identical;
    };
    rules = rules_of(options_.fewer_trials ? minimal_families(added_, keeps_identical)
                                           : minimal_families_one_by_one(added_, keeps_identical));
    if (options_.narrow_layers && layers > 1) {
      const bool informed = options_.fewer_trials;
      for (FixRule& r : rules) {
        if (!ops::family_is_per_layer(r.family)) {
          continue;
        }
        int lo = 0;
        int hi = layers - 1;     // the answer for first_layer lies in [lo, hi]
        layer_taps_ = informed;  // light trials also watch each layer's output: where it differs
        while (lo < hi) {
          const int mid = (lo + hi + 1) / 2;
          r.first_layer = mid;
          const TrialOutcome o = trial("narrow", rules, lockstep);
          if (o.identical) {
            lo = mid;
          } else {
            hi = mid - 1;
            // Diverged at layer l < mid in the first step: up to that point every first layer
            // above l computes what this trial did (layers <= l unfixed, the inputs those of the
            // start), so each of them diverges there too.
            if (informed && o.first.found() && o.first.canvas == 0 && o.first.step == 1 &&
                o.first.layer >= 0 && o.first.layer < mid) {
              hi = std::max(lo, std::min(hi, o.first.layer));
            }
          }
        }
        layer_taps_ = false;
        r.first_layer = lo;
        int a = lo;
        int b = layers - 1;  // the answer for last_layer lies in [a, b]
        if (informed && lo == 0 && a < b) {
          // A fix needed from layer 0 is most often needed to the last: ask that first.
          r.last_layer = b - 1;
          if (trial("narrow", rules, lockstep).identical) {
            b = b - 1;
          } else {
            a = b;
          }
        }
        while (a < b) {
          const int mid = (a + b) / 2;
          r.last_layer = mid;
          if (trial("narrow", rules, lockstep).identical) {
            b = mid;
          } else {
            a = mid + 1;
          }
        }
        r.last_layer = b == layers - 1 ? -1 : b;
      }
    }
  }

  // Trials minimise() can take for `rules`: one drop per rule (in groups: at most 2n - 1), and a
  // binary search of each end of each per-layer rule's range.
  int minimise_bound(const std::vector<FixRule>& rules) const {
    int search = 0;
    while ((1 << search) < layers_) {
      ++search;
    }
    int n = options_.fewer_trials ? static_cast<int>(rules.size()) - 1 : 0;
    for (const FixRule& r : rules) {
      // The first layer's search, the last layer's (and its first question).
      n += 1 + (options_.narrow_layers && layers_ > 1 && ops::family_is_per_layer(r.family)
                    ? 2 * search + (options_.fewer_trials ? 1 : 0)
                    : 0);
    }
    return n;
  }

  // One progress for the whole search: trials done (the running one in part) of the bound,
  // with an ETA from the search's own pace.
  base::Progress search_progress(const base::Progress& inner, int index,
                                 const std::string& stage) const {
    constexpr std::int64_t kUnits = 1000;  // per trial: the running trial moves the bar
    base::Progress q;
    const int bound = std::max(bound_, index + 1);
    q.total = static_cast<std::int64_t>(bound) * kUnits;
    q.done = static_cast<std::int64_t>(index) * kUnits +
             static_cast<std::int64_t>(inner.fraction() * static_cast<double>(kUnits));
    q.elapsed_s = seconds_since(search_start_);
    const double done_trials = static_cast<double>(q.done) / kUnits;
    q.eta_s = done_trials > 0.05 ? q.elapsed_s / done_trials * (bound - done_trials) : -1.0;
    q.stage = "culprit trial " + std::to_string(index + 1) + " of at most " +
              std::to_string(bound) + " (" + stage + "): " + inner.stage;
    return q;
  }

  // The ticks a light or greedy-search trial watches: a few past the latest tick any trial so far
  // first diverged at (and past step 2, self-conditioning's first), so that it grows when a trial
  // diverges late; options_.horizon_ticks when given; 0 (every tick) without fewer_trials.
  std::int64_t horizon() const {
    if (options_.horizon_ticks >= 0) {
      return options_.horizon_ticks;
    }
    return options_.fewer_trials ? std::max<std::int64_t>(latest_tick_, 1) + 1 + kHorizonMargin : 0;
  }

  static double seconds_since(Clock::time_point t) {
    return std::chrono::duration<double>(Clock::now() - t).count();
  }

  std::string strategy_word() const { return std::string(ops::strategy_name(options_.strategy)); }

  TrialOutcome trial(const std::string& stage, const std::vector<FixRule>& rules, bool lockstep) {
    if (control_.cancel != nullptr && control_.cancel->cancelled()) {
      base::raise(base::ErrorCode::Cancelled, "culprit finder cancelled");
    }
    ExperimentSpec s = spec_;
    s.workaround.reset();
    // Every tap, so that the first divergence is seen where it starts; the logits alone where
    // only "identical or not" is asked.
    s.taps.clear();
    if (light_) {
      s.taps.emplace_back(probe::tap_name(probe::Tap::Logits));
      if (layer_taps_) {
        s.taps.emplace_back(probe::tap_name(probe::Tap::LayerOut));
      }
    }
    s.repeats = 0;
    // Which kernels ran is recorded once, by the experiment written with the answer: profiling
    // every engine of every trial cost more than the trials (the 26B-A4B architecture on an
    // H100: 42 trials in 337 s).
    s.kernels = false;
    s.mode = lockstep ? RunMode::Lockstep : RunMode::Free;
    const ops::OpPolicy fix = fix_policy(rules, options_.strategy);
    s.policy = rules.empty() ? spec_.policy : ops::combine(spec_.policy, fix);
    const auto start = Clock::now();
    RunControl rc;
    rc.cancel = control_.cancel;
    rc.stop_at_first_difference = true;  // a trial asks whether and where, not how far
    rc.stop_after_ticks = light_ || short_ ? horizon() : 0;
    rc.cuda_graphs = false;
    const int index = static_cast<int>(report_.trials.size());
    if (control_.progress) {
      rc.progress = [&](const base::Progress& p) {
        control_.progress(search_progress(p, index, stage));
      };
    }
    auto result = run_experiment(session_, s, rc);
    if (!result.ok()) {
      base::raise(result.error().code, result.error().message);
    }
    TrialOutcome o = trial_outcome(result.value());
    if (!o.identical && o.first.found()) {
      latest_tick_ = std::max<std::int64_t>(latest_tick_, o.first.tick);
    }
    CulpritTrial t;
    // "minimise (logits, first 4 ticks)", "search (first 4 ticks)", "verify".
    std::string watched = light_ ? "logits" : "";
    if (rc.stop_after_ticks > 0) {
      watched += (watched.empty() ? "" : ", ") + std::string("first ") +
                 std::to_string(rc.stop_after_ticks) + " ticks";
    }
    t.stage = watched.empty() ? stage : stage + " (" + watched + ")";
    t.fix = rules.empty() ? std::string("none") : ops::describe(fix);
    t.identical = o.identical;
    t.first = o.first;
    t.comparison = o.comparison;
    t.wall_s = seconds_since(start);
    report_.trials.push_back(t);
    return o;
  }

  // The fix's cost through the one cost measurement (setup/policy_cost.h): the spec's own
  // policy and the policy with the fix, at each batch size of the spec.
  void measure_costs() {
    if (options_.cost_repeats <= 0) {
      return;
    }
    if (control_.cancel != nullptr && control_.cancel->cancelled()) {
      base::raise(base::ErrorCode::Cancelled, "culprit finder cancelled");
    }
    setup::PolicyCostRequest req;
    req.policies = {{"default", spec_.policy}, {"fixed", ops::combine(spec_.policy, report_.fix)}};
    req.batch_sizes = spec_.batch_sizes;
    req.repeat = options_.cost_repeats;
    req.progress = [this](int /*done*/, int /*total*/) {
      return control_.cancel == nullptr || !control_.cancel->cancelled();
    };
    const setup::PolicyCosts costs = base::take(setup::measure_policy_costs(*session_.model, req));
    for (std::size_t i = 0; i < costs.batch_sizes.size(); ++i) {
      const setup::PolicyCostCell& plain = costs.cells[0][i];
      const setup::PolicyCostCell& fixed = costs.cells[1][i];
      CulpritCost k;
      k.batch_size = static_cast<int>(costs.batch_sizes[i]);
      k.default_ms = plain.median_ms;
      k.fixed_ms = fixed.median_ms;
      k.default_q1_ms = plain.q1_ms;
      k.default_q3_ms = plain.q3_ms;
      k.fixed_q1_ms = fixed.q1_ms;
      k.fixed_q3_ms = fixed.q3_ms;
      k.noisy = costs.noisy(1, i);
      k.cpu = costs.cpu;
      report_.costs.push_back(k);
    }
  }

  const setup::Session& session_;
  const ExperimentSpec& spec_;
  const CulpritOptions& options_;
  const RunControl& control_;
  CulpritReport report_;
  // Families the greedy search added per trial, in order (minimise tries large groups whole).
  std::vector<std::vector<OpFamily>> added_;
  bool light_ = false;  // trials watch the logits only, and only the first horizon() ticks
  bool short_ = false;  // the first greedy search's trials watch the first horizon() ticks
  std::int64_t latest_tick_ = 0;  // the latest tick a trial so far first diverged at
  // Ticks watched past the latest first divergence (and past step 2, self-conditioning's first).
  static constexpr std::int64_t kHorizonMargin = 2;
  bool layer_taps_ = false;  // ... and each layer's output (narrowing: where they diverge)
  int layers_ = 1;
  int bound_ = 1;  // the most trials the search can still take (search_progress)
  Clock::time_point search_start_ = Clock::now();
};

}  // namespace

namespace {

// Every family of the groups, in order.
std::vector<OpFamily> flattened(const std::vector<std::vector<OpFamily>>& added) {
  std::vector<OpFamily> all;
  for (const auto& group : added) {
    all.insert(all.end(), group.begin(), group.end());
  }
  return all;
}

}  // namespace

std::vector<OpFamily> minimal_families_one_by_one(const std::vector<std::vector<OpFamily>>& added,
                                                  const KeepsIdentical& keeps_identical) {
  std::vector<OpFamily> kept = flattened(added);
  for (std::size_t i = 0; i < kept.size();) {
    std::vector<OpFamily> without = kept;
    without.erase(without.begin() + static_cast<std::ptrdiff_t>(i));
    if (!without.empty() && keeps_identical(without)) {
      kept = without;
    } else {
      ++i;
    }
  }
  return kept;
}

namespace {

// Drops `group` from `kept` at once when the rest still keeps it identical, else each half in
// turn; a single family as the one-by-one loop does (never the last one).
void drop_group(std::vector<OpFamily>& kept, const std::vector<OpFamily>& group,
                const KeepsIdentical& keeps_identical) {
  if (group.empty()) {
    return;
  }
  std::vector<OpFamily> without;
  for (const OpFamily f : kept) {
    if (std::find(group.begin(), group.end(), f) == group.end()) {
      without.push_back(f);
    }
  }
  if (!without.empty() && keeps_identical(without)) {
    kept = without;
    return;
  }
  if (group.size() == 1) {
    return;  // needed
  }
  const auto half = group.begin() + static_cast<std::ptrdiff_t>(group.size() / 2);
  drop_group(kept, std::vector<OpFamily>(group.begin(), half), keeps_identical);
  drop_group(kept, std::vector<OpFamily>(half, group.end()), keeps_identical);
}

}  // namespace

std::vector<OpFamily> minimal_families(const std::vector<std::vector<OpFamily>>& added,
                                       const KeepsIdentical& keeps_identical) {
  std::vector<OpFamily> kept = flattened(added);
  // A group the greedy search added whole (every family left: many, most not needed) is tried
  // at once, halved when it diverges; the families behind one tap (a few) one by one, as a
  // group that diverges costs more trials than it saves.
  for (const auto& group : added) {
    if (group.size() >= kDropGroupFrom) {
      drop_group(kept, group, keeps_identical);
    } else {
      for (const OpFamily f : group) {
        drop_group(kept, {f}, keeps_identical);
      }
    }
  }
  return kept;
}

std::string TrialOutcome::where() const {
  if (!first.found()) {
    return comparison + ": tokens";
  }
  std::string s = comparison + " canvas " + std::to_string(first.canvas + 1) + " step " +
                  std::to_string(first.step) + " " + first.tap;
  if (first.layer >= 0) {
    s += " layer " + std::to_string(first.layer);
  }
  return s;
}

// Row under test of every batch size against B=1 (the comparisons of the main group).
TrialOutcome trial_outcome(const ExperimentResult& r) {
  TrialOutcome o;
  o.identical = true;
  for (const ComparisonResult& c : r.comparisons) {
    if (c.kind != experiment::ComparisonKind::Row0 ||
        c.reference != experiment::reference_run(experiment::RunGroup::Main) ||
        experiment::role_of_run(c.run) == experiment::RunRole::Repeat) {
      continue;
    }
    const bool differs = c.first.found() || !c.tokens_identical;
    if (!differs) {
      continue;
    }
    if (o.identical || (c.first.found() && (!o.first.found() || c.first.tick < o.first.tick))) {
      o.first = c.first;
      o.comparison = c.id;
    }
    o.identical = false;
  }
  return o;
}

base::Result<CulpritReport> find_culprit(const setup::Session& session, const ExperimentSpec& spec,
                                         const CulpritOptions& options, const RunControl& control) {
  return base::guarded([&]() -> CulpritReport {
    if (options.strategy == ops::Strategy::Batched) {
      base::raise(base::ErrorCode::InvalidArgument,
                  "the culprit finder's strategy must be row_wise or batch_invariant");
    }
    if (!session.model) {
      base::raise(base::ErrorCode::InvalidArgument, "the culprit finder needs an open model");
    }
    return Finder(session, spec, options, control).run();
  });
}

base::Result<ExperimentResult> run_culprit_experiment(const ExperimentSpec& spec,
                                                      const CulpritOptions& options,
                                                      const RunControl& control) {
  return base::guarded([&]() -> ExperimentResult {
    auto session = open_session_for(spec, control);
    if (!session.ok()) {
      throw base::ErrorException(session.error());
    }
    auto report = find_culprit(session.value(), spec, options, control);
    if (!report.ok()) {
      throw base::ErrorException(report.error());
    }
    ExperimentSpec shown = spec;
    shown.workaround.reset();
    if (report.value().found) {
      shown.workaround = report.value().fix;
      shown.workaround->name = "culprit";
    }
    auto result = run_experiment(session.value(), shown, control);
    if (!result.ok()) {
      throw base::ErrorException(result.error());
    }
    ExperimentResult out = std::move(result).value();
    out.timings.load_s = session.value().load_s;
    out.timings.prepare_s = session.value().prepare_s;
    out.culprit = std::move(report).value();
    return out;
  });
}

}  // namespace batchlens::analysis
