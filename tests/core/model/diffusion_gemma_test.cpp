// SPDX-License-Identifier: Apache-2.0
#include "core/model/diffusion_gemma.h"

#include <cmath>
#include <cstdlib>
#include <functional>
#include <iostream>

#include <ATen/ATen.h>
#include <ATen/CPUGeneratorImpl.h>
#include <gtest/gtest.h>

#include "core/base/error.h"
#include "core/compat/torch_compat.h"
#include "core/kernels/fused_ops.h"
#include "core/ops/policy.h"
#include "tests/core/kernels/aten_bf16_gemm.h"
#include "tests/support/naive_model.h"

namespace batchlens::model {
namespace {

ModelConfig tiny() {
  auto c = load_preset("tiny");
  EXPECT_TRUE(c.ok()) << c.error().message;
  return c.value();
}

DiffusionGemma make_model(at::ScalarType dtype, std::uint64_t seed = 1) {
  const ModelConfig cfg = tiny();
  return DiffusionGemma(cfg, random_weights(cfg, seed, at::kCPU, dtype));
}

at::Tensor random_ids(std::int64_t b, std::int64_t n, std::int64_t vocab, std::uint64_t seed) {
  auto gen = at::make_generator<at::CPUGeneratorImpl>(seed);
  return at::randint(vocab, {b, n}, gen, at::TensorOptions().dtype(at::kLong));
}

double max_abs(const at::Tensor& a, const at::Tensor& b) {
  return (a.to(at::kDouble) - b.to(at::kDouble)).abs().max().item<double>();
}

TEST(RmsNorm, MatchesFp64FormulaAndKeepsDtype) {
  at::manual_seed(3);
  const at::Tensor x = at::randn({3, 8}).to(at::kBFloat16);
  const at::Tensor w = at::randn({8}).to(at::kBFloat16);
  const at::Tensor y = rms_norm(x, w, 1e-6);
  EXPECT_EQ(y.scalar_type(), at::kBFloat16);
  const at::Tensor xd = x.to(at::kDouble);
  const at::Tensor ref = xd / at::sqrt((xd * xd).mean(-1, true) + 1e-6) * w.to(at::kDouble);
  EXPECT_LT(max_abs(y, ref), 0.02 * ref.abs().max().item<double>());
  // Without a weight: unit RMS.
  const at::Tensor u = rms_norm(x.to(at::kFloat), at::Tensor(), 1e-6);
  EXPECT_NEAR((u * u).mean(-1).mean().item<double>(), 1.0, 1e-4);
}

TEST(Rope, ProportionalInvFreqMatchesHandComputedValues) {
  // 26B full layers: head_dim 512, partial_rotary_factor 0.25, theta 1e6 -> 64 rotating
  // frequencies 1e6^(-2i/512) (denominator 512, not 128), then 192 zeros.
  const RopeParams full{"proportional", 1e6, 0.25, 1.0};
  const at::Tensor f = rope_inv_freq(full, 512);
  ASSERT_EQ(f.numel(), 256);
  EXPECT_EQ(f.scalar_type(), at::kFloat);
  EXPECT_FLOAT_EQ(f[0].item<float>(), 1.0F);
  EXPECT_NEAR(f[1].item<double>(), std::pow(1e6, -2.0 / 512.0), 1e-7);
  EXPECT_NEAR(f[63].item<double>(), std::pow(1e6, -126.0 / 512.0), 1e-7);
  EXPECT_EQ(f.narrow(0, 64, 192).abs().sum().item<float>(), 0.0F);
  // Sliding layers: default RoPE over the whole head, 1e4^(-2i/256).
  const at::Tensor s = rope_inv_freq(RopeParams{}, 256);
  ASSERT_EQ(s.numel(), 128);
  EXPECT_NEAR(s[5].item<double>(), std::pow(1e4, -10.0 / 256.0), 1e-7);
}

TEST(Rope, RotatesPairsIAndIPlusHalfOnlyWhereFrequencyIsNonZero) {
  const RopeParams full{"proportional", 1e6, 0.25, 1.0};
  const at::Tensor inv = rope_inv_freq(full, 16);  // 2 rotating pairs of 8
  const auto [cos, sin] = rope_tables(inv, at::arange(3, 4, at::kLong), at::kFloat);
  ASSERT_EQ(cos.sizes(), (at::IntArrayRef{1, 1, 16}));
  const at::Tensor x = at::arange(16, at::kFloat).view({1, 1, 1, 16}) + 1;  // [B, S, H, D]
  const at::Tensor y = apply_rope(x, cos, sin);
  // Pair (0, 8) rotates by angle 3 * 1.
  EXPECT_NEAR(y[0][0][0][0].item<double>(), 1 * std::cos(3.0) - 9 * std::sin(3.0), 1e-5);
  EXPECT_NEAR(y[0][0][0][8].item<double>(), 9 * std::cos(3.0) + 1 * std::sin(3.0), 1e-5);
  // Pair (2, 10) has frequency 0 and passes through.
  EXPECT_FLOAT_EQ(y[0][0][0][2].item<float>(), 3.0F);
  EXPECT_FLOAT_EQ(y[0][0][0][10].item<float>(), 11.0F);
}

TEST(DiffusionGemma, Fp32ForwardMatchesIndependentFp64Model) {
  const DiffusionGemma m = make_model(at::kFloat);
  const auto& t = m.config().text;
  const at::Tensor prompt = random_ids(2, 7, t.vocab_size, 11);
  const at::Tensor canvas = random_ids(2, m.config().canvas_length, t.vocab_size, 12);
  KvCache cache;
  m.encode(prompt, cache);
  const at::Tensor logits = m.decode(canvas, cache, at::Tensor());
  ASSERT_EQ(logits.sizes(), (at::IntArrayRef{2, m.config().canvas_length, t.vocab_size}));
  EXPECT_EQ(logits.scalar_type(), at::kFloat);
  const at::Tensor ref = testing::naive_forward(m.config(), m.weights(), prompt, canvas, {});
  EXPECT_LT(max_abs(logits, ref), 1e-5) << "logit scale " << ref.abs().max().item<double>();
  EXPECT_GT(ref.abs().max().item<double>(), 0.1) << "logits too small for the tolerance to bite";

  // With self-conditioning from the previous step's processed logits.
  const at::Tensor sc = (logits / 0.8).to(at::kBFloat16);
  const at::Tensor logits2 = m.decode(canvas, cache, sc);
  const at::Tensor ref2 = testing::naive_forward(m.config(), m.weights(), prompt, canvas, sc);
  EXPECT_LT(max_abs(logits2, ref2), 1e-5);
  EXPECT_GT(max_abs(logits2, logits), 1e-3) << "self-conditioning must change the logits";
}

TEST(DiffusionGemma, PromptLongerThanSlidingWindowUsesTheWindow) {
  const DiffusionGemma m = make_model(at::kFloat, 5);
  const auto& t = m.config().text;
  ASSERT_LT(t.sliding_window, 40);
  const at::Tensor prompt = random_ids(1, 40, t.vocab_size, 21);
  const at::Tensor canvas = random_ids(1, m.config().canvas_length, t.vocab_size, 22);
  KvCache cache;
  m.encode(prompt, cache);
  EXPECT_EQ(cache.seq_length, 40);
  EXPECT_EQ(cache.k[0].size(2), t.sliding_window - 1);  // sliding layer keeps W - 1
  EXPECT_EQ(cache.k[static_cast<std::size_t>(t.num_hidden_layers - 1)].size(2), 40);
  const at::Tensor logits = m.decode(canvas, cache, at::Tensor());
  const at::Tensor ref = testing::naive_forward(m.config(), m.weights(), prompt, canvas, {});
  EXPECT_LT(max_abs(logits, ref), 1e-5) << "logit scale " << ref.abs().max().item<double>();
}

// A left-padded batch of three prompts of 9, 5 and 7 tokens (issue #35): which slots are real,
// and each row's position ids counted over its real tokens (what a fix would pass).
struct PaddedBatch {
  at::Tensor ids;            // [3, 9] int64, padding 0 at the left
  at::Tensor valid;          // [3, 9] bool
  at::Tensor row_positions;  // [3, 9] int64: real tokens 0.., padding 0
  at::Tensor lengths;        // [3] int64
};

PaddedBatch padded_batch(std::int64_t vocab) {
  PaddedBatch p;
  p.ids = random_ids(3, 9, vocab, 61);
  p.lengths = at::tensor({5, 9, 7}, at::kLong);
  const at::Tensor slot = at::arange(9, at::kLong).unsqueeze(0);  // [1, 9]
  p.valid = slot >= (9 - p.lengths).unsqueeze(1);                 // [3, 9]
  p.ids = p.ids.masked_fill(p.valid.logical_not(), 0);
  p.row_positions = (p.valid.to(at::kLong).cumsum(1) - 1).clamp_min(0);
  return p;
}

TEST(DiffusionGemma, PaddedBatchMatchesIndependentFp64ModelWithSharedAndPerRowPositions) {
  const DiffusionGemma m = make_model(at::kFloat, 3);
  const auto& t = m.config().text;
  const std::int64_t c = m.config().canvas_length;
  const PaddedBatch p = padded_batch(t.vocab_size);
  const at::Tensor canvas = random_ids(3, c, t.vocab_size, 62);
  const auto lopt = at::TensorOptions().dtype(at::kLong);
  // transformers' generate: one set of positions for every row, counting the padding.
  const at::Tensor shared_prompt = at::arange(9, lopt).unsqueeze(0);           // [1, 9]
  const at::Tensor shared_canvas = at::arange(9, 9 + c, lopt).unsqueeze(0);    // [1, C]
  const at::Tensor row_canvas = p.lengths.unsqueeze(1) + at::arange(c, lopt);  // [3, C]
  for (const bool per_row : {false, true}) {
    SCOPED_TRACE(per_row ? "per-row positions" : "shared positions");
    KvCache cache;
    m.encode(p.ids, cache, {}, TokenLayout{per_row ? p.row_positions : shared_prompt, p.valid});
    EXPECT_TRUE(cache.padded);
    ASSERT_EQ(cache.valid.sizes(), (at::IntArrayRef{3, 9}));
    const at::Tensor logits =
        m.decode(canvas, cache, at::Tensor(), {}, per_row ? row_canvas : shared_canvas);
    const at::Tensor ref = testing::naive_forward_padded(
        m.config(), m.weights(), p.ids, p.valid,
        per_row ? p.row_positions : shared_prompt.expand({3, 9}), canvas,
        per_row ? row_canvas : shared_canvas.expand({3, c}), {});
    EXPECT_LT(max_abs(logits, ref), 1e-5) << "logit scale " << ref.abs().max().item<double>();
    // RoPE is relative and padding is masked: in exact arithmetic row 0 (4 padding slots) is
    // row 0 alone, with either set of positions (the window is longer than the batch).
    ASSERT_GT(t.sliding_window, 9);  // the decoder's cache keeps every prompt slot
    const at::Tensor alone_ids = p.ids.narrow(0, 0, 1).narrow(1, 4, 5);
    const at::Tensor alone =
        testing::naive_forward(m.config(), m.weights(), alone_ids, canvas.narrow(0, 0, 1), {});
    EXPECT_LT(max_abs(ref[0], alone[0]), 1e-9);
    EXPECT_LT(max_abs(logits[0], alone[0]), 1e-5);
  }
}

TEST(DiffusionGemma, AllRealPaddingMaskAndExplicitPositionsChangeNoBit) {
  const DiffusionGemma m = make_model(at::kBFloat16, 4);
  const auto& t = m.config().text;
  const std::int64_t c = m.config().canvas_length;
  const at::Tensor prompt = random_ids(2, 6, t.vocab_size, 71);
  const at::Tensor canvas = random_ids(2, c, t.vocab_size, 72);
  KvCache plain;
  m.encode(prompt, plain);
  const at::Tensor expected = m.decode(canvas, plain, at::Tensor());
  const auto lopt = at::TensorOptions().dtype(at::kLong);
  // The same positions given [1, S] and [B, S], and a mask with no padding: no mask is
  // materialised (transformers' shortcuts) and every bit stays.
  for (const bool per_row : {false, true}) {
    KvCache cache;
    const at::Tensor pp = at::arange(6, lopt).unsqueeze(0);
    m.encode(prompt, cache, {},
             TokenLayout{per_row ? pp.expand({2, 6}) : pp, at::ones({2, 6}, at::kBool)});
    EXPECT_FALSE(cache.padded);
    const at::Tensor cp = at::arange(6, 6 + c, lopt).unsqueeze(0);
    const at::Tensor logits =
        m.decode(canvas, cache, at::Tensor(), {}, per_row ? cp.expand({2, c}) : cp);
    EXPECT_TRUE(at::equal(logits, expected)) << (per_row ? "per-row" : "shared");
  }
}

TEST(DiffusionGemma, PaddedBatchRowsAreThemselvesAloneOnlyWithTheirOwnPositionsOnCpu) {
  if (compat::sdpa_backend() != compat::SdpaBackend::Math) {
    GTEST_SKIP() << "LibTorch's own attention may pick another kernel for a masked call; this "
                    "is about BatchLens's math path (LibTorch < 2.1)";
  }
  // Each row against its prompt alone, on this CPU's batch-invariant kernels and BatchLens's
  // math attention. Row 1 (9 tokens) is not padded: only the mask differs, and masking none of
  // its own keys changes no bit. Row 0 (5 tokens after 4 padding slots): transformers' shared
  // positions shift it by 4, and bf16 RoPE is not relative, so its logits change; counting its
  // own tokens (a fix) gives every bit back.
  const DiffusionGemma m = make_model(at::kBFloat16, 6);
  const auto& t = m.config().text;
  const std::int64_t c = m.config().canvas_length;
  const PaddedBatch p = padded_batch(t.vocab_size);
  const at::Tensor canvas = random_ids(3, c, t.vocab_size, 81);
  const auto alone = [&](std::int64_t row, std::int64_t pad) {
    KvCache cache;
    m.encode(p.ids.narrow(0, row, 1).narrow(1, pad, 9 - pad), cache);
    return m.decode(canvas.narrow(0, row, 1), cache, at::Tensor())[0];
  };
  KvCache shared;
  m.encode(p.ids, shared, {}, TokenLayout{{}, p.valid});
  const at::Tensor shifted = m.decode(canvas, shared, at::Tensor());
  EXPECT_TRUE(shifted.isfinite().all().item<bool>()) << "padding queries must not make NaN";
  EXPECT_TRUE(at::equal(shifted[1], alone(1, 0)));
  const at::Tensor row0 = alone(0, 4);
  EXPECT_GT((shifted[0] != row0).to(at::kDouble).mean().item<double>(), 0.5);
  KvCache own;
  m.encode(p.ids, own, {}, TokenLayout{p.row_positions, p.valid});
  const at::Tensor row_canvas =
      p.lengths.unsqueeze(1) + at::arange(c, at::TensorOptions().dtype(at::kLong));
  EXPECT_TRUE(at::equal(m.decode(canvas, own, at::Tensor(), {}, row_canvas)[0], row0));
}

TEST(DiffusionGemma, BadPaddingLayoutsAreRefused) {
  const DiffusionGemma m = make_model(at::kFloat, 2);
  const auto& t = m.config().text;
  const at::Tensor prompt = random_ids(2, 5, t.vocab_size, 91);
  const auto expect_invalid = [](const std::function<void()>& f, const std::string& needle) {
    try {
      f();
      ADD_FAILURE() << "no error; expected one naming " << needle;
    } catch (const base::ErrorException& e) {
      EXPECT_EQ(e.error().code, base::ErrorCode::InvalidArgument);
      EXPECT_NE(std::string(e.what()).find(needle), std::string::npos) << e.what();
    }
  };
  const auto lopt = at::TensorOptions().dtype(at::kLong);
  expect_invalid(
      [&] {
        KvCache c;
        m.encode(prompt, c, {}, TokenLayout{{}, at::ones({2, 4}, at::kBool)});
      },
      "padding mask");
  expect_invalid(
      [&] {
        KvCache c;
        m.encode(prompt, c, {}, TokenLayout{{}, at::ones({2, 5}, at::kLong)});
      },
      "padding mask");
  expect_invalid(
      [&] {
        KvCache c;
        m.encode(prompt, c, {}, TokenLayout{at::arange(5, lopt).unsqueeze(0).expand({3, 5}), {}});
      },
      "position ids");
  expect_invalid(
      [&] {
        KvCache c;
        m.encode(prompt, c, {}, TokenLayout{at::zeros({1, 5}, at::kFloat), {}});
      },
      "position ids");
  KvCache cache;
  m.encode(prompt, cache);
  const at::Tensor canvas = random_ids(2, m.config().canvas_length, t.vocab_size, 92);
  expect_invalid([&] { m.decode(canvas, cache, at::Tensor(), {}, at::arange(3, lopt)); },
                 "position ids");
}

TEST(DiffusionGemma, Bf16ForwardFollowsTheReferenceDtypes) {
  const DiffusionGemma m = make_model(at::kBFloat16);
  const auto& t = m.config().text;
  const at::Tensor prompt = random_ids(1, 5, t.vocab_size, 31);
  const at::Tensor canvas = random_ids(1, m.config().canvas_length, t.vocab_size, 32);
  KvCache cache;
  m.encode(prompt, cache);
  EXPECT_EQ(cache.k[0].scalar_type(), at::kBFloat16);
  probe::TapRecorder taps = probe::TapRecorder::all();
  const at::Tensor logits = m.decode(canvas, cache, at::Tensor(), ForwardContext{nullptr, &taps});
  EXPECT_EQ(logits.scalar_type(), at::kFloat);
  EXPECT_EQ(taps.get(probe::Tap::RouterScores, 0).scalar_type(), at::kBFloat16);
  EXPECT_EQ(taps.get(probe::Tap::RouterTopkWeights, 0).scalar_type(), at::kFloat);
  EXPECT_EQ(taps.get(probe::Tap::LayerOut, 1).scalar_type(), at::kBFloat16);
  // The lm_head output is bf16 before the fp32 soft-cap: logits / 30 are tanh of bf16 values.
  const at::Tensor pre = at::atanh((logits / t.final_logit_softcapping).clamp(-0.999, 0.999)) *
                         t.final_logit_softcapping;
  EXPECT_LT(max_abs(pre, pre.to(at::kBFloat16)), 1e-2);
  // bf16 tracks the fp64 model loosely.
  const at::Tensor ref = testing::naive_forward(m.config(), m.weights(), prompt, canvas, {});
  EXPECT_LT(max_abs(logits, ref), 0.5);
  EXPECT_LE(logits.abs().max().item<double>(), t.final_logit_softcapping);
}

TEST(DiffusionGemma, SameSeedSameLogitsBitwise) {
  const DiffusionGemma a = make_model(at::kBFloat16, 7);
  const DiffusionGemma b = make_model(at::kBFloat16, 7);
  const DiffusionGemma c = make_model(at::kBFloat16, 8);
  const auto& t = a.config().text;
  const at::Tensor prompt = random_ids(1, 6, t.vocab_size, 41);
  const at::Tensor canvas = random_ids(1, a.config().canvas_length, t.vocab_size, 42);
  const auto run = [&](const DiffusionGemma& m) {
    KvCache cache;
    m.encode(prompt, cache);
    return m.decode(canvas, cache, at::Tensor());
  };
  const at::Tensor la = run(a);
  EXPECT_TRUE(at::equal(la, run(b)));
  EXPECT_TRUE(at::equal(la, run(a)));
  EXPECT_FALSE(at::equal(la, run(c)));
}

TEST(DiffusionGemma, IdenticalRowsGiveIdenticalOutputsAndRowWiseEqualsDefaultOnCpu) {
  const DiffusionGemma m = make_model(at::kBFloat16, 9);
  const auto& t = m.config().text;
  const at::Tensor prompt = random_ids(1, 6, t.vocab_size, 51);
  const at::Tensor canvas1 = random_ids(1, m.config().canvas_length, t.vocab_size, 52);
  KvCache cache1;
  m.encode(prompt, cache1);
  const at::Tensor ref = m.decode(canvas1, cache1, at::Tensor());
  const at::Tensor sc1 = (ref / 0.75).to(at::kBFloat16);
  const at::Tensor ref_sc = m.decode(canvas1, cache1, sc1);

  const KvCache cache3 = cache1.repeat_rows(3);
  const at::Tensor canvas3 = canvas1.expand({3, -1}).contiguous();
  const at::Tensor sc3 = sc1.expand({3, -1, -1}).contiguous();
  const ops::OpPolicy row_all = ops::OpPolicy::row_wise_all();
  const ops::OpPolicy workaround = ops::OpPolicy::issue_workaround();
  for (const ops::OpPolicy* policy :
       {static_cast<const ops::OpPolicy*>(nullptr), &row_all, &workaround}) {
    const ForwardContext ctx{policy, nullptr};
    const at::Tensor batched = m.decode(canvas3, cache3, at::Tensor(), ctx);
    const at::Tensor batched_sc = m.decode(canvas3, cache3, sc3, ctx);
    for (int r = 0; r < 3; ++r) {
      EXPECT_TRUE(at::equal(batched[r], batched[0])) << "row " << r;
      // CPU kernels here are batch invariant (docs/build.md), so row 0 equals batch 1.
      EXPECT_TRUE(at::equal(batched[r], ref[0])) << "row " << r;
      EXPECT_TRUE(at::equal(batched_sc[r], ref_sc[0])) << "row " << r;
    }
  }
}

TEST(DiffusionGemma, TapsHaveDocumentedShapesAndCostNothingWhenUnwanted) {
  const DiffusionGemma m = make_model(at::kBFloat16, 2);
  const auto& t = m.config().text;
  const std::int64_t c = m.config().canvas_length;
  const at::Tensor prompt = random_ids(2, 5, t.vocab_size, 61);
  const at::Tensor canvas = random_ids(2, c, t.vocab_size, 62);
  KvCache cache;
  m.encode(prompt, cache);
  probe::TapRecorder all = probe::TapRecorder::all();
  const at::Tensor logits = m.decode(canvas, cache, at::Tensor(), ForwardContext{nullptr, &all});
  const std::int64_t full = t.num_hidden_layers - 1;
  using probe::Tap;
  EXPECT_EQ(all.get(Tap::AttnQ, 0).sizes(),
            (at::IntArrayRef{2, c, t.num_attention_heads, t.head_dim}));
  EXPECT_EQ(all.get(Tap::AttnK, static_cast<int>(full)).sizes(),
            (at::IntArrayRef{2, c, t.layer_kv_heads(full), t.global_head_dim}));
  EXPECT_EQ(all.get(Tap::AttnOut, 0).sizes(),
            (at::IntArrayRef{2, c, t.num_attention_heads * t.head_dim}));
  EXPECT_EQ(all.get(Tap::RouterScores, 1).sizes(), (at::IntArrayRef{2, c, t.num_experts}));
  EXPECT_EQ(all.get(Tap::RouterTopkIds, 1).sizes(), (at::IntArrayRef{2, c, t.top_k_experts}));
  EXPECT_EQ(all.get(Tap::MoeOut, 2).sizes(), (at::IntArrayRef{2, c, t.hidden_size}));
  EXPECT_EQ(all.get(Tap::SelfCondOut).sizes(), (at::IntArrayRef{2, c, t.hidden_size}));
  EXPECT_TRUE(at::equal(all.get(Tap::Logits), logits));
  EXPECT_EQ(all.recorded().size(),
            static_cast<std::size_t>(11 * t.num_hidden_layers + 3));  // 11 per layer + 3

  probe::TapRecorder none(std::bitset<probe::kTapCount>{});
  const at::Tensor again = m.decode(canvas, cache, at::Tensor(), ForwardContext{nullptr, &none});
  EXPECT_TRUE(none.recorded().empty());
  EXPECT_TRUE(at::equal(again, logits));
}

// issue #37: the decoder writes its keys into the room the encoder left after the cache's
// (KvRoom) instead of concatenating the cache in every pass. The same bits as the concatenation
// (a copy of the cache has no room and concatenates), pass after pass, after a commit, on
// repeated rows, and the taps of K and V are tensors of their own, which the next pass leaves.
TEST(DiffusionGemma, TheDecodersKeysInTheCachesRoomChangeNoBit) {
  const DiffusionGemma m = make_model(at::kBFloat16, 4);
  const auto& t = m.config().text;
  const std::int64_t c = m.config().canvas_length;
  const auto layers = static_cast<std::size_t>(t.num_hidden_layers);
  const at::Tensor prompt = random_ids(2, 40, t.vocab_size, 71);  // past the sliding window
  KvCache cache;
  m.encode(prompt, cache);
  ASSERT_EQ(cache.room.slots, c);
  ASSERT_EQ(cache.room.k.size(), layers);
  for (std::size_t l = 0; l < layers; ++l) {
    ASSERT_EQ(cache.room.k[l].size(2), cache.k[l].size(2) + c) << "layer " << l;
    ASSERT_EQ(cache.room.k[l].data_ptr(), cache.k[l].data_ptr()) << "layer " << l;
  }
  const KvCache copy = cache;  // NOLINT(performance-unnecessary-copy-initialization)
  ASSERT_EQ(copy.room.slots, 0) << "a copy has no room: it concatenates";
  ASSERT_TRUE(copy.room.k.empty());

  const at::Tensor first = random_ids(2, c, t.vocab_size, 72);
  const at::Tensor second = random_ids(2, c, t.vocab_size, 73);
  probe::TapRecorder taps = probe::TapRecorder::all();
  const at::Tensor a = m.decode(first, cache, at::Tensor(), ForwardContext{nullptr, &taps});
  const at::Tensor k0 = taps.get(probe::Tap::AttnK, 0).clone();
  const at::Tensor sc = (a / 0.8).to(at::kBFloat16);
  probe::TapRecorder taps2 = probe::TapRecorder::all();
  const at::Tensor b = m.decode(second, cache, sc, ForwardContext{nullptr, &taps2});
  for (const int l : {0, static_cast<int>(layers) - 1}) {  // a sliding and a full layer
    const auto li = static_cast<std::size_t>(l);
    EXPECT_TRUE(at::equal(cache.room.k[li].narrow(2, cache.k[li].size(2), c),
                          taps2.get(probe::Tap::AttnK, l).transpose(1, 2)))
        << "the pass's keys are in the room, layer " << l;
    EXPECT_TRUE(at::equal(cache.room.v[li].narrow(2, cache.v[li].size(2), c),
                          taps2.get(probe::Tap::AttnV, l).transpose(1, 2)));
  }
  EXPECT_TRUE(at::equal(a, m.decode(first, copy, at::Tensor())));
  EXPECT_TRUE(at::equal(b, m.decode(second, copy, sc)));
  EXPECT_TRUE(at::equal(taps.get(probe::Tap::AttnK, 0), k0)) << "the tap is the room's view";
  EXPECT_FALSE(at::equal(a, b));

  // A commit (the encoder after the decoder passes) makes new room; the passes after it.
  KvCache committed = std::move(cache);
  KvCache plain = copy;
  m.encode(first, committed);
  m.encode(first, plain);
  plain.room = KvRoom();  // concatenates
  EXPECT_EQ(committed.room.k[0].size(2), committed.k[0].size(2) + c);
  EXPECT_TRUE(at::equal(m.decode(second, committed, sc), m.decode(second, plain, sc)));

  // repeat_rows keeps the room (the engine's copied prefill).
  KvCache one;
  m.encode(prompt.narrow(0, 0, 1), one);
  const KvCache three = one.repeat_rows(3);
  ASSERT_EQ(three.room.slots, c);
  KvCache three_plain = three;
  const at::Tensor canvas3 = random_ids(3, c, t.vocab_size, 74);
  EXPECT_TRUE(at::equal(m.decode(canvas3, three, at::Tensor()),
                        m.decode(canvas3, three_plain, at::Tensor())));

  // BATCHLENS_FUSED_OFF=room: the encoder leaves none; the same logits.
  RunSettings no_room;
  no_room.switches.fused_off = {"room"};
  const DiffusionGemma without(m.config(), m.weights(), no_room);
  KvCache bare;
  without.encode(prompt, bare);
  EXPECT_EQ(bare.room.slots, 0);
  EXPECT_TRUE(bare.room.k.empty());
  EXPECT_TRUE(at::equal(without.decode(first, bare, at::Tensor()), a));
}

TEST(DiffusionGemma, FusedKernelsAreCudaOnlyAndChangeNothingOnCpu) {
  const DiffusionGemma m = make_model(at::kBFloat16, 3);
  EXPECT_FALSE(m.fused_kernels().any());
  EXPECT_NE(m.fused_kernels().report.find("none"), std::string::npos) << m.fused_kernels().report;
  const auto& t = m.config().text;
  const at::Tensor prompt = random_ids(1, 5, t.vocab_size, 71);
  const at::Tensor canvas = random_ids(1, m.config().canvas_length, t.vocab_size, 72);
  KvCache cache;
  m.encode(prompt, cache);
  ForwardContext off;
  off.fused_kernels = false;
  EXPECT_TRUE(
      at::equal(m.decode(canvas, cache, at::Tensor(), off), m.decode(canvas, cache, at::Tensor())));
}

// The one-kernel mean of squares stands in for ATen's only where ATen reduces in the layout it
// reproduces (issue #37): vectorised by 4 (width > 128, a multiple of 4), one warp per row
// (16 rows or more, ceil(width / 32) < 256), 32-bit indexing and an exact fp32 element count.
TEST(FusedKernels, MeanOfSquaresFitsOnlyAtensOneWarpLayout) {
  EXPECT_TRUE(kernels::mean_sq_fits(256, 2816));       // B=1, hidden
  EXPECT_TRUE(kernels::mean_sq_fits(4096, 256));       // B=1, q heads x head_dim
  EXPECT_TRUE(kernels::mean_sq_fits(16, 8160));        // ceil(8160 / 32) = 255
  EXPECT_FALSE(kernels::mean_sq_fits(16, 8164));       // 256 values per lane: warps share a row
  EXPECT_FALSE(kernels::mean_sq_fits(15, 2816));       // under 16 rows: wider blocks
  EXPECT_FALSE(kernels::mean_sq_fits(256, 128));       // not vectorised
  EXPECT_FALSE(kernels::mean_sq_fits(256, 2818));      // not a multiple of 4
  EXPECT_FALSE(kernels::mean_sq_fits(1 << 20, 2816));  // over 2^31 bytes of squares
  EXPECT_FALSE(kernels::mean_sq_fits(0, 2816));
  EXPECT_FALSE(kernels::mean_sq_fits(16, 0));
}

// Where LibTorch computes bf16 matmuls with ATen's own kernel (CPUs without AVX-512), the model
// uses the CPU GEMM it checked at load; every logit is the same bit as with ATen's GEMMs, with
// the default policy, under emulated split-K (whose chunks are strided) and row-wise.
TEST(DiffusionGemma, CpuGemmChangesNoBit) {
  const kernels::testing::AtenBf16Gemm aten;
  const DiffusionGemma m = make_model(at::kBFloat16, 5);
  if (!m.fused_kernels().cpu_gemm) {
#if !BL_TORCH_AT_LEAST(2, 0)
    FAIL() << m.fused_kernels().report;
#else
    GTEST_SKIP() << m.fused_kernels().report;
#endif
  }
  const auto& t = m.config().text;
  const at::Tensor prompt = random_ids(3, 6, t.vocab_size, 81);
  const at::Tensor canvas = random_ids(3, m.config().canvas_length, t.vocab_size, 82);
  const at::Tensor sc =
      (at::randn({3, m.config().canvas_length, t.vocab_size}) * 2.0).to(at::kBFloat16);
  for (const ops::OpPolicy& policy :
       {ops::OpPolicy::default_policy(), ops::OpPolicy::emulated_split_k(),
        ops::OpPolicy::row_wise_all()}) {
    KvCache cache;
    m.encode(prompt, cache, ForwardContext{&policy, nullptr});
    ForwardContext on{&policy, nullptr};
    ForwardContext off{&policy, nullptr};
    off.fused_kernels = false;
    EXPECT_TRUE(at::equal(m.decode(canvas, cache, sc, on).view(at::kInt),
                          m.decode(canvas, cache, sc, off).view(at::kInt)))
        << policy.name;
  }
}

// On a CPU the batch-invariant kernels are proven for every family, in bf16 and fp32, with the
// checked batch sizes recorded; the report names what the default kernels already do.
TEST(DiffusionGemma, BatchInvarianceIsMeasuredForEveryFamilyOnCpu) {
  for (const at::ScalarType dtype : {at::kBFloat16, at::kFloat}) {
    const DiffusionGemma m = make_model(dtype, 6);
    const BatchInvariance& bi = m.batch_invariance();
    EXPECT_EQ(&bi, &m.batch_invariance());  // measured once
    EXPECT_EQ(bi.batch_sizes, (std::vector<int>{1, 2, 3, 4, 5, 8, 16, 33, 64}));
    EXPECT_TRUE(bi.proven.all()) << bi.report;
    EXPECT_NE(bi.report.find("router_proj: default"), std::string::npos) << bi.report;
    // A policy the check did not prove is refused: here every family is, so one runs.
    const ops::OpPolicy policy = ops::OpPolicy::batch_invariant_all();
    KvCache cache;
    const auto& t = m.config().text;
    EXPECT_NO_THROW(
        m.encode(random_ids(2, 4, t.vocab_size, 3), cache, ForwardContext{&policy, nullptr}));
  }
}

TEST(DiffusionGemma, RejectsBadInputsWithClearErrors) {
  const DiffusionGemma m = make_model(at::kFloat);
  const auto& t = m.config().text;
  KvCache cache;
  const auto bad_ids = base::guarded([&] {
    m.encode(at::full({1, 3}, t.vocab_size, at::kLong), cache);
  });
  ASSERT_FALSE(bad_ids.ok());
  EXPECT_EQ(bad_ids.error().code, base::ErrorCode::InvalidArgument);
  EXPECT_NE(bad_ids.error().message.find("token ids must be in"), std::string::npos);

  const auto no_cache = base::guarded([&] {
    return m.decode(random_ids(1, m.config().canvas_length, t.vocab_size, 1), KvCache{}, {});
  });
  ASSERT_FALSE(no_cache.ok());
  EXPECT_NE(no_cache.error().message.find("prefilled cache"), std::string::npos);

  m.encode(random_ids(1, 4, t.vocab_size, 2), cache);
  const auto bad_sc = base::guarded([&] {
    return m.decode(random_ids(1, m.config().canvas_length, t.vocab_size, 3), cache,
                    at::zeros({1, 2, 3}));
  });
  ASSERT_FALSE(bad_sc.ok());
  EXPECT_EQ(bad_sc.error().code, base::ErrorCode::InvalidArgument);

  const auto grouped = base::guarded([&] {
    return DiffusionGemma(m.config(), m.weights(), RunSettings{ExpertsImpl::GroupedMm, {}});
  });
  ASSERT_FALSE(grouped.ok());
  EXPECT_NE(grouped.error().message.find("grouped_mm"), std::string::npos);
}

// issue #14: with oneDNN limited to AVX2 on an AVX-512 machine (ONEDNN_MAX_CPU_ISA=AVX2, the
// way to emulate an older CPU), LibTorch still sends bf16 matmuls to oneDNN, which refuses
// them; a bf16 model then falls back to ATen's kernels, as on a CPU without AVX-512.
TEST(DiffusionGemma, Bf16MatmulsRunWhateverOneDnnSupports) {
  const DiffusionGemma m = make_model(at::kBFloat16);  // probes once per process
  const bool fallback = ensure_cpu_bf16_matmul();
  EXPECT_EQ(fallback, !at::globalContext().userEnabledMkldnn());
  const char* isa = std::getenv("ONEDNN_MAX_CPU_ISA");
  std::cout << "oneDNN ISA limit " << (isa != nullptr ? isa : "(none)") << ": bf16 matmuls on "
            << (fallback ? "ATen's kernels (fallback)" : "LibTorch's default route") << "\n";
  const auto& t = m.config().text;
  const at::Tensor x = at::randn({2, m.config().canvas_length, t.hidden_size}).to(at::kBFloat16);
  EXPECT_NO_THROW((void)at::linear(x, m.weights().embed));
  KvCache cache;
  EXPECT_NO_THROW(m.encode(random_ids(1, 4, t.vocab_size, 2), cache));
}

}  // namespace
}  // namespace batchlens::model
