// SPDX-License-Identifier: Apache-2.0
#include <algorithm>
#include <cstdio>
#include <iostream>
#include <memory>

#include <nlohmann/json.hpp>

#include "app/cli/cli_progress.h"
#include "app/cli/command.h"
#include "app/cli/model_options.h"
#include "core/base/input.h"
#include "core/base/system_info.h"
#include "core/setup/front_door.h"
#include "core/setup/policy_cost.h"

namespace batchlens::cli {

namespace {

// --profile: per batch size, each policy's device time per op family and, outside the op layer,
// per kind of kernel; the sum against the graph replay's median (the rest: the GPU between
// kernels).
void print_profiles(const setup::PolicyCosts& c) {
  if (!c.profile_note.empty()) {
    std::cout << "  " << c.profile_note << "\n";
  }
  for (std::size_t i = 0; i < c.batch_sizes.size(); ++i) {
    if (c.cells[0][i].profile.groups.empty()) {
      continue;
    }
    std::cout << "\nprofile B=" << c.batch_sizes[i]
              << ": device time of one eager pass's kernels, ms (launches)\n";
    std::vector<std::string> names;
    for (std::size_t p = 0; p < c.labels.size(); ++p) {
      for (const setup::KernelGroup& g : c.cells[p][i].profile.groups) {
        if (std::find(names.begin(), names.end(), g.name) == names.end()) {
          names.push_back(g.name);
        }
      }
    }
    std::printf("%-40s", "family / kind");
    for (const std::string& l : c.labels) {
      std::printf("  %22s", l.substr(0, 22).c_str());
    }
    std::printf("\n");
    const auto row = [&](const std::string& label, const auto& value) {
      std::printf("%-40s", label.c_str());
      for (std::size_t p = 0; p < c.labels.size(); ++p) {
        std::printf("  %22s", value(c.cells[p][i]).c_str());
      }
      std::printf("\n");
    };
    for (const std::string& name : names) {
      const bool op_layer =
          std::any_of(c.cells[0][i].profile.groups.begin(), c.cells[0][i].profile.groups.end(),
                      [&](const setup::KernelGroup& g) { return g.name == name && g.op_layer; });
      row((op_layer ? "op " : "") + name, [&](const setup::PolicyCostCell& cell) {
        for (const setup::KernelGroup& g : cell.profile.groups) {
          if (g.name == name) {
            char text[64];
            std::snprintf(text, sizeof(text), "%.3f (%d)", g.total_us / 1000.0, g.kernels);
            return std::string(text);
          }
        }
        return std::string("-");
      });
    }
    const auto ms = [](double v) {
      char text[32];
      std::snprintf(text, sizeof(text), "%.3f", v);
      return std::string(text);
    };
    row("sum of kernels",
        [&](const setup::PolicyCostCell& cell) { return ms(cell.profile.kernel_ms); });
    row("graph replay (median above)",
        [&](const setup::PolicyCostCell& cell) { return ms(cell.median_ms); });
    row("between kernels (replay - sum)", [&](const setup::PolicyCostCell& cell) {
      return ms(cell.median_ms - cell.profile.kernel_ms);
    });
    for (std::size_t p = 0; p < c.labels.size(); ++p) {
      const setup::PassProfile& prof = c.cells[p][i].profile;
      if (!prof.complete()) {
        std::cout << "  INCOMPLETE (" << c.labels[p] << "): the profiler dropped records, "
                  << prof.ops_without_kernels << " of " << prof.op_calls
                  << " op calls have no kernel in the trace; its sums are lower bounds\n";
      }
    }
    std::cout << "  the longest kernels outside the op layer (" << c.labels[0]
              << "), ms (launches):\n";
    for (const setup::KernelGroup& g : c.cells[0][i].profile.top_outside) {
      std::printf("    %8.3f (%3d)  %s\n", g.total_us / 1000.0, g.kernels,
                  g.name.substr(0, 104).c_str());
    }
  }
}

void print_costs(const setup::PolicyCosts& c, const std::string& device) {
  std::cout << "cost: decoder forward (self-conditioning on, identical rows) as the engine runs "
               "it on "
            << device << ", median of " << c.repeat
            << " interleaved passes, ms (vs the first policy; ~ = within the noise: the "
               "interquartile ranges overlap)\n";
  std::size_t width = 8;
  for (const std::string& l : c.labels) {
    width = std::max(width, l.size());
  }
  std::printf("%-*s", static_cast<int>(width), "policy");
  for (const std::int64_t b : c.batch_sizes) {
    std::printf("  %19s", ("B=" + std::to_string(b)).c_str());
  }
  std::printf("\n");
  for (std::size_t p = 0; p < c.labels.size(); ++p) {
    std::printf("%-*s", static_cast<int>(width), c.labels[p].c_str());
    for (std::size_t i = 0; i < c.batch_sizes.size(); ++i) {
      const double ms = c.cells[p][i].median_ms;
      const double base = c.cells[0][i].median_ms;
      char cell[64];
      if (p == 0 || base <= 0.0) {
        std::snprintf(cell, sizeof(cell), "%.2f", ms);
      } else {
        std::snprintf(cell, sizeof(cell), "%.2f (%s%+.1f %%)", ms,
                      c.cells[p][i].within_noise ? "~" : "", 100.0 * (ms / base - 1.0));
      }
      std::printf("  %19s", cell);
    }
    std::printf("\n");
  }
  std::fflush(stdout);
  for (std::size_t p = 0; p < c.labels.size(); ++p) {
    std::cout << "  " << c.labels[p] << " = " << c.policies[p]
              << "; ran as: " << c.cells[p].front().mode << "\n";
  }
  std::cout << "  interquartile ranges, ms:";
  for (std::size_t p = 0; p < c.labels.size(); ++p) {
    std::cout << "\n    " << c.labels[p] << ":";
    for (std::size_t i = 0; i < c.batch_sizes.size(); ++i) {
      char range[64];
      std::snprintf(range, sizeof(range), " B=%lld %.2f-%.2f",
                    static_cast<long long>(c.batch_sizes[i]), c.cells[p][i].q1_ms,
                    c.cells[p][i].q3_ms);
      std::cout << range;
    }
  }
  std::cout << "\n";
  if (c.busy()) {
    std::cout << "  NOISY: load average " << std::max(c.load_before, c.load_after) << " on "
              << c.cores << " cores while measuring; every number above is unreliable\n";
  }
  if (c.cpu) {
    std::cout << "  measured on a CPU: what these policies cost here, not on a GPU\n";
  }
  if (!c.invariance_report.empty()) {
    std::cout << c.invariance_report << "\n";
  }
  print_profiles(c);
}

nlohmann::json profile_json(const setup::PassProfile& p) {
  if (p.groups.empty()) {
    return nullptr;
  }
  nlohmann::json groups = nlohmann::json::array();
  for (const setup::KernelGroup& g : p.groups) {
    groups.push_back({{"name", g.name},
                      {"op_layer", g.op_layer},
                      {"kernels", g.kernels},
                      {"ms", g.total_us / 1000.0}});
  }
  nlohmann::json top = nlohmann::json::array();
  for (const setup::KernelGroup& g : p.top_outside) {
    top.push_back({{"kernel", g.name}, {"kernels", g.kernels}, {"ms", g.total_us / 1000.0}});
  }
  return {{"kernel_ms", p.kernel_ms},
          {"groups", groups},
          {"top_outside", top},
          {"op_calls", p.op_calls},
          {"ops_without_kernels", p.ops_without_kernels}};
}

nlohmann::json costs_json(const setup::PolicyCosts& c) {
  nlohmann::json rows = nlohmann::json::array();
  for (std::size_t p = 0; p < c.labels.size(); ++p) {
    nlohmann::json cells = nlohmann::json::array();
    for (std::size_t i = 0; i < c.batch_sizes.size(); ++i) {
      const auto& cell = c.cells[p][i];
      cells.push_back(
          {{"batch_size", c.batch_sizes[i]},
           {"median_ms", cell.median_ms},
           {"min_ms", cell.min_ms},
           {"iqr_ms", {cell.q1_ms, cell.q3_ms}},
           {"noisy", c.noisy(p, i)},
           {"overhead",
            c.cells[0][i].median_ms > 0.0 ? cell.median_ms / c.cells[0][i].median_ms - 1.0 : 0.0},
           {"mode", cell.mode},
           {"profile", profile_json(cell.profile)}});
    }
    rows.push_back({{"label", c.labels[p]}, {"policy", c.policies[p]}, {"cells", cells}});
  }
  return {{"repeat", c.repeat},
          {"cpu", c.cpu},
          {"load_average", {c.load_before, c.load_after}},
          {"cores", c.cores},
          {"busy", c.busy()},
          {"policies", rows},
          {"invariance_report", c.invariance_report},
          {"fused_report", c.fused_report},
          {"profile_note", c.profile_note}};
}

}  // namespace

void register_cost(CLI::App& app, int& exit_code) {
  struct Options {
    ModelOptions model;
    setup::PolicyCostRequest request;
    std::vector<std::string> policies{"default", "row_wise:selfcond_matmul", "issue_workaround",
                                      "batch_invariant:selfcond_matmul", "batch_invariant"};
    bool json = false;
  };
  auto opts = std::make_shared<Options>();
  auto* cmd = app.add_subcommand(
      "cost",
      "What each fix costs: decoder forward time per policy and batch size, as the engine runs "
      "it (CUDA graph + fused kernels on CUDA), on one loaded model");
  add_model_options(cmd, opts->model);
  cmd->add_option("--policies", opts->policies,
                  "Policies to time, the first being the baseline: named presets, "
                  "row_wise:FAMILY,..., batch_invariant:FAMILY,..., JSON files")
      ->capture_default_str();
  cmd->add_option("--batch-sizes", opts->request.batch_sizes, "Batch sizes to time")
      ->delimiter(',')
      ->capture_default_str();
  cmd->add_option("--repeat", opts->request.repeat, "Timed passes per cell (the median is kept)")
      ->check(CLI::Range(1, 10000))
      ->capture_default_str();
  cmd->add_option("--prompt-len", opts->request.prompt_length, "Random prompt length")
      ->capture_default_str();
  cmd->add_flag("--json", opts->json, "Print the table as JSON instead");
  cmd->add_flag("--profile", opts->request.profile,
                "Also profile one eager pass per cell (CUDA): device time per op family and, "
                "outside the op layer, per kind of kernel, against the graph replay");
  cmd->callback([opts, &exit_code] {
    auto& mo = opts->model;
    if (mo.source.preset.empty() && mo.checkpoint.empty()) {
      std::cerr << "batchlens-cli cost: give --preset or --checkpoint\n";
      exit_code = kExitUsage;
      return;
    }
    opts->request.policies.clear();
    for (const std::string& text : opts->policies) {
      ops::OpPolicy policy;
      if (!resolve_policy(text, policy, exit_code)) {
        return;
      }
      opts->request.policies.emplace_back(text, policy);
    }
    mo.source.checkpoint_dir = mo.checkpoint;
    const auto session = setup::open_model(mo.source, mo.load);
    if (!session.ok()) {
      exit_code = report_error(session.error());
      return;
    }
    const SigintCancel sigint;
    const base::ProgressClock clock(static_cast<std::int64_t>(opts->request.policies.size() *
                                                              opts->request.batch_sizes.size()));
    opts->request.progress = [&](int done, int total) {
      draw_progress(clock.at(done, std::to_string(done) + "/" + std::to_string(total) + " cells"));
      return !sigint.token()->cancelled();
    };
    const auto costs = setup::measure_policy_costs(*session.value().model, opts->request);
    if (!costs.ok()) {
      exit_code = report_error(costs.error());
      return;
    }
    if (opts->json) {
      std::cout << base::dump_json_lossy(costs_json(costs.value()), 1) << "\n";
    } else {
      print_costs(costs.value(), mo.load.device);
    }
    exit_code = kExitOk;
  });
}

}  // namespace batchlens::cli
