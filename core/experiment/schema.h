// SPDX-License-Identifier: Apache-2.0
// The fields of an experiment's results, declared once: each result struct's fields with their
// names, their kind (a single value or an array), the shape of each array in the experiment's
// axes, the schema version that added it and what a reader checks. The HDF5 writer and reader
// (core/io/experiment_file.cpp) and summary_json (experiment.cpp) are visitors of these
// declarations, so adding a field means adding one line here (docs/file-format.md lists the
// fields for people). Torch-free, HDF5-free.
#pragma once

#include <cstdint>
#include <limits>
#include <type_traits>
#include <vector>

#include "core/experiment/experiment.h"

namespace batchlens::experiment::schema {

/// A schema version of the experiment file (major.minor); not the tool's version.
struct Version {
  int major = 1;
  int minor = 0;
};
constexpr bool operator<(Version a, Version b) {
  return a.major != b.major ? a.major < b.major : a.minor < b.minor;
}
constexpr bool operator==(Version a, Version b) {
  return a.major == b.major && a.minor == b.minor;
}
/// The first schema: its fields are in every file.
inline constexpr Version kFirstSchema{1, 0};

/// One dimension of an array, in the experiment's axes (docs/file-format.md).
enum class Axis : std::uint8_t {
  Ticks,        ///< S: the ticks of the runs (a run's own [S] arrays say how many it has)
  Canvas,       ///< C: canvas positions
  Layers,       ///< L
  Slots,        ///< L+1: layer slots; slot L holds the per-step taps
  Taps,         ///< T: the spec's taps, in their order
  Any,          ///< any length (tokens, steps, prompt ids, token edits)
  EditColumns,  ///< 3: a token edit's op, reference position and run position
  Edits,        ///< a token diff's rows: at most the two runs' tokens together (checked before
                ///< the read: a file claiming 2,000,000 rows is refused, issue #32)
};
/// An array's shape, outermost dimension first.
using Shape = std::vector<Axis>;

/// How one field is stored, read and summarised. The defaults fit most fields; the others are
/// chained: `Opt().summary("policy")`, `row0.since({1, 1})`.
struct Opt {
  bool stored = true;            ///< false: this result has no such field (see when())
  Version added{1, 0};           ///< the schema version that added the field
  bool root = false;             ///< kept in the file's root group, not in the struct's group
  bool summarised = false;       ///< part of summary_json
  const char* summary_key = "";  ///< its key there; "": the field's name
  // Integers: the values a reader accepts (inclusive). Checked as soon as the value is read
  // ("/g/@name is out of range (v)") or, with `absurd` set, once the group's attributes are
  // verified ("/g has an absurd <absurd>"). Int members are also checked to fit an int.
  std::int64_t lo = std::numeric_limits<std::int64_t>::min();
  std::int64_t hi = std::numeric_limits<std::int64_t>::max();
  const char* absurd = nullptr;

