// SPDX-License-Identifier: Apache-2.0
#include "core/model/weights.h"

#include <map>
#include <set>
#include <sstream>

#include <ATen/ATen.h>

#include "core/base/error.h"
#include "core/compat/torch_compat.h"
#include "core/model/safetensors.h"

namespace batchlens::model {

namespace {

constexpr const char* kDecoder = "model.decoder.";
constexpr const char* kEncoderLayers = "model.encoder.language_model.layers.";

// How a parameter is initialised by the reference's _init_weights.
enum class Init { Normal, Ones, Embedding };

struct LayerField {
  const char* suffix;
  at::Tensor LayerWeights::*member;
  Init init;
};

// Per-layer keys under model.decoder.layers.N. ref: spec section 7.2
const std::vector<LayerField>& layer_fields() {
  static const std::vector<LayerField> fields{
      {"input_layernorm.weight", &LayerWeights::input_layernorm, Init::Ones},
      {"self_attn.q_proj.weight", &LayerWeights::q_proj, Init::Normal},
      {"self_attn.k_proj.weight", &LayerWeights::k_proj, Init::Normal},
      {"self_attn.v_proj.weight", &LayerWeights::v_proj, Init::Normal},
      {"self_attn.o_proj.weight", &LayerWeights::o_proj, Init::Normal},
      {"self_attn.q_norm.weight", &LayerWeights::q_norm, Init::Ones},
      {"self_attn.k_norm.weight", &LayerWeights::k_norm, Init::Ones},
      {"post_attention_layernorm.weight", &LayerWeights::post_attention_layernorm, Init::Ones},
      {"pre_feedforward_layernorm.weight", &LayerWeights::pre_feedforward_layernorm, Init::Ones},
      {"mlp.gate_proj.weight", &LayerWeights::mlp_gate, Init::Normal},
      {"mlp.up_proj.weight", &LayerWeights::mlp_up, Init::Normal},
      {"mlp.down_proj.weight", &LayerWeights::mlp_down, Init::Normal},
      {"post_feedforward_layernorm_1.weight", &LayerWeights::post_feedforward_layernorm_1,
       Init::Ones},
      {"pre_feedforward_layernorm_2.weight", &LayerWeights::pre_feedforward_layernorm_2,
       Init::Ones},
      {"router.scale", &LayerWeights::router_scale, Init::Ones},
      {"router.proj.weight", &LayerWeights::router_proj, Init::Normal},
      {"router.per_expert_scale", &LayerWeights::router_per_expert_scale, Init::Ones},
      {"experts.gate_up_proj", &LayerWeights::experts_gate_up, Init::Normal},
      {"experts.down_proj", &LayerWeights::experts_down, Init::Normal},
      {"post_feedforward_layernorm_2.weight", &LayerWeights::post_feedforward_layernorm_2,
       Init::Ones},
      {"post_feedforward_layernorm.weight", &LayerWeights::post_feedforward_layernorm, Init::Ones},
      {"layer_scalar", &LayerWeights::layer_scalar, Init::Ones},
  };
  return fields;
}

struct GlobalField {
  const char* key;
  at::Tensor ModelWeights::*member;
  Init init;
};

const std::vector<GlobalField>& global_fields() {
  static const std::vector<GlobalField> fields{
      {"model.decoder.embed_tokens.weight", &ModelWeights::embed, Init::Embedding},
      {"model.decoder.norm.weight", &ModelWeights::final_norm, Init::Ones},
      {"model.decoder.self_conditioning.pre_norm.weight", &ModelWeights::sc_pre_norm, Init::Ones},
      {"model.decoder.self_conditioning.gate_proj.weight", &ModelWeights::sc_gate, Init::Normal},
      {"model.decoder.self_conditioning.up_proj.weight", &ModelWeights::sc_up, Init::Normal},
      {"model.decoder.self_conditioning.down_proj.weight", &ModelWeights::sc_down, Init::Normal},
  };
  return fields;
}

std::vector<std::int64_t> layer_shape(const TextConfig& t, std::int64_t layer,
                                      const std::string& suffix) {
  const std::int64_t h = t.hidden_size;
  const std::int64_t d = t.layer_head_dim(layer);
  const std::int64_t hq = t.num_attention_heads;
  const std::int64_t hkv = t.layer_kv_heads(layer);
  const std::int64_t e = t.num_experts;
  const std::int64_t im = t.moe_intermediate_size;
  const std::int64_t i = t.intermediate_size;
  static const std::map<std::string, int> kind{
      {"self_attn.q_proj.weight", 0}, {"self_attn.k_proj.weight", 1},
      {"self_attn.v_proj.weight", 1}, {"self_attn.o_proj.weight", 2},
      {"self_attn.q_norm.weight", 3}, {"self_attn.k_norm.weight", 3},
      {"mlp.gate_proj.weight", 4},    {"mlp.up_proj.weight", 4},
      {"mlp.down_proj.weight", 5},    {"router.proj.weight", 6},
      {"router.per_expert_scale", 7}, {"experts.gate_up_proj", 8},
      {"experts.down_proj", 9},       {"layer_scalar", 10}};
  const auto it = kind.find(suffix);
  switch (it == kind.end() ? -1 : it->second) {
    case 0:
      return {hq * d, h};
    case 1:
      return {hkv * d, h};
    case 2:
      return {h, hq * d};
    case 3:
      return {d};
    case 4:
      return {i, h};
    case 5:
      return {h, i};
    case 6:
      return {e, h};
    case 7:
      return {e};
    case 8:
      return {e, 2 * im, h};
    case 9:
      return {e, h, im};
    case 10:
      return {1};
    default:
      return {h};  // the norms and router.scale
  }
}

std::vector<std::int64_t> global_shape(const TextConfig& t, const std::string& key) {
  if (key == "model.decoder.embed_tokens.weight") {
    return {t.vocab_size, t.hidden_size};
  }
  if (key.find("gate_proj") != std::string::npos || key.find("up_proj") != std::string::npos) {
    return {t.intermediate_size, t.hidden_size};
  }
  if (key.find("down_proj") != std::string::npos) {
    return {t.hidden_size, t.intermediate_size};
  }
  return {t.hidden_size};
}

std::string layer_key(std::int64_t layer, const char* suffix) {
  return std::string(kDecoder) + "layers." + std::to_string(layer) + "." + suffix;
}

std::string encoder_scalar_key(std::int64_t layer) {
  return std::string(kEncoderLayers) + std::to_string(layer) + ".layer_scalar";
}

std::string shape_string(at::IntArrayRef shape) {
  std::ostringstream out;
  out << "[";
  for (std::size_t i = 0; i < shape.size(); ++i) {
    out << (i > 0 ? ", " : "") << shape[i];
  }
  out << "]";
  return out.str();
}

// FNV-1a: a stable per-key seed component, the same on every platform.
std::uint64_t fnv1a(const std::string& s) {
  std::uint64_t h = 1469598103934665603ULL;
  for (const unsigned char c : s) {
    h = (h ^ c) * 1099511628211ULL;
  }
  return h;
}

at::Tensor init_tensor(const std::string& key, const std::vector<std::int64_t>& shape, Init init,
                       const TextConfig& t, std::uint64_t seed, const at::Device& device,
                       at::ScalarType dtype) {
  const auto opts = at::TensorOptions().device(device).dtype(at::kFloat);
  if (init == Init::Ones) {
    return at::ones(shape, opts.dtype(dtype));
  }
  at::Generator gen = compat::make_generator(device, seed ^ fnv1a(key));
  at::Tensor w = at::empty(shape, opts);
  w.normal_(0.0, t.initializer_range, gen);
  if (init == Init::Embedding && t.pad_token_id >= 0 && t.pad_token_id < shape[0]) {
    w[t.pad_token_id].zero_();  // nn.Embedding(padding_idx) keeps the pad row zero
  }
  return w.to(dtype);
}

}  // namespace

std::int64_t ModelWeights::bytes() const {
  std::int64_t total = 0;
  const auto add = [&total](const at::Tensor& t) {
    if (t.defined()) {
      total += static_cast<std::int64_t>(t.numel() * t.element_size());
    }
  };
  for (const auto& f : global_fields()) {
    add(this->*(f.member));
  }
  for (const auto& layer : layers) {
    for (const auto& f : layer_fields()) {
      add(layer.*(f.member));
    }
    add(layer.encoder_layer_scalar);
  }
  return total;
}

std::vector<WeightSpec> weight_specs(const TextConfig& text) {
  std::vector<WeightSpec> specs;
  for (const auto& f : global_fields()) {
    specs.push_back({f.key, global_shape(text, f.key)});
  }
  for (std::int64_t l = 0; l < text.num_hidden_layers; ++l) {
    for (const auto& f : layer_fields()) {
      if (f.member == &LayerWeights::v_proj && !text.layer_has_v_proj(l)) {
        continue;
      }
      specs.push_back({layer_key(l, f.suffix), layer_shape(text, l, f.suffix)});
    }
  }
  for (std::int64_t l = 0; l < text.num_hidden_layers; ++l) {
    specs.push_back({encoder_scalar_key(l), {1}});
  }
  return specs;
}

bool is_ignored_key(const std::string& key) {
  return key.rfind("model.encoder.vision_tower.", 0) == 0 ||
         key.rfind("model.encoder.embed_vision.", 0) == 0;
}

namespace {

// Where a spec key lands in ModelWeights.
at::Tensor& slot(ModelWeights& w, const TextConfig& t, const std::string& key) {
  for (const auto& f : global_fields()) {
    if (key == f.key) {
      return w.*(f.member);
    }
  }
  if (key.rfind(kEncoderLayers, 0) == 0) {
    const std::int64_t l = std::stoll(key.substr(std::string(kEncoderLayers).size()));
    return w.layers.at(static_cast<std::size_t>(l)).encoder_layer_scalar;
  }
  const std::string rest = key.substr(std::string(kDecoder).size() + 7);  // after "layers."
  const auto dot = rest.find('.');
  const std::int64_t l = std::stoll(rest.substr(0, dot));
  const std::string suffix = rest.substr(dot + 1);
  for (const auto& f : layer_fields()) {
    if (suffix == f.suffix) {
      return w.layers.at(static_cast<std::size_t>(l)).*(f.member);
    }
  }
  (void)t;
  base::raise(base::ErrorCode::Internal, "no slot for weight key " + key);
}

}  // namespace

std::string checkpoint_key_of(const ModelWeights& w, const TextConfig& text,
                              const at::Tensor& tensor) {
  if (!tensor.defined() || !tensor.has_storage()) {
    return "";
  }
  const void* data = tensor.storage().data();
  for (const WeightSpec& s : weight_specs(text)) {
    // slot() only finds the member; nothing is written through it here.
    const at::Tensor& t = slot(const_cast<ModelWeights&>(w), text, s.key);
    if (t.defined() && t.has_storage() && t.storage().data() == data) {
      return s.key;
    }
  }
  return "";
}

namespace {

Init init_of(const std::string& key) {
  for (const auto& f : global_fields()) {
    if (key == f.key) {
      return f.init;
    }
  }
  for (const auto& f : layer_fields()) {
    const std::string suffix = std::string(".") + f.suffix;
    if (key.size() > suffix.size() &&
        key.compare(key.size() - suffix.size(), suffix.size(), suffix) == 0) {
      return f.init;
    }
  }
  return Init::Ones;  // encoder layer_scalar
}

}  // namespace

ModelWeights load_weights(const Checkpoint& checkpoint, const ModelConfig& config,
                          const at::Device& device, at::ScalarType dtype,
                          const base::ProgressFn& progress, const base::CancelToken* cancel) {
  const TextConfig& t = config.text;
  const auto specs = weight_specs(t);

  // Validate the whole key set and every shape before moving a byte.
  std::vector<std::string> missing;
  std::vector<std::string> mismatched;
  std::set<std::string> expected;
  for (const auto& s : specs) {
    expected.insert(s.key);
    if (!checkpoint.contains(s.key)) {
      missing.push_back(s.key);
      continue;
    }
    const auto& info = checkpoint.info(s.key);
    if (info.shape != s.shape) {
      mismatched.push_back(s.key + ": expected " + shape_string(s.shape) + ", got " +
                           shape_string(info.shape));
    }
    if (!at::isFloatingType(info.dtype)) {
      mismatched.push_back(s.key + ": expected a floating dtype, got " +
                           std::string(c10::toString(info.dtype)));
    }
  }
  std::vector<std::string> unexpected;
  for (const auto& name : checkpoint.names()) {
    if (expected.count(name) == 0 && !is_ignored_key(name)) {
      unexpected.push_back(name);
    }
  }
  if (!missing.empty() || !mismatched.empty() || !unexpected.empty()) {
    std::ostringstream msg;
    msg << "checkpoint " << checkpoint.path().string() << " does not match config '" << config.name
        << "'";
    const auto list = [&msg](const char* what, const std::vector<std::string>& keys) {
      if (keys.empty()) {
        return;
      }
      msg << "; " << keys.size() << " " << what << ": ";
      for (std::size_t i = 0; i < keys.size() && i < 8; ++i) {
        msg << (i > 0 ? ", " : "") << keys[i];
      }
      if (keys.size() > 8) {
        msg << ", ...";
      }
    };
    list("missing", missing);
    list("with wrong shape or dtype", mismatched);
    list("unexpected", unexpected);
    base::raise(base::ErrorCode::FileCorrupted, msg.str());
  }

  ModelWeights w;
  w.layers.resize(static_cast<std::size_t>(t.num_hidden_layers));
  base::ProgressClock clock(static_cast<std::int64_t>(specs.size()));
  std::int64_t done = 0;
  for (const auto& s : specs) {
    if (cancel != nullptr && cancel->cancelled()) {
      base::raise(base::ErrorCode::Cancelled, "loading weights cancelled");
    }
    // The mapped bytes go straight to the device; only a dtype conversion on the host
    // (bf16 -> fp32 for CPU fp32 runs) allocates, one tensor at a time.
    slot(w, t, s.key) = checkpoint.tensor(s.key).to(device, dtype, /*non_blocking=*/false,
                                                    /*copy=*/true);
    if (progress) {
      progress(clock.at(++done, s.key));
    }
  }
  return w;
}

ModelWeights random_weights(const ModelConfig& config, std::uint64_t seed, const at::Device& device,
                            at::ScalarType dtype) {
  const TextConfig& t = config.text;
  ModelWeights w;
  w.layers.resize(static_cast<std::size_t>(t.num_hidden_layers));
  for (const auto& s : weight_specs(t)) {
    slot(w, t, s.key) = init_tensor(s.key, s.shape, init_of(s.key), t, seed, device, dtype);
  }
  return w;
}

std::vector<std::pair<std::string, at::Tensor>> named_tensors(const ModelWeights& weights,
                                                              const TextConfig& text) {
  std::vector<std::pair<std::string, at::Tensor>> out;
  auto& mutable_weights = const_cast<ModelWeights&>(weights);  // slot() is shared with loading
  for (const auto& s : weight_specs(text)) {
    out.emplace_back(s.key, slot(mutable_weights, text, s.key));
  }
  return out;
}

}  // namespace batchlens::model
