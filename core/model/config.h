// SPDX-License-Identifier: Apache-2.0
// DiffusionGemma's configuration: config.json parsed and resolved as the reference's
// __post_init__ does (layer types, RoPE parameters, sliding window, experts), and the presets.
#pragma once

#include <cstdint>
#include <filesystem>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include <nlohmann/json.hpp>

#include "core/base/error.h"

namespace batchlens::model {

/// Attention type of one layer. ref: DiffusionGemmaTextConfig.layer_types
enum class LayerType { Sliding, Full };

/// RoPE parameters of one layer type. ref: DiffusionGemmaTextConfig.rope_parameters
struct RopeParams {
  std::string rope_type = "default";  ///< "default" or "proportional"
  double rope_theta = 10000.0;
  double partial_rotary_factor = 1.0;  ///< share of head_dim that rotates
  double factor = 1.0;                 ///< proportional RoPE divides inv_freq by this
};

/// The text model's configuration (HF `text_config`, model_type "diffusion_gemma_text"),
/// after the reference's __post_init__ resolution (layer_types filled, last layer forced full,
/// per-layer head dims and kv heads resolved). ref: DiffusionGemmaTextConfig
struct TextConfig {
  std::int64_t vocab_size = 262144;
  std::int64_t hidden_size = 2304;
  std::int64_t intermediate_size = 9216;
  std::int64_t num_hidden_layers = 30;
  std::int64_t num_attention_heads = 8;
  std::int64_t num_key_value_heads = 4;         ///< sliding layers
  std::int64_t num_global_key_value_heads = 0;  ///< full layers; 0 = same as num_key_value_heads
  std::int64_t head_dim = 256;                  ///< sliding layers
  std::int64_t global_head_dim = 512;           ///< full layers
  std::string hidden_activation = "gelu_pytorch_tanh";
  std::int64_t max_position_embeddings = 131072;
  double initializer_range = 0.02;
  double rms_norm_eps = 1e-6;
  std::int64_t pad_token_id = 0;
  std::int64_t bos_token_id = 2;
  std::vector<std::int64_t> eos_token_ids{1};
  bool tie_word_embeddings = true;
  bool attention_bias = false;
  std::int64_t sliding_window = 512;
  std::vector<LayerType> layer_types;  ///< one per layer
  double final_logit_softcapping = 30.0;
  std::string use_bidirectional_attention;  ///< "", "vision" or "all"
  std::int64_t num_experts = 0;
  std::int64_t top_k_experts = 0;
  std::int64_t moe_intermediate_size = 0;
  RopeParams rope_sliding;  ///< rope_parameters["sliding_attention"]
  RopeParams rope_full{"proportional", 1000000.0, 0.25, 1.0};  ///< ["full_attention"]

  bool is_sliding(std::int64_t layer) const { return layer_types.at(layer) == LayerType::Sliding; }
  /// Head dim of a layer: head_dim on sliding layers, global_head_dim on full layers.
  std::int64_t layer_head_dim(std::int64_t layer) const {
    return is_sliding(layer) ? head_dim : global_head_dim;
  }
  /// KV heads of a layer (full layers use num_global_key_value_heads when set).
  std::int64_t layer_kv_heads(std::int64_t layer) const {
    return is_sliding(layer) || num_global_key_value_heads == 0 ? num_key_value_heads
                                                                : num_global_key_value_heads;
  }
  /// Full layers have no v_proj (V is the k_proj output, "attention_k_eq_v").
  bool layer_has_v_proj(std::int64_t layer) const { return is_sliding(layer); }
};

/// The whole model configuration (HF config.json, model_type "diffusion_gemma").
/// ref: DiffusionGemmaConfig
struct ModelConfig {
  TextConfig text;
  std::int64_t canvas_length = 256;
  std::vector<std::int64_t> eos_token_ids{1};  ///< top level (e.g. [1, 106])
  // Vision tokens: unused by the text model, kept for writing config.json back. Any integer or
  // null (absent) is accepted, inside the text vocabulary or not: transformers only warns, and
  // its save_pretrained keeps them when the vocabulary shrinks.
  std::optional<std::int64_t> boi_token_id = 255999;
  std::optional<std::int64_t> eoi_token_id = 258882;
  std::optional<std::int64_t> image_token_id = 258880;
  std::string dtype = "bfloat16";  ///< the checkpoint's parameter dtype
  std::string name;                ///< preset name or checkpoint directory, for display
};

/// Parses an HF config.json document (top level with `text_config`). Missing optional fields
/// take the reference's defaults. Fields BatchLens uses are validated; fields it does not use are
/// accepted wherever transformers accepts them (vision token ids and bos/eos ids outside the text
/// vocabulary, which transformers only warns about). Messages show at most 60 characters of a
/// value and never walk into nested lists or objects. Errors (ErrorCode::InvalidArgument) name the
/// field, the expected and the actual value, e.g. "text_config.top_k_experts: expected an integer
/// in [1, num_experts=128], got 200". Never throws.
base::Result<ModelConfig> parse_config(const nlohmann::json& doc);

/// Reads and parses a config.json file: FileNotFound, FileUnrecognised for a FIFO, device or
/// directory (refused without blocking), FileCorrupted on bad JSON or nesting deeper than
/// base::kMaxJsonDepth (the message names the file and the byte, never echoes the input),
/// otherwise parse_config()'s errors prefixed with the path. Sets ModelConfig::name to the
/// file's parent directory name. Never throws.
base::Result<ModelConfig> load_config_file(const std::filesystem::path& path);

/// A preset shipped with BatchLens ("tiny", "demo", "mid", "26b-a4b"); embedded in the binary
/// from resources/models/<name>.json. InvalidArgument for an unknown name. Never throws.
base::Result<ModelConfig> load_preset(const std::string& name);

/// Names of the shipped presets, in size order.
std::vector<std::string> preset_names();

/// What a shipped preset carries beside its config. A trained preset (resources/models/<name>/)
/// bundles its checkpoint's files in the binary; the views point at static storage. A preset of
/// seeded random weights (and an unknown name) has none.
struct PresetBundle {
  std::string_view config_json;             ///< config.json as bundled
  std::string_view weights;                 ///< model.safetensors
  std::string_view tokenizer_json;          ///< tokenizer.json
  std::string_view generation_config_json;  ///< generation_config.json
  bool trained() const { return !weights.empty(); }
};
PresetBundle preset_bundle(const std::string& name);

/// The config as an HF-style config.json document that parse_config() reads back to an equal
/// config (and that transformers' DiffusionGemmaConfig accepts).
nlohmann::json to_json(const ModelConfig& config);

/// Throws base::ErrorException(InvalidArgument) naming the first inconsistent field.
void validate(const ModelConfig& config);

}  // namespace batchlens::model
