// SPDX-License-Identifier: Apache-2.0
#include "core/analysis/repro.h"

#include <algorithm>
#include <array>
#include <chrono>
#include <cmath>
#include <iomanip>
#include <map>
#include <optional>
#include <sstream>
#include <utility>

#include <ATen/ATen.h>
#include <nlohmann/json.hpp>

#include "core/analysis/exact.h"
#include "core/analysis/kernel_evidence.h"
#include "core/base/atomic_file.h"
#include "core/base/input.h"
#include "core/base/sha256.h"
#include "core/base/version.h"
#include "core/experiment/command_line.h"
#include "core/experiment/kernel_provenance.h"
#include "core/experiment/plan.h"
#include "core/model/diffusion_gemma.h"
#include "core/model/safetensors.h"
#include "core/model/tap_families.h"
#include "core/model/weights.h"
#include "core/ops/op_family.h"
#include "core/ops/op_runner.h"

#include <unistd.h>

namespace batchlens::analysis {

using experiment::ComparisonResult;
using experiment::ExperimentResult;
using experiment::PlannedGroup;
using experiment::PlannedRun;
using experiment::Provenance;
using experiment::RunControl;

namespace detail {
std::string_view embedded_repro_script();  // generated from resources/repro/repro.py
}

std::string_view repro_script() {
  return detail::embedded_repro_script();
}

namespace {

using base::ErrorCode;

// Throws the error of `r` (base::take for Result<void>).
void check(const base::Result<void>& r) {
  if (!r.ok()) {
    throw base::ErrorException(r.error());
  }
}
constexpr const char* kFormat = "batchlens-repro/2";
constexpr std::size_t kMaxCaptured = 256;  // op calls kept from one pass

// One op call of the observed pass with its operands: activations cloned, weights as the model
// holds them (they outlive the capture).
struct Captured {
  ops::OpCall call;
  std::vector<at::Tensor> tensors;  // linear/matmul {x, w}; grouped_mm {x, w, offs}
};

class Capture final : public ops::OpObserver {
 public:
  explicit Capture(std::vector<ops::OpSite> wanted) : wanted_(std::move(wanted)) {}
  void on_op(const ops::OpCall& /*call*/) override {}
  bool wants_inputs(ops::OpFamily family, int layer) const override {
    return calls.size() < kMaxCaptured &&
           std::any_of(wanted_.begin(), wanted_.end(), [&](const ops::OpSite& s) {
             return s.family == family && s.layer == layer;
           });
  }
  void on_inputs(const ops::OpCall& call, std::initializer_list<at::Tensor> inputs) override {
    Captured c;
    c.call = call;
    std::size_t i = 0;
    for (const at::Tensor& t : inputs) {
      c.tensors.push_back(i == 1 ? t : t.clone());  // [1] is the weight
      ++i;
    }
    calls.push_back(std::move(c));
  }
  std::vector<Captured> calls;

