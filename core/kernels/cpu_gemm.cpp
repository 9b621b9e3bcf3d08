// SPDX-License-Identifier: Apache-2.0
// Compiled with -ffp-contract=off (core/CMakeLists.txt): a multiply and an add written apart
// must stay apart, or the non-FMA variant would not be ATen's default build.
#include "core/kernels/cpu_gemm.h"

#include <algorithm>
#include <cmath>
#include <cstring>
#include <map>
#include <memory>
#include <mutex>
#include <set>
#include <sstream>
#include <tuple>

#include <ATen/ATen.h>
#include <ATen/CPUGeneratorImpl.h>
#include <ATen/Parallel.h>
#include <c10/util/BFloat16.h>

#include "core/base/system_info.h"

#if defined(__x86_64__) || defined(_M_X64)
#include <immintrin.h>
#define BL_CPU_GEMM_AVX2 1
#else
#define BL_CPU_GEMM_AVX2 0
#endif

namespace batchlens::kernels {

namespace {

constexpr std::int64_t kCols = 16;  // output columns per block: two 8-lane vectors
constexpr std::int64_t kRows = 4;   // output rows per block (8 independent chains)

// One F.linear call, as raw pointers. Output [m, n] row-major.
struct Gemm {
  const std::uint16_t* x = nullptr;  // x[i * ldx + k]
  std::int64_t m = 0, k = 0, n = 0, ldx = 0;
  const std::uint16_t* w = nullptr;  // w_rows: w[j * ldw + k]; else w[k * ldw + j]
  std::int64_t ldw = 0;
  bool w_rows = true;
  std::uint16_t* out = nullptr;
  // fp32 (the batch-invariant fp32 path): weights wf[j * ldw + k] and output out_f instead of w
  // and out; transa chains only.
  const float* wf = nullptr;
  float* out_f = nullptr;
  const float* packed = nullptr;  // transa: every block's W^T, block b at packed + b * k * 16
};

inline float to_float(std::uint16_t bits) {
  const std::uint32_t u = static_cast<std::uint32_t>(bits) << 16;
  float f = 0.0F;
  std::memcpy(&f, &u, sizeof f);
  return f;
}

// ATen's float -> bf16 conversion (round to nearest even; NaN -> 0x7FC0).
inline std::uint16_t to_bf16(float f) {
  return c10::BFloat16(f).x;
}

inline float round_bf16(float f) {
  return to_float(to_bf16(f));
}

// --- The scalar chains (any CPU): what ATen's cpublas loops compute, one output at a time.

// ref: at::native::cpublas gemm_transa_ (LibTorch 1.13): sum in fp32, rounded once.
template <bool Fma>
void transa_scalar(const Gemm& g, const float* xf, std::int64_t j0, std::int64_t j1) {
  for (std::int64_t i = 0; i < g.m; ++i) {
    const float* xi = xf + i * g.k;
    for (std::int64_t j = j0; j < j1; ++j) {
      float acc = 0.0F;
      for (std::int64_t l = 0; l < g.k; ++l) {
        const float w = g.wf != nullptr ? g.wf[j * g.ldw + l] : to_float(g.w[j * g.ldw + l]);
        if constexpr (Fma) {
          acc = std::fma(xi[l], w, acc);
        } else {
          const float p = xi[l] * w;
          acc = acc + p;
        }
      }
      if (g.out_f != nullptr) {
        g.out_f[i * g.n + j] = acc;
      } else {
        g.out[i * g.n + j] = to_bf16(acc);
      }
    }
  }
}

// ref: at::native::cpublas gemm_notrans_ (LibTorch 1.13): `c[..] += a[..] * val` on bf16 c,
// so the product is rounded to bf16 and every partial sum too.
void notrans_scalar(const Gemm& g, const float* xf, std::int64_t j0, std::int64_t j1) {
  for (std::int64_t i = 0; i < g.m; ++i) {
    const float* xi = xf + i * g.k;
    for (std::int64_t j = j0; j < j1; ++j) {
      float c = 0.0F;
      for (std::int64_t l = 0; l < g.k; ++l) {
        c = round_bf16(c + round_bf16(xi[l] * to_float(g.w[l * g.ldw + j])));
      }
      g.out[i * g.n + j] = to_bf16(c);
    }
  }
}

#if BL_CPU_GEMM_AVX2

#define BL_AVX2 __attribute__((target("avx2,fma")))

BL_AVX2 inline __m256 load8(const std::uint16_t* p) {
  const __m128i h = _mm_loadu_si128(reinterpret_cast<const __m128i*>(p));
  return _mm256_castsi256_ps(_mm256_slli_epi32(_mm256_cvtepu16_epi32(h), 16));
}

// c10's round_to_nearest_even on 8 lanes, the result widened back to fp32. `Nan`: whether a
// lane can be NaN (c10 gives NaN one fixed pattern); without it, 2 of 7 instructions go.
template <bool Nan>
BL_AVX2 inline __m256 round8(__m256 v) {
  const __m256i u = _mm256_castps_si256(v);
  const __m256i lsb = _mm256_and_si256(_mm256_srli_epi32(u, 16), _mm256_set1_epi32(1));
  const __m256i r =
      _mm256_and_si256(_mm256_add_epi32(u, _mm256_add_epi32(lsb, _mm256_set1_epi32(0x7FFF))),
                       _mm256_set1_epi32(static_cast<int>(0xFFFF0000U)));
  if constexpr (!Nan) {
    return _mm256_castsi256_ps(r);
  } else {
    const __m256 nan = _mm256_cmp_ps(v, v, _CMP_UNORD_Q);
    return _mm256_blendv_ps(_mm256_castsi256_ps(r),
                            _mm256_castsi256_ps(_mm256_set1_epi32(0x7FC00000)), nan);
  }
}

// One step of a notrans chain: c = bf16(c + bf16(a * b)).
template <bool Nan>
BL_AVX2 inline __m256 bf16_step(__m256 acc, __m256 a, __m256 b) {
  return round8<Nan>(_mm256_add_ps(acc, round8<Nan>(_mm256_mul_ps(a, b))));
}

// The largest |value| of `count` bf16 values at p (NaN -> NaN).
BL_AVX2 float max_abs(const std::uint16_t* p, std::int64_t count) {
  __m256 m = _mm256_setzero_ps();
  __m256 nan = _mm256_setzero_ps();
  const __m256 sign = _mm256_castsi256_ps(_mm256_set1_epi32(0x7FFFFFFF));
  std::int64_t i = 0;
  for (; i + 8 <= count; i += 8) {
    const __m256 v = _mm256_and_ps(load8(p + i), sign);
    nan = _mm256_or_ps(nan, _mm256_cmp_ps(v, v, _CMP_UNORD_Q));
    m = _mm256_max_ps(m, v);
  }
  if (_mm256_movemask_ps(nan) != 0) {
    return NAN;
  }
  alignas(32) float lanes[8];
  _mm256_store_ps(lanes, m);
  float out = 0.0F;
  for (const float f : lanes) {
    out = std::max(out, f);
  }
  for (; i < count; ++i) {
    const float f = std::fabs(to_float(p[i]));
    out = std::isnan(f) || std::isnan(out) ? NAN : std::max(out, f);
  }
  return out;
}

// Whether no notrans chain of g can meet a NaN or an infinity: finite inputs whose products,
// summed K times (each partial sum rounded up by at most 2^-8), stay far below FLT_MAX.
BL_AVX2 bool notrans_finite(const Gemm& g, std::int64_t j0, std::int64_t j1) {
  float mx = 0.0F;
  for (std::int64_t i = 0; i < g.m; ++i) {
    mx = std::max(mx, max_abs(g.x + i * g.ldx, g.k));
    if (std::isnan(mx)) {
      return false;
    }
  }
  float mw = 0.0F;
  for (std::int64_t l = 0; l < g.k; ++l) {
    mw = std::max(mw, max_abs(g.w + l * g.ldw + j0, j1 - j0));
    if (std::isnan(mw)) {
      return false;
    }
  }
  return std::isfinite(mx) && std::isfinite(mw) &&
         static_cast<double>(mx) * mw * static_cast<double>(g.k) * 2.0 < 1e37;
}

// W^T of 16 weight rows as fp32: pack[l * 16 + c] = rows[c][l] for l < k. 8 x 8 blocks
// are converted and transposed in registers; the last k % 8 values one by one.
BL_AVX2 void pack_transposed(const std::uint16_t* const* rows, std::int64_t k, float* pack) {
  std::int64_t l = 0;
  for (; l + 8 <= k; l += 8) {
    for (std::int64_t half = 0; half < 2; ++half) {
      __m256 r[8];
      for (int c = 0; c < 8; ++c) {
        r[c] = load8(rows[half * 8 + c] + l);
      }
      const __m256 t0 = _mm256_unpacklo_ps(r[0], r[1]);
      const __m256 t1 = _mm256_unpackhi_ps(r[0], r[1]);
      const __m256 t2 = _mm256_unpacklo_ps(r[2], r[3]);
      const __m256 t3 = _mm256_unpackhi_ps(r[2], r[3]);
      const __m256 t4 = _mm256_unpacklo_ps(r[4], r[5]);
      const __m256 t5 = _mm256_unpackhi_ps(r[4], r[5]);
      const __m256 t6 = _mm256_unpacklo_ps(r[6], r[7]);
      const __m256 t7 = _mm256_unpackhi_ps(r[6], r[7]);
      const __m256 u0 = _mm256_shuffle_ps(t0, t2, 0x44);
      const __m256 u1 = _mm256_shuffle_ps(t0, t2, 0xEE);
      const __m256 u2 = _mm256_shuffle_ps(t1, t3, 0x44);
      const __m256 u3 = _mm256_shuffle_ps(t1, t3, 0xEE);
      const __m256 u4 = _mm256_shuffle_ps(t4, t6, 0x44);
      const __m256 u5 = _mm256_shuffle_ps(t4, t6, 0xEE);
      const __m256 u6 = _mm256_shuffle_ps(t5, t7, 0x44);
      const __m256 u7 = _mm256_shuffle_ps(t5, t7, 0xEE);
      const __m256 out[8] = {
          _mm256_permute2f128_ps(u0, u4, 0x20), _mm256_permute2f128_ps(u1, u5, 0x20),
          _mm256_permute2f128_ps(u2, u6, 0x20), _mm256_permute2f128_ps(u3, u7, 0x20),
          _mm256_permute2f128_ps(u0, u4, 0x31), _mm256_permute2f128_ps(u1, u5, 0x31),
          _mm256_permute2f128_ps(u2, u6, 0x31), _mm256_permute2f128_ps(u3, u7, 0x31)};
      for (int i = 0; i < 8; ++i) {
        _mm256_storeu_ps(pack + (l + i) * kCols + half * 8, out[i]);
      }
    }
  }
  for (; l < k; ++l) {
    for (std::int64_t c = 0; c < kCols; ++c) {
      pack[l * kCols + c] = to_float(rows[c][l]);
    }
  }
}

// How a 4 x 16 tile's chains advance: ATen's transa chain (fp32 sum, fused or not) over a
// packed fp32 W^T block, or its notrans chain (bf16 product and sum) over W^T's bf16 rows.
enum class Chain { TransaFma, TransaPlain, NotransNan, NotransFinite };

template <Chain C>
BL_AVX2 inline __m256 advance(__m256 acc, __m256 x, __m256 w) {
  if constexpr (C == Chain::TransaFma) {
    return _mm256_fmadd_ps(x, w, acc);
  } else if constexpr (C == Chain::TransaPlain) {
    return _mm256_add_ps(acc, _mm256_mul_ps(x, w));
  } else {
    return bf16_step<C == Chain::NotransNan>(acc, x, w);
  }
}

// Output rows [i0, i0 + 4) x columns [jb, jb + cols) (cols <= 16): 8 chains, one lane per
// output element, advance together along K. `w` is the block's first W^T row: fp32 packed
// (16 per step) for transa, bf16 with row stride g.ldw for notrans. A short tile repeats its
// last row and leaves it unwritten.
template <Chain C>
BL_AVX2 void tile(const Gemm& g, const float* xf, const void* w, std::int64_t i0, std::int64_t jb,
                  std::int64_t cols) {
  constexpr bool kPacked = C == Chain::TransaFma || C == Chain::TransaPlain;
  const auto row = [&](std::int64_t r) {
    return xf + std::min(i0 + r, g.m - 1) * g.k;
  };
  const float* x0 = row(0);
  const float* x1 = row(1);
  const float* x2 = row(2);
  const float* x3 = row(3);
  // Eight named accumulators (an array would live on the stack): row r, columns 0-7 / 8-15.
  __m256 a00 = _mm256_setzero_ps();
  __m256 a01 = a00;
  __m256 a10 = a00;
  __m256 a11 = a00;
  __m256 a20 = a00;
  __m256 a21 = a00;
  __m256 a30 = a00;
  __m256 a31 = a00;
  const auto* pf = static_cast<const float*>(w);
  const auto* pb = static_cast<const std::uint16_t*>(w);
  for (std::int64_t l = 0; l < g.k; ++l) {
    __m256 b0;
    __m256 b1;
    if constexpr (kPacked) {
      b0 = _mm256_loadu_ps(pf + l * kCols);
      b1 = _mm256_loadu_ps(pf + l * kCols + 8);
    } else {
      b0 = load8(pb + l * g.ldw);
      b1 = load8(pb + l * g.ldw + 8);
    }
    const __m256 v0 = _mm256_broadcast_ss(x0 + l);
    const __m256 v1 = _mm256_broadcast_ss(x1 + l);
    const __m256 v2 = _mm256_broadcast_ss(x2 + l);
    const __m256 v3 = _mm256_broadcast_ss(x3 + l);
    a00 = advance<C>(a00, v0, b0);
    a01 = advance<C>(a01, v0, b1);
    a10 = advance<C>(a10, v1, b0);
    a11 = advance<C>(a11, v1, b1);
    a20 = advance<C>(a20, v2, b0);
    a21 = advance<C>(a21, v2, b1);
    a30 = advance<C>(a30, v3, b0);
    a31 = advance<C>(a31, v3, b1);
  }
  const __m256 acc[kRows][2] = {{a00, a01}, {a10, a11}, {a20, a21}, {a30, a31}};
  for (std::int64_t r = 0; r < kRows && i0 + r < g.m; ++r) {
    alignas(32) float v[kCols];
    _mm256_store_ps(v, acc[r][0]);
    _mm256_store_ps(v + 8, acc[r][1]);
    if (g.out_f != nullptr) {
      std::copy(v, v + cols, g.out_f + (i0 + r) * g.n + jb);
      continue;
    }
    std::uint16_t* o = g.out + (i0 + r) * g.n + jb;
    for (std::int64_t c = 0; c < cols; ++c) {
      o[c] = to_bf16(v[c]);  // notrans: already a bf16 value, exact
    }
  }
}

// Columns [j0, j1) of a transa product, 16 at a time, on W^T blocks packed to fp32 (cached for
// large weights, else packed here).
template <Chain C>
BL_AVX2 void transa_avx2(const Gemm& g, const float* xf, std::int64_t j0, std::int64_t j1) {
  thread_local std::vector<float> pack;
  pack.resize(static_cast<std::size_t>((g.k + 8) * kCols));
  for (std::int64_t jb = j0; jb < j1; jb += kCols) {
    const std::int64_t cols = std::min(kCols, j1 - jb);
    const float* block = pack.data();
    if (g.packed != nullptr) {
      block = g.packed + (jb / kCols) * g.k * kCols;
    } else if (g.wf != nullptr) {
      for (std::int64_t c = 0; c < kCols; ++c) {
        const float* wj = g.wf + (jb + std::min(c, cols - 1)) * g.ldw;
        for (std::int64_t l = 0; l < g.k; ++l) {
          pack[static_cast<std::size_t>(l * kCols + c)] = wj[l];
        }
      }
    } else {
      const std::uint16_t* rows[kCols];
      for (std::int64_t c = 0; c < kCols; ++c) {
        rows[c] = g.w + (jb + std::min(c, cols - 1)) * g.ldw;  // a short block repeats a column
      }
      pack_transposed(rows, g.k, pack.data());
    }
    for (std::int64_t i0 = 0; i0 < g.m; i0 += kRows) {
      tile<C>(g, xf, block, i0, jb, cols);
    }
  }
}

// Columns [j0, j1) of a notrans product: W^T's rows are contiguous, so 16 columns load
// directly; each step rounds the product and the partial sum to bf16 as ATen's bf16 `+=` does.
// A tail of fewer than 16 columns takes the scalar chain.
template <Chain C>
BL_AVX2 void notrans_avx2(const Gemm& g, const float* xf, std::int64_t j0, std::int64_t j1) {
  const std::int64_t full = j0 + (j1 - j0) / kCols * kCols;
  for (std::int64_t jb = j0; jb < full; jb += kCols) {
    for (std::int64_t i0 = 0; i0 < g.m; i0 += kRows) {
      tile<C>(g, xf, g.w + jb, i0, jb, kCols);
    }
  }
  if (full < j1) {
    notrans_scalar(g, xf, full, j1);
  }
}

// Every block's W^T for a transa product, as transa_avx2 packs them one by one.
BL_AVX2 std::vector<float> pack_all(const Gemm& g) {
  const std::int64_t blocks = (g.n + kCols - 1) / kCols;
  std::vector<float> packed(static_cast<std::size_t>(blocks * g.k * kCols));
  for (std::int64_t b = 0; b < blocks; ++b) {
    const std::int64_t cols = std::min(kCols, g.n - b * kCols);
    const std::uint16_t* rows[kCols];
    for (std::int64_t c = 0; c < kCols; ++c) {
      rows[c] = g.w + (b * kCols + std::min(c, cols - 1)) * g.ldw;
    }
    pack_transposed(rows, g.k, packed.data() + b * g.k * kCols);
  }
  return packed;
}

bool has_avx2() {
  static const bool yes = __builtin_cpu_supports("avx2") && __builtin_cpu_supports("fma");
  return yes;
}

#endif

void run_columns(const Gemm& g, const float* xf, bool fma, std::int64_t j0, std::int64_t j1) {
#if BL_CPU_GEMM_AVX2
  if (has_avx2()) {
    if (!g.w_rows) {
      if (notrans_finite(g, j0, j1)) {
        notrans_avx2<Chain::NotransFinite>(g, xf, j0, j1);
      } else {
        notrans_avx2<Chain::NotransNan>(g, xf, j0, j1);
      }
    } else if (fma) {
      transa_avx2<Chain::TransaFma>(g, xf, j0, j1);
    } else {
      transa_avx2<Chain::TransaPlain>(g, xf, j0, j1);
    }
    return;
  }
#endif
  if (!g.w_rows) {
    notrans_scalar(g, xf, j0, j1);
  } else if (fma) {
    transa_scalar<true>(g, xf, j0, j1);
  } else {
    transa_scalar<false>(g, xf, j0, j1);
  }
}

// Packed weights, kept while their storage lives and is not written: a model's weights are
// packed at their first product and reused by every later one (the lm_head's pack costs as much
// as a third of its product). Small weights pack on the fly. At most kPackCacheBytes; past that
// the cache starts over.
constexpr std::size_t kPackCacheBytes = std::size_t{512} << 20;

struct PackKey {
  const void* data;
  std::int64_t n, k, ldw;
  bool operator<(const PackKey& o) const {
    return std::tie(data, n, k, ldw) < std::tie(o.data, o.n, o.k, o.ldw);
  }
};

// Built whole by brace initialisation only (weak_intrusive_ptr has no default).
struct PackEntry {  // NOLINT(cppcoreguidelines-pro-type-member-init)
  c10::weak_intrusive_ptr<c10::StorageImpl> storage;
  std::uint32_t version;
  std::shared_ptr<const std::vector<float>> packed;
};

std::shared_ptr<const std::vector<float>> cached_pack(const at::Tensor& w, const Gemm& g) {
#if BL_CPU_GEMM_AVX2
  if (!has_avx2() || !g.w_rows || g.wf != nullptr || g.n * g.k < (std::int64_t{1} << 14)) {
    return nullptr;
  }
  static std::mutex mutex;
  static std::map<PackKey, PackEntry> cache;
  static std::size_t bytes = 0;
  const PackKey key{g.w, g.n, g.k, g.ldw};
  const std::uint32_t version = w._version();
  const std::lock_guard<std::mutex> lock(mutex);
  const auto it = cache.find(key);
  if (it != cache.end() && !it->second.storage.expired() && it->second.version == version) {
    return it->second.packed;
  }
  if (it != cache.end()) {  // its storage was freed (and the address reused) or written
    bytes -= it->second.packed->size() * sizeof(float);
    cache.erase(it);
  }
  auto packed = std::make_shared<const std::vector<float>>(pack_all(g));
  const std::size_t size = packed->size() * sizeof(float);
  if (bytes + size > kPackCacheBytes) {
    cache.clear();
    bytes = 0;
  }
  cache.emplace(key, PackEntry{w.storage().getWeakStorageImpl(), version, packed});
  bytes += size;
  return packed;
#else
  (void)w, (void)g;
  return nullptr;
#endif
}

// Column blocks are independent (each output is its own chain), so threads change no bit.
// Products below kParallelMacs multiply-adds (tens of microseconds) stay on the calling thread:
// an OpenMP region per small GEMM costs more than it saves, and on a busy machine each one can
// wait a scheduler slice for its second thread.
constexpr std::int64_t kParallelMacs = std::int64_t{1} << 21;

void run_all_columns(const Gemm& g, const float* xf, bool fma) {
  if (g.m * g.n * g.k < kParallelMacs) {
    run_columns(g, xf, fma, 0, g.n);
    return;
  }
  const std::int64_t blocks = (g.n + kCols - 1) / kCols;
  const std::int64_t per_block = std::max<std::int64_t>(1, g.m * g.k * kCols);
  const std::int64_t grain = std::max<std::int64_t>(1, (std::int64_t{1} << 18) / per_block);
  at::parallel_for(0, blocks, grain, [&](std::int64_t b0, std::int64_t b1) {
    run_columns(g, xf, fma, b0 * kCols, std::min(g.n, b1 * kCols));
  });
}

bool bits_equal(const at::Tensor& a, const at::Tensor& b) {
  return a.sizes() == b.sizes() && a.scalar_type() == b.scalar_type() &&
         at::equal(a.contiguous().view(at::kShort), b.contiguous().view(at::kShort));
}

}  // namespace

bool cpu_linear_bf16_covers(const at::Tensor& x, const at::Tensor& w) {
  if (!x.defined() || !w.defined() || !x.device().is_cpu() || !w.device().is_cpu() ||
      x.scalar_type() != at::kBFloat16 || w.scalar_type() != at::kBFloat16 || x.dim() < 2 ||
      w.dim() != 2 || x.size(-1) != w.size(1) || x.is_neg() || x.is_conj() || w.is_neg() ||
      w.is_conj()) {
    return false;
  }
  const std::int64_t k = w.size(1);
  const std::int64_t n = w.size(0);
  if (k < 2 || n < 2 || x.numel() == 0 || x.stride(-1) != 1) {
    return false;
  }
  if (x.dim() == 2 ? x.stride(0) < k : !x.is_contiguous()) {
    return false;  // ATen would copy or fold x another way
  }
  // The strides ATen's addmm reads as "transposed" (transa) or "as is" (notrans).
  const bool rows = w.stride(1) == 1 && w.stride(0) >= k;
  const bool cols = w.stride(0) == 1 && w.stride(1) >= n;
  return rows != cols;
}

at::Tensor cpu_linear_bf16(const at::Tensor& x, const at::Tensor& w, bool fma) {
  TORCH_CHECK(cpu_linear_bf16_covers(x, w), "cpu_linear_bf16: layout not covered");
  Gemm g;
  g.k = w.size(1);
  g.n = w.size(0);
  g.m = x.numel() / g.k;
  g.ldx = x.dim() == 2 ? x.stride(0) : g.k;
  g.w_rows = w.stride(1) == 1;
  g.ldw = g.w_rows ? w.stride(0) : w.stride(1);
  g.x = reinterpret_cast<const std::uint16_t*>(x.data_ptr());
  g.w = reinterpret_cast<const std::uint16_t*>(w.data_ptr());
  std::vector<std::int64_t> shape(x.sizes().begin(), x.sizes().end());
  shape.back() = g.n;
  at::Tensor out = at::empty(shape, x.options());  // [..., N] bf16
  g.out = reinterpret_cast<std::uint16_t*>(out.data_ptr());

  std::vector<float> xf(static_cast<std::size_t>(g.m * g.k));  // x in fp32 (exact), [M, K]
  for (std::int64_t i = 0; i < g.m; ++i) {
    const std::uint16_t* xi = g.x + i * g.ldx;
    float* d = xf.data() + i * g.k;
    for (std::int64_t l = 0; l < g.k; ++l) {
      d[l] = to_float(xi[l]);
    }
  }
  const std::shared_ptr<const std::vector<float>> packed = cached_pack(w, g);
  g.packed = packed ? packed->data() : nullptr;
  run_all_columns(g, xf.data(), fma);
  return out;
}

at::Tensor cpu_linear_invariant(const at::Tensor& x, const at::Tensor& w, bool fma) {
  TORCH_CHECK(x.device().is_cpu() && w.device().is_cpu() && x.dim() >= 1 && w.dim() == 2 &&
                  x.size(-1) == w.size(1) && x.scalar_type() == w.scalar_type(),
              "cpu_linear_invariant: x [..., K] and w [N, K] CPU tensors of one dtype");
  const std::int64_t k = w.size(1);
  std::vector<std::int64_t> shape(x.sizes().begin(), x.sizes().end());
  shape.back() = w.size(0);
  if (x.numel() == 0 || k == 0 || w.size(0) == 0) {
    return at::zeros(shape, x.options());
  }
  at::Tensor x2 = x.resolve_conj().resolve_neg().reshape({-1, k});  // [M, K]
  if (x2.stride(1) != 1 || x2.stride(0) < k) {
    x2 = x2.contiguous();
  }
  if (x.scalar_type() == at::kBFloat16) {
    at::Tensor ww = w.resolve_conj().resolve_neg();
    if (!cpu_linear_bf16_covers(x2, ww)) {
      ww = ww.contiguous();
    }
    if (cpu_linear_bf16_covers(x2, ww)) {
      return cpu_linear_bf16(x2, ww, fma).view(shape);
    }
    // K = 1 or N = 1: each output one product (or one row of them), the chain below in fp32
    // is exact up to the final rounding, which does not depend on M either.
  }
  TORCH_CHECK(x.scalar_type() == at::kFloat || x.scalar_type() == at::kBFloat16,
              "cpu_linear_invariant: bf16 or fp32 only");
  const at::Tensor xf = x2.to(at::kFloat).contiguous();                              // [M, K] fp32
  const at::Tensor wf = w.resolve_conj().resolve_neg().to(at::kFloat).contiguous();  // [N, K]
  Gemm g;
  g.k = k;
  g.n = w.size(0);
  g.m = xf.size(0);
  g.ldx = k;
  g.ldw = k;
  g.wf = wf.data_ptr<float>();
  at::Tensor out = at::empty({g.m, g.n}, xf.options());  // [M, N] fp32
  g.out_f = out.data_ptr<float>();
  run_all_columns(g, xf.data_ptr<float>(), fma);
  return out.to(x.scalar_type()).view(shape);
}

CpuGemmCheck check_cpu_gemm(const std::vector<std::int64_t>& ks) {
  CpuGemmCheck result;
  at::Generator gen = at::detail::createCPUGenerator(20261204);
  const auto normal = [&](const std::vector<std::int64_t>& shape, double scale) {
    return (at::normal(0.0, 1.0, shape, gen) * scale).to(at::kBFloat16);
  };
  std::set<std::int64_t> lengths;
  for (const std::int64_t k : ks) {
    // The model's reduction lengths and the chunks the emulated split-K kernel cuts them into.
    for (const std::int64_t s : {1, 2, 8}) {
      if (k / s >= 2) {
        lengths.insert((k + s - 1) / s);
      }
    }
  }
  std::string why;
  bool ok_fma = true;
  bool ok_plain = true;
  for (const std::int64_t k : lengths) {
    // Plain values; products below fp32's normals; a NaN and infinities among them.
    for (const int data : {0, 1, 2}) {
      const double scale = data == 1 ? 0x1p-68 : 1.0;
      at::Tensor w_full = normal({40, k + 3}, scale);
      at::Tensor b_full = normal({k + 2, 37}, scale);
      if (data == 2) {
        w_full.index_put_({3, 1}, INFINITY);
        b_full.index_put_({1, 5}, -INFINITY);
        b_full.index_put_({2, 7}, NAN);
      }
      const std::vector<at::Tensor> weights = {
          w_full.narrow(1, 0, k).contiguous(),  // [N, K] (transa)
          w_full.narrow(1, 1, k),               // strided rows (an emulated chunk)
          b_full.narrow(0, 0, k).t(),           // [N, K] with unit stride along N (notrans)
          b_full.narrow(0, 2, k).t().narrow(0, 1, 35)};
      // 1 and 3 rows, and a block of up to 33 (fewer at long K: ATen's side is the slow one).
      const std::int64_t many = std::clamp<std::int64_t>(140000 / k, 5, 33);
      for (const std::int64_t m : {std::int64_t{1}, std::int64_t{3}, many}) {
        at::Tensor x_full = normal({m, k + 5}, scale);
        if (data == 2) {
          x_full.index_put_({0, 4}, INFINITY);
          x_full.index_put_({m - 1, 6}, NAN);
        }
        for (const at::Tensor& x : {x_full.narrow(1, 0, k).contiguous(), x_full.narrow(1, 4, k)}) {
          for (const at::Tensor& w : weights) {
            if (!cpu_linear_bf16_covers(x, w)) {
              why = "a probe layout is not covered";
              ok_fma = ok_plain = false;
              continue;
            }
            const at::Tensor want = at::linear(x, w);
            const bool eq_fma = bits_equal(cpu_linear_bf16(x, w, true), want);
            const bool eq_plain = bits_equal(cpu_linear_bf16(x, w, false), want);
            if (!eq_fma && !eq_plain && why.empty()) {
              std::ostringstream s;
              s << "differs from at::linear at M=" << m << " K=" << k << " w strides ("
                << w.stride(0) << ", " << w.stride(1) << ")";
              why = s.str();
            }
            ok_fma = ok_fma && eq_fma;
            ok_plain = ok_plain && eq_plain;
          }
        }
      }
    }
  }
  result.use = ok_fma || ok_plain;
  // Where the probes cannot tell the variants apart, ATen's build decides: its AVX2 and AVX-512
  // kernels are compiled with FMA contraction, its default one has no FMA to use.
  result.fma = ok_fma && (!ok_plain || base::query_cpu_isa().aten_capability != "DEFAULT");
  std::ostringstream s;
  if (result.use) {
    s << "CPU bf16 GEMM: BatchLens kernel, bitwise ATen's (checked at K =";
    for (const std::int64_t k : lengths) {
      s << ' ' << k;
    }
    s << (result.fma ? "; fused multiply-add" : "; multiply then add") << ")";
  } else {
    s << "CPU bf16 GEMM: ATen's (BatchLens kernel " << why << ")";
  }
  result.report = s.str();
  return result;
}

}  // namespace batchlens::kernels
