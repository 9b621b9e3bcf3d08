#!/usr/bin/env python3
# SPDX-License-Identifier: Apache-2.0
"""Times the experts' grouped GEMM as transformers calls it against the transposed problem
(out^T = W_e x^T: weights as the 3-D left operand, tokens grouped along the columns), and says
whether the two give the same bits. Shapes of the 26B-A4B experts at B = 1 (256 tokens, top-8 of
128 experts, hidden 2816, expert width 704). Run on the GPU machine.

    python3 bench/grouped_mm_variants.py [--tokens 256]
"""
import argparse
import sys
from pathlib import Path

import torch
import torch.nn.functional as F

sys.path.insert(0, str(Path(__file__).resolve().parent))
from cuda_timing import graph_ms  # noqa: E402


def main():
    p = argparse.ArgumentParser()
    p.add_argument("--tokens", type=int, default=256)
    p.add_argument("--experts", type=int, default=128)
    p.add_argument("--top-k", type=int, default=8)
    p.add_argument("--hidden", type=int, default=2816)
    p.add_argument("--inter", type=int, default=704)
    a = p.parse_args()
    torch.manual_seed(0)
    dev = "cuda"
    scores = torch.randn(a.tokens, a.experts, device=dev)
    ids = scores.topk(a.top_k, dim=-1).indices.reshape(-1)
    ids_sorted, perm = torch.sort(ids)
    counts = torch.histc(ids_sorted.int(), bins=a.experts, min=0, max=a.experts - 1)
    offs = torch.cumsum(counts, 0, dtype=torch.int32)
    rows = ids.numel()
    for name, n, k in (("gate_up", 2 * a.inter, a.hidden), ("down", a.hidden, a.inter)):
        w = (torch.randn(a.experts, n, k, device=dev) * 0.02).to(torch.bfloat16)  # [E, N, K]
        x = torch.randn(rows, k, device=dev).to(torch.bfloat16)                   # [S, K]
        ref = F.grouped_mm(x, w.transpose(-2, -1), offs=offs)                      # [S, N]
        t_ref = graph_ms(lambda: F.grouped_mm(x, w.transpose(-2, -1), offs=offs))
        line = f"{name}: reference (x @ W^T, 2d x 3d) {t_ref * 1000:.1f} us"
        try:
            xt = x.t()  # [K, S], column-major view
            out_t = F.grouped_mm(w, xt, offs=offs)  # [N, S]
            same = torch.equal(out_t.t(), ref)
            t_t = graph_ms(lambda: F.grouped_mm(w, xt, offs=offs))
            line += f"; transposed (W @ x^T, 3d x 2d) {t_t * 1000:.1f} us, bits {'EQUAL' if same else 'DIFFER'}"
            if not same:
                line += f" ({int((out_t.t() != ref).sum())} of {ref.numel()} differ)"
        except Exception as exc:  # noqa: BLE001
            line += f"; transposed: {type(exc).__name__}: {str(exc)[:200]}"
        print(line, flush=True)


if __name__ == "__main__":
    main()