 private:
  std::vector<ops::OpSite> wanted_;
};

// x repeated along dim 0: each logical row's block again, B times ([1, S, K] -> [B, S, K],
// [S, K] -> [B*S, K]), as the batch of B identical rows lays it out.
at::Tensor repeat_rows(const at::Tensor& x, std::int64_t b) {
  std::vector<std::int64_t> reps(static_cast<std::size_t>(x.dim()), 1);
  reps[0] = b;
  return x.repeat(reps);
}

// The grouped GEMM's operands at B identical rows: each expert's rows B times in a row (the
// stable sort by expert of B rows' pairs), offsets times B; `row0` indexes row 0's outputs.
struct GroupedAtB {
  at::Tensor x;       // [B*R, K]
  at::Tensor offs;    // [E] int32
  at::Tensor row_of;  // [B*R] int64
  at::Tensor row0;    // [R] int64 positions of row 0's outputs
};
GroupedAtB grouped_at(const at::Tensor& x, const at::Tensor& offs, std::int64_t b) {
  const at::Tensor ends = offs.to(at::kCPU).to(at::kLong);
  std::vector<std::int64_t> take;
  std::vector<std::int64_t> row_of;
  std::vector<std::int64_t> row0;
  std::int64_t start = 0;
  for (std::int64_t e = 0; e < ends.size(0); ++e) {
    const auto end = ends[e].item<std::int64_t>();
    for (std::int64_t r = 0; r < b; ++r) {
      for (std::int64_t i = start; i < end; ++i) {
        if (r == 0) {
          row0.push_back(static_cast<std::int64_t>(take.size()));
        }
        take.push_back(i);
        row_of.push_back(r);
      }
    }
    start = end;
  }
  const auto longs = [&](const std::vector<std::int64_t>& v) {
    return at::tensor(v, at::TensorOptions().dtype(at::kLong)).to(x.device());
  };
  return {x.index_select(0, longs(take)), (offs.to(at::kLong) * b).to(at::kInt), longs(row_of),
          longs(row0)};
}

struct BitDiff {
  bool differs = false;
  double frac = 0.0;
  double max_abs = 0.0;
  std::int64_t max_ulp = 0;
};

BitDiff compare(const at::Tensor& a, const at::Tensor& b) {
  BitDiff o;
  const std::int64_t n = a.numel();
  if (n == 0) {
    return o;
  }
  const at::Tensor oa = ordered_bits(a);
  const at::Tensor ob = ordered_bits(b);
  const at::Tensor ne = oa.ne(ob);
  const auto differing = ne.sum().item<std::int64_t>();
  o.differs = differing > 0;
  o.frac = static_cast<double>(differing) / static_cast<double>(n);
  if (o.differs) {
    o.max_abs = (a.to(at::kFloat) - b.to(at::kFloat)).abs().nan_to_num(0.0).max().item<double>();
    o.max_ulp = (oa - ob).abs().max().item<std::int64_t>();
  }
  return o;
}

// The op's results alone at batch 1 and row 0's at B identical rows.
struct Alone {
  at::Tensor one;
  at::Tensor batch;
};

// The op alone at batch 1 and at B identical rows under `policy`, as the op layer computes it.
Alone run_alone(const Captured& c, const ops::OpPolicy& policy, std::int64_t b) {
  const ops::OpSite site{c.call.family, c.call.layer};
  const ops::OpRunner one(policy, 1);
  const ops::OpRunner many(policy, b);
  const at::Tensor& x = c.tensors.at(0);
  const at::Tensor& w = c.tensors.at(1);
  at::Tensor y1;
  at::Tensor yb;
  if (c.call.op == "linear") {
    y1 = one.linear(x, w, site);
    yb = many.linear(repeat_rows(x, b), w, site).narrow(0, 0, x.size(0));
  } else if (c.call.op == "matmul") {
    y1 = one.matmul(x, w, site);
    yb = many.matmul(repeat_rows(x, b), w, site).narrow(0, 0, x.size(0));
  } else {
    const at::Tensor& offs = c.tensors.at(2);
    const at::Tensor zeros = at::zeros({x.size(0)}, x.options().dtype(at::kLong));
    y1 = one.grouped_mm(x, w, offs, zeros, site);
    const GroupedAtB g = grouped_at(x, offs, b);
    yb = many.grouped_mm(g.x, w, g.offs, g.row_of, site).index_select(0, g.row0);
  }
  return {y1, yb};
}

// run_alone's row 0 compared; with `exact`, how far both lie from the op in fp64.
BitDiff isolate(const Captured& c, const ops::OpPolicy& policy, std::int64_t b,
                ExactDistance* exact = nullptr) {
  const Alone a = run_alone(c, policy, b);
  if (exact != nullptr) {
    *exact = exact_distance(a.one, a.batch, exact_op(c.call.op, c.tensors));
  }
  return compare(a.one, a.batch);
}

std::string site_name(ops::OpFamily family, int layer) {
  std::string s(ops::family_name(family));
  return layer >= 0 ? s + " layer " + std::to_string(layer) : s;
}

// The row-0 comparison to export.
const ComparisonResult& pick_comparison(const ExperimentResult& r, const std::string& id) {
  if (!id.empty()) {
    const ComparisonResult* c = r.comparison(id);
    if (c == nullptr || c->kind != experiment::ComparisonKind::Row0) {
      std::string known;
      for (const ComparisonResult& x : r.comparisons) {
        if (x.kind == experiment::ComparisonKind::Row0) {
          known += (known.empty() ? "" : ", ") + x.id;
        }
      }
      base::raise(ErrorCode::InvalidArgument,
                  "no row-0 comparison '" + id + "' in the experiment (it has: " + known + ")");
    }
    return *c;
  }
  for (const ComparisonResult& c : r.comparisons) {
    if (c.kind == experiment::ComparisonKind::Row0 && c.first.found()) {
      return c;
    }
  }
  base::raise(ErrorCode::InvalidArgument,
              "no comparison of the experiment diverges: row 0 is bitwise equal at every batch "
              "size, so there is nothing to reproduce (give --comparison and --step to export "
              "an op anyway)");
}

PlannedRun planned(const ExperimentResult& r, const std::string& id) {
  for (const PlannedGroup& g : plan_groups(r.spec)) {
    for (const PlannedRun& run : g.runs) {
      if (run.id == id) {
        return run;
      }
    }
  }
  base::raise(ErrorCode::InvalidArgument, "the experiment's spec does not plan run " + id);
}

// The ops to capture: the requested one, or those behind the divergence's tap.
std::vector<ops::OpSite> wanted_sites(const ReproRequest& req, const ComparisonResult& c) {
  if (!req.family.empty()) {
    const std::optional<ops::OpFamily> f = ops::family_from_name(req.family);
    if (!f) {
      base::raise(ErrorCode::InvalidArgument, "unknown op family '" + req.family + "'");
    }
    const bool per_layer = ops::family_is_per_layer(*f);
    if (per_layer && req.layer < 0) {
      base::raise(ErrorCode::InvalidArgument, req.family + " is per layer: give --layer");
    }
    return {ops::OpSite{*f, per_layer ? req.layer : -1}};
  }
  const ops::FamilySet families = model::families_behind(c.first.tap);
  std::vector<ops::OpSite> out;
  for (const ops::OpFamily f : ops::all_families()) {
    if (families.test(static_cast<std::size_t>(f))) {
      out.push_back({f, ops::family_is_per_layer(f) ? c.first.layer : -1});
    }
  }
  if (out.empty()) {
    base::raise(ErrorCode::InvalidArgument, "no op is behind the first divergence (" +
                                                describe(c.first) +
                                                "): give --op FAMILY --layer L");
  }
  return out;
}

// Mean, standard deviation and how a seeded stand-in is drawn for a floating tensor.
void describe_values(const at::Tensor& t, ReproInput& in) {
  const at::Tensor f = t.to(at::kFloat);
  in.mean = f.mean().item<double>();
  in.std = f.numel() > 1 ? f.std().item<double>() : 0.0;
  const bool probabilities = in.role == "activation" && f.min().item<double>() >= 0.0 &&
                             (f.sum(-1) - 1.0).abs().max().item<double>() < 1e-2;
  in.random = probabilities ? "softmax" : "normal";
}

std::string shape_text(const std::vector<std::int64_t>& shape) {
  std::string s = "[";
  for (std::size_t i = 0; i < shape.size(); ++i) {
    s += (i > 0 ? ", " : "") + std::to_string(shape[i]);
  }
  return s + "]";
}

std::string bytes_text(std::uint64_t b) {
  std::ostringstream o;
  o.precision(3);
  if (b >= (std::uint64_t{1} << 30)) {
    o << static_cast<double>(b) / static_cast<double>(std::uint64_t{1} << 30) << " GiB";
  } else if (b >= (std::uint64_t{1} << 20)) {
    o << static_cast<double>(b) / static_cast<double>(std::uint64_t{1} << 20) << " MiB";
  } else {
    o << b << " bytes";
  }
  return o.str();
}

nlohmann::json to_json(const ReproExport& r, const ExperimentResult& shown,
                       const std::vector<std::string>& kernel_lines) {
  nlohmann::json inputs = nlohmann::json::array();
  for (const ReproInput& in : r.inputs) {
    inputs.push_back({{"name", in.name},
                      {"role", in.role},
                      {"shape", in.shape},
                      {"dtype", in.dtype},
                      {"included", in.included},
                      {"transposed", in.transposed},
                      {"key", in.key},
                      {"sha256", in.sha256},
                      {"bytes", in.bytes},
                      {"mean", in.mean},
                      {"std", in.std},
                      {"random", in.random}});
  }
  const Provenance& p = shown.provenance;
  return {{"format", kFormat},
          {"comparison", r.comparison},
          {"family", r.family},
          {"layer", r.layer},
          {"canvas", r.canvas + 1},  // 1-based, as shown everywhere (docs/repro.md)
          {"step", r.step},
          {"op", r.op},
          {"batch", r.batch},
          {"dtype", r.dtype},
          {"device", r.device},
          {"emulated", r.emulated},
          {"policy", r.policy},
          {"inputs", inputs},
          {"batchlens",
           {{"reproduces", r.reproduces},
            {"frac_differ", r.frac_differ},
            {"max_abs", r.max_abs},
            {"max_ulp", r.max_ulp},
            {"exact", experiment::to_json(r.exact)},
            {"version", (base::build_info().tool_version + " " + base::build_info().git_hash)}}},
          {"environment",
           {{"device_name", p.device_name},
            {"driver", p.driver},
            {"cuda", p.cuda},
            {"cublas", p.cublas},
            {"libtorch", p.libtorch},
            {"blas", p.blas}}},
          {"kernels", kernel_lines}};
}

std::string readme(const ReproExport& r, const ExperimentResult& shown, const ReproRequest& req,
                   const std::vector<std::string>& kernel_lines) {
  const Provenance& p = shown.provenance;
  const std::string where = site_name(*ops::family_from_name(r.family), r.layer);
  const std::string b = std::to_string(r.batch);
  std::ostringstream o;
  o << "# BatchLens minimal repro: " << where << " (" << r.op << ")\n\n"
    << "Row 0 of a batch of " << b << " identical rows and the same row alone (batch 1) give "
    << "different bits in `" << where << "` at canvas " << r.canvas + 1 << " step " << r.step
    << " of comparison `" << r.comparison << "` of the experiment"
    << (req.source_file.empty() ? "" : " `" + req.source_file + "`") << ".\n\n"
    << "`repro.py` computes this one op with plain PyTorch (no BatchLens, no transformers, no "
       "checkpoint) exactly as the model computes it ("
    << r.dtype
    << ", the weight's stored "
       "layout, "
    << (r.op == "matmul" ? "torch.matmul(probs, embed_tokens.weight)"
        : r.op == "grouped_mm"
            ? "torch._grouped_mm(rows sorted by expert, experts.transpose(-2, -1), offs)"
            : "F.linear(x, w)")
    << "), once at batch 1 and once with the row repeated to batch " << b
    << ", and prints whether row 0 is bitwise equal, the share of differing elements, max |Δ|, "
       "max ULP and the CUDA kernels each call launched. Exit status 1 when row 0 differs, 0 "
       "when equal, 2 when it cannot run here.\n\n";
  o << "## What BatchLens measured\n\n"
    << "- First divergence: " << describe(shown.comparison(r.comparison)->first) << "\n"
    << "- The op alone on the captured inputs, this export's check: row 0 "
    << (r.reproduces ? "DIFFERS" : "is bitwise equal") << " at B=" << b;
  if (r.reproduces) {
    o << " (" << r.frac_differ * 100.0 << " % of elements, max |Δ| " << r.max_abs << ", max ULP "
      << r.max_ulp << ")";
  }
  if (r.exact.computed) {
    o << "\n- Exact reference (the op in fp64 on the CPU, the same operands): "
      << r.exact.text(r.batch) << ". `python3 repro.py --exact` computes the same";
  }
  o << "\n- Policy of the batched run: " << r.policy << "\n";
  if (r.emulated) {
    o << "- **Emulated split-K.** The experiment ran this op with BatchLens's labelled emulation "
         "of a GPU library's split-K (a CPU stand-in: the K reduction cut in "
         "max(1, min(8 / ceil(M / 16), K / 32)) chunks, summed in fp32 in order). `repro.py` "
         "reproduces it only when told so: `python3 repro.py --emulate`. Without `--emulate` it "
         "computes this device's own kernels.\n";
  }
  for (const std::string& n : r.notes) {
    o << "- " << n << "\n";
  }
  o << "\n## Inputs\n\n";
  for (const ReproInput& in : r.inputs) {
    o << "- `" << in.name << "` (" << in.role << ") " << shape_text(in.shape) << " " << in.dtype
      << (in.transposed ? ", read as its transpose(-2, -1)" : "") << ": "
      << (in.included
              ? "captured, in inputs.safetensors"
              : "not included (" + bytes_text(in.bytes) + " over the " + bytes_text(req.max_bytes) +
                    " cap): seeded random " + in.random + " stand-in")
      << (in.key.empty() ? "" : "; checkpoint key `" + in.key + "`") << "; sha256 `" << in.sha256
      << "`\n";
  }
  o << "\n## Recorded on\n\n"
    << "- Device: " << p.device << " (" << p.device_name << ")\n"
    << "- Driver: " << (p.driver.empty() ? "-" : p.driver)
    << "; CUDA: " << (p.cuda.empty() ? "-" : p.cuda)
    << "; cuBLAS: " << (p.cublas.empty() ? "-" : p.cublas) << "\n- LibTorch: " << p.libtorch
    << "; CPU BLAS: " << p.blas << "\n"
    << "- BatchLens: " << p.tool_version << " (export by "
    << (base::build_info().tool_version + " " + base::build_info().git_hash) << ")\n";
  o << "\n## Kernels seen (BatchLens kernel provenance)\n\n";
  if (kernel_lines.empty()) {
    o << "Not recorded in the experiment (run without --no-kernels to record them).\n";
  }
  for (const std::string& k : kernel_lines) {
    o << "- " << k << "\n";
  }
  // Each line's comment starts in one column.
  const std::string flags = r.emulated ? " --emulate" : "";
  const auto line = [&o](const std::string& command, const std::string& comment) {
    o << command << std::string(command.size() < 44 ? 44 - command.size() : 1, ' ') << "# "
      << comment << "\n";
  };
  o << "\n## Run it\n\n"
    << "`--device` defaults to the kind of device it was recorded on (" << r.device
    << "); `--device cpu` or `--device cuda` runs it on the other.\n\n```sh\n";
  line("python3 repro.py" + flags, "captured inputs where included, B=" + b);
  line("python3 repro.py" + flags + " --random", "seeded random inputs of the same shapes");
  line("python3 repro.py" + flags + " --batch 8 --seed 3", "another batch size and seed");
  line("python3 repro.py" + flags + " --strategy row_wise",
       "the fix: each row alone, row 0 bitwise equal");
  o << "```\n\n";
  o << "`--strategy batch_invariant` names BatchLens's batch-invariant kernels, which plain "
       "PyTorch does not have: the script says so and exits 2.\n\n"
    << "The full BatchLens experiment again:\n\n```sh\n"
    << cli_run_command(shown.spec, shown.prompt_ids, "experiment.h5") << "\n"
    << "batchlens-cli repro experiment.h5 --comparison " << r.comparison << " --op " << r.family
    << (r.layer >= 0 ? " --layer " + std::to_string(r.layer) : "") << " --step " << r.step
    << " --canvas " << r.canvas + 1 << " --out repro\n```\n";
  return o.str();
}

// The tensor as stored: the contiguous parameter a transposed view reads, or a contiguous copy.
at::Tensor stored_layout(const at::Tensor& t, bool& transposed) {
  transposed = !t.is_contiguous() && t.dim() >= 2 && t.transpose(-2, -1).is_contiguous();
  return transposed ? t.transpose(-2, -1) : t.contiguous();
}

void check_is_previous_export(const std::filesystem::path& dir) {
  std::error_code ec;
  if (!std::filesystem::exists(dir, ec)) {
    return;
  }
  if (!std::filesystem::is_directory(dir, ec)) {
    base::raise(ErrorCode::InvalidArgument, dir.string() + " exists and is not a folder");
  }
  if (std::filesystem::is_empty(dir, ec)) {
    return;
  }
  // op.json read as untrusted input: a FIFO of that name blocked the export forever (issue #32);
  // anything but a small regular file with our format means "not ours".
  auto text = base::read_input_file(dir / "op.json", "op.json", std::uint64_t{16} << 20);
  auto doc = text.ok() ? base::parse_json(text.value(), "op.json")
                       : base::Result<nlohmann::json>(text.error());
  const auto format = doc.ok() && doc.value().is_object() && doc.value().contains("format") &&
                              doc.value()["format"].is_string()
                          ? doc.value()["format"].get<std::string>()
                          : std::string();
  if (format != kFormat) {
    base::raise(ErrorCode::InvalidArgument,
                dir.string() +
                    " exists and is not a BatchLens repro folder: choose another "
                    "--out (nothing there was changed)");
  }
}

// The operands of `call` as the folder stores them, described in `inputs`: activations first
// under the cap, then the weight; offsets always. Returns those included.
std::vector<std::pair<std::string, at::Tensor>> operands(const Captured& call,
                                                         const model::DiffusionGemma& model,
                                                         std::uint64_t cap,
                                                         std::vector<ReproInput>& inputs) {
  constexpr std::array<const char*, 3> kNames{"x", "w", "offs"};
  std::vector<std::pair<std::string, at::Tensor>> tensors;
  std::uint64_t used = 0;
  for (std::size_t i = 0; i < call.tensors.size() && i < kNames.size(); ++i) {
    ReproInput in;
    in.name = kNames.at(i);
    in.role = i == 0 ? "activation" : i == 1 ? "weight" : "offsets";
    const at::Tensor stored = stored_layout(call.tensors[i], in.transposed).to(at::kCPU);
    in.shape.assign(stored.sizes().begin(), stored.sizes().end());
    in.dtype = model::safetensors_dtype_name(stored.scalar_type());
    in.bytes = static_cast<std::uint64_t>(stored.numel()) * stored.element_size();
    in.sha256 = base::sha256_hex(stored.data_ptr(), in.bytes);
    if (i == 1) {
      in.key = model::checkpoint_key_of(model.weights(), model.config().text, call.tensors[i]);
    }
    if (i == 2) {
      in.random = "copy";
      in.included = true;
    } else {
      describe_values(stored, in);
      in.included = used + in.bytes <= cap;
    }
    if (in.included) {
      used += in.bytes;
      tensors.emplace_back(in.name, stored);
    }
    inputs.push_back(std::move(in));
  }
  return tensors;
}

// Writes the folder beside req.out and moves it into place complete: it replaces a previous
// export there (checked before the work), which is moved aside first and removed once the new
// one is in place, or put back when the move fails.
void write_folder(const ReproRequest& req, const ReproExport& r, const ExperimentResult& shown,
                  const std::vector<std::pair<std::string, at::Tensor>>& tensors,
                  const std::vector<std::string>& kernel_lines) {
  base::AtomicDir dir(req.out);
  model::write_safetensors(dir.path() / "inputs.safetensors", tensors, {{"format", kFormat}});
  check(base::write_file_atomic(dir.path() / "op.json",
                                base::dump_json_lossy(to_json(r, shown, kernel_lines), 2) + "\n"));
  check(base::write_file_atomic(dir.path() / "repro.py", repro_script()));
  check(base::write_file_atomic(dir.path() / "README.md", readme(r, shown, req, kernel_lines)));
  std::error_code ec;
  const std::filesystem::path old =
      req.out.string() + ".old-" + std::to_string(static_cast<long>(::getpid()));
  if (std::filesystem::exists(req.out, ec) && !std::filesystem::is_empty(req.out, ec)) {
    std::filesystem::rename(req.out, old);
  }
  try {
    dir.commit();
  } catch (...) {
    if (std::filesystem::exists(old, ec)) {
      std::filesystem::rename(old, req.out, ec);  // the previous export back
    }
    throw;
  }
  std::filesystem::remove_all(old, ec);
  std::filesystem::permissions(req.out / "repro.py", std::filesystem::perms::owner_exec,
                               std::filesystem::perm_options::add, ec);
}

}  // namespace

base::Result<ReproExport> export_repro(const setup::Session& session, const ExperimentResult& shown,
                                       const ReproRequest& req, const RunControl& control) {
  return base::guarded([&]() -> ReproExport {
    if (req.out.empty()) {
      base::raise(ErrorCode::InvalidArgument, "no output folder given");
    }
    check_is_previous_export(req.out);
    const ComparisonResult& c = pick_comparison(shown, req.comparison);
    const bool explicit_step = req.step >= 1;
    if (!explicit_step && !c.first.found()) {
      base::raise(ErrorCode::InvalidArgument,
                  "comparison " + c.id + " does not diverge: give --step (and --canvas)");
    }
    ReproExport r;
    r.comparison = c.id;
    r.canvas = explicit_step ? std::max(0, req.canvas) : c.first.canvas;
    r.step = explicit_step ? req.step : c.first.step;
    const PlannedRun run = planned(shown, c.run);
    const ops::OpPolicy& policy = run.policy;
    const experiment::RunGroup group = run.group;
    r.batch = run.batch_size;
    r.policy = ops::policy_text(policy);
    const std::vector<ops::OpSite> sites = wanted_sites(req, c);

    Capture capture(sites);
    check(observe_reference_step(session, shown, group, r.canvas, r.step, capture, control));
    if (capture.calls.empty()) {
      std::string names;
      for (const ops::OpSite& s : sites) {
        names += (names.empty() ? "" : ", ") + site_name(s.family, s.layer);
      }
      base::raise(ErrorCode::InvalidArgument,
                  "the decoder pass of canvas " + std::to_string(r.canvas + 1) + " step " +
                      std::to_string(r.step) + " runs no " + names +
                      " through the op layer (attention is not exported; eager experts run per "
                      "expert)");
    }
    // The first call, in pass order, that diverges alone; else the first exportable one.
    const Captured* chosen = nullptr;
    BitDiff outcome;
    for (const Captured& call : capture.calls) {
      const std::string name = site_name(call.call.family, call.call.layer) + " (" + call.call.op +
                               ", M=" + std::to_string(call.call.m) + ")";
      if (call.call.op == "sdpa") {
        continue;
      }
      BitDiff o;
      try {
        o = isolate(call, policy, r.batch);
      } catch (const std::exception& e) {
        r.candidates.push_back(name + ": not computable here (" + e.what() + ")");
        continue;
      }
      r.candidates.push_back(name + (o.differs ? ": row 0 differs alone" : ": equal alone"));
      if (chosen == nullptr || (o.differs && !outcome.differs)) {
        chosen = &call;
        outcome = o;
      }
      if (o.differs && req.family.empty()) {
        break;
      }
    }
    if (chosen == nullptr) {
      base::raise(ErrorCode::InvalidArgument,
                  "none of the ops captured can be computed alone here: " + r.candidates.front());
    }
    const ops::OpCall& call = chosen->call;
    r.family = std::string(ops::family_name(call.family));
    r.layer = call.layer;
    r.op = call.op;
    r.dtype = call.dtype;
    r.device = chosen->tensors.front().device().str();
    r.emulated = policy.emulates(call.family);
    r.reproduces = outcome.differs;
    r.frac_differ = outcome.frac;
    r.max_abs = outcome.max_abs;
    r.max_ulp = outcome.max_ulp;
    try {
      (void)isolate(*chosen, policy, r.batch, &r.exact);
    } catch (const std::exception& e) {
      r.notes.emplace_back(std::string("no exact (fp64) reference: ") + e.what());
    }
    if (!outcome.differs) {
      r.notes.emplace_back(
          req.family.empty()
              ? "No op behind the divergence reproduces it alone with this build: their row-0 "
                "inputs already differ in the experiment (e.g. a cache from a batched prefill), "
                "or the divergence comes from an op outside the op layer."
              : "This op alone gives row 0 bitwise equal at B and at 1 on these inputs with this "
                "build: it is not a source of the divergence here (the script shows the same).");
    }
    const std::vector<std::pair<std::string, at::Tensor>> tensors =
        operands(*chosen, *session.model, req.max_bytes, r.inputs);
    std::vector<std::string> kernel_lines;
    if (shown.kernels) {
      ComparisonResult at = c;
      at.first.step = r.step;
      at.first.layer = r.layer;
      for (const std::string& line : first_divergence_kernels(shown, at)) {
        if (line.rfind(r.family, 0) == 0) {
          kernel_lines.push_back(line);
        }
      }
    }

    write_folder(req, r, shown, tensors, kernel_lines);
    r.dir = req.out;
    return r;
  });
}

namespace {

// fp64 operands at most this many elements per weight (512 MiB): a wide op is compared with
// exact on an evenly spaced sample of its output columns.
constexpr std::int64_t kMaxExactWeight = std::int64_t{1} << 26;
constexpr std::int64_t kMaxExactColumns = 4096;

// "bf16" for c10's "BFloat16" (the op layer's dtype names), as the file and CLI name dtypes.
std::string short_dtype(const std::string& c10) {
  if (c10 == "BFloat16") {
    return "bf16";
  }
  if (c10 == "Half") {
    return "fp16";
  }
  if (c10 == "Float") {
    return "fp32";
  }
  return c10 == "Double" ? "fp64" : c10;
}

// `c` alone at 1 and at B, and how far both lie from its fp64 value on at most
// kMaxExactColumns output columns (fewer when K is large: the 26B-A4B's lm_head has 262144
// columns, its self-conditioning matmul K = 262144).
experiment::ExactOp exact_of(const Captured& c, const ops::OpPolicy& policy, std::int64_t b) {
  const Alone a = run_alone(c, policy, b);
  experiment::ExactOp op;
  op.site = site_name(c.call.family, c.call.layer);
  op.op = c.call.op;
  op.dtype = short_dtype(c.call.dtype);
  op.differs_alone = compare(a.one, a.batch).differs;
  const std::int64_t n = a.one.size(-1);
  const at::Tensor& w = c.tensors.at(1);
  const std::int64_t k = c.call.op == "linear" ? w.size(-1) : w.size(-2);
  const std::int64_t keep =
      std::max<std::int64_t>(1, std::min({n, kMaxExactColumns, kMaxExactWeight / k}));
  std::vector<at::Tensor> operands = c.tensors;
  at::Tensor one = a.one;
  at::Tensor batch = a.batch;
  if (keep < n) {
    const at::Tensor cols =
        (at::arange(keep, at::TensorOptions().dtype(at::kLong)) * (n / keep)).to(w.device());
    one = one.index_select(-1, cols);
    batch = batch.index_select(-1, cols);
    // linear: w [N, K]; matmul: b [..., K, N]; grouped_mm: w [E, K, N]
    operands[1] = c.call.op == "linear" ? w.index_select(0, cols) : w.index_select(-1, cols);
  }
  op.columns = keep;
  op.columns_of = n;
  op.distance = exact_distance(one, batch, exact_op(c.call.op, operands));
  return op;
}

// The exact reference of one diverging comparison (the op behind its first divergence and the
// step's lm_head).
experiment::ExactAtDivergence exact_of_comparison(const setup::Session& session,
                                                  const ExperimentResult& shown,
                                                  const ComparisonResult& c, const PlannedRun& run,
                                                  const RunControl& control) {
  experiment::ExactAtDivergence e;
  e.comparison = c.id;
  e.batch = run.batch_size;
  e.canvas = c.first.canvas;
  e.step = c.first.step;
  std::vector<ops::OpSite> sites = wanted_sites(ReproRequest{}, c);
  sites.push_back({ops::OpFamily::LmHead, -1});
  Capture capture(sites);
  check(observe_reference_step(session, shown, run.group, e.canvas, e.step, capture, control));
  const Captured* chosen = nullptr;
  bool chosen_differs = false;
  for (const Captured& call : capture.calls) {
    if (call.call.op == "sdpa") {
      continue;
    }
    if (call.call.family == ops::OpFamily::LmHead && !e.logits) {
      try {
        e.logits = exact_of(call, run.policy, run.batch_size);
      } catch (const std::exception& ex) {
        e.note += std::string(e.note.empty() ? "" : "; ") + "lm_head: " + ex.what();
      }
    }
    const bool behind = std::any_of(sites.begin(), sites.end() - 1, [&](const ops::OpSite& s) {
      return s.family == call.call.family && s.layer == call.call.layer;
    });
    if (!behind || chosen_differs) {
      continue;
    }
    bool differs = false;
    try {
      differs = isolate(call, run.policy, run.batch_size).differs;
    } catch (const std::exception&) {
      continue;  // not computable alone here (as the repro says of it)
    }
    if (chosen == nullptr || differs) {
      chosen = &call;
      chosen_differs = differs;
    }
  }
  if (chosen != nullptr) {
    try {
      e.op = exact_of(*chosen, run.policy, run.batch_size);
    } catch (const std::exception& ex) {
      e.note += std::string(e.note.empty() ? "" : "; ") + "the op: " + ex.what();
    }
  } else {
    e.note = "no op behind the first divergence (" + describe(c.first) +
             ") runs through the op layer as one product (attention is not recomputed)";
  }
  if (!e.logits && e.note.find("lm_head") == std::string::npos) {
    e.note += std::string(e.note.empty() ? "" : "; ") + "the step's lm_head was not captured";
  }
  return e;
}

}  // namespace

base::Result<experiment::ExactReport> exact_at_divergence(const setup::Session& session,
                                                          const ExperimentResult& shown,
                                                          const RunControl& control) {
  return base::guarded([&]() -> experiment::ExactReport {
    const auto start = std::chrono::steady_clock::now();
    experiment::ExactReport report;
    for (const ComparisonResult& c : shown.comparisons) {
      if (c.kind != experiment::ComparisonKind::Row0 || !c.first.found()) {
        continue;
      }
      const PlannedRun run = planned(shown, c.run);
      if (run.batch_size < 2) {
        continue;  // the B=1 repeat: no batch to compare with
      }
      try {
        report.comparisons.push_back(exact_of_comparison(session, shown, c, run, control));
      } catch (const base::ErrorException& e) {
        if (e.error().code == ErrorCode::Cancelled || e.error().code == ErrorCode::OutOfMemory) {
          throw;
        }
        experiment::ExactAtDivergence failed;
        failed.comparison = c.id;
        failed.batch = run.batch_size;
        failed.canvas = c.first.canvas;
        failed.step = c.first.step;
        failed.note = "not computed: " + e.error().message;
        report.comparisons.push_back(std::move(failed));
      }
    }
    report.wall_s = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
    return report;
  });
}

base::Result<ReproExport> export_repro(const ExperimentResult& shown, const ReproRequest& req,
                                       const RunControl& control) {
  return base::guarded([&] {
    const setup::Session session = base::take(open_session_for(shown.spec, control));
    return base::take(export_repro(session, shown, req, control));
  });
}

std::string repro_text(const ReproExport& r) {
  std::ostringstream o;
  const std::string where = site_name(*ops::family_from_name(r.family), r.layer);
  o << "repro: " << where << " (" << r.op << ", " << r.dtype << ") at canvas " << r.canvas + 1
    << " step " << r.step << " of " << r.comparison << "\n"
    << "  the op alone at B=" << r.batch << " vs B=1 on the captured inputs: row 0 "
    << (r.reproduces ? "DIFFERS" : "bitwise equal");
  if (r.reproduces) {
    o << " (" << r.frac_differ * 100.0 << " % of elements, max |delta| " << r.max_abs
      << ", max ULP " << r.max_ulp << ")";
  }
  o << "\n";
  if (r.exact.computed) {
    o << "  exact (fp64 on the CPU): " << r.exact.text(r.batch) << "\n";
  }
  if (r.emulated) {
    o << "  emulated split-K in the experiment: the script reproduces it with --emulate\n";
  }
  for (const ReproInput& in : r.inputs) {
    o << "  " << in.name << " " << shape_text(in.shape) << " " << in.dtype << ": "
      << (in.included ? "captured" : "seeded random stand-in (over the cap)")
      << (in.key.empty() ? "" : ", " + in.key) << "\n";
  }
  for (const std::string& c : r.candidates) {
    o << "  tried: " << c << "\n";
  }
  for (const std::string& n : r.notes) {
    o << "  note: " << n << "\n";
  }
  o << "  wrote " << r.dir.string() << "/{repro.py, inputs.safetensors, op.json, README.md}\n"
    << "  run: cd " << experiment::shell_quote(r.dir.string()) << " && python3 repro.py"
    << (r.emulated ? " --emulate" : "") << "\n";
  return o.str();
}

}  // namespace batchlens::analysis
