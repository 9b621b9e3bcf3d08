#!/usr/bin/env python3
# SPDX-License-Identifier: Apache-2.0
"""Which summation order ATen's CUDA mean over the last dimension uses on this machine.

Run ON the GPU server (PyTorch with CUDA). For fp32 rows of several widths and row counts it
computes x.pow(2).mean(-1) with torch on the device and, in exact fp32 on the host, the same
mean under candidate orders of ATen's reduce kernel (Reduce.cuh): lanes, accumulators per lane,
vector width, and the shuffle tree. It prints, per shape, which candidates give torch's bits.
The fused mean of squares (core/kernels/fused_kernels.cu, mean_sq_kernel) implements one of
them; its load-time check (model/fused_layer.cpp, check_mean) says whether it matches.

  python3 tools/probe_reduce_order.py [--widths 256,2816] [--rows 16,256,1031] [--samples 4]
"""
import argparse

import numpy as np
import torch


def tree(lanes, descending=False):
    """Shuffle-down combine at offsets 1, 2, 4, ... (or 16, 8, ...): lane 0's sum (fp32 adds)."""
    vals = list(lanes)
    offsets = []
    offset = 1
    while offset < len(vals):
        offsets.append(offset)
        offset <<= 1
    for offset in reversed(offsets) if descending else offsets:
        vals = [np.float32(vals[i] + vals[i + offset]) if i + offset < len(vals) else vals[i]
                for i in range(len(vals))]
    return vals[0]


def block_x(lanes):
    """Wider than a warp: shared-memory halving (offsets width/2 .. 32), then a warp's tree."""
    vals = list(lanes)
    offset = len(vals) // 2
    while offset >= 32:
        vals = [np.float32(vals[i] + vals[i + offset]) for i in range(offset)]
        offset >>= 1
    return tree(vals[:32])


def combine(accs):
    total = accs[0]
    for a in accs[1:]:
        total = np.float32(total + a)
    return total


def vectorized(sq, lanes, vec, descending=False, wide=False):
    """Lane l adds vectors l, l + lanes, ... (vec elements each) into vec accumulators."""
    n = len(sq)
    per_lane = []
    for lane in range(lanes):
        accs = [np.float32(0)] * vec
        j = lane
        while j * vec + vec - 1 < n:
            for i in range(vec):
                accs[i] = np.float32(accs[i] + sq[j * vec + i])
            j += lanes
        tail = (n // vec) * vec + lane
        if tail < n:
            accs[0] = np.float32(accs[0] + sq[tail])
        per_lane.append(combine(accs))
    return block_x(per_lane) if wide else tree(per_lane, descending)


def strided(sq, lanes, vt0):
    """Lane l adds elements l + lanes * i + lanes * vt0 * k into accumulator i (no vectors)."""
    n = len(sq)
    per_lane = []
    for lane in range(lanes):
        accs = [np.float32(0)] * vt0
        base = lane
        while base < n:
            for i in range(vt0):
                idx = base + i * lanes
                if idx < n:
                    accs[i] = np.float32(accs[i] + sq[idx])
            base += lanes * vt0
        per_lane.append(combine(accs))
    return tree(per_lane)


CANDIDATES = {
    "32 lanes, vectors of 4 (fused_kernels.cu)": lambda sq: vectorized(sq, 32, 4),
    "32 lanes, vectors of 8": lambda sq: vectorized(sq, 32, 8),
    "32 lanes, vectors of 2": lambda sq: vectorized(sq, 32, 2),
    "32 lanes, strided, 4 accumulators": lambda sq: strided(sq, 32, 4),
    "32 lanes, strided, 8 accumulators": lambda sq: strided(sq, 32, 8),
    "32 lanes, strided, 2 accumulators": lambda sq: strided(sq, 32, 2),
    "16 lanes, vectors of 4": lambda sq: vectorized(sq, 16, 4),
    "64 lanes (one block row), vectors of 4": lambda sq: vectorized(sq, 64, 4, wide=True),
    "128 lanes (one block row), vectors of 4": lambda sq: vectorized(sq, 128, 4, wide=True),
    "256 lanes (one block row), vectors of 4": lambda sq: vectorized(sq, 256, 4, wide=True),
    "512 lanes (one block row), vectors of 4": lambda sq: vectorized(sq, 512, 4, wide=True),
    "32 lanes, vectors of 4, tree 16 8 4 2 1": lambda sq: vectorized(sq, 32, 4, True),
    "a float64 sum": lambda sq: np.float32(np.sum(sq, dtype=np.float64)),
    "numpy's pairwise fp32 sum": lambda sq: np.sum(sq, dtype=np.float32),
}


def main():
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--widths", default="256,704,2816")
    p.add_argument("--rows", default="1,4,8,16,17,256,1031")
    p.add_argument("--samples", type=int, default=8, help="rows checked per shape")
    args = p.parse_args()
    torch.manual_seed(0)
    print(f"torch {torch.__version__}, {torch.cuda.get_device_name()}")
    for n in (int(w) for w in args.widths.split(",")):
        for rows in (int(r) for r in args.rows.split(",")):
            x = torch.randn(rows, n, device="cuda") * 3
            sq = x.pow(2)
            ref = sq.mean(-1).cpu().numpy()
            factor = np.float32(np.float32(rows) / np.float32(rows * n))
            sq_host = sq.cpu().numpy()
            matches = []
            for name, fn in CANDIDATES.items():
                ok = all(np.float32(fn(sq_host[r]) * factor) == ref[r]
                         for r in range(min(rows, args.samples)))
                if ok:
                    matches.append(name)
            print(f"width {n}, {rows} rows: " + ("; ".join(matches) if matches else "no candidate"))


if __name__ == "__main__":
    main()
