#!/usr/bin/env python3
# SPDX-License-Identifier: Apache-2.0
"""Which tensor-core fold gives torch._grouped_mm's bits on this GPU (run ON the GPU machine).

The experts' own GEMM (core/kernels/expert_gemm.cu) folds each output over K in steps of 16 with
mma.sync; the reference's grouped GEMM (CUTLASS sm90) does with wgmma. Whether the two
instructions round a step alike is the device's affair, and the model's load check only says
yes or no for the whole kernel. This probe answers it per instruction: it builds
bench/mma_fold_probe.cu (nvcc, sm_90a), runs its five folds (mma.sync k16 or 2 x k8 from -0 or
+0, wgmma k16 with the first step not reading its accumulator or from +0) with the weights as
the MMA's A operand (expert_gemm.cu's orientation) and with the tokens as A (CUTLASS's: M =
tokens), on the 26B-A4B experts' K (2816 for gate/up, 704 for down), and counts per fold the
bf16 results that differ from torch._grouped_mm and from F.linear (cuBLAS) on the same operands.

    python3 bench/mma_fold_probe.py [--k 2816,704] [--tokens 1,5,16,64] [--features 256]
"""
import argparse
import ctypes
import glob
import os
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

import torch
import torch.nn.functional as F

FOLDS = {
    0: "mma.sync k16 from -0 (ExpertFold::K16)",
    1: "mma.sync 2 x k8 from -0 (ExpertFold::K8)",
    2: "mma.sync k16 from +0",
    3: "wgmma k16, first step scale-d 0",
    4: "wgmma k16 from +0",
}


def build(out_dir):
    found = sorted(glob.glob("/usr/local/cuda*/bin/nvcc"))
    nvcc = (os.environ.get("NVCC") or os.environ.get("CUDACXX") or shutil.which("nvcc")
            or (found[0] if found else "nvcc"))
    here = Path(__file__).resolve().parent
    lib = Path(out_dir) / "mma_fold_probe.so"
    cmd = [nvcc, "-O3", "-std=c++17", "-arch=sm_90a", "-shared", "-Xcompiler", "-fPIC",
           f"-I{here.parent}", "-o", str(lib), str(here / "mma_fold_probe.cu")]
    done = subprocess.run(cmd, capture_output=True, text=True, check=False)
    if done.returncode != 0:
        sys.exit(f"mma_fold_probe: nvcc failed ({' '.join(cmd)}):\n{done.stderr}")
    probe = ctypes.CDLL(str(lib))
    probe.bl_fold_probe.restype = ctypes.c_int
    probe.bl_fold_probe.argtypes = [ctypes.c_int, ctypes.c_void_p, ctypes.c_int, ctypes.c_void_p,
                                    ctypes.c_int, ctypes.c_int, ctypes.c_void_p, ctypes.c_void_p]
    return probe


def fold(probe, variant, a, b):
    """out[i][j] = sum_k a[i][k] b[j][k] in fp32 by the fold `variant` (not rounded)."""
    out = torch.full((a.size(0), b.size(0)), float("nan"), device=a.device, dtype=torch.float32)
    rc = probe.bl_fold_probe(variant, a.data_ptr(), a.size(0), b.data_ptr(), b.size(0),
                             a.size(1), out.data_ptr(), torch.cuda.current_stream().cuda_stream)
    torch.cuda.synchronize()
    if rc != 0:
        sys.exit(f"mma_fold_probe: fold {variant} failed with {rc}")
    return out


def differing(x, y):
    return int((x.contiguous().view(torch.int16) != y.contiguous().view(torch.int16)).sum())


def grouped(x, w, before):
    """torch._grouped_mm of x with the one expert w [N, K] (its transpose, as transformers
    passes the experts), x's rows after `before` rows of a first expert (zeros)."""
    dev = x.device
    xs = torch.cat([torch.zeros(before, x.size(1), device=dev, dtype=x.dtype), x])
    ws = torch.stack([torch.zeros_like(w), w]).transpose(1, 2)  # [2, K, N], as the model's
    offs = torch.tensor([before, before + x.size(0)], device=dev, dtype=torch.int32)
    return torch._grouped_mm(xs, ws, offs=offs)[before:]


def main():
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--k", default="2816,704", help="K of the GEMMs (multiples of 16)")
    p.add_argument("--tokens", default="1,5,16,64", help="rows of one expert")
    p.add_argument("--features", type=int, default=256, help="output features (N)")
    p.add_argument("--seed", type=int, default=0)
    a = p.parse_args()
    if not torch.cuda.is_available():
        sys.exit("mma_fold_probe: no CUDA device")
    dev = torch.device("cuda")
    print(f"{torch.cuda.get_device_name(dev)}, torch {torch.__version__}, "
          f"CUDA {torch.version.cuda}")
    with tempfile.TemporaryDirectory() as tmp:
        probe = build(tmp)
        gen = torch.Generator(device=dev).manual_seed(a.seed)
        # fold name, orientation -> [differing from grouped_mm, from linear, total, fp32 equal
        # to mma k16 weights-as-A]
        tally = {}
        for k in (int(v) for v in a.k.split(",")):
            for tokens in (int(v) for v in a.tokens.split(",")):
                w = (torch.randn(a.features, k, device=dev, generator=gen) * 0.02).bfloat16()
                x = torch.randn(tokens, k, device=dev, generator=gen).bfloat16()
                ref = grouped(x, w, 0)
                ref_shifted = grouped(x, w, 3)
                lin = F.linear(x, w)
                exact = x.double() @ w.double().T
                base = fold(probe, 0, w, x).T.contiguous()
                print(f"K={k} tokens={tokens}: grouped_mm at row 0 vs row 3: "
                      f"{differing(ref, ref_shifted)} differ; F.linear vs grouped_mm: "
                      f"{differing(lin, ref)} of {ref.numel()} differ")
                for variant, name in FOLDS.items():
                    for orient, got in (("weights as A", fold(probe, variant, w, x).T.contiguous()),
                                        ("tokens as A", fold(probe, variant, x, w))):
                        err = float((got.double() - exact).abs().max())
                        same32 = int((got.view(torch.int32) == base.view(torch.int32)).sum())
                        row = [differing(got.bfloat16(), ref), differing(got.bfloat16(), lin),
                               ref.numel(), same32]
                        t = tally.setdefault((name, orient), [0, 0, 0, 0])
                        for i, v in enumerate(row):
                            t[i] += v
                        print(f"  {name:42s} {orient:13s} vs grouped_mm {row[0]:6d}, vs linear "
                              f"{row[1]:6d}, fp32 = fold 0 (weights as A) {same32:6d}/{row[2]}, "
                              f"max |err| vs fp64 {err:.3g}")
        print("\nSummary (every shape): bf16 results differing from torch._grouped_mm / F.linear")
        for (name, orient), (d_ref, d_lin, total, same32) in tally.items():
            verdict = "its bits" if d_ref == 0 else "NOT its bits"
            print(f"  {name:42s} {orient:13s} {d_ref:7d} / {d_lin:7d} of {total}: {verdict}"
                  f" (fp32 equal to fold 0: {same32})")


if __name__ == "__main__":
    main()
