// SPDX-License-Identifier: Apache-2.0
#include "tests/support/gemm_probe.h"

#include <cstdint>
#include <functional>
#include <map>
#include <mutex>
#include <utility>
#include <vector>

#include <ATen/ATen.h>
#include <ATen/CPUGeneratorImpl.h>

#include "core/base/system_info.h"
#include "core/model/config.h"

namespace batchlens::test {
namespace {

// Row block [0, m0) of `op` at m0 rows and at m0 * blocks rows (other rows appended).
template <typename Op>
bool row_block_changes(std::int64_t m0, std::int64_t blocks, std::int64_t k, at::Generator& gen,
                       const Op& op) {
  const auto bf16 = at::TensorOptions().dtype(at::kBFloat16);
  const at::Tensor x = at::randn({m0 * blocks, k}, gen, at::TensorOptions()).to(bf16);
  const at::Tensor alone = op(x.narrow(0, 0, m0).contiguous());
  const at::Tensor batched = op(x).narrow(0, 0, m0);
  return !at::equal(alone.view(at::kShort), batched.contiguous().view(at::kShort));
}

std::string measure(const std::string& preset) {
  const auto config = model::load_preset(preset);
  if (!config.ok()) {
    return "cannot probe: " + config.error().message;
  }
  const model::TextConfig& t = config.value().text;
  const std::int64_t c = config.value().canvas_length;
  const std::int64_t h = t.hidden_size;
  at::Generator gen = at::detail::createCPUGenerator(7);
  const auto weight = [&gen](std::int64_t rows, std::int64_t cols) {
    return (at::randn({rows, cols}, gen, at::TensorOptions()) * 0.02).to(at::kBFloat16);
  };
  // (name, K, the product of x [M, K])
  std::vector<
      std::pair<std::string, std::pair<std::int64_t, std::function<at::Tensor(const at::Tensor&)>>>>
      products;
  for (const std::int64_t n : {t.num_attention_heads * t.head_dim, t.intermediate_size,
                               2 * t.moe_intermediate_size, t.vocab_size}) {
    const at::Tensor w = weight(n, h);
    products.push_back({"x [M, " + std::to_string(h) + "] @ W^T [" + std::to_string(h) + ", " +
                            std::to_string(n) + "]",
                        {h, [w](const at::Tensor& x) {
                           return at::linear(x, w);
                         }}});
  }
  for (const std::int64_t k : {t.intermediate_size, t.moe_intermediate_size}) {
    const at::Tensor w = weight(h, k);
    products.push_back({"x [M, " + std::to_string(k) + "] @ W^T [" + std::to_string(k) + ", " +
                            std::to_string(h) + "]",
                        {k, [w](const at::Tensor& x) {
                           return at::linear(x, w);
                         }}});
  }
  const at::Tensor embed = weight(t.vocab_size, h);
  products.push_back({"probs [M, " + std::to_string(t.vocab_size) + "] @ E [" +
                          std::to_string(t.vocab_size) + ", " + std::to_string(h) +
                          "] (the self-conditioning matmul)",
                      {t.vocab_size, [embed](const at::Tensor& x) {
                         return at::matmul(x, embed);
                       }}});
  const bool amx = base::query_cpu_isa().flags.find("amx_bf16") != std::string::npos;
  for (const auto& [name, p] : products) {
    for (const std::int64_t m0 : {c, std::int64_t{3}, std::int64_t{7}}) {
      for (const std::int64_t blocks : {2, 3, 4}) {
        if (row_block_changes(m0, blocks, p.first, gen, p.second)) {
          return "this CPU's bf16 product " + name + " gives rows 0.." + std::to_string(m0 - 1) +
                 " other bits at M = " + std::to_string(m0 * blocks) +
                 " than at M = " + std::to_string(m0) +
                 (amx ? " (AMX: oneDNN's amx_bf16 kernels)" : "") +
                 ", so LibTorch's own CPU kernels are not batch-invariant here";
        }
      }
    }
  }
  return {};
}

}  // namespace

std::string bf16_products_depend_on_rows(const std::string& preset) {
  static std::mutex mutex;
  static std::map<std::string, std::string> measured;
  const std::lock_guard<std::mutex> lock(mutex);
  auto it = measured.find(preset);
  if (it == measured.end()) {
    it = measured.emplace(preset, measure(preset)).first;
  }
  return it->second;
}

}  // namespace batchlens::test