  /// Stored only where `present` holds (a condition on the struct's single values: readers read
  /// them before its arrays).
  constexpr Opt when(bool present) const {
    Opt o = *this;
    o.stored = present;
    return o;
  }
  /// Added by schema `v`: files of an older schema lack it (the reader's rule for files before
  /// 1.2 is in FieldReader::present, core/io/experiment_file.cpp).
  constexpr Opt since(Version v) const {
    Opt o = *this;
    o.added = v;
    return o;
  }
  /// Kept among the root group's attributes.
  constexpr Opt in_root() const {
    Opt o = *this;
    o.root = true;
    return o;
  }
  /// Listed by summary_json under `key` ("": the field's name).
  constexpr Opt summary(const char* key = "") const {
    Opt o = *this;
    o.summarised = true;
    o.summary_key = key;
    return o;
  }
  /// Refused outside [lo, hi] as soon as it is read.
  constexpr Opt range(std::int64_t low, std::int64_t high) const {
    Opt o = *this;
    o.lo = low;
    o.hi = high;
    return o;
  }
  /// Refused outside [lo, hi] once the group's attributes are verified, as an absurd `what`.
  constexpr Opt plausible(std::int64_t low, std::int64_t high, const char* what) const {
    Opt o = range(low, high);
    o.absurd = what;
    return o;
  }
};

namespace detail {
// Lets one declaration serve a struct and a const struct: writers visit const results.
template <class T, class Want>
using IfIs = std::enable_if_t<std::is_same_v<std::remove_const_t<T>, Want>, int>;
inline constexpr std::int64_t kIntMax = std::numeric_limits<int>::max();
}  // namespace detail

// A visitor V has, for a field `name` of member type T (const T for writers):
//   v.attr(name, member, opt)          a single value: std::string, std::int64_t, int, bool,
//                                      double; an enum of the result vocabulary as its name
//                                      (run_vocabulary.h); ExperimentSpec and
//                                      std::vector<std::string> as JSON text;
//   v.array(name, member, shape, opt)  NdArray<T>, std::vector<T> (int stored as int32),
//                                      std::vector<text::TokenEdit> ([E, 3] int64);
//   v.nested(prefix, member, opt)      a struct whose fields are stored beside the others, each
//                                      name prefixed.
// Every declaration lists its single values before its arrays. The order is the file's: writers
// create attributes and datasets in declaration order (which fixes the file's bytes) and readers
// check them in that order (which fixes which error a damaged file reports).

/// Where and with what the experiment ran: /provenance, and two fields in the root group.
template <class P, class V, detail::IfIs<P, Provenance> = 0>
void visit_fields(P& p, V&& v) {
  v.attr("tool_version", p.tool_version, Opt().in_root());
  v.attr("created_utc", p.created_utc, Opt().in_root());
  v.attr("host", p.host);
  v.attr("device", p.device, Opt().summary());
  v.attr("device_name", p.device_name, Opt().summary());
  v.attr("driver", p.driver);
  v.attr("cuda", p.cuda);
  v.attr("cublas", p.cublas);
  v.attr("libtorch", p.libtorch, Opt().summary());
  v.attr("blas", p.blas);
  v.attr("dtype", p.dtype);
  v.attr("threads", p.threads);
  v.attr("emulated", p.emulated, Opt().summary());
}

/// The CPU's ISA: /provenance/cpu, a group of its own (schema 1.3) so that /provenance keeps the
/// attribute set, and digest, that readers of 1.2 check.
template <class C, class V, detail::IfIs<C, base::CpuIsa> = 0>
void visit_fields(C& c, V&& v) {
  constexpr Version k13{1, 3};
  v.attr("flags", c.flags, Opt().since(k13).summary("cpu_flags"));
  v.attr("aten_capability", c.aten_capability, Opt().since(k13).summary("cpu_aten_capability"));
  v.attr("onednn_isa", c.onednn_isa, Opt().since(k13).summary("cpu_onednn_isa"));
  v.attr("bf16_matmul", c.bf16_matmul, Opt().since(k13).summary("cpu_bf16_matmul"));
  v.attr("caps", c.caps, Opt().since(k13).summary("cpu_isa_caps"));
}

/// The experiment's own fields: /spec. Its provenance, runs and comparisons have theirs.
template <class R, class V, detail::IfIs<R, ExperimentResult> = 0>
void visit_fields(R& r, V&& v) {
  constexpr const char* kSizes = "layer count or canvas length";
  v.attr("spec_json", r.spec);
  v.attr("config_json", r.config_json);
  v.attr("generation_config_json", r.generation_config_json);
  v.attr("prompt_text", r.prompt_text);
  v.attr("taps_json", r.taps);
  v.attr("layers", r.layers, Opt().plausible(1, 1024, kSizes));
  v.attr("canvas_length", r.canvas_length, Opt().plausible(1, 65536, kSizes));
  v.attr("top_k", r.top_k);
  v.array("prompt_ids", r.prompt_ids, {Axis::Any});  // [P] int64
}

/// One run: /runs/<id> (the id is the group's name).
template <class R, class V, detail::IfIs<R, RunResult> = 0>
void visit_fields(R& r, V&& v) {
  using A = Axis;
  v.attr("batch_size", r.batch_size, Opt().summary());
  v.attr("group", r.group, Opt().summary());
  v.attr("policy_json", r.policy_json);
  v.attr("policy_text", r.policy_text, Opt().summary("policy"));
  v.attr("emulated", r.emulated, Opt().summary());
  v.attr("wall_time_s", r.wall_time_s, Opt().summary());
  v.attr("stop_position", r.stop_position, Opt().summary());
  v.attr("text", r.text, Opt().summary());
  v.array("canvas_in", r.canvas_in, {A::Ticks, A::Canvas});  // [S, C] int64
  v.array("argmax", r.argmax, {A::Ticks, A::Canvas});        // [S, C] int64
  v.array("sampled", r.sampled, {A::Ticks, A::Canvas});      // [S, C] int64
  v.array("accepted", r.accepted, {A::Ticks, A::Canvas});    // [S, C] uint8
  v.array("entropy", r.entropy, {A::Ticks, A::Canvas});      // [S, C] float32
  v.array("tick_canvas", r.tick_canvas, {A::Ticks});         // [S] int32
  v.array("tick_step", r.tick_step, {A::Ticks});             // [S] int32
  v.array("tokens", r.tokens, {A::Any});                     // [N] int64
  v.array("steps", r.steps, {A::Any}, Opt().summary());      // [canvases] int32
}

/// Where a comparison first differs: stored as its comparison's first_* attributes.
template <class D, class V, detail::IfIs<D, Divergence> = 0>
void visit_fields(D& d, V&& v) {
  const Opt index = Opt().range(-1, detail::kIntMax).summary();
  v.attr("tick", d.tick, index);
  v.attr("canvas", d.canvas, index);
  v.attr("step", d.step, index);
  v.attr("layer", d.layer, index);
  v.attr("tap", d.tap, Opt().summary());
  v.attr("position", d.position, Opt().summary());
}

/// One comparison: /comparisons/<id> (the id is the group's name).
template <class C, class V, detail::IfIs<C, ComparisonResult> = 0>
void visit_fields(C& c, V&& v) {
  using A = Axis;
  v.attr("reference", c.reference, Opt().summary());
  v.attr("run", c.run, Opt().summary());
  v.attr("kind", c.kind, Opt().summary());
  v.attr("tokens_identical", c.tokens_identical, Opt().summary());
  v.attr("tokens_changed", c.tokens_changed, Opt().summary());
  v.attr("stop_changed", c.stop_changed, Opt().summary());
  v.attr("steps_changed", c.steps_changed, Opt().summary());
  v.nested("first_", c.first, Opt().summary("first_divergence"));
  v.array("frac_differ", c.frac_differ, {A::Ticks, A::Slots, A::Taps});  // [S, L+1, T] float32
  v.array("max_abs", c.max_abs, {A::Ticks, A::Slots, A::Taps});          // [S, L+1, T] float32
  v.array("max_ulp", c.max_ulp, {A::Ticks, A::Slots, A::Taps});          // [S, L+1, T] float32
  v.array("compared", c.compared, {A::Ticks});                           // [S] uint8
  // Row 0 against row 0 only: a "rows" comparison (lockstep) keeps the aggregates above.
  const Opt row0 = Opt().when(c.kind == ComparisonKind::Row0);
  const Shape per_position{A::Ticks, A::Slots, A::Taps, A::Canvas};
  v.array("pos_frac_differ", c.pos_frac_differ, per_position, row0);                  // float32
  v.array("pos_max_abs", c.pos_max_abs, per_position, row0.since({1, 1}));            // float32
  v.array("pos_max_ulp", c.pos_max_ulp, per_position, row0.since({1, 1}));            // float32
  v.array("routing_flips", c.routing_flips, {A::Ticks, A::Layers, A::Canvas}, row0);  // uint8
  v.array("router_margin", c.router_margin, {A::Ticks, A::Layers, A::Canvas}, row0);  // float32
  v.array("sampler_diff", c.sampler_diff, {A::Ticks, A::Canvas}, row0);               // uint8
  v.array("token_diff", c.token_diff, {A::Edits, A::EditColumns}, row0);              // int64
}

}  // namespace batchlens::experiment::schema
