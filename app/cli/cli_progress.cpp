// SPDX-License-Identifier: Apache-2.0
#include "app/cli/cli_progress.h"

#include <cstdio>
#include <string>

namespace batchlens::cli {

namespace {

base::CancelToken* g_cancel = nullptr;

extern "C" void on_sigint(int /*signal*/) {
  if (g_cancel != nullptr) {
    g_cancel->cancel();  // an atomic store: async-signal-safe
  }
}

}  // namespace

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
  g_cancel = &token_;
  previous_ = std::signal(SIGINT, on_sigint);
}

SigintCancel::~SigintCancel() {
  std::signal(SIGINT, previous_);
  g_cancel = nullptr;
}

}  // namespace batchlens::cli
