// SPDX-License-Identifier: Apache-2.0
#include "core/experiment/divergence.h"

#include <utility>

namespace batchlens::experiment {

namespace {

using probe::Tap;

// The (slot, tap) cells of one tick in model order.
std::vector<std::pair<std::int64_t, std::int64_t>> model_order(const Layout& lay) {
  const auto ntap = static_cast<std::int64_t>(lay.taps.size());
  const auto tap = [&lay](std::int64_t t) {
    return lay.taps[static_cast<std::size_t>(t)];
  };
  std::vector<std::pair<std::int64_t, std::int64_t>> order;
  for (std::int64_t t = 0; t < ntap; ++t) {
    if (!probe::tap_is_per_layer(tap(t)) && tap(t) != Tap::Logits) {
      order.emplace_back(lay.layers, t);
    }
  }
  for (std::int64_t l = 0; l < lay.layers; ++l) {
    for (std::int64_t t = 0; t < ntap; ++t) {
      if (probe::tap_is_per_layer(tap(t))) {
        order.emplace_back(l, t);
      }
    }
  }
  for (std::int64_t t = 0; t < ntap; ++t) {
    if (tap(t) == Tap::Logits) {
      order.emplace_back(lay.layers, t);
    }
  }
  return order;
}

}  // namespace

Divergence first_divergence(const ComparisonResult& c, const Layout& lay,
                            const std::vector<std::string>& names, const RunResult& ref) {
  Divergence d;
  const std::int64_t s_count = c.frac_differ.empty() ? 0 : c.frac_differ.shape[0];
  const auto order = model_order(lay);
  for (std::int64_t s = 0; s < s_count; ++s) {
    if (c.compared[static_cast<std::size_t>(s)] == 0) {
      continue;
    }
    for (const auto& [slot, t] : order) {
      const float f = c.frac_differ.at({s, slot, t});
      if (!(f > 0)) {
        continue;
      }
      d.tick = static_cast<int>(s);
      d.layer = slot < lay.layers ? static_cast<int>(slot) : -1;
      d.tap = names[static_cast<std::size_t>(t)];
      if (!c.pos_frac_differ.empty()) {
        for (std::int64_t p = 0; p < lay.c; ++p) {
          if (c.pos_frac_differ.at({s, slot, t, p}) > 0) {
            d.position = p;
            break;
          }
        }
      }
      break;
    }
    if (!d.found() && !c.sampler_diff.empty()) {
      for (std::int64_t p = 0; p < lay.c; ++p) {
        if (c.sampler_diff.at({s, p}) != 0) {
          d.tick = static_cast<int>(s);
          d.tap = "sampler";
          d.position = p;
          break;
        }
      }
    }
    if (d.found()) {
      d.canvas = ref.tick_canvas[static_cast<std::size_t>(s)];
      d.step = ref.tick_step[static_cast<std::size_t>(s)];
      return d;
    }
  }
  return d;
}

}  // namespace batchlens::experiment
