// SPDX-License-Identifier: Apache-2.0
#include "core/analysis/culprit.h"

#include <algorithm>
#include <cstdio>
#include <filesystem>
#include <random>
#include <string>

#include <gtest/gtest.h>

#include "core/analysis/summary.h"
#include "core/experiment/runner.h"
#include "core/io/experiment_file.h"
#include "core/model/tap_families.h"
#include "core/setup/front_door.h"

#include <unistd.h>

namespace batchlens::experiment {
namespace {

using namespace batchlens::analysis;  // NOLINT(google-build-using-namespace): the units under test

namespace fs = std::filesystem;

// The demo preset, one canvas of 32 tokens, 4 steps, B=1 against B=2.
ExperimentSpec culprit_spec(const std::string& policy) {
  ExperimentSpec s;
  s.model.preset = "demo";
  s.seed = 3;
  s.overrides.max_denoising_steps = 4;
  s.overrides.max_new_tokens = 32;
  s.batch_sizes = {2};
  s.repeats = 0;
  s.policy = ops::policy_from_text(policy).value();
  return s;
}

// One loaded demo model for every trial of every test (the reusable runner pieces).
const setup::Session& culprit_session() {
  static const setup::Session s = [] {
    auto opened = open_session_for(culprit_spec("default"));
    EXPECT_TRUE(opened.ok()) << (opened.ok() ? "" : opened.error().message);
    return std::move(opened).value();
  }();
  return s;
}

CulpritReport find(const ExperimentSpec& spec, ops::Strategy strategy) {
  CulpritOptions o;
  o.strategy = strategy;
  o.cost_repeats = 1;
  auto r = find_culprit(culprit_session(), spec, o);
  EXPECT_TRUE(r.ok()) << (r.ok() ? "" : r.error().message);
  return r.ok() ? r.value() : CulpritReport{};
}

ops::FamilySet fix_families(const CulpritReport& r) {
  ops::FamilySet f;
  for (const ops::PolicyRule& rule : r.fix.rules) {
    f |= rule.families;
  }
  return f;
}

ops::FamilySet of(std::initializer_list<ops::OpFamily> families) {
  ops::FamilySet f;
  for (const auto family : families) {
    f.set(static_cast<std::size_t>(family));
  }
  return f;
}

TEST(Culprit, FindsExactlyTheFamiliesTheEmulationSplits) {
  const CulpritReport r = find(culprit_spec("emulated_h100_report"), ops::Strategy::RowWise);
  EXPECT_TRUE(r.diverged);
  ASSERT_TRUE(r.found) << r.verdict;
  EXPECT_TRUE(r.confirmed) << r.verdict;
  EXPECT_EQ(fix_families(r), of({ops::OpFamily::RouterProj, ops::OpFamily::SelfCondMatmul}));
  for (const ops::PolicyRule& rule : r.fix.rules) {
    EXPECT_EQ(rule.strategy, ops::Strategy::RowWise);
    EXPECT_EQ(rule.first_layer, 0);  // emulated in every layer: no narrower range fixes it
    EXPECT_EQ(rule.last_layer, -1);
  }
  ASSERT_GE(r.trials.size(), 4U);
  EXPECT_EQ(r.trials.front().stage, "baseline");
  EXPECT_FALSE(r.trials.front().identical);
  EXPECT_EQ(r.trials.back().stage, "confirm");
  EXPECT_TRUE(r.trials.back().identical);
  // Minimising watched the logits only; the result was then verified on every tap.
  int light = 0;
  for (const CulpritTrial& t : r.trials) {
    light += t.stage.rfind("minimise (logits", 0) == 0 ? 1 : 0;
  }
  EXPECT_EQ(light, 2);  // each of the two families dropped once, and needed
  ASSERT_GE(r.trials.size(), 5U);
  EXPECT_EQ(r.trials[r.trials.size() - 2].stage, "verify");
  EXPECT_TRUE(r.trials[r.trials.size() - 2].identical);
  ASSERT_EQ(r.costs.size(), 1U);
  EXPECT_EQ(r.costs[0].batch_size, 2);
  EXPECT_GT(r.costs[0].default_ms, 0.0);
  EXPECT_GT(r.costs[0].fixed_ms, 0.0);
  EXPECT_NE(r.headline({2}).find("Culprit: {router_proj, selfcond_matmul} row_wise — with it "
                                 "B=2 are bitwise identical to B=1; cost "),
            std::string::npos)
      << r.headline({2});
}

// issue #37: narrowing from where trials diverge gives the plain binary search's answer in fewer
// trials, on a model deeper than the demo's 6 layers would need: a fix needed in every layer is
// settled in two trials a family, and a range that starts above layer 0 still narrows exactly.
TEST(Culprit, NarrowingFromTheDivergenceGivesThePlainAnswerInFewerTrials) {
  // The report's H100 profile splits the router projection (per layer) in every layer.
  for (const char* policy : {"emulated_h100_report"}) {
    CulpritOptions plain;
    plain.strategy = ops::Strategy::RowWise;
    plain.cost_repeats = 0;
    plain.fewer_trials = false;
    CulpritOptions informed = plain;
    informed.fewer_trials = true;
    const auto a = find_culprit(culprit_session(), culprit_spec(policy), plain);
    const auto b = find_culprit(culprit_session(), culprit_spec(policy), informed);
    ASSERT_TRUE(a.ok() && b.ok());
    ASSERT_TRUE(a.value().found && b.value().found) << policy;
    EXPECT_EQ(ops::to_json(a.value().fix).dump(), ops::to_json(b.value().fix).dump()) << policy;
    EXPECT_TRUE(b.value().confirmed) << policy;
    const auto narrow = [](const CulpritReport& r) {
      int n = 0;
      for (const CulpritTrial& t : r.trials) {
        n += t.stage.rfind("narrow", 0) == 0 ? 1 : 0;
      }
      return n;
    };
    EXPECT_LT(narrow(b.value()), narrow(a.value())) << policy;
    EXPECT_LT(b.value().trials.size(), a.value().trials.size()) << policy;
    std::printf("%s: %zu trials (%d narrowing) plain, %zu (%d) informed\n", policy,
                a.value().trials.size(), narrow(a.value()), b.value().trials.size(),
                narrow(b.value()));
  }
}

// issue #37: the search and light trials watch only the first ticks (where every family ran); the
// answer is the one of trials that watch every tick, and a horizon too short for it (one tick:
// the self-conditioning matmul first runs at step 2) is caught by the verify trial and searched
// again over the whole generation, to the same answer.
TEST(Culprit, ATickHorizonGivesTheWholeRunsAnswerAndATooShortOneIsCaught) {
  // 12 steps: the horizon (a few ticks past the first divergences) ends well before the canvas.
  ExperimentSpec spec = culprit_spec("emulated_h100_report");
  spec.overrides.max_denoising_steps = 12;
  CulpritOptions whole;
  whole.cost_repeats = 0;
  whole.horizon_ticks = 0;
  const auto a = find_culprit(culprit_session(), spec, whole);
  ASSERT_TRUE(a.ok()) << a.error().message;
  ASSERT_TRUE(a.value().found);
  const auto fix = ops::to_json(a.value().fix).dump();
  const auto horizon_of = [](const CulpritReport& r) {
    for (const CulpritTrial& t : r.trials) {
      if (t.stage.find("ticks)") != std::string::npos) {
        return t.stage;
      }
    }
    return std::string();
  };
  EXPECT_EQ(horizon_of(a.value()), "");

  CulpritOptions chosen = whole;
  chosen.horizon_ticks = -1;
  const auto b = find_culprit(culprit_session(), spec, chosen);
  ASSERT_TRUE(b.ok()) << b.error().message;
  EXPECT_EQ(ops::to_json(b.value().fix).dump(), fix);
  EXPECT_TRUE(b.value().confirmed);
  EXPECT_NE(horizon_of(b.value()).find("first "), std::string::npos);
  // The greedy search watched the horizon too (its last trial is identical: otherwise a whole
  // run).
  const auto searches_with_horizon = [](const CulpritReport& r) {
    int n = 0;
    for (const CulpritTrial& t : r.trials) {
      n += t.stage.rfind("search (first ", 0) == 0 ? 1 : 0;
    }
    return n;
  };
  EXPECT_GT(searches_with_horizon(b.value()), 0);
  EXPECT_EQ(searches_with_horizon(a.value()), 0);
  double identical_a = 0.0;
  double identical_b = 0.0;
  for (const auto& [r, sum] :
       {std::pair{&a.value(), &identical_a}, std::pair{&b.value(), &identical_b}}) {
    for (const CulpritTrial& t : r->trials) {
      *sum += t.identical && t.stage != "verify" && t.stage != "confirm" ? t.wall_s : 0.0;
    }
  }
  std::printf(
      "identical search/minimise trials: %.2f s watching every tick, %.2f s with the "
      "horizon\n",
      identical_a, identical_b);

  CulpritOptions short_horizon = whole;
  short_horizon.horizon_ticks = 1;
  const auto c = find_culprit(culprit_session(), spec, short_horizon);
  ASSERT_TRUE(c.ok()) << c.error().message;
  EXPECT_EQ(ops::to_json(c.value().fix).dump(), fix);
  EXPECT_TRUE(c.value().confirmed);
  int verifies = 0;
  int failed = 0;
  for (const CulpritTrial& t : c.value().trials) {
    verifies += t.stage == "verify" ? 1 : 0;
    failed += t.stage == "verify" && !t.identical ? 1 : 0;
  }
  EXPECT_EQ(verifies, 1);  // the heavy pass needs no verify of its own
  EXPECT_EQ(failed, 1) << "one tick cannot see the self-conditioning matmul";
  // After the failed verify the search went on watching every tick.
  bool after_verify = false;
  bool searched_whole = false;
  for (const CulpritTrial& t : c.value().trials) {
    after_verify = after_verify || t.stage == "verify";
    searched_whole = searched_whole || (after_verify && t.stage == "search");
  }
  EXPECT_TRUE(searched_whole);
}

// The grouped drop keeps the one-by-one loop's families for every monotone trial (seeded random
// "needed" sets, and needs of either of two sets), with no more identical trials, and far fewer
// when the large group is mostly not needed (the 26B-A4B batched-prefill case: 13 families
// added at once, 3 needed).
TEST(Culprit, GroupedDropsKeepTheOneByOneFamiliesWithFewerIdenticalTrials) {
  std::mt19937 rng(7);
  const auto family = [](int i) {
    return static_cast<ops::OpFamily>(i % ops::kOpFamilyCount);
  };
  int saved = 0;
  for (int round = 0; round < 300; ++round) {
    // The greedy search's groups: a few small ones, then maybe every family left.
    std::vector<std::vector<ops::OpFamily>> added;
    int next = 0;
    const int small = static_cast<int>(rng() % 4);
    for (int g = 0; g < small && next < ops::kOpFamilyCount; ++g) {
      const int n = 1 + static_cast<int>(rng() % 3);
      added.emplace_back();
      for (int k = 0; k < n && next < ops::kOpFamilyCount; ++k) {
        added.back().push_back(family(next++));
      }
    }
    if (rng() % 2 == 0 || added.empty()) {
      added.emplace_back();
      while (next < ops::kOpFamilyCount) {
        added.back().push_back(family(next++));
      }
    }
    // Monotone: identical when the kept families hold all of A, or all of B.
    std::vector<ops::OpFamily> need_a;
    std::vector<ops::OpFamily> need_b;
    for (int f = 0; f < next; ++f) {
      if (rng() % 4 == 0) {
        need_a.push_back(family(f));
      }
      if (rng() % 3 == 0) {
        need_b.push_back(family(f));
      }
    }
    const bool either = rng() % 3 == 0;
    int identical_one = 0;
    int identical_grouped = 0;
    const auto oracle = [&](int& count) {
      return [&](const std::vector<ops::OpFamily>& kept) {
        const auto holds = [&](const std::vector<ops::OpFamily>& need) {
          return std::all_of(need.begin(), need.end(), [&](ops::OpFamily f) {
            return std::find(kept.begin(), kept.end(), f) != kept.end();
          });
        };
        const bool ok = holds(need_a) || (either && holds(need_b));
        count += ok ? 1 : 0;
        return ok;
      };
    };
    const auto one = minimal_families_one_by_one(added, oracle(identical_one));
    const auto grouped = minimal_families(added, oracle(identical_grouped));
    ASSERT_EQ(one, grouped) << "round " << round;
    EXPECT_LE(identical_grouped, identical_one) << "round " << round;
    saved += identical_one - identical_grouped;
  }
  EXPECT_GT(saved, 100);
  // 13 families added at once, 3 of them needed: 10 identical trials one by one, far fewer here.
  std::vector<std::vector<ops::OpFamily>> all(1);
  for (int f = 0; f < 13; ++f) {
    all[0].push_back(family(f));
  }
  const std::vector<ops::OpFamily> need{family(1), family(2), family(11)};
  int one = 0;
  int grouped = 0;
  const auto count = [&need](int& n) {
    return [&need, &n](const std::vector<ops::OpFamily>& kept) {
      const bool ok = std::all_of(need.begin(), need.end(), [&](ops::OpFamily f) {
        return std::find(kept.begin(), kept.end(), f) != kept.end();
      });
      n += ok ? 1 : 0;
      return ok;
    };
  };
  EXPECT_EQ(minimal_families_one_by_one(all, count(one)), need);
  EXPECT_EQ(minimal_families(all, count(grouped)), need);
  EXPECT_EQ(one, 10);
  EXPECT_LE(grouped, 5);
}

// A range that starts above layer 0 (the fix of layer 0 made part of the spec's own policy): the
// informed search narrows it to the same first and last layer as the plain one.
TEST(Culprit, NarrowingARangeAboveLayerZeroIsExact) {
  ExperimentSpec spec = culprit_spec("emulated_h100_report");
  CulpritOptions plain;
  plain.cost_repeats = 0;
  plain.fewer_trials = false;
  CulpritOptions informed = plain;
  informed.fewer_trials = true;
  // Router projection fixed row-wise in layers 0..1 by the spec itself: what is left to fix of
  // it starts at layer 2.
  ops::OpPolicy p = spec.policy;
  p.rules.push_back(
      ops::PolicyRule{ops::family_set({ops::OpFamily::RouterProj}), 0, 1, ops::Strategy::RowWise});
  spec.policy = p;
  const auto a = find_culprit(culprit_session(), spec, plain);
  const auto b = find_culprit(culprit_session(), spec, informed);
  ASSERT_TRUE(a.ok() && b.ok());
  ASSERT_TRUE(a.value().found && b.value().found);
  EXPECT_EQ(ops::to_json(a.value().fix).dump(), ops::to_json(b.value().fix).dump());
  bool router_from_2 = false;
  for (const ops::PolicyRule& rule : b.value().fix.rules) {
    router_from_2 =
        router_from_2 || (rule.families.test(static_cast<std::size_t>(ops::OpFamily::RouterProj)) &&
                          rule.first_layer == 2);
  }
  EXPECT_TRUE(router_from_2) << ops::to_json(b.value().fix).dump();
  EXPECT_LE(b.value().trials.size(), a.value().trials.size() + 1);
}

// issue #34: one progress for the whole search: trials done of a bound that never grows,
// never going back, with its own ETA, and the bound holds.
TEST(Culprit, ReportsOneProgressForTheWholeSearch) {
  CulpritOptions o;
  o.cost_repeats = 0;
  std::vector<base::Progress> seen;
  RunControl control;
  control.progress = [&seen](const base::Progress& p) {
    seen.push_back(p);
  };
  auto r = find_culprit(culprit_session(), culprit_spec("emulated_h100_report"), o, control);
  ASSERT_TRUE(r.ok()) << r.error().message;
  ASSERT_GT(seen.size(), 10U);
  std::int64_t last_total = seen.front().total;
  bool eta = false;
  for (const base::Progress& p : seen) {
    ASSERT_GT(p.total, 0);
    EXPECT_LE(p.done, p.total);
    EXPECT_LE(p.total, last_total) << p.stage;  // the bound only comes down
    EXPECT_GE(p.done, 0);
    EXPECT_NE(p.stage.find("culprit trial "), std::string::npos) << p.stage;
    last_total = p.total;
    eta = eta || p.eta_s >= 0;
  }
  EXPECT_TRUE(eta);
  // Trials done never go back, and the bound held: the trials taken fit in it.
  for (std::size_t i = 1; i < seen.size(); ++i) {
    EXPECT_GE(seen[i].done, seen[i - 1].done) << seen[i].stage;
  }
  EXPECT_LE(static_cast<std::int64_t>(r.value().trials.size()) * 1000, seen.front().total);
  EXPECT_LE(static_cast<std::int64_t>(r.value().trials.size()) * 1000, seen.back().total);
}

TEST(Culprit, BatchInvariantStrategyFixesTheH200ProfileWithOneFamily) {
  const CulpritReport r = find(culprit_spec("emulated_h200"), ops::Strategy::BatchInvariant);
  ASSERT_TRUE(r.found) << r.verdict;
  EXPECT_TRUE(r.confirmed);
  EXPECT_EQ(fix_families(r), of({ops::OpFamily::SelfCondMatmul}));
  ASSERT_EQ(r.fix.rules.size(), 1U);
  EXPECT_EQ(r.fix.rules[0].strategy, ops::Strategy::BatchInvariant);
}

TEST(Culprit, StopsAfterOneRunWhenNothingDiverges) {
  const CulpritReport r = find(culprit_spec("default"), ops::Strategy::RowWise);
  EXPECT_FALSE(r.diverged);
  EXPECT_FALSE(r.found);
  EXPECT_EQ(r.trials.size(), 1U);
  EXPECT_NE(r.verdict.find("no divergence"), std::string::npos) << r.verdict;
}

TEST(Culprit, SaysPlainlyWhenNoOpLevelFixExists) {
  // One random stream shared by the batch (the reference's sampler): row 0 draws other numbers
  // at B=2, whatever the ops compute.
  ExperimentSpec s = culprit_spec("default");
  s.rng = generation::RngMode::Shared;
  const CulpritReport r = find(s, ops::Strategy::RowWise);
  EXPECT_TRUE(r.diverged);
  EXPECT_FALSE(r.found);
  EXPECT_NE(r.verdict.find("no op-level fix exists"), std::string::npos) << r.verdict;
  EXPECT_TRUE(r.fix.rules.empty());
}

TEST(Culprit, ATrialStopsAtTheFirstDifferenceWhereTheWholeRunSeesIt) {
  const ExperimentSpec spec = culprit_spec("emulated_h200");
  auto whole = run_experiment(culprit_session(), spec);
  RunControl stop;
  stop.stop_at_first_difference = true;
  auto stopped = run_experiment(culprit_session(), spec, stop);
  ASSERT_TRUE(whole.ok() && stopped.ok());
  const auto row0 = [](const ExperimentResult& r) -> const ComparisonResult& {
    for (const ComparisonResult& c : r.comparisons) {
      if (c.kind == experiment::ComparisonKind::Row0 && c.run == "b2") {
        return c;
      }
    }
    ADD_FAILURE() << "no row-0 comparison of b2";
    return r.comparisons.front();
  };
  const ComparisonResult& w = row0(whole.value());
  const ComparisonResult& s = row0(stopped.value());
  ASSERT_TRUE(w.first.found());
  ASSERT_TRUE(s.first.found());
  EXPECT_EQ(s.first.tick, w.first.tick);
  EXPECT_EQ(s.first.tap, w.first.tap);
  EXPECT_EQ(s.first.layer, w.first.layer);
  EXPECT_EQ(s.frac_differ.shape[0], w.first.tick + 1);  // nothing ran past it
  EXPECT_LT(s.frac_differ.shape[0], w.frac_differ.shape[0]);
}

TEST(Culprit, TapsLeadToTheOpsBehindThem) {
  EXPECT_EQ(model::families_behind("router.scores"), of({ops::OpFamily::RouterProj}));
  EXPECT_EQ(model::families_behind("mlp.out"),
            of({ops::OpFamily::MlpGate, ops::OpFamily::MlpUp, ops::OpFamily::MlpDown}));
  EXPECT_EQ(model::families_behind("selfcond.soft_embed"), of({ops::OpFamily::SelfCondMatmul}));
  EXPECT_TRUE(model::families_behind("layer.out").none());
  EXPECT_TRUE(model::families_behind("tokens").none());
  EXPECT_TRUE(model::families_behind("no.such.tap").none());
}

TEST(Culprit, TheReportTravelsInTheExperimentFile) {
  CulpritOptions o;
  o.cost_repeats = 1;
  const ExperimentSpec spec = culprit_spec("emulated_h200");
  auto r = run_culprit_experiment(spec, o);
  ASSERT_TRUE(r.ok()) << r.error().message;
  ASSERT_TRUE(r.value().culprit.has_value());
  ASSERT_TRUE(r.value().spec.workaround.has_value());  // the fix ran as the workaround group
  EXPECT_NE(r.value().comparison("wa.ref__wa.b2"), nullptr);
  EXPECT_FALSE(r.value().comparison("wa.ref__wa.b2")->first.found());
  const fs::path path =
      fs::path(::testing::TempDir()) / ("culprit_" + std::to_string(::getpid()) + ".h5");
  ASSERT_TRUE(io::write_experiment(path, r.value()).ok());
  const auto back = io::read_experiment(path);
  fs::remove(path);
  ASSERT_TRUE(back.ok()) << back.error().message;
  ASSERT_TRUE(back.value().culprit.has_value());
  const CulpritReport& a = *r.value().culprit;
  const CulpritReport& b = *back.value().culprit;
  EXPECT_EQ(b.trials.size(), a.trials.size());
  EXPECT_EQ(b.fix, a.fix);
  EXPECT_EQ(b.headline({2}), a.headline({2}));
  EXPECT_EQ(summary_json(back.value())["culprit"]["headline"], a.headline({2}));
  // Malformed reports are refused as such.
  EXPECT_FALSE(culprit_from_json(nlohmann::json::parse(R"({"trials": 3, "fix": {}})")).ok());
  EXPECT_FALSE(
      culprit_from_json(nlohmann::json::parse(R"({"trials": [], "fix": {"rules": 1}})")).ok());
}

}  // namespace
}  // namespace batchlens::experiment
