// SPDX-License-Identifier: Apache-2.0
#include "core/probe/metrics.h"

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <limits>
#include <string>

#include <ATen/ATen.h>
#include <ATen/Parallel.h>

#include "core/kernels/fused_ops.h"

namespace batchlens::probe {

namespace {

// The integer type with the float's width, to compare and order bit patterns.
at::ScalarType bits_type(at::ScalarType t) {
  switch (t) {
    case at::kBFloat16:
    case at::kHalf:
      return at::kShort;
    case at::kFloat:
      return at::kInt;
    case at::kDouble:
      return at::kLong;
    default:
      return t;
  }
}

at::Tensor ordered_key(const at::Tensor& x) {
  const at::Tensor bits = x.contiguous().view(bits_type(x.scalar_type())).to(at::kLong);
  const std::int64_t width = static_cast<std::int64_t>(x.element_size()) * 8;
  const std::int64_t sign = std::int64_t{1} << (width - 1);
  // Negative floats: bits < 0 as signed; their magnitude is bits + 2^(w-1).
  return at::where(bits < 0, -(bits + sign), bits);
}

// ---- position_diffs on the CPU: one pass over each pair's elements ----------------------------

struct DiffAcc {
  std::uint64_t differ = 0;
  float max_abs = 0.0F;
  std::int64_t max_ulp = 0;
};

// |a - b| as nan_to_num((a.float() - b.float()).abs(), 0, 3e38, 3e38) gives it.
float abs_diff(float a, float b) {
  const float d = std::fabs(a - b);
  if (std::isnan(d)) {
    return 0.0F;
  }
  return std::isinf(d) ? 3.0e38F : d;
}

// The ordered key of a float's bits (see ordered_key), in modular unsigned arithmetic: exact
// for 16- and 32-bit floats; for doubles it wraps as ATen's int64 ops do, without UB.
template <class Bits>
std::uint64_t key_of(Bits bits) {
  constexpr std::uint64_t kSign = std::uint64_t{1} << (sizeof(Bits) * 8 - 1);
  const auto v = static_cast<std::int64_t>(bits);
  return v < 0 ? std::uint64_t{0} - (static_cast<std::uint64_t>(v) + kSign)
               : static_cast<std::uint64_t>(v);
}

// |key(x) - key(y)| as ATen's int64 abs gives it.
template <class Bits>
std::int64_t key_distance(Bits x, Bits y) {
  const std::uint64_t d = key_of(x) - key_of(y);
  return static_cast<std::int64_t>(static_cast<std::int64_t>(d) < 0 ? std::uint64_t{0} - d : d);
}

// T: the element type; Bits: the signed integer of its width.
template <class T, class Bits>
DiffAcc diff_floats(const T* a, const T* b, std::int64_t n) {
  DiffAcc acc;
  for (std::int64_t i = 0; i < n; ++i) {
    Bits x{};
    Bits y{};
    std::memcpy(&x, a + i, sizeof(Bits));
    std::memcpy(&y, b + i, sizeof(Bits));
    if (x == y) {
      continue;
    }
    ++acc.differ;
    acc.max_abs =
        std::max(acc.max_abs, abs_diff(static_cast<float>(a[i]), static_cast<float>(b[i])));
    acc.max_ulp = std::max(acc.max_ulp, key_distance(x, y));
  }
  return acc;
}

DiffAcc diff_bytes(const std::uint8_t* a, const std::uint8_t* b, std::int64_t n, std::size_t size) {
  DiffAcc acc;
  for (std::int64_t i = 0; i < n; ++i) {
    const std::size_t at = static_cast<std::size_t>(i) * size;
    acc.differ += std::memcmp(a + at, b + at, size) != 0 ? 1 : 0;
  }
  return acc;
}

// One pair's [C, n] rows (raw pointers into contiguous tensors of `type`) into out [3, C].
void diff_pair_cpu(const kernels::cuda::DiffPair& pair, at::ScalarType type, std::size_t size,
                   std::int64_t c, float* out) {
  const std::int64_t n = pair.inner;
  const auto* pa = static_cast<const std::uint8_t*>(pair.a);
  const auto* pb = static_cast<const std::uint8_t*>(pair.b);
  const std::int64_t grain = std::max<std::int64_t>(1, 32768 / std::max<std::int64_t>(n, 1));
  at::parallel_for(0, c, grain, [&](std::int64_t begin, std::int64_t end) {
    for (std::int64_t p = begin; p < end; ++p) {
      const std::size_t at = static_cast<std::size_t>(p * n) * size;
      DiffAcc acc;
      switch (type) {
        case at::kBFloat16:
          acc = diff_floats<c10::BFloat16, std::int16_t>(
              reinterpret_cast<const c10::BFloat16*>(pa + at),
              reinterpret_cast<const c10::BFloat16*>(pb + at), n);
          break;
        case at::kHalf:
          acc =
              diff_floats<c10::Half, std::int16_t>(reinterpret_cast<const c10::Half*>(pa + at),
                                                   reinterpret_cast<const c10::Half*>(pb + at), n);
          break;
        case at::kFloat:
          acc = diff_floats<float, std::int32_t>(reinterpret_cast<const float*>(pa + at),
                                                 reinterpret_cast<const float*>(pb + at), n);
          break;
        case at::kDouble:
          acc = diff_floats<double, std::int64_t>(reinterpret_cast<const double*>(pa + at),
                                                  reinterpret_cast<const double*>(pb + at), n);
          break;
        default:
          acc = diff_bytes(pa + at, pb + at, n, size);
          break;
      }
      out[p] = n > 0 ? static_cast<float>(acc.differ) / static_cast<float>(n) : 0.0F;
      out[c + p] = acc.max_abs;
      out[2 * c + p] = static_cast<float>(acc.max_ulp);
    }
  });
}

kernels::cuda::DiffKind kind_of(const at::Tensor& t) {
  using kernels::cuda::DiffKind;
  switch (t.scalar_type()) {
    case at::kBFloat16:
      return DiffKind::BF16;
    case at::kHalf:
      return DiffKind::F16;
    case at::kFloat:
      return DiffKind::F32;
    default:
      break;
  }
  switch (t.element_size()) {
    case 1:
      return DiffKind::Bits1;
    case 2:
      return DiffKind::Bits2;
    case 4:
      return DiffKind::Bits4;
    default:
      return DiffKind::Bits8;
  }
}

// Whether the kernel reads every pair's dtype (not fp64 nor complex: those take ATen's ops).
bool kernel_types(const std::vector<TapRow>& rows) {
  return std::all_of(rows.begin(), rows.end(), [](const TapRow& r) {
    const at::ScalarType t = r.tensor.scalar_type();
    return !at::isComplexType(t) &&
           (!at::isFloatingType(t) || t == at::kBFloat16 || t == at::kHalf || t == at::kFloat);
  });
}

// The row's first element in a contiguous [B, C, ...] tensor.
const void* row_pointer(const at::Tensor& t, std::int64_t row) {
  const std::int64_t per_row = t.size(0) > 0 ? t.numel() / t.size(0) : 0;
  return static_cast<const std::uint8_t*>(t.data_ptr()) + row * per_row * t.element_size();
}

}  // namespace

at::Tensor ulp_distance(const at::Tensor& a, const at::Tensor& b) {
  return (ordered_key(a) - ordered_key(b)).abs();
}

at::Tensor position_diff(const at::Tensor& ref, const at::Tensor& run) {
  TORCH_CHECK(ref.sizes() == run.sizes() && ref.scalar_type() == run.scalar_type(),
              "position_diff: shapes or dtypes differ: ", ref.sizes(), " vs ", run.sizes());
  const std::int64_t c = ref.size(0);
  const at::ScalarType bt = bits_type(ref.scalar_type());
  const at::Tensor a = ref.contiguous().view({c, -1});
  const at::Tensor b = run.contiguous().view({c, -1});
  const at::Tensor ne = a.view(bt) != b.view(bt);  // [C, n]
  // count / n, a true fp32 division (a tensor divisor: ATen multiplies by the reciprocal of a
  // scalar one on CUDA).
  const at::Tensor count = ne.sum(1).to(at::kFloat);
  const at::Tensor frac = count / at::full_like(count, static_cast<float>(a.size(1)));
  if (!at::isFloatingType(ref.scalar_type())) {
    const at::Tensor zero = at::zeros_like(frac);
    return at::stack({frac, zero, zero});
  }
  const at::Tensor abs =
      at::nan_to_num((a.to(at::kFloat) - b.to(at::kFloat)).abs(), 0.0, 3.0e38, 3.0e38).amax(1);
  const at::Tensor ulp = ulp_distance(a, b).amax(1).to(at::kFloat);
  return at::stack({frac, abs, ulp});
}

at::Tensor position_diffs(const std::vector<TapRow>& refs, const std::vector<TapRow>& runs,
                          bool use_kernel) {
  TORCH_CHECK(refs.size() == runs.size() && !refs.empty(),
              "position_diffs: needs as many runs as references, at least one");
  const at::Tensor& first = refs.front().tensor;
  TORCH_CHECK(first.dim() >= 2, "position_diffs: expected [B, C, ...] tensors, got ",
              first.sizes());
  const std::int64_t c = first.size(1);
  const at::Device device = first.device();
  const bool cuda = device.is_cuda() && use_kernel && kernels::built() && kernel_types(refs);
  if (!cuda && !device.is_cpu()) {
    std::vector<at::Tensor> rows;
    rows.reserve(refs.size());
    for (std::size_t i = 0; i < refs.size(); ++i) {
      rows.push_back(position_diff(refs[i].tensor.select(0, refs[i].row),
                                   runs[i].tensor.select(0, runs[i].row)));
    }
    return at::stack(rows);
  }
  std::vector<at::Tensor> keep;  // contiguous copies of the (rare) strided tensors
  std::vector<kernels::cuda::DiffPair> pairs(refs.size());
  const auto contiguous = [&keep](const at::Tensor& t) -> const at::Tensor& {
    if (t.is_contiguous()) {
      return t;
    }
    keep.push_back(t.contiguous());
    return keep.back();
  };
  keep.reserve(2 * refs.size());
  for (std::size_t i = 0; i < refs.size(); ++i) {
    const at::Tensor& a = refs[i].tensor;
    const at::Tensor& b = runs[i].tensor;
    TORCH_CHECK(a.dim() >= 2 && b.dim() >= 2 && a.sizes().slice(1) == b.sizes().slice(1) &&
                    a.scalar_type() == b.scalar_type(),
                "position_diffs: pair ", i, " differs in shape or dtype: ", a.sizes(), " vs ",
                b.sizes());
    TORCH_CHECK(a.device() == device && b.device() == device, "position_diffs: pair ", i,
                " is not on ", device);
    TORCH_CHECK(a.size(1) == c, "position_diffs: pair ", i, " has ", a.size(1), " positions, not ",
                c);
    TORCH_CHECK(
        refs[i].row >= 0 && refs[i].row < a.size(0) && runs[i].row >= 0 && runs[i].row < b.size(0),
        "position_diffs: pair ", i, " has no row ", refs[i].row, " / ", runs[i].row);
    TORCH_CHECK(!at::isFloatingType(a.scalar_type()) || a.scalar_type() == at::kBFloat16 ||
                    a.scalar_type() == at::kHalf || a.scalar_type() == at::kFloat ||
                    (!cuda && a.scalar_type() == at::kDouble),
                "position_diffs: unsupported dtype ", a.scalar_type());
    TORCH_CHECK(!at::isComplexType(a.scalar_type()), "position_diffs: complex tensors");
    kernels::cuda::DiffPair& p = pairs[i];
    p.a = row_pointer(contiguous(a), refs[i].row);
    p.b = row_pointer(contiguous(b), runs[i].row);
    p.inner = c > 0 ? a.numel() / (a.size(0) * c) : 0;
    p.kind = kind_of(a);
  }
  if (cuda) {
    TORCH_CHECK(c <= std::numeric_limits<std::int32_t>::max(),
                "position_diffs: too many positions for one grid: ", c);
    return kernels::position_diffs(pairs, c, device);
  }
  at::Tensor out = at::empty({static_cast<std::int64_t>(refs.size()), 3, c}, at::kFloat);
  for (std::size_t i = 0; i < refs.size(); ++i) {
    const at::Tensor& a = refs[i].tensor;
    diff_pair_cpu(pairs[i], a.scalar_type(), static_cast<std::size_t>(a.element_size()), c,
                  out.data_ptr<float>() + static_cast<std::int64_t>(i) * 3 * c);
  }
  return out;
}

at::Tensor position_diffs(const std::vector<at::Tensor>& refs, const std::vector<at::Tensor>& runs,
                          bool use_kernel) {
  TORCH_CHECK(refs.size() == runs.size(), "position_diffs: needs as many runs as references");
  std::vector<TapRow> a;
  std::vector<TapRow> b;
  for (std::size_t i = 0; i < refs.size(); ++i) {
    a.push_back({refs[i].dim() > 0 ? refs[i].unsqueeze(0) : refs[i].view({1, 1}), 0});
    b.push_back({runs[i].dim() > 0 ? runs[i].unsqueeze(0) : runs[i].view({1, 1}), 0});
  }
  return position_diffs(a, b, use_kernel);
}

at::Tensor routing_flips(const at::Tensor& ref_ids, const at::Tensor& run_ids) {
  const at::Tensor a = std::get<0>(ref_ids.sort(-1));
  const at::Tensor b = std::get<0>(run_ids.sort(-1));
  return (a != b).any(-1);
}

at::Tensor router_margin(const at::Tensor& scores, std::int64_t k) {
  const std::int64_t e = scores.size(-1);
  if (k >= e) {
    return at::full({scores.size(0)}, 3.0e38, scores.options().dtype(at::kFloat));
  }
  const at::Tensor top = std::get<0>(scores.to(at::kFloat).topk(k + 1, -1));  // [C, k+1]
  return top.select(-1, k - 1) - top.select(-1, k);
}

}  // namespace batchlens::probe
