// SPDX-License-Identifier: Apache-2.0
#include "core/model/config.h"

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <limits>
#include <string>
#include <utility>
#include <vector>

#include "core/base/input.h"
#include "core/model/embedded_presets.h"

namespace batchlens::model {

using base::ErrorCode;
using nlohmann::json;

namespace {

// Sanity limits: far above any DiffusionGemma variant, low enough that a typo (or a config of a
// different model family) is refused before anything allocates.
constexpr std::int64_t kMaxVocab = std::int64_t{1} << 24;
constexpr std::int64_t kMaxHidden = 65536;
constexpr std::int64_t kMaxIntermediate = std::int64_t{1} << 20;
constexpr std::int64_t kMaxLayers = 512;
constexpr std::int64_t kMaxHeads = 1024;
constexpr std::int64_t kMaxHeadDim = 4096;
constexpr std::int64_t kMaxPositions = std::int64_t{1} << 24;
constexpr std::int64_t kMaxExperts = 4096;
constexpr std::int64_t kMaxCanvas = 65536;
constexpr std::uint64_t kMaxConfigFileBytes = std::uint64_t{64} << 20;

constexpr const char* kModelType = "diffusion_gemma";
constexpr const char* kTextModelType = "diffusion_gemma_text";
constexpr const char* kArchitecture = "DiffusionGemmaForBlockDiffusion";
constexpr const char* kActivation = "gelu_pytorch_tanh";
constexpr const char* kSliding = "sliding_attention";
constexpr const char* kFull = "full_attention";
constexpr const char* kBidiChoices = R"(null, "vision" or "all")";

// ---- Messages ----------------------------------------------------------------------------

constexpr std::size_t kMaxShown = 60;  // characters of a value a message shows

/// Compact JSON text of a value that is not an array or object (dump of a scalar never
/// recurses); invalid UTF-8 is replaced rather than thrown about (messages must not throw).
std::string dump_scalar(const json& value) {
  return value.dump(-1, ' ', false, json::error_handler_t::replace);
}

std::string cut(std::string text) {
  if (text.size() > kMaxShown) {
    text = text.substr(0, kMaxShown - 3) + "...";
  }
  return text;
}

std::string quoted(const std::string& text) {
  // Cut before quoting: a message never copies more of the input than it shows.
  return cut(dump_scalar(json(text.size() > kMaxShown ? text.substr(0, kMaxShown) : text)));
}

/// A JSON value as the message shows it: scalars compact and cut after 60 characters, a short
/// list of scalars as written, any other list or object by its size. Never walks into nested
/// values, so an adversarial document cannot make building a message recurse or grow.
std::string describe(const json* value) {
  if (value == nullptr) {
    return "nothing (the field is missing)";
  }
  if (value->is_string()) {
    return quoted(value->get_ref<const std::string&>());
  }
  if (value->is_object()) {
    return "an object with " + std::to_string(value->size()) + " member(s)";
  }
  if (value->is_array()) {
    std::string text = "[";
    for (const json& item : *value) {
      if (item.is_structured() || text.size() > kMaxShown) {
        return "a list of " + std::to_string(value->size()) + " item(s)";
      }
      text += (text.size() > 1 ? "," : "") +
              (item.is_string() ? quoted(item.get_ref<const std::string&>()) : dump_scalar(item));
    }
    return cut(text + "]");
  }
  return cut(dump_scalar(*value));
}

/// Throws InvalidArgument "<path>: expected <expected>, got <actual>".
[[noreturn]] void fail(const std::string& path, const std::string& expected,
                       const std::string& actual) {
  base::raise(ErrorCode::InvalidArgument, path + ": expected " + expected + ", got " + actual);
}

/// Checks lo <= value <= hi (value < hi when hi_open). hi_text names the bound when it comes
/// from another field ("num_experts=128"); a bound that is a sanity limit says so.
void check_range(const std::string& path, std::int64_t value, std::int64_t lo, std::int64_t hi,
                 const std::string& hi_text = {}, bool hi_open = false) {
  const bool above = hi_open ? value >= hi : value > hi;
  if (value >= lo && !above) {
    return;
  }
  std::string expected = "an integer in [" + std::to_string(lo) + ", " +
                         (hi_text.empty() ? std::to_string(hi) : hi_text) + (hi_open ? ")" : "]");
  if (above && hi_text.empty()) {
    expected += " (sanity limit)";
  }
  fail(path, expected, std::to_string(value));
}

/// Checks that a floating-point value is finite and > 0 (>= 0 when allow_zero).
void check_positive(const std::string& path, double value, bool allow_zero = false) {
  if (std::isfinite(value) && (value > 0.0 || (allow_zero && value == 0.0))) {
    return;
  }
  fail(path, allow_zero ? "a finite number >= 0" : "a finite number > 0", dump_scalar(json(value)));
}

// ---- Typed field readers -----------------------------------------------------------------
// Absent fields keep the default the caller passes (the reference's class default). Present
// fields must have the right JSON type; nothing from nlohmann ever throws out of here.

/// The member `key` of `object`, or nullptr when absent.
const json* member(const json& object, const std::string& key) {
  const auto it = object.find(key);
  return it == object.end() ? nullptr : &*it;
}

/// An integer from a JSON value (floats and booleans are refused).
std::int64_t as_int(const json& value, const std::string& path) {
  if (value.is_number_unsigned()) {
    const auto u = value.get<std::uint64_t>();
    if (u > static_cast<std::uint64_t>(std::numeric_limits<std::int64_t>::max())) {
      fail(path, "an integer below 2^63", dump_scalar(value));
    }
    return static_cast<std::int64_t>(u);
  }
  if (value.is_number_integer()) {
    return value.get<std::int64_t>();
  }
  fail(path, "an integer", describe(&value));
}

class FieldReader {
 public:
  /// Reads members of `object`; `prefix` is its JSON path ("text_config." or empty).
  FieldReader(const json& object, std::string prefix)
      : object_(object), prefix_(std::move(prefix)) {}

