#!/usr/bin/env python3
# SPDX-License-Identifier: Apache-2.0
"""Compares two safetensors files tensor by tensor: a reference (make_reference.py) and ours
(`batchlens-cli forward`).

    compare.py REF.safetensors OURS.safetensors [--json OUT.json] [--title TEXT]

For every tensor name in REF that OURS also has (OURS is reshaped to REF's shape when only the
shape differs and the element count matches) it reports: shape, dtype, and either "bitwise" (every
element has the same bit pattern: same dtype, same bits, NaNs and signed zeros included) or the
largest |ref - ours| in float64, the share of elements that differ, the batch rows that differ and
the first differing index. Names missing on either side are listed. The rows follow the decoder's
dataflow (self-conditioning, then layer 0 attn.q ... layer.out, layer 1, ..., logits), so the first
non-bitwise row is where the two implementations part.

Always exits 0 (it is a report). The last line is "PARITY: logits bitwise equal" or
"PARITY: logits differ (max |Δ| = ...)".
"""
from __future__ import annotations

import argparse
import json
import math
import sys

try:
    import torch
    from safetensors.torch import load_file
except ImportError as exc:  # pragma: no cover
    print(f"compare: needs torch and safetensors ({exc})", file=sys.stderr)
    print("PARITY: not compared (torch/safetensors missing)")
    sys.exit(0)

from tap_names import LAYER_TAPS, STEP_TAPS  # noqa: E402  (shared with the other script)
STEP_TAPS_BEFORE = STEP_TAPS
CHUNK = 1 << 24  # elements per comparison chunk (bounds the float64 temporaries)

BITS = {
    torch.float64: torch.int64,
    torch.float32: torch.int32,
    torch.bfloat16: torch.int16,
    torch.float16: torch.int16,
}


def order_key(name: str):
    """Dataflow order: step taps before the layers, per-layer taps by (layer, tap), logits last,
    anything unknown after that by name."""
    if name in STEP_TAPS_BEFORE:
        return (0, STEP_TAPS_BEFORE.index(name), 0, name)
    base, _, layer = name.rpartition(".")
    if base in LAYER_TAPS and layer.isdigit():
        return (1, int(layer), LAYER_TAPS.index(base), name)
    if name == "logits":
        return (2, 0, 0, name)
    return (3, 0, 0, name)


def unravel(flat_index: int, shape) -> tuple:
    out = []
    for dim in reversed(tuple(shape)):
        if dim == 0:
            return ()
        out.append(flat_index % dim)
        flat_index //= dim
    return tuple(reversed(out))


def scalar(t: "torch.Tensor"):
    v = t.item()
    return v if not isinstance(v, float) else float(v)


def compare_tensor(ref: "torch.Tensor", ours: "torch.Tensor") -> dict:
    row = {
        "shape": list(ref.shape),
        "dtype": str(ref.dtype).replace("torch.", ""),
        "ours_dtype": str(ours.dtype).replace("torch.", ""),
    }
    if tuple(ours.shape) != tuple(ref.shape):
        if ours.numel() != ref.numel():
            row.update(status="shape mismatch", ours_shape=list(ours.shape))
            return row
        row["reshaped_from"] = list(ours.shape)
        ours = ours.reshape(ref.shape)
    same_dtype = ref.dtype == ours.dtype
    ref_flat = ref.contiguous().reshape(-1)
    ours_flat = ours.contiguous().reshape(-1)
    n = ref_flat.numel()
    differing = 0
    max_abs = 0.0
    max_ref = 0.0
    first = None
    for start in range(0, n, CHUNK):
        a = ref_flat[start:start + CHUNK]
        b = ours_flat[start:start + CHUNK]
        if same_dtype and a.dtype in BITS:
            neq = a.view(BITS[a.dtype]) != b.view(BITS[b.dtype])
        elif same_dtype and not a.is_floating_point() and not a.is_complex():
            neq = a != b
        else:
            a64, b64 = a.to(torch.float64), b.to(torch.float64)
            neq = (a64 != b64) & ~(a64.isnan() & b64.isnan())
        count = int(neq.sum())
        a64 = a.to(torch.float64)
        if a64.numel():
            finite = a64[torch.isfinite(a64)]
            if finite.numel():
                max_ref = max(max_ref, float(finite.abs().max()))
        if count == 0:
            continue
        b64 = b.to(torch.float64)
        diff = (a64 - b64).abs()
        both_nan = a64.isnan() & b64.isnan()
        diff = torch.where(both_nan, torch.zeros_like(diff), diff)
        diff = torch.nan_to_num(diff, nan=math.inf)  # NaN on one side only
        max_abs = max(max_abs, float(diff.max()))
        differing += count
        if first is None:
            first = start + int(torch.nonzero(neq, as_tuple=False)[0, 0])
    row["elements"] = n
    if differing == 0:
        row["status"] = "bitwise" if same_dtype else "equal values (dtype differs)"
        return row
    index = unravel(first, ref.shape)
    row.update(
        status="differs",
        max_abs_diff=max_abs,
        rel_max_abs_diff=(max_abs / max_ref) if max_ref > 0 else None,
        differing=differing,
        differing_share=differing / n if n else 0.0,
        first_index=list(index),
        first_ref=scalar(ref[index]) if index else None,
        first_ours=scalar(ours[index]) if index else None,
    )
    if ref.dim() >= 2 and ref.shape[0] > 1:
        rows = []
        for r in range(ref.shape[0]):
            a, b = ref[r].contiguous(), ours[r].contiguous()
            if same_dtype and a.dtype in BITS:
                equal = torch.equal(a.view(BITS[a.dtype]), b.view(BITS[b.dtype]))
            else:
                equal = torch.equal(a.to(torch.float64), b.to(torch.float64))
            if not equal:
                rows.append(r)
        row["rows_differing"] = rows
    return row


