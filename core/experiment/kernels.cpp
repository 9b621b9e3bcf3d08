// SPDX-License-Identifier: Apache-2.0
#include "core/experiment/kernels.h"

#include <algorithm>
#include <chrono>
#include <map>
#include <regex>
#include <set>
#include <sstream>
#include <utility>

#include <ATen/ATen.h>
#include <ATen/CPUGeneratorImpl.h>
#include <nlohmann/json.hpp>

#include "core/base/cancel.h"
#include "core/base/system_info.h"
#include "core/experiment/culprit.h"
#include "core/experiment/experiment.h"
#include "core/experiment/plan.h"
#include "core/model/diffusion_gemma.h"
#include "core/ops/op_observer.h"
#include "core/ops/op_profile.h"
#include "core/setup/front_door.h"

namespace batchlens::experiment {

namespace {

using Clock = std::chrono::steady_clock;

constexpr std::size_t kMaxEngines = 4096;
constexpr std::size_t kMaxOps = 100000;
constexpr std::size_t kMaxKernels = 4096;
constexpr std::size_t kMaxText = 4096;

// Collects the op layer's calls of one pass, one entry per (family, layer) in first-call order.
class Collector final : public ops::OpObserver {
 public:
  // `library` names who computes ATen's own GEMM calls here ("cuBLAS", "oneDNN", ...).
  Collector(bool marks, std::string library) : marks_(marks), library_(std::move(library)) {}

  void on_op(const ops::OpCall& call) override {
    ops::OpCall c = call;
    if (c.path == "at::linear" || c.path == "at::matmul") {
      c.path += " → " + library_;  // the library behind ATen's own call
    }
    const std::string family(ops::family_name(c.family));
    const auto key = std::make_pair(family, c.layer);
    auto it = index_.find(key);
    if (it == index_.end()) {
      it = index_.emplace(key, ops_.size()).first;
      OpKernels o;
      o.family = family;
      o.layer = c.layer;
      o.op = c.op;
      o.strategy = std::string(ops::strategy_name(c.strategy));
      o.m = c.m;
      o.n = c.n;
      o.k = c.k;
      o.dtype = c.dtype;
      o.path = c.path;
      ops_.push_back(std::move(o));
      paths_.emplace_back();
      paths_.back().insert(c.path);
    } else if (paths_[it->second].insert(c.path).second) {
      ops_[it->second].path += " | " + c.path;
    }
    ops_[it->second].calls += c.calls;
  }
  bool marks() const override { return marks_; }

  std::vector<OpKernels>& ops() { return ops_; }
  OpKernels* find(const std::string& family, int layer) {
    const auto it = index_.find({family, layer});
    return it == index_.end() ? nullptr : &ops_[it->second];
  }