  std::string path(const std::string& key) const { return prefix_ + key; }
  const json* find(const std::string& key) const { return member(object_, key); }

  void read(const std::string& key, std::int64_t& out) const {
    if (const json* v = find(key)) {
      out = as_int(*v, path(key));
    }
  }

  void read(const std::string& key, double& out) const {
    if (const json* v = find(key)) {
      if (!v->is_number()) {
        fail(path(key), "a number", describe(v));
      }
      out = v->get<double>();
    }
  }

  void read(const std::string& key, bool& out) const {
    if (const json* v = find(key)) {
      if (!v->is_boolean()) {
        fail(path(key), "true or false", describe(v));
      }
      out = v->get<bool>();
    }
  }

  void read(const std::string& key, std::string& out) const {
    if (const json* v = find(key)) {
      if (!v->is_string()) {
        fail(path(key), "a string", describe(v));
      }
      out = v->get<std::string>();
    }
  }

  /// An integer or null (the reference's `int | None`); absent keeps `out`.
  void read(const std::string& key, std::optional<std::int64_t>& out) const {
    if (const json* v = find(key)) {
      out = v->is_null() ? std::nullopt : std::optional<std::int64_t>(as_int(*v, path(key)));
    }
  }

  /// eos_token_id: an integer or a non-empty list of integers. ref: PreTrainedConfig
  void read_token_ids(const std::string& key, std::vector<std::int64_t>& out) const {
    const json* v = find(key);
    if (v == nullptr) {
      return;
    }
    const std::string expected = "an integer or a non-empty list of integers";
    if (v->is_number_integer()) {
      out = {as_int(*v, path(key))};
      return;
    }
    if (!v->is_array() || v->empty()) {
      fail(path(key), expected, describe(v));
    }
    std::vector<std::int64_t> ids;
    ids.reserve(v->size());
    for (std::size_t i = 0; i < v->size(); ++i) {
      ids.push_back(as_int((*v)[i], path(key) + "[" + std::to_string(i) + "]"));
    }
    out = std::move(ids);
  }