def fmt_float(v) -> str:
    if v is None:
        return "-"
    if v == 0:
        return "0"
    if math.isinf(v):
        return "inf"
    return f"{v:.3e}"


def fmt_value(v) -> str:
    if isinstance(v, float):
        return f"{v:.6g}"
    return str(v)


def markdown_row(name: str, r: dict) -> str:
    shape = "×".join(str(d) for d in r["shape"])
    dtype = r["dtype"] if r["dtype"] == r["ours_dtype"] else f"{r['dtype']} / ours {r['ours_dtype']}"
    if "reshaped_from" in r:
        shape += f" (ours {'×'.join(str(d) for d in r['reshaped_from'])})"
    status = r["status"]
    if status == "differs":
        rows = r.get("rows_differing")
        rows_txt = "-" if rows is None else (",".join(str(x) for x in rows) or "none")
        first = "[" + ",".join(str(i) for i in r["first_index"]) + "]"
        first += f" {fmt_value(r['first_ref'])} → {fmt_value(r['first_ours'])}"
        return (
            f"| {name} | {shape} | {dtype} | **differs** | {fmt_float(r['max_abs_diff'])} | "
            f"{fmt_float(r['rel_max_abs_diff'])} | {100.0 * r['differing_share']:.4f} % | {rows_txt} | {first} |"
        )
    if status == "shape mismatch":
        ours = "×".join(str(d) for d in r["ours_shape"])
        return f"| {name} | {shape} | {dtype} | **shape mismatch** (ours {ours}) | - | - | - | - | - |"
    return f"| {name} | {shape} | {dtype} | {status} | 0 | 0 | 0 % | - | - |"


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description="Tensor-by-tensor comparison of two safetensors files.")
    p.add_argument("ref", help="reference safetensors (make_reference.py)")
    p.add_argument("ours", help="BatchLens safetensors (batchlens-cli forward)")
    p.add_argument("--json", dest="json_out", help="also write the comparison as JSON")
    p.add_argument("--title", default=None, help="heading for the Markdown report")
    args = p.parse_args(argv)

    try:
        ref = load_file(args.ref)
        ours = load_file(args.ours)
    except Exception as exc:  # noqa: BLE001 - a report, not a test: say why and stop
        print(f"compare: cannot read inputs: {type(exc).__name__}: {exc}")
        print("PARITY: not compared (unreadable input)")
        return 0

    names = sorted(ref, key=order_key)
    missing = [n for n in names if n not in ours]
    extra = sorted((n for n in ours if n not in ref), key=order_key)
    rows = {}
    for name in names:
        if name in ours:
            rows[name] = compare_tensor(ref[name], ours[name])

    title = args.title or f"Parity: {args.ours} vs {args.ref}"
    print(f"### {title}\n")
    print(f"reference `{args.ref}` ({len(ref)} tensors), ours `{args.ours}` ({len(ours)} tensors)\n")
    print("| tensor | shape | dtype | result | max abs Δ | max abs Δ / max abs ref | elements differing "
          "| rows differing | first differing index: ref → ours |")
    print("|---|---|---|---|---|---|---|---|---|")
    for name, r in rows.items():
        print(markdown_row(name, r))
    print()

    bitwise = [n for n, r in rows.items() if r["status"] == "bitwise"]
    differing = [n for n, r in rows.items() if r["status"] != "bitwise"]
    print(f"- compared {len(rows)}: {len(bitwise)} bitwise, {len(differing)} not bitwise")
    if differing:
        print(f"- first non-bitwise tensor in dataflow order: `{differing[0]}`")
    if missing:
        print(f"- missing in ours ({len(missing)}): " + ", ".join(f"`{n}`" for n in missing))
    if extra:
        print(f"- only in ours ({len(extra)}): " + ", ".join(f"`{n}`" for n in extra))
    print()

    logits = rows.get("logits")
    if "logits" not in ref:
        verdict = "PARITY: logits missing in the reference"
    elif logits is None:
        verdict = "PARITY: logits missing in ours"
    elif logits["status"] == "bitwise":
        verdict = "PARITY: logits bitwise equal"
    elif logits["status"] == "differs":
        verdict = f"PARITY: logits differ (max |Δ| = {fmt_float(logits['max_abs_diff'])}, " \
                  f"{100.0 * logits['differing_share']:.4f} % of elements)"
    else:
        verdict = f"PARITY: logits differ ({logits['status']})"

    if args.json_out:
        report = {
            "ref": args.ref,
            "ours": args.ours,
            "tensors": rows,
            "order": list(rows),
            "missing_in_ours": missing,
            "only_in_ours": extra,
            "first_non_bitwise": differing[0] if differing else None,
            "verdict": verdict,
        }
        with open(args.json_out, "w", encoding="utf-8") as handle:
            json.dump(report, handle, indent=2)
            handle.write("\n")
        print(f"(JSON written to {args.json_out})\n")
    print(verdict)
    return 0


if __name__ == "__main__":
    sys.exit(main())
