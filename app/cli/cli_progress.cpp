// SPDX-License-Identifier: Apache-2.0
#include "app/cli/cli_progress.h"

#include <cstdio>
#include <string>

#include "core/base/atomic_file.h"

namespace batchlens::cli {

void draw_progress(const base::Progress& p) {
  const int width = 30;
  const auto filled = static_cast<int>(p.fraction() * width);
  std::fprintf(stderr, "\r[%s%s] %3.0f%%  %-34s", std::string(filled, '#').c_str(),
               std::string(width - filled, '.').c_str(), 100.0 * p.fraction(), p.stage.c_str());
  if (p.eta_s >= 0) {
    std::fprintf(stderr, " ETA %.1fs ", p.eta_s);
  }
  std::fflush(stderr);
}

SigintCancel::SigintCancel() {
  base::set_signal_cancel(&token_);
}

SigintCancel::~SigintCancel() {
  base::set_signal_cancel(nullptr);
}

}  // namespace batchlens::cli