 private:
  const json& object_;
  std::string prefix_;
};

// ---- Text config -------------------------------------------------------------------------

std::string layer_type_name(LayerType type) {
  return type == LayerType::Sliding ? kSliding : kFull;
}

/// rope_parameters[layer_type]. ref: _compute_proportional_rope_parameters, which reads
/// partial_rotary_factor and factor with 1.0 as the default.
RopeParams read_rope(const json& rope_parameters, const std::string& layer_type) {
  const std::string path = "text_config.rope_parameters." + layer_type;
  const json* value = member(rope_parameters, layer_type);
  if (value == nullptr || !value->is_object()) {
    fail(path, "an object with rope_type and rope_theta", describe(value));
  }
  const FieldReader reader(*value, path + ".");
  RopeParams rope;  // rope_type "default", rope_theta 10000 (default_theta), factors 1.0
  reader.read("rope_type", rope.rope_type);
  reader.read("rope_theta", rope.rope_theta);
  reader.read("partial_rotary_factor", rope.partial_rotary_factor);
  reader.read("factor", rope.factor);
  return rope;
}

/// text_config.per_layer_config, which transformers' to_dict writes in place of global_head_dim
/// and num_global_key_value_heads: {"<layer>": {"head_dim": .., "num_key_value_heads": ..}}.
/// ref: DiffusionGemmaTextConfig.__post_init__ only derives it from those two keys when it is
/// absent, so when present it wins, and a layer without an entry takes the base values.
/// BatchLens models one shape for all full layers and the base shape for sliding layers; any
/// other per-layer override is refused rather than silently ignored.
void apply_per_layer_config(const json& value, TextConfig& text) {
  const std::string path = "text_config.per_layer_config";
  if (!value.is_object()) {
    fail(path, "an object keyed by layer index", describe(&value));
  }
  const auto layers = static_cast<std::int64_t>(text.layer_types.size());
  // The effective shape of every layer; layers without an entry keep the base values.
  std::vector<std::int64_t> head_dims(layers, text.head_dim);
  std::vector<std::int64_t> kv_heads(layers, text.num_key_value_heads);
  bool kv_overridden = false;
  for (const auto& item : value.items()) {
    const std::string entry_path = path + "." + quoted(item.key());
    const std::string& key = item.key();
    const bool is_index =
        !key.empty() && key.size() <= 9 &&
        std::all_of(key.begin(), key.end(), [](char c) { return c >= '0' && c <= '9'; });
    const std::int64_t layer = is_index ? std::stoll(key) : -1;
    if (layer < 0 || layer >= layers) {
      fail(entry_path, "a layer index in [0, " + std::to_string(layers) + ")", quoted(item.key()));
    }
    if (!item.value().is_object()) {
      fail(entry_path, "an object with head_dim and/or num_key_value_heads",
           describe(&item.value()));
    }
    for (const auto& field : item.value().items()) {
      const std::string field_path = entry_path + "." + field.key();
      if (field.key() == "head_dim") {
        head_dims[layer] = as_int(field.value(), field_path);
      } else if (field.key() == "num_key_value_heads") {
        kv_heads[layer] = as_int(field.value(), field_path);
        kv_overridden = kv_overridden || text.layer_types[layer] == LayerType::Full;
      } else {
        fail(field_path,
             "only head_dim or num_key_value_heads (other per-layer overrides are "
             "not supported)",
             describe(&field.value()));
      }
    }
  }
  std::int64_t first_full = -1;
  for (std::int64_t i = 0; i < layers; ++i) {
    const std::string layer_path = path + "." + quoted(std::to_string(i));
    if (text.layer_types[i] == LayerType::Sliding) {
      if (head_dims[i] != text.head_dim || kv_heads[i] != text.num_key_value_heads) {
        fail(layer_path,
             "a sliding layer with the base head_dim=" + std::to_string(text.head_dim) +
                 " and num_key_value_heads=" + std::to_string(text.num_key_value_heads),
             "head_dim=" + std::to_string(head_dims[i]) +
                 ", num_key_value_heads=" + std::to_string(kv_heads[i]));
      }
    } else if (first_full < 0) {
      first_full = i;
    } else if (head_dims[i] != head_dims[first_full] || kv_heads[i] != kv_heads[first_full]) {
      fail(layer_path,
           "the shape of full layer " + std::to_string(first_full) +
               " (head_dim=" + std::to_string(head_dims[first_full]) +
               ", num_key_value_heads=" + std::to_string(kv_heads[first_full]) + ")",
           "head_dim=" + std::to_string(head_dims[i]) +
               ", num_key_value_heads=" + std::to_string(kv_heads[i]));
    }
  }
  text.global_head_dim = first_full < 0 ? text.head_dim : head_dims[first_full];
  text.num_global_key_value_heads = first_full >= 0 && kv_overridden ? kv_heads[first_full] : 0;
}

TextConfig read_text_config(const json& value) {
  if (!value.is_object()) {
    fail("text_config", "an object", describe(&value));
  }
  const FieldReader reader(value, "text_config.");
  TextConfig text;  // the reference's class defaults
  if (const json* type = reader.find("model_type"); type != nullptr && *type != kTextModelType) {
    fail(reader.path("model_type"), quoted(kTextModelType), describe(type));
  }
  reader.read("vocab_size", text.vocab_size);
  reader.read("hidden_size", text.hidden_size);
  reader.read("intermediate_size", text.intermediate_size);
  reader.read("num_hidden_layers", text.num_hidden_layers);
  reader.read("num_attention_heads", text.num_attention_heads);
  reader.read("num_key_value_heads", text.num_key_value_heads);
  // ref: DiffusionGemmaTextConfig.__post_init__ pops num_global_key_value_heads (default None:
  // full layers keep num_key_value_heads) and global_head_dim (default 512).
  if (const json* v = reader.find("num_global_key_value_heads"); v != nullptr && !v->is_null()) {
    text.num_global_key_value_heads = as_int(*v, reader.path("num_global_key_value_heads"));
  }
  reader.read("head_dim", text.head_dim);
  reader.read("global_head_dim", text.global_head_dim);
  reader.read("hidden_activation", text.hidden_activation);
  reader.read("max_position_embeddings", text.max_position_embeddings);
  reader.read("initializer_range", text.initializer_range);
  reader.read("rms_norm_eps", text.rms_norm_eps);
  reader.read("pad_token_id", text.pad_token_id);
  reader.read("bos_token_id", text.bos_token_id);
  reader.read_token_ids("eos_token_id", text.eos_token_ids);
  reader.read("tie_word_embeddings", text.tie_word_embeddings);
  reader.read("attention_bias", text.attention_bias);
  reader.read("final_logit_softcapping", text.final_logit_softcapping);
  reader.read("num_experts", text.num_experts);
  reader.read("top_k_experts", text.top_k_experts);
  reader.read("moe_intermediate_size", text.moe_intermediate_size);

  if (const json* v = reader.find("use_bidirectional_attention"); v != nullptr && !v->is_null()) {
    if (!v->is_string() || (*v != "vision" && *v != "all")) {
      fail(reader.path("use_bidirectional_attention"), kBidiChoices, describe(v));
    }
    text.use_bidirectional_attention = v->get<std::string>();
  }

  reader.read("sliding_window", text.sliding_window);
  if (text.use_bidirectional_attention == "all") {
    // ref: DiffusionGemmaTextConfig.__post_init__: with fully bidirectional attention the
    // window becomes an exclusive bound on both sides, sliding_window // 2 + 1. Checked first
    // because C++ and Python divide negative numbers differently.
    check_range(reader.path("sliding_window"), text.sliding_window, 1, kMaxPositions);
    text.sliding_window = text.sliding_window / 2 + 1;
  }

  if (const json* v = reader.find("layer_types"); v != nullptr && !v->is_null()) {
    if (!v->is_array()) {
      fail(reader.path("layer_types"), R"(a list of "sliding_attention"/"full_attention")",
           describe(v));
    }
    for (std::size_t i = 0; i < v->size(); ++i) {
      const json& item = (*v)[i];
      if (item == kSliding) {
        text.layer_types.push_back(LayerType::Sliding);
      } else if (item == kFull) {
        text.layer_types.push_back(LayerType::Full);
      } else {
        fail(reader.path("layer_types") + "[" + std::to_string(i) + "]",
             R"("sliding_attention" or "full_attention")", describe(&item));
      }
    }
  } else {
    // ref: DiffusionGemmaTextConfig.__post_init__: the default pattern is 5 sliding : 1 full.
    // A silly num_hidden_layers is refused before the list is allocated.
    check_range(reader.path("num_hidden_layers"), text.num_hidden_layers, 1, kMaxLayers);
    for (std::int64_t i = 0; i < text.num_hidden_layers; ++i) {
      text.layer_types.push_back((i + 1) % 6 == 0 ? LayerType::Full : LayerType::Sliding);
    }
  }
  if (!text.layer_types.empty()) {
    // ref: DiffusionGemmaTextConfig.__post_init__ forces the last layer to full attention.
    text.layer_types.back() = LayerType::Full;
  }

  if (const json* v = reader.find("per_layer_config"); v != nullptr && !v->is_null()) {
    apply_per_layer_config(*v, text);
  }

  // ref: DiffusionGemmaTextConfig.__post_init__: rope_parameters None means these defaults.
  if (const json* v = reader.find("rope_parameters"); v != nullptr && !v->is_null()) {
    if (!v->is_object()) {
      fail(reader.path("rope_parameters"), "an object keyed by layer type", describe(v));
    }
    text.rope_sliding = read_rope(*v, kSliding);
    text.rope_full = read_rope(*v, kFull);
  } else {
    text.rope_sliding = RopeParams{"default", 10000.0, 1.0, 1.0};
    text.rope_full = RopeParams{"proportional", 1000000.0, 0.25, 1.0};
  }
  return text;
}

json rope_to_json(const RopeParams& rope) {
  json out = {{"rope_type", rope.rope_type}, {"rope_theta", rope.rope_theta}};
  // Left out at 1.0, the reference's default, as in the released config.json.
  if (rope.partial_rotary_factor != 1.0) {
    out["partial_rotary_factor"] = rope.partial_rotary_factor;
  }
  if (rope.factor != 1.0) {
    out["factor"] = rope.factor;
  }
  return out;
}

json token_ids_to_json(const std::vector<std::int64_t>& ids) {
  return ids.size() == 1 ? json(ids.front()) : json(ids);
}

json optional_to_json(const std::optional<std::int64_t>& id) {
  return id ? json(*id) : json(nullptr);
}

// ---- Validation --------------------------------------------------------------------------

void validate_token_id(const std::string& path, std::int64_t id, std::int64_t vocab) {
  check_range(path, id, 0, vocab, "vocab_size=" + std::to_string(vocab), /*hi_open=*/true);
}

/// eos_token_id lists: non-empty. The ids themselves are not range-checked: BatchLens stops on
/// generation_config.json's eos ids, not on these, and transformers only warns about special
/// ids outside the vocabulary (configs on the Hub carry such ids, e.g. -1).
void validate_token_ids(const std::string& path, const std::vector<std::int64_t>& ids) {
  if (ids.empty()) {
    fail(path, "an integer or a non-empty list of integers", "[]");
  }
}

void validate_rope(const std::string& path, const RopeParams& rope) {
  if (rope.rope_type != "default" && rope.rope_type != "proportional") {
    fail(path + ".rope_type", R"("default" or "proportional")", quoted(rope.rope_type));
  }
  check_positive(path + ".rope_theta", rope.rope_theta);
  if (!(rope.partial_rotary_factor > 0.0 && rope.partial_rotary_factor <= 1.0)) {
    fail(path + ".partial_rotary_factor", "a number in (0, 1]",
         dump_scalar(json(rope.partial_rotary_factor)));
  }
  check_positive(path + ".factor", rope.factor);
}

/// Checks that `kv` (the field at `path`) divides num_attention_heads.
void validate_kv_heads(const std::string& path, std::int64_t kv, std::int64_t heads) {
  const std::string heads_text = "num_attention_heads=" + std::to_string(heads);
  check_range(path, kv, 1, heads, heads_text);
  if (heads % kv != 0) {
    fail(path, "a divisor of " + heads_text, std::to_string(kv));
  }
}

void validate_head_dim(const std::string& path, std::int64_t dim) {
  check_range(path, dim, 2, kMaxHeadDim);
  if (dim % 2 != 0) {
    fail(path, "an even integer (RoPE rotates pairs)", std::to_string(dim));
  }
}

void validate_text(const TextConfig& t) {
  const std::string p = "text_config.";
  check_range(p + "vocab_size", t.vocab_size, 1, kMaxVocab);
  check_range(p + "hidden_size", t.hidden_size, 1, kMaxHidden);
  check_range(p + "intermediate_size", t.intermediate_size, 1, kMaxIntermediate);
  check_range(p + "num_hidden_layers", t.num_hidden_layers, 1, kMaxLayers);
  check_range(p + "num_attention_heads", t.num_attention_heads, 1, kMaxHeads);
  validate_kv_heads(p + "num_key_value_heads", t.num_key_value_heads, t.num_attention_heads);
  if (t.num_global_key_value_heads != 0) {  // 0: full layers use num_key_value_heads
    validate_kv_heads(p + "num_global_key_value_heads", t.num_global_key_value_heads,
                      t.num_attention_heads);
  }
  validate_head_dim(p + "head_dim", t.head_dim);
  validate_head_dim(p + "global_head_dim", t.global_head_dim);
  if (t.hidden_activation != kActivation) {
    fail(p + "hidden_activation", quoted(kActivation), quoted(t.hidden_activation));
  }
  check_range(p + "max_position_embeddings", t.max_position_embeddings, 1, kMaxPositions);
  check_positive(p + "initializer_range", t.initializer_range, /*allow_zero=*/true);
  check_positive(p + "rms_norm_eps", t.rms_norm_eps);
  // pad_token_id is the embedding's padding row (zeroed in random weights), so it must be a row;
  // transformers' nn.Embedding refuses it outside the vocabulary too. bos is not used.
  validate_token_id(p + "pad_token_id", t.pad_token_id, t.vocab_size);
  validate_token_ids(p + "eos_token_id", t.eos_token_ids);
  if (!t.tie_word_embeddings) {
    fail(p + "tie_word_embeddings", "true (the lm_head is the embedding)", "false");
  }
  if (t.attention_bias) {
    fail(p + "attention_bias", "false (the model has no biases)", "true");
  }
  if (t.use_bidirectional_attention == "all") {
    // A window of 1 cannot be written back: to_json stores (sliding_window - 1) * 2.
    check_range(p + "sliding_window", t.sliding_window, 2, kMaxPositions);
  } else {
    check_range(p + "sliding_window", t.sliding_window, 1, kMaxPositions);
  }
  if (static_cast<std::int64_t>(t.layer_types.size()) != t.num_hidden_layers) {
    fail(p + "layer_types",
         "a list of num_hidden_layers=" + std::to_string(t.num_hidden_layers) + " entries",
         std::to_string(t.layer_types.size()) + " entries");
  }
  if (t.layer_types.back() != LayerType::Full) {
    // ref: DiffusionGemmaTextConfig.__post_init__ forces this; a config that differs could not
    // be written out and read back unchanged.
    fail(p + "layer_types[" + std::to_string(t.layer_types.size() - 1) + "]",
         quoted(kFull) + " (the last layer is always full attention)",
         quoted(layer_type_name(t.layer_types.back())));
  }
  check_positive(p + "final_logit_softcapping", t.final_logit_softcapping);
  const std::string& bidi = t.use_bidirectional_attention;
  if (!bidi.empty() && bidi != "vision" && bidi != "all") {
    fail(p + "use_bidirectional_attention", kBidiChoices, quoted(bidi));
  }
  // DiffusionGemma always has the MoE branch, so the reference's None is not allowed here.
  check_range(p + "num_experts", t.num_experts, 1, kMaxExperts);
  check_range(p + "top_k_experts", t.top_k_experts, 1, t.num_experts,
              "num_experts=" + std::to_string(t.num_experts));
  check_range(p + "moe_intermediate_size", t.moe_intermediate_size, 1, kMaxIntermediate);
  validate_rope(p + "rope_parameters.sliding_attention", t.rope_sliding);
  validate_rope(p + "rope_parameters.full_attention", t.rope_full);
}

// ---- Files -------------------------------------------------------------------------------

/// parse_config() that throws base::ErrorException.
ModelConfig parse_or_throw(const json& doc) {
  if (!doc.is_object()) {
    fail("config", "a JSON object", describe(&doc));
  }
  const FieldReader reader(doc, "");
  if (const json* type = reader.find("model_type"); type != nullptr && *type != kModelType) {
    fail("model_type", quoted(kModelType), describe(type));
  }
  const json* text = reader.find("text_config");
  if (text == nullptr) {
    fail("text_config", "an object", describe(text));
  }
  ModelConfig config;
  config.text = read_text_config(*text);
  // The top-level eos ids (the chat template's end-of-turn included) default to the text ones.
  config.eos_token_ids = config.text.eos_token_ids;
  reader.read("canvas_length", config.canvas_length);
  reader.read_token_ids("eos_token_id", config.eos_token_ids);
  reader.read("boi_token_id", config.boi_token_id);
  reader.read("eoi_token_id", config.eoi_token_id);
  reader.read("image_token_id", config.image_token_id);
  bool tie = true;
  reader.read("tie_word_embeddings", tie);
  if (!tie) {
    // ref: DiffusionGemmaConfig.tie_word_embeddings: False would also untie encoder and decoder.
    fail("tie_word_embeddings", "true (the encoder and decoder share their weights)", "false");
  }
  // Newer transformers write "dtype", older ones "torch_dtype".
  if (reader.find("dtype") != nullptr) {
    reader.read("dtype", config.dtype);
  } else {
    reader.read("torch_dtype", config.dtype);
  }
  validate(config);
  return config;
}

}  // namespace

base::Result<ModelConfig> parse_config(const json& doc) {
  return base::guarded([&] {
    try {
      return parse_or_throw(doc);
    } catch (const json::exception& e) {
      // Not expected (the readers check types first); still a bad config, not a crash.
      base::raise(ErrorCode::InvalidArgument, std::string("config: ") + e.what());
    }
  });
}

base::Result<ModelConfig> load_config_file(const std::filesystem::path& path) {
  return base::guarded([&]() -> base::Result<ModelConfig> {
    // Refuses a FIFO, a device or a directory without blocking, and silly sizes.
    auto text = base::read_input_file(path, "config file", kMaxConfigFileBytes);
    if (!text.ok()) {
      return text.error();
    }
    // Depth-limited, no exceptions; the message names the byte, never echoes the input.
    auto doc = base::parse_json(text.value(), path.string(), ErrorCode::FileCorrupted);
    if (!doc.ok()) {
      return doc.error();
    }
    auto parsed = parse_config(doc.value());
    if (!parsed.ok()) {
      return base::Error{parsed.error().code, path.string() + ": " + parsed.error().message};
    }
    ModelConfig config = std::move(parsed).value();
    config.name = std::filesystem::absolute(path).parent_path().filename().string();
    return config;
  });
}

base::Result<ModelConfig> load_preset(const std::string& name) {
  for (const auto& preset : detail::embedded_presets()) {
    if (preset.name != name) {
      continue;
    }
    auto doc = base::parse_json(preset.json, "model preset \"" + name + "\"", ErrorCode::Internal);
    if (!doc.ok()) {
      return doc.error();
    }
    auto parsed = parse_config(doc.value());
    if (!parsed.ok()) {
      // The presets are tested; a failure here is a build or resource bug.
      return base::Error{ErrorCode::Internal,
                         "model preset \"" + name + "\": " + parsed.error().message};
    }
    ModelConfig config = std::move(parsed).value();
    config.name = name;
    return config;
  }
  std::string known;
  for (const auto& preset_name : preset_names()) {
    known += (known.empty() ? "" : ", ") + preset_name;
  }
  return base::Error{ErrorCode::InvalidArgument,
                     "preset: expected one of " + known + ", got " + quoted(name)};
}

std::vector<std::string> preset_names() {
  std::vector<std::string> names;
  for (const auto& preset : detail::embedded_presets()) {
    names.emplace_back(preset.name);
  }
  return names;
}

PresetBundle preset_bundle(const std::string& name) {
  for (const auto& preset : detail::embedded_presets()) {
    if (preset.name == name) {
      if (preset.weights.empty()) {
        return {};
      }
      return {preset.json, preset.weights, preset.tokenizer_json, preset.generation_config_json};
    }
  }
  return {};
}

json to_json(const ModelConfig& config) {
  const TextConfig& t = config.text;
  json layer_types = json::array();
  for (const LayerType type : t.layer_types) {
    layer_types.push_back(layer_type_name(type));
  }
  json text = {
      {"model_type", kTextModelType},
      {"vocab_size", t.vocab_size},
      {"hidden_size", t.hidden_size},
      {"intermediate_size", t.intermediate_size},
      {"num_hidden_layers", t.num_hidden_layers},
      {"num_attention_heads", t.num_attention_heads},
      {"num_key_value_heads", t.num_key_value_heads},
      {"num_global_key_value_heads",
       t.num_global_key_value_heads == 0 ? json(nullptr) : json(t.num_global_key_value_heads)},
      {"head_dim", t.head_dim},
      {"global_head_dim", t.global_head_dim},
      {"hidden_activation", t.hidden_activation},
      {"max_position_embeddings", t.max_position_embeddings},
      {"initializer_range", t.initializer_range},
      {"rms_norm_eps", t.rms_norm_eps},
      {"pad_token_id", t.pad_token_id},
      {"bos_token_id", t.bos_token_id},
      {"eos_token_id", token_ids_to_json(t.eos_token_ids)},
      {"tie_word_embeddings", t.tie_word_embeddings},
      {"attention_bias", t.attention_bias},
      // ref: DiffusionGemmaTextConfig.to_dict writes the window __post_init__ converts from,
      // so that a reload converts once more instead of halving the halved window.
      {"sliding_window",
       t.use_bidirectional_attention == "all" ? (t.sliding_window - 1) * 2 : t.sliding_window},
      {"layer_types", layer_types},
      {"final_logit_softcapping", t.final_logit_softcapping},
      {"use_bidirectional_attention",
       t.use_bidirectional_attention.empty() ? json(nullptr) : json(t.use_bidirectional_attention)},
      {"num_experts", t.num_experts},
      {"top_k_experts", t.top_k_experts},
      {"moe_intermediate_size", t.moe_intermediate_size},
      {"rope_parameters",
       {{kSliding, rope_to_json(t.rope_sliding)}, {kFull, rope_to_json(t.rope_full)}}},
  };
  return {
      {"model_type", kModelType},
      {"architectures", json::array({kArchitecture})},
      {"canvas_length", config.canvas_length},
      {"eos_token_id", token_ids_to_json(config.eos_token_ids)},
      {"boi_token_id", optional_to_json(config.boi_token_id)},
      {"eoi_token_id", optional_to_json(config.eoi_token_id)},
      {"image_token_id", optional_to_json(config.image_token_id)},
      {"tie_word_embeddings", true},
      {"dtype", config.dtype},
      {"text_config", std::move(text)},
  };
}

void validate(const ModelConfig& config) {
  const TextConfig& t = config.text;
  validate_text(t);
  check_range("canvas_length", config.canvas_length, 1, kMaxCanvas);
  validate_token_ids("eos_token_id", config.eos_token_ids);
  // boi/eoi/image_token_id are vision tokens the text model never sees: any value is kept as is.
  if (config.dtype != "bfloat16" && config.dtype != "float16" && config.dtype != "float32") {
    fail("dtype", R"("bfloat16", "float16" or "float32")", quoted(config.dtype));
  }
}

}  // namespace batchlens::model
