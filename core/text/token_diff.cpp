// SPDX-License-Identifier: Apache-2.0
#include "core/text/token_diff.h"

#include <algorithm>

namespace batchlens::text {

namespace {

using Op = TokenEdit::Op;

std::vector<TokenEdit> positional(const std::vector<std::int64_t>& a,
                                  const std::vector<std::int64_t>& b) {
  std::vector<TokenEdit> out;
  const std::size_t n = std::min(a.size(), b.size());
  out.reserve(std::max(a.size(), b.size()));
  for (std::size_t i = 0; i < n; ++i) {
    out.push_back({a[i] == b[i] ? Op::Equal : Op::Replace, static_cast<std::int64_t>(i),
                   static_cast<std::int64_t>(i)});
  }
  for (std::size_t i = n; i < a.size(); ++i) {
    out.push_back({Op::Delete, static_cast<std::int64_t>(i), -1});
  }
  for (std::size_t j = n; j < b.size(); ++j) {
    out.push_back({Op::Insert, -1, static_cast<std::int64_t>(j)});
  }
  return out;
}

}  // namespace

std::vector<TokenEdit> token_diff(const std::vector<std::int64_t>& ref,
                                  const std::vector<std::int64_t>& run) {
  const std::vector<std::int64_t>& a = ref;
  const std::vector<std::int64_t>& b = run;
  const std::size_t n = a.size();
  const std::size_t m = b.size();
  if (n * m > (std::size_t{1} << 24)) {
    return positional(a, b);
  }
  // lcs[i][j]: LCS length of a[i:] and b[j:].
  std::vector<std::uint32_t> lcs((n + 1) * (m + 1), 0);
  const auto at = [&](std::size_t i, std::size_t j) -> std::uint32_t& {
    return lcs[i * (m + 1) + j];
  };
  for (std::size_t i = n; i-- > 0;) {
    for (std::size_t j = m; j-- > 0;) {
      at(i, j) = a[i] == b[j] ? at(i + 1, j + 1) + 1 : std::max(at(i + 1, j), at(i, j + 1));
    }
  }
  std::vector<TokenEdit> raw;
  std::size_t i = 0;
  std::size_t j = 0;
  while (i < n || j < m) {
    if (i < n && j < m && a[i] == b[j]) {
      raw.push_back({Op::Equal, static_cast<std::int64_t>(i++), static_cast<std::int64_t>(j++)});
    } else if (j < m && (i == n || at(i, j + 1) >= at(i + 1, j))) {
      raw.push_back({Op::Insert, -1, static_cast<std::int64_t>(j++)});
    } else {
      raw.push_back({Op::Delete, static_cast<std::int64_t>(i++), -1});
    }
  }
  // Pair runs of deletions and insertions between equal stretches into replacements.
  std::vector<TokenEdit> out;
  for (std::size_t k = 0; k < raw.size();) {
    if (raw[k].op == Op::Equal) {
      out.push_back(raw[k++]);
      continue;
    }
    std::vector<std::int64_t> dels;
    std::vector<std::int64_t> inss;
    for (; k < raw.size() && raw[k].op != Op::Equal; ++k) {
      (raw[k].op == Op::Delete ? dels : inss)
          .push_back(raw[k].op == Op::Delete ? raw[k].ref_pos : raw[k].run_pos);
    }
    const std::size_t pairs = std::min(dels.size(), inss.size());
    for (std::size_t p = 0; p < pairs; ++p) {
      out.push_back({Op::Replace, dels[p], inss[p]});
    }
    for (std::size_t p = pairs; p < dels.size(); ++p) {
      out.push_back({Op::Delete, dels[p], -1});
    }
    for (std::size_t p = pairs; p < inss.size(); ++p) {
      out.push_back({Op::Insert, -1, inss[p]});
    }
  }
  return out;
}

std::int64_t changed_count(const std::vector<TokenEdit>& edits) {
  std::int64_t ref = 0;
  std::int64_t run = 0;
  std::int64_t equal = 0;
  for (const TokenEdit& e : edits) {
    ref += e.op != Op::Insert ? 1 : 0;
    run += e.op != Op::Delete ? 1 : 0;
    equal += e.op == Op::Equal ? 1 : 0;
  }
  return std::max(ref, run) - equal;
}

}  // namespace batchlens::text
