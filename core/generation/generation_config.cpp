// SPDX-License-Identifier: Apache-2.0
#include "core/generation/generation_config.h"

#include <cmath>
#include <cstdint>
#include <limits>
#include <string>
#include <type_traits>

#include <nlohmann/json.hpp>

#include "core/base/input.h"

namespace batchlens::generation {

namespace {

using base::ErrorCode;
using json = nlohmann::json;

}  // namespace

base::Result<void> validate(const GenerationConfig& c) {
  const SamplerConfig& s = c.sampler;
  auto bad = [](const std::string& m) {
    return base::Error{ErrorCode::InvalidArgument, m};
  };
  // ref: DiffusionGemmaGenerationConfig.validate (plus an upper bound on steps and finite values)
  if (s.max_denoising_steps <= 0 || s.max_denoising_steps > 100000) {
    return bad("max_denoising_steps must be in 1..100000, not " +
               std::to_string(s.max_denoising_steps));
  }
  if (!std::isfinite(s.t_min) || !std::isfinite(s.t_max) || s.t_min < 0 || s.t_max < 0) {
    return bad("t_min and t_max must be finite and >= 0");
  }
  if (s.t_max <= s.t_min) {
    return bad("t_max must be > t_min (got t_min " + std::to_string(s.t_min) + ", t_max " +
               std::to_string(s.t_max) + ")");
  }
  if (!std::isfinite(s.entropy_bound) || s.entropy_bound <= 0) {
    return bad("entropy_bound must be finite and > 0");
  }
  if (s.stability_threshold < 0) {
    return bad("stability_threshold must be >= 0");
  }
  if (!std::isfinite(s.confidence_threshold) || s.confidence_threshold <= 0) {
    return bad("confidence_threshold must be > 0");
  }
  if (c.max_new_tokens <= 0 || c.max_new_tokens > (1LL << 24)) {
    return bad("max_new_tokens must be in 1..16777216, not " + std::to_string(c.max_new_tokens));
  }
  for (std::int64_t id : c.eos_token_ids) {
    if (id < 0) {
      return bad("eos_token_id must be >= 0");
    }
  }
  if (c.pad_token_id < 0) {
    return bad("pad_token_id must be >= 0");
  }
  return base::ok_result();
}

namespace {

// A JSON number as T, or FileCorrupted naming `key`: integers must be JSON integers within T's
// range (nlohmann's get<T> converts a float or an out-of-range value with undefined behaviour;
// the fuzzer found -9.2e20 as an eos_token_id).
template <class T>
T checked_number(const json& v, const char* key) {
  if constexpr (std::is_floating_point_v<T>) {
    if (v.is_number()) {
      return v.get<T>();
    }
  } else {
    if (v.is_number_unsigned()) {
      const auto u = v.get<std::uint64_t>();
      if (u <= static_cast<std::uint64_t>(std::numeric_limits<T>::max())) {
        return static_cast<T>(u);
      }
    } else if (v.is_number_integer()) {
      const auto i = v.get<std::int64_t>();
      if (i >= static_cast<std::int64_t>(std::numeric_limits<T>::min()) &&
          i <= static_cast<std::int64_t>(std::numeric_limits<T>::max())) {
        return static_cast<T>(i);
      }
    }
  }
  base::raise(
      ErrorCode::FileCorrupted,
      std::string("generation config: ") + key +
          (std::is_floating_point_v<T> ? " is not a number" : " is not an integer in range"));
}

}  // namespace

base::Result<GenerationConfig> parse_generation_config(std::string_view json_text,
                                                       const GenerationConfig& defaults) {
  GenerationConfig c = defaults;
  // Depth-limited, no exceptions, and the message never echoes the input.
  auto parsed = base::parse_json(json_text, "generation config", ErrorCode::FileCorrupted);
  if (!parsed.ok()) {
    return parsed.error();
  }
  try {
    const json& j = parsed.value();
    if (!j.is_object()) {
      return base::Error{ErrorCode::FileCorrupted, "generation config: not a JSON object"};
    }
    SamplerConfig& s = c.sampler;
    auto get = [&](const char* key, auto& into) {
      if (j.contains(key) && !j[key].is_null()) {
        into = checked_number<std::decay_t<decltype(into)>>(j[key], key);
      }
    };
    get("max_new_tokens", c.max_new_tokens);
    get("max_denoising_steps", s.max_denoising_steps);
    get("t_min", s.t_min);
    get("t_max", s.t_max);
    get("stability_threshold", s.stability_threshold);
    get("confidence_threshold", s.confidence_threshold);
    get("pad_token_id", c.pad_token_id);
    if (j.contains("sampler_config") && j["sampler_config"].is_object()) {
      const json& sc = j["sampler_config"];
      const std::string cls = sc.value("_cls_name", std::string("EntropyBoundSamplerConfig"));
      if (cls != "EntropyBoundSamplerConfig") {
        const std::string shown = cls.size() > 60 ? cls.substr(0, 57) + "..." : cls;
        return base::Error{ErrorCode::InvalidArgument,
                           "generation config: sampler_config '" + shown +
                               "' is not EntropyBoundSamplerConfig (the only sampler there is)"};
      }
      if (sc.contains("entropy_bound")) {
        s.entropy_bound = checked_number<double>(sc["entropy_bound"], "entropy_bound");
      }
    }
    if (j.contains("eos_token_id") && !j["eos_token_id"].is_null()) {
      const json& e = j["eos_token_id"];
      c.eos_token_ids.clear();
      for (const json& id : e.is_array() ? e : json::array({e})) {
        c.eos_token_ids.push_back(checked_number<std::int64_t>(id, "eos_token_id"));
      }
    }
  } catch (const json::exception& e) {
    return base::Error{ErrorCode::FileCorrupted, std::string("generation config: ") + e.what()};
  } catch (const base::ErrorException& e) {
    return e.error();
  }
  if (auto v = validate(c); !v.ok()) {
    return base::Error{v.error().code, "generation config: " + v.error().message};
  }
  return c;
}

base::Result<GenerationConfig> load_generation_config(const std::filesystem::path& dir) {
  const std::filesystem::path path = dir / "generation_config.json";
  std::error_code ec;
  if (!std::filesystem::exists(path, ec)) {
    return GenerationConfig{};
  }
  // Refuses a FIFO, a device or a directory without blocking on it.
  auto text = base::read_input_file(path, "generation config file", std::uint64_t{64} << 20);
  if (!text.ok()) {
    return text.error();
  }
  auto c = parse_generation_config(text.value());
  if (!c.ok()) {
    return base::Error{c.error().code, path.string() + ": " + c.error().message};
  }
  return c;
}

base::Result<GenerationConfig> apply(const GenerationOverrides& o, const GenerationConfig& base) {
  GenerationConfig c = base;
  auto set = [](const auto& from, auto& into) {
    if (from) {
      into = *from;
    }
  };
  set(o.max_denoising_steps, c.sampler.max_denoising_steps);
  set(o.max_new_tokens, c.max_new_tokens);
  set(o.t_min, c.sampler.t_min);
  set(o.t_max, c.sampler.t_max);
  set(o.entropy_bound, c.sampler.entropy_bound);
  set(o.stability_threshold, c.sampler.stability_threshold);
  set(o.confidence_threshold, c.sampler.confidence_threshold);
  if (auto v = validate(c); !v.ok()) {
    return v.error();
  }
  return c;
}

std::string to_json(const GenerationConfig& c) {
  nlohmann::ordered_json j = {
      {"max_new_tokens", c.max_new_tokens},
      {"max_denoising_steps", c.sampler.max_denoising_steps},
      {"sampler_config",
       {{"_cls_name", "EntropyBoundSamplerConfig"}, {"entropy_bound", c.sampler.entropy_bound}}},
      {"t_min", c.sampler.t_min},
      {"t_max", c.sampler.t_max},
      {"stability_threshold", c.sampler.stability_threshold},
      {"confidence_threshold", c.sampler.confidence_threshold},
      {"eos_token_id", c.eos_token_ids},
      {"pad_token_id", c.pad_token_id}};
  return base::dump_json_lossy(j, 2) + "\n";
}

}  // namespace batchlens::generation
