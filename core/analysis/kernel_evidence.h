// SPDX-License-Identifier: Apache-2.0
// Kernel evidence: what an experiment's kernel provenance (experiment/kernel_provenance.h) says
// about its divergence, as the lines that summaries and reports print: the kernels behind a
// first divergence at B=1 and at B=N, and per engine the ops whose kernels differ.
#pragma once

#include <string>
#include <vector>

#include "core/experiment/experiment.h"

namespace batchlens::analysis {

/// The kernel lines a summary prints under a row-0 comparison's first divergence: for each op
/// family behind its tap at its layer, "B=1: …", "B=4: …" and what differs. Empty when the
/// experiment has no kernel provenance or the divergence has no op behind it.
std::vector<std::string> first_divergence_kernels(const experiment::ExperimentResult& r,
                                                  const experiment::ComparisonResult& c);

/// Per engine (with and without self-conditioning), the ops whose kernels differ from its
/// group's B=1 reference's, with what differs; a note when the file has no provenance.
std::string kernels_text(const experiment::ExperimentResult& r);

}  // namespace batchlens::analysis
