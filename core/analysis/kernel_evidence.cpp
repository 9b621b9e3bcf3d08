// SPDX-License-Identifier: Apache-2.0
#include "core/analysis/kernel_evidence.h"

#include <sstream>

#include "core/experiment/run_vocabulary.h"
#include "core/model/tap_families.h"
#include "core/ops/op_family.h"

namespace batchlens::analysis {

using experiment::ComparisonResult;
using experiment::EngineKernels;
using experiment::ExperimentResult;
using experiment::OpKernels;

std::vector<std::string> first_divergence_kernels(const ExperimentResult& r,
                                                  const ComparisonResult& c) {
  std::vector<std::string> out;
  if (!r.kernels || c.kind != experiment::ComparisonKind::Row0 || !c.first.found()) {
    return out;
  }
  // The first step of a canvas runs without self-conditioning; every later one with it.
  const bool sc = c.first.step > 1;
  const EngineKernels* ref = r.kernels->engine(c.reference, sc);
  const EngineKernels* run = r.kernels->engine(c.run, sc);
  if (ref == nullptr || run == nullptr) {
    return out;
  }
  const ops::FamilySet families = model::families_behind(c.first.tap);
  for (int f = 0; f < ops::kOpFamilyCount; ++f) {
    if (!families.test(static_cast<std::size_t>(f))) {
      continue;
    }
    const std::string family(ops::family_name(static_cast<ops::OpFamily>(f)));
    const int layer = ops::family_is_per_layer(static_cast<ops::OpFamily>(f)) ? c.first.layer : -1;
    const OpKernels* a = find_op(*ref, family, layer);
    const OpKernels* b = find_op(*run, family, layer);
    if (a == nullptr || b == nullptr) {
      continue;
    }
    const std::string where = family + (layer >= 0 ? " layer " + std::to_string(layer) : "");
    out.push_back(where + ", B=" + std::to_string(ref->batch_size) + ": " + describe(*a));
    out.push_back(where + ", B=" + std::to_string(run->batch_size) + ": " + describe(*b));
    const std::vector<std::string> diff = kernel_differences(*a, *b);
    if (diff.empty()) {
      out.push_back(where + ": the same kernels at both batch sizes");
    }
    for (const std::string& d : diff) {
      out.push_back(where + " differs: ");
      out.back() += d;
    }
  }
  return out;
}

std::string kernels_text(const ExperimentResult& r) {
  if (!r.kernels) {
    return "kernels: not recorded (run without --no-kernels, BatchLens 0.1 schema 1.5+)\n";
  }
  std::ostringstream o;
  o << "kernels (" << r.kernels->source << ", " << r.kernels->wall_s << " s):\n";
  for (const EngineKernels& e : r.kernels->engines) {
    const std::string ref_id = experiment::reference_run_of(e.run);
    const EngineKernels* ref = r.kernels->engine(ref_id, e.self_conditioning);
    if (ref == nullptr || ref == &e) {
      continue;
    }
    std::size_t differing = 0;
    std::ostringstream lines;
    for (const OpKernels& op : e.ops) {
      const OpKernels* base = find_op(*ref, op.family, op.layer);
      if (base == nullptr) {
        continue;
      }
      const std::vector<std::string> diff = kernel_differences(*base, op);
      if (diff.empty()) {
        continue;
      }
      ++differing;
      lines << "    " << op.family << (op.layer >= 0 ? " layer " + std::to_string(op.layer) : "")
            << ":";
      for (const std::string& d : diff) {
        lines << " " << d << ";";
      }
      lines << "\n";
    }
    o << "  " << e.run << " (B=" << e.batch_size << ", "
      << (e.self_conditioning ? "with" : "without") << " self-conditioning): " << differing
      << " of " << e.ops.size() << " ops differ from " << ref_id << "\n"
      << lines.str();
  }
  return o.str();
}

}  // namespace batchlens::analysis