 private:
  bool marks_;
  std::string library_;
  std::vector<OpKernels> ops_;
  std::vector<std::set<std::string>> paths_;
  std::map<std::pair<std::string, int>, std::size_t> index_;
};

// "bl/<family>/<layer>" back to its parts.
bool parse_scope(const std::string& scope, std::string& family, int& layer) {
  if (scope.rfind("bl/", 0) != 0) {
    return false;
  }
  const std::size_t slash = scope.rfind('/');
  if (slash <= 3) {
    return false;
  }
  family = scope.substr(3, slash - 3);
  try {
    layer = std::stoi(scope.substr(slash + 1));
  } catch (...) {
    return false;
  }
  return true;
}

// Who computes "at::linear" / "at::matmul" on this device and dtype.
std::string library_of(const at::Device& device, at::ScalarType dtype) {
  if (device.is_cuda()) {
    return "cuBLAS";
  }
  if (dtype == at::kBFloat16 || dtype == at::kHalf) {
    return base::query_cpu_isa().bf16_matmul;  // "oneDNN" or "ATen"
  }
  return "BLAS (" + std::string(at::hasMKL() ? "MKL" : "LibTorch's") + ")";
}

std::string dims_text(const std::array<std::int64_t, 3>& d) {
  return "[" + std::to_string(d[0]) + "," + std::to_string(d[1]) + "," + std::to_string(d[2]) + "]";
}

// One pass of `run`: prefill as the spec makes it, then the decoder over a seeded canvas.
EngineKernels capture_one(const model::DiffusionGemma& model, const ExperimentSpec& spec,
                          const at::Tensor& prompt, const PlannedRun& run, bool sc) {
  const auto start = Clock::now();
  const at::Device device = model.device();
  const std::int64_t b = run.batch_size;
  const std::int64_t c = model.config().canvas_length;
  const std::int64_t vocab = model.config().text.vocab_size;
  const model::ForwardContext plain{&run.policy, nullptr};
  model::KvCache cache;
  if (spec.prefill == generation::PrefillMode::Copied) {
    model::KvCache one;
    model.encode(prompt, one, plain);
    cache = one.repeat_rows(b);
  } else {
    model.encode(prompt.expand({b, -1}).contiguous(), cache, plain);
  }
  auto gen = at::make_generator<at::CPUGeneratorImpl>(spec.seed + 0x9e3779b97f4a7c15ULL);
  const at::Tensor canvas = at::randint(vocab, {1, c}, gen, at::TensorOptions().dtype(at::kLong))
                                .to(device)
                                .expand({b, -1})
                                .contiguous();  // [B, C] int64
  at::Tensor sc_logits;
  if (sc) {
    sc_logits = at::randn({1, c, vocab}, gen)
                    .to(model.weights().embed.scalar_type())
                    .to(device)
                    .expand({b, -1, -1})
                    .contiguous();  // [B, C, V] in the embedding's dtype, as the engine passes
  }
  Collector collector(device.is_cuda(), library_of(device, model.dtype()));
  const model::ForwardContext observed{&run.policy, nullptr, /*check_id_range=*/false,
                                       /*fused_kernels=*/true, &collector};
  EngineKernels e;
  e.run = run.id;
  e.batch_size = static_cast<int>(b);
  e.policy = ops::policy_text(run.policy);
  e.self_conditioning = sc;
  e.device = device.str();
  if (device.is_cuda() && ops::kernel_profiler_available()) {
    // A warm-up first: library handles and heuristics caches are made outside the trace.
    (void)model.decode(canvas, cache, sc_logits,
                       model::ForwardContext{&run.policy, nullptr, false});
    const std::vector<ops::KernelSeen> launched = ops::profile_marked_kernels(
        [&] { (void)model.decode(canvas, cache, sc_logits, observed); });
    for (const ops::KernelSeen& k : launched) {
      std::string family;
      int layer = -1;
      if (!parse_scope(k.scope, family, layer)) {
        continue;  // elementwise work outside the op layer
      }
      OpKernels* op = collector.find(family, layer);
      if (op == nullptr) {
        continue;
      }
      auto same = std::find_if(op->kernels.begin(), op->kernels.end(), [&](const KernelLaunch& x) {
        return x.name == k.name && x.grid == k.grid && x.block == k.block;
      });
      if (same == op->kernels.end()) {
        op->kernels.push_back(KernelLaunch{k.name, k.grid, k.block, 0, 0.0});
        same = op->kernels.end() - 1;
      }
      ++same->calls;
      same->total_us += k.duration_us;
    }
  } else {
    (void)model.decode(canvas, cache, sc_logits, observed);
  }
  e.ops = std::move(collector.ops());
  e.seconds = std::chrono::duration<double>(Clock::now() - start).count();
  return e;
}

std::string text_of(const nlohmann::json& j, const char* key) {
  if (!j.contains(key)) {
    return {};
  }
  std::string s = j.at(key).get<std::string>();
  if (s.size() > kMaxText) {
    throw std::length_error(key);
  }
  return s;
}

std::array<std::int64_t, 3> dims_of(const nlohmann::json& j, const char* key) {
  std::array<std::int64_t, 3> d{0, 0, 0};
  if (!j.contains(key)) {
    return d;
  }
  const nlohmann::json& v = j.at(key);
  if (!v.is_array() || v.size() != 3) {
    throw std::length_error(key);
  }
  for (std::size_t i = 0; i < 3; ++i) {
    d[i] = v[i].get<std::int64_t>();
  }
  return d;
}

// The tile of a GEMM kernel's name ("..._128x128x64_...") or "".
std::string tile_of(const std::string& name) {
  static const std::regex tile(R"((\d+)x(\d+)(x\d+)?)");
  std::smatch m;
  return std::regex_search(name, m, tile) ? m.str(0) : std::string();
}

// A kernel's name without its argument list ("void f<...>(args)" -> "f<...>"), at most 160
// characters: what a reader needs to tell kernels apart.
std::string short_name(const std::string& name) {
  std::string n = name;
  if (n.rfind("void ", 0) == 0) {
    n = n.substr(5);
  }
  int depth = 0;
  for (std::size_t i = 0; i < n.size(); ++i) {
    depth += n[i] == '<' ? 1 : (n[i] == '>' ? -1 : 0);
    if (n[i] == '(' && depth == 0) {
      n = n.substr(0, i);
      break;
    }
  }
  return n.size() > 160 ? n.substr(0, 157) + "..." : n;
}

bool is_split_k(const std::string& name) {
  std::string lower = name;
  std::transform(lower.begin(), lower.end(), lower.begin(),
                 [](unsigned char ch) { return static_cast<char>(std::tolower(ch)); });
  return lower.find("splitk") != std::string::npos || lower.find("split_k") != std::string::npos ||
         lower.find("reduce") != std::string::npos;
}

}  // namespace

const EngineKernels* KernelProvenance::engine(const std::string& run,
                                              bool self_conditioning) const {
  for (const EngineKernels& e : engines) {
    if (e.run == run && e.self_conditioning == self_conditioning) {
      return &e;
    }
  }
  return nullptr;
}

nlohmann::json to_json(const KernelProvenance& k) {
  nlohmann::json engines = nlohmann::json::array();
  for (const EngineKernels& e : k.engines) {
    nlohmann::json ops = nlohmann::json::array();
    for (const OpKernels& o : e.ops) {
      nlohmann::json kernels = nlohmann::json::array();
      for (const KernelLaunch& l : o.kernels) {
        kernels.push_back({{"name", l.name},
                           {"grid", l.grid},
                           {"block", l.block},
                           {"calls", l.calls},
                           {"total_us", l.total_us}});
      }
      ops.push_back({{"family", o.family},
                     {"layer", o.layer},
                     {"op", o.op},
                     {"strategy", o.strategy},
                     {"m", o.m},
                     {"n", o.n},
                     {"k", o.k},
                     {"calls", o.calls},
                     {"dtype", o.dtype},
                     {"path", o.path},
                     {"kernels", kernels}});
    }
    engines.push_back({{"run", e.run},
                       {"batch_size", e.batch_size},
                       {"policy", e.policy},
                       {"self_conditioning", e.self_conditioning},
                       {"device", e.device},
                       {"seconds", e.seconds},
                       {"ops", ops}});
  }
  return {{"source", k.source}, {"wall_s", k.wall_s}, {"engines", engines}};
}

base::Result<KernelProvenance> kernels_from_json(const nlohmann::json& doc) {
  const auto bad = [](const std::string& what) {
    return base::Error{base::ErrorCode::FileCorrupted, "kernel provenance: " + what};
  };
  try {
    if (!doc.is_object() || !doc.contains("engines") || !doc["engines"].is_array()) {
      return bad(R"(expected an object with an "engines" array)");
    }
    if (doc["engines"].size() > kMaxEngines) {
      return bad("too many engines");
    }
    KernelProvenance k;
    k.source = text_of(doc, "source");
    k.wall_s = doc.value("wall_s", 0.0);
    for (const nlohmann::json& e : doc["engines"]) {
      if (!e.is_object() || !e.contains("ops") || !e["ops"].is_array()) {
        return bad("an engine is not an object with an \"ops\" array");
      }
      if (e["ops"].size() > kMaxOps) {
        return bad("an engine has too many ops");
      }
      EngineKernels x;
      x.run = text_of(e, "run");
      x.batch_size = e.value("batch_size", 0);
      if (x.batch_size < 1 || x.batch_size > 4096) {
        return bad("batch size out of range");
      }
      x.policy = text_of(e, "policy");
      x.self_conditioning = e.value("self_conditioning", false);
      x.device = text_of(e, "device");
      x.seconds = e.value("seconds", 0.0);
      for (const nlohmann::json& o : e["ops"]) {
        if (!o.is_object()) {
          return bad("an op is not an object");
        }
        OpKernels op;
        op.family = text_of(o, "family");
        op.layer = o.value("layer", -1);
        op.op = text_of(o, "op");
        op.strategy = text_of(o, "strategy");
        op.m = o.value("m", std::int64_t{0});
        op.n = o.value("n", std::int64_t{0});
        op.k = o.value("k", std::int64_t{0});
        op.calls = o.value("calls", std::int64_t{0});
        op.dtype = text_of(o, "dtype");
        op.path = text_of(o, "path");
        if (o.contains("kernels")) {
          const nlohmann::json& ks = o["kernels"];
          if (!ks.is_array() || ks.size() > kMaxKernels) {
            return bad("an op's kernels are not a short array");
          }
          for (const nlohmann::json& l : ks) {
            if (!l.is_object()) {
              return bad("a kernel is not an object");
            }
            op.kernels.push_back(KernelLaunch{text_of(l, "name"), dims_of(l, "grid"),
                                              dims_of(l, "block"), l.value("calls", 0),
                                              l.value("total_us", 0.0)});
          }
        }
        x.ops.push_back(std::move(op));
      }
      k.engines.push_back(std::move(x));
    }
    return k;
  } catch (const nlohmann::json::exception&) {
    return bad("a field has the wrong type");
  } catch (const std::length_error& e) {
    return bad(std::string("field ") + e.what() + " is too long or misshapen");
  }
}

const OpKernels* find_op(const EngineKernels& engine, const std::string& family, int layer) {
  for (const OpKernels& o : engine.ops) {
    if (o.family == family && o.layer == layer) {
      return &o;
    }
  }
  return nullptr;
}

std::string describe(const OpKernels& op) {
  std::string out = op.path;
  if (op.calls > 1) {
    out += " (" + std::to_string(op.calls) + " calls)";
  }
  for (std::size_t i = 0; i < op.kernels.size(); ++i) {
    const KernelLaunch& l = op.kernels[i];
    out += (i == 0 ? ": " : "; ") + short_name(l.name) + " grid " + dims_text(l.grid) + " block " +
           dims_text(l.block);
    if (l.calls > 1) {
      out += " ×" + std::to_string(l.calls);
    }
  }
  return out;
}

std::vector<std::string> kernel_differences(const OpKernels& a, const OpKernels& b) {
  std::vector<std::string> out;
  if (a.path != b.path) {
    out.push_back("path: " + a.path + " → " + b.path);
  }
  const auto names = [](const OpKernels& o) {
    std::vector<std::string> n;
    for (const KernelLaunch& l : o.kernels) {
      n.push_back(l.name);
    }
    return n;
  };
  const std::vector<std::string> na = names(a);
  const std::vector<std::string> nb = names(b);
  const auto any_split = [](const std::vector<std::string>& n) {
    return std::any_of(n.begin(), n.end(), is_split_k);
  };
  if (na != nb) {
    const std::string ka = na.empty() ? std::string("-") : na.front();
    const std::string kb = nb.empty() ? std::string("-") : nb.front();
    if (ka != kb) {
      out.push_back("kernel: " + short_name(ka) + " → " + short_name(kb));
    }
    if (na.size() != nb.size()) {
      out.push_back("kernels per op: " + std::to_string(na.size()) + " → " +
                    std::to_string(nb.size()));
    }
    const std::string ta = tile_of(ka);
    const std::string tb = tile_of(kb);
    if (ta != tb) {
      out.push_back("tile " + (ta.empty() ? std::string("?") : ta) + " → " +
                    (tb.empty() ? std::string("?") : tb));
    }
  }
  if (any_split(na) != any_split(nb)) {
    out.push_back(std::string("split-K: ") + (any_split(na) ? "yes" : "no") + " → " +
                  (any_split(nb) ? "yes" : "no"));
  }
  // A kernel both ran, launched with another shape (a split-K reduction's grid counts the
  // splits, for one).
  for (const KernelLaunch& x : a.kernels) {
    for (const KernelLaunch& y : b.kernels) {
      if (x.name == y.name && (x.grid != y.grid || x.block != y.block)) {
        out.push_back("launch of " + short_name(x.name) + ": grid " + dims_text(x.grid) + " → " +
                      dims_text(y.grid) + ", block " + dims_text(x.block) + " → " +
                      dims_text(y.block));
        break;
      }
    }
  }
  return out;
}

std::string reference_run_of(const std::string& run) {
  return run.rfind("wa.", 0) == 0 ? "wa.ref" : "ref";
}

std::vector<std::string> first_divergence_kernels(const ExperimentResult& r,
                                                  const ComparisonResult& c) {
  std::vector<std::string> out;
  if (!r.kernels || c.kind != "row0" || !c.first.found()) {
    return out;
  }
  // The first step of a canvas runs without self-conditioning; every later one with it.
  const bool sc = c.first.step > 1;
  const EngineKernels* ref = r.kernels->engine(c.reference, sc);
  const EngineKernels* run = r.kernels->engine(c.run, sc);
  if (ref == nullptr || run == nullptr) {
    return out;
  }
  const ops::FamilySet families = families_behind(c.first.tap);
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
    const std::string ref_id = reference_run_of(e.run);
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

KernelProvenance capture_kernels(const setup::Session& session, const ExperimentSpec& spec,
                                 const std::vector<std::int64_t>& prompt_ids,
                                 const std::vector<PlannedGroup>& groups,
                                 const base::CancelToken* cancel) {
  const auto start = Clock::now();
  const model::DiffusionGemma& model = *session.model;
  KernelProvenance k;
  k.source = model.device().is_cuda() && ops::kernel_profiler_available()
                 ? "profiler (Kineto): one uncaptured decoder pass per engine"
                 : "op layer paths: one decoder pass per engine";
  const at::Tensor prompt = at::tensor(prompt_ids, at::TensorOptions().dtype(at::kLong))
                                .view({1, -1})
                                .to(model.device());  // [1, L] int64
  for (const PlannedGroup& g : groups) {
    for (const PlannedRun& run : g.runs) {
      if (run.id.find("repeat") != std::string::npos) {
        continue;  // the reference's engine again
      }
      for (const bool sc : {false, true}) {
        if (cancel != nullptr && cancel->cancelled()) {
          base::raise(base::ErrorCode::Cancelled, "kernel provenance cancelled");
        }
        k.engines.push_back(capture_one(model, spec, prompt, run, sc));
      }
    }
  }
  k.wall_s = std::chrono::duration<double>(Clock::now() - start).count();
  return k;
}

}  // namespace batchlens::experiment
