#!/usr/bin/env python3
# SPDX-License-Identifier: Apache-2.0
"""BatchLens minimal repro: one op of DiffusionGemma, at batch 1 and with the row repeated.

Plain PyTorch: no BatchLens, no transformers, no checkpoint. Reads op.json (what the op is, as
BatchLens exported it) and inputs.safetensors (its captured row-0 operands, where they fit under
the export's size cap; otherwise seeded random stand-ins of the same shapes and dtypes). Computes
the op once at batch 1 and once with the row repeated to batch B, exactly as the model computes
it (dtype, the weight's stored layout and transposes, the same ATen call), and prints whether
row 0 is bitwise equal, the share of differing elements, max |delta|, max ULP and the CUDA
kernels each call launched.

Exit status: 1 row 0 differs; 0 bitwise equal; 2 it cannot run here (a missing file, an op this
PyTorch or device lacks, a strategy only BatchLens has).
"""

import argparse
import json
import os
import struct
import sys

HERE = os.path.dirname(os.path.abspath(__file__))
FORMAT = "batchlens-repro/2"
DTYPES = {"BF16": "bfloat16", "F16": "float16", "F32": "float32", "F64": "float64",
          "I32": "int32", "I64": "int64"}


def fail(message):
    print("repro.py: " + message, file=sys.stderr)
    sys.exit(2)


MAX_ELEMENTS = 1 << 31  # per operand: far above any op BatchLens exports
MAX_HEADER = 100 << 20


def count_of(shape, where):
    """The element count of `shape` (a list of non-negative integers), refused above
    MAX_ELEMENTS before anything of that size is allocated."""
    if not isinstance(shape, list) or len(shape) > 8 or not all(
            isinstance(d, int) and not isinstance(d, bool) and 0 <= d <= MAX_ELEMENTS
            for d in shape):
        fail("%s: shape %r is not a list of at most 8 sizes" % (where, shape))
    count = 1
    for d in shape:
        count *= d
    if count > MAX_ELEMENTS:
        fail("%s: shape %r holds more than %d elements" % (where, shape, MAX_ELEMENTS))
    return count


def check_op(op, path):
    """op.json comes with the folder from someone else: every field this script reads is checked
    for its type (and every shape for its size) before it is used."""
    def need(obj, key, types, where):
        if not isinstance(obj, dict) or key not in obj or not isinstance(obj[key], types) or (
                isinstance(obj[key], bool) and bool not in (types if isinstance(types, tuple)
                                                            else (types,))):
            fail("%s: %s%s is missing or of the wrong type" % (path, where, key))
        return obj[key]
    for key, types in (("family", str), ("layer", int), ("canvas", int), ("step", int),
                       ("op", str), ("batch", int), ("dtype", str), ("device", str),
                       ("emulated", bool), ("comparison", str), ("inputs", list)):
        need(op, key, types, "")
    if op["canvas"] < 1 or op["step"] < 1:
        fail("%s: canvas and step count from 1 (canvas %d, step %d)" % (path, op["canvas"],
                                                                        op["step"]))
    if not 1 <= op["batch"] <= 4096:
        fail("%s: batch %d is not 1 to 4096" % (path, op["batch"]))
    if len(op["inputs"]) > 16:
        fail("%s: more than 16 inputs" % path)
    for i, spec in enumerate(op["inputs"]):
        where = "inputs[%d]." % i
        for key, types in (("name", str), ("role", str), ("dtype", str), ("random", str),
                           ("transposed", bool), ("shape", list), ("mean", (int, float)),
                           ("std", (int, float))):
            need(spec, key, types, where)
        if spec["dtype"] not in DTYPES:
            fail("%s: %sdtype %r is not one of %s" % (path, where, spec["dtype"],
                                                      ", ".join(sorted(DTYPES))))
        if spec["random"] not in ("copy", "softmax", "normal"):
            fail("%s: %srandom %r is not copy, softmax or normal" % (path, where, spec["random"]))
        if spec["transposed"] and len(spec["shape"]) < 2:
            fail("%s: %stransposed needs two dimensions" % (path, where))
        count_of(spec["shape"], path + ": " + where + "shape")
    return op


def load_op():
    path = os.path.join(HERE, "op.json")
    try:
        if not os.path.isfile(path) or os.path.getsize(path) > (16 << 20):
            fail("%s is not a small regular file" % path)
        with open(path, encoding="utf-8") as f:
            op = json.load(f)
    except (OSError, ValueError, RecursionError) as e:
        fail("cannot read %s: %s" % (path, e))
    if not isinstance(op, dict) or op.get("format") != FORMAT:
        fail("%s is not a BatchLens repro description (%s)" % (path, FORMAT))
    if op.get("op") not in ("linear", "matmul", "grouped_mm"):
        fail("unknown op %r in op.json" % op.get("op"))
    return check_op(op, path)


def read_safetensors(torch, path):
    """The tensors of a .safetensors file (its own small reader: 8-byte header length, JSON
    header, raw little-endian data). The header length, every dtype, shape and byte range are
    checked against the file's size before anything is allocated; then only those ranges are
    read."""
    out = {}
    if not os.path.exists(path):
        return out
    if not os.path.isfile(path):
        fail("%s is not a regular file" % path)
    size = os.path.getsize(path)
    with open(path, "rb") as f:
        if size < 8:
            fail("%s is truncated" % path)
        (n,) = struct.unpack("<Q", f.read(8))
        if n > size - 8 or n > MAX_HEADER:
            fail("%s: header of %d bytes in a file of %d" % (path, n, size))
        try:
            header = json.loads(f.read(n).decode("utf-8"))
        except (ValueError, RecursionError) as e:
            fail("%s: header is not JSON: %s" % (path, e))
        if not isinstance(header, dict):
            fail("%s: header is not a JSON object" % path)
        body_start, body_len = 8 + n, size - 8 - n
        ranges = []
        for name, info in header.items():
            if name == "__metadata__":
                continue
            where = "%s: %s" % (path, name)
            if not isinstance(info, dict):
                fail("%s is not described by an object" % where)
            dtype = DTYPES.get(info.get("dtype")) if isinstance(info.get("dtype"), str) else None
            if dtype is None:
                fail("%s has dtype %r" % (where, info.get("dtype")))
            dtype = getattr(torch, dtype)
            offsets = info.get("data_offsets")
            if not isinstance(offsets, list) or len(offsets) != 2 or not all(
                    isinstance(o, int) and not isinstance(o, bool) for o in offsets):
                fail("%s: data_offsets %r are not two integers" % (where, offsets))
            begin, end = offsets
            shape = info.get("shape")
            count = count_of(shape, where + " shape")
            element = torch.tensor([], dtype=dtype).element_size()
            if not 0 <= begin <= end <= body_len or end - begin != count * element:
                fail("%s's bytes [%d, %d) do not hold %s %s" % (where, begin, end, shape,
                                                              info["dtype"]))
            ranges.append((begin, end, name, dtype, shape, count))
        for begin, end, name, dtype, shape, count in sorted(ranges):
            f.seek(body_start + begin)
            raw = bytearray(f.read(end - begin))
            t = torch.frombuffer(raw, dtype=dtype) if count > 0 else torch.empty(0, dtype=dtype)
            out[name] = t.reshape(shape)
    return out


def stand_in(torch, spec, seed):
    """A seeded random tensor of the operand's shape and dtype, drawn like its values."""
    g = torch.Generator().manual_seed(seed)
    dtype = getattr(torch, DTYPES[spec["dtype"]])
    shape = spec["shape"]
    if spec["random"] == "softmax":
        return torch.softmax(torch.randn(shape, generator=g) * 4.0, -1).to(dtype)
    std = spec["std"] if spec["std"] > 0 else 1.0
    return (torch.randn(shape, generator=g) * std + spec["mean"]).to(dtype)


def emulated_split_count(m, k):
    """BatchLens's emulated split-K (a labelled CPU stand-in for a GPU library's heuristic):
    more K chunks when M is small, as split-K GEMMs do."""
    tiles = max(1, (m + 15) // 16)
    return max(1, min(max(1, 8 // tiles), k // 32))


def linear(torch, x, w, emulate):
    """F.linear(x, w), or with --emulate BatchLens's emulated split-K: K cut in
    emulated_split_count(M, K) contiguous chunks, each chunk's product in x's dtype, summed in
    fp32 in chunk order and rounded once."""
    F = torch.nn.functional
    k = x.shape[-1]
    m = x.numel() // k if k > 0 else 0
    splits = emulated_split_count(m, k) if emulate else 1
    if splits == 1 or m == 0:
        return F.linear(x, w)
    x2 = x.reshape(m, k)
    chunk = (k + splits - 1) // splits
    acc = None
    for lo in range(0, k, chunk):
        n = min(chunk, k - lo)
        p = F.linear(x2.narrow(1, lo, n), w.narrow(1, lo, n)).to(torch.float32)
        acc = p if acc is None else acc.add_(p)
    return acc.to(x.dtype).view(*x.shape[:-1], w.shape[0])


def grouped_operands(torch, x, offs, batch):
    """The grouped GEMM's operands for `batch` identical rows: each expert's rows `batch` times
    in a row (how a stable sort by expert orders `batch` rows' pairs), offsets times `batch`;
    and the positions of row 0's outputs."""
    ends = offs.to("cpu").tolist()
    take, row0, start = [], [], 0
    for end in ends:
        for r in range(batch):
            for i in range(start, end):
                if r == 0:
                    row0.append(len(take))
                take.append(i)
        start = end
    index = torch.tensor(take, dtype=torch.int64, device=x.device)
    return (x.index_select(0, index), (offs.to(torch.int64) * batch).to(torch.int32),
            torch.tensor(row0, dtype=torch.int64, device=x.device))


def make_call(torch, op, t, emulate):
    """The op on a batch of operands, as the model calls it."""
    if op["op"] == "linear":
        return lambda x: linear(torch, x, t["w"], emulate)
    if op["op"] == "matmul":
        # torch.matmul(probs, embed) is F.linear(probs, embed.t()) bit for bit (one mm).
        if emulate:
            return lambda x: linear(torch, x, t["w"].t(), True)
        return lambda x: torch.matmul(x, t["w"])
    if not hasattr(torch, "_grouped_mm"):
        fail("this op is torch._grouped_mm, which PyTorch %s lacks (2.8+ with CUDA sm90)"
             % torch.__version__)
    return lambda x, offs: torch._grouped_mm(x, t["w"], offs=offs)


def batched(torch, op, t, call, batch, strategy):
    """The op at `batch` identical rows, its operands prepared beforehand: (compute, row0), where
    compute() is the op's own call(s) and row0(out) picks row 0's outputs."""
    x = t["x"]
    rows = x.shape[0]
    if op["op"] == "grouped_mm":
        if strategy == "row_wise" or batch == 1:
            return (lambda: call(x, t["offs"])), (lambda out: out)
        xb, offs_b, index = grouped_operands(torch, x, t["offs"], batch)
        return (lambda: call(xb, offs_b)), (lambda out: out.index_select(0, index))
    if strategy == "row_wise" and batch > 1:
        # One call per logical row: row 0's call is the batch-1 call.
        parts = [x.clone() for _ in range(batch)]
        return (lambda: torch.cat([call(part) for part in parts], 0)), (
            lambda out: out.narrow(0, 0, rows))
    xb = x.repeat(*([batch] + [1] * (x.dim() - 1))) if batch > 1 else x
    return (lambda: call(xb)), (lambda out: out.narrow(0, 0, rows))


def short_name(name):
    """A kernel's name without its template arguments and parameter list."""
    name = name[5:] if name.startswith("void ") else name
    name = name.replace("(anonymous namespace)::", "")
    for stop in "<(":
        at = name.find(stop)
        if at > 0:
            name = name[:at]
    name = name.strip()
    return name if len(name) <= 96 else name[:95] + "..."


def run_profiled(torch, compute, device):
    """compute() once to warm up (library handles, heuristics), then again; on CUDA under
    torch.profiler: the kernels that second call launched, in launch order (repeats once)."""
    compute()
    if device.type != "cuda":
        return None, compute()
    torch.cuda.synchronize()
    try:
        import warnings
        from torch.profiler import profile, ProfilerActivity
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            with profile(activities=[ProfilerActivity.CUDA]) as prof:
                out = compute()
                torch.cuda.synchronize()
        names = []
        for e in prof.events():
            if str(getattr(e, "device_type", "")).endswith("CUDA"):
                name = short_name(e.name)
                if name not in names:
                    names.append(name)
        return names, out
    except Exception as e:  # the profiler is optional: say why it is missing
        return ["(profiler unavailable: %s)" % e], compute()


def ordered(torch, t):
    """Bits as integers ordered like the values: adjacent floats are 1 apart (ULPs)."""
    wide = t.element_size() == 4
    bits = t.contiguous().view(torch.int32 if wide else torch.int16).to(torch.int64)
    lowest = -(1 << 31) if wide else -(1 << 15)
    return torch.where(bits < 0, lowest - bits, bits)


def exact_op(torch, op, t):
    """The op in fp64 on the CPU from the operands (the values the kernels were given)."""
    x = t["x"].to("cpu", torch.float64)
    w = t["w"].to("cpu", torch.float64)
    if op["op"] == "linear":
        return torch.nn.functional.linear(x, w)
    if op["op"] == "matmul":
        return torch.matmul(x, w)
    ends = t["offs"].to("cpu").tolist()
    out = torch.zeros(x.shape[0], w.shape[-1], dtype=torch.float64)
    start = 0
    for e, end in enumerate(ends):
        end = min(int(end), x.shape[0])
        if end > start:
            out[start:end] = x[start:end] @ w[e]
        start = max(start, end)
    return out


def exact_line(torch, one, many, exact, batch):
    """How far both results lie from exact: ULPs of their dtype (from exact rounded to it) and
    the share of elements where each is closer in value."""
    n = max(1, one.numel())
    ref = ordered(torch, exact.to(one.dtype))
    ua = (ordered(torch, one) - ref).abs().double()
    ub = (ordered(torch, many) - ref).abs().double()
    ea = (one.double() - exact).abs()
    eb = (many.double() - exact).abs()
    closer_one = float((ea < eb).sum()) / n
    closer_b = float((eb < ea).sum()) / n
    return ("  exact (fp64 on the CPU): B=1: max %d ULP, mean %.3g; B=%d: max %d ULP, mean %.3g; "
            "closer: B=1 on %.1f %%, B=%d on %.1f %%, equally close on %.1f %% of %d elements"
            % (int(ua.max()), float(ua.mean()), batch, int(ub.max()), float(ub.mean()),
               100.0 * closer_one, batch, 100.0 * closer_b,
               100.0 * (1.0 - closer_one - closer_b), one.numel()))


def main():
    op = load_op()
    where = op["family"] + (" layer %d" % op["layer"] if op["layer"] >= 0 else "")
    parser = argparse.ArgumentParser(
        description="BatchLens minimal repro of %s (%s, %s): row 0 at batch 1 and at batch B."
        % (where, op["op"], op["dtype"]),
        epilog="Exit status: 1 row 0 differs, 0 bitwise equal, 2 cannot run here.")
    parser.add_argument("--device", default="cuda" if op["device"].startswith("cuda") else "cpu",
                        help="where to compute (default: where BatchLens recorded it, %(default)s)")
    parser.add_argument("--batch", type=int, default=op["batch"],
                        help="rows of the batched call (default: the experiment's, %(default)s)")
    parser.add_argument("--seed", type=int, default=0,
                        help="seed of the random stand-ins (default %(default)s)")
    parser.add_argument("--random", action="store_true",
                        help="seeded random operands even where captured ones are included")
    parser.add_argument("--emulate", action="store_true",
                        help="BatchLens's emulated split-K (a CPU stand-in for a GPU library's "
                        "split-K heuristic; the experiment %s)"
                        % ("used it for this op" if op["emulated"] else "did not use it"))
    parser.add_argument("--exact", action="store_true",
                        help="also compute the op in fp64 on the CPU from the same operands and "
                        "say how far B=1's and B's results are from it, and which is closer")
    parser.add_argument("--strategy", default="batched",
                        choices=["batched", "row_wise", "batch_invariant"],
                        help="batched: one call, as transformers computes (default); row_wise: "
                        "one call per row; batch_invariant: BatchLens-only")
    args = parser.parse_args()
    if args.batch < 1 or args.batch > 4096:
        fail("--batch must be 1..4096")
    if args.strategy == "batch_invariant":
        print("--strategy batch_invariant: BatchLens's batch-invariant kernels (cuBLASLt with one "
              "pinned algorithm and a fixed K split on CUDA, its own GEMM on CPUs) are not part "
              "of PyTorch; this script cannot call them. Check the fix with BatchLens: "
              "batchlens-cli run ... --workaround batch_invariant:%s, or run this script with "
              "--strategy row_wise." % op["family"])
        sys.exit(2)

    try:
        import torch
    except ImportError:
        fail("PyTorch is not installed (Debian: apt install python3-torch; or pip install torch)")
    device = torch.device(args.device)
    if device.type == "cuda" and not torch.cuda.is_available():
        fail("--device %s: CUDA is not available to this PyTorch" % args.device)

    captured = read_safetensors(torch, os.path.join(HERE, "inputs.safetensors"))
    t, sources = {}, []
    for i, spec in enumerate(op["inputs"]):
        name = spec["name"]
        # --random draws stand-ins for values; routing (the offsets) is kept as captured.
        wanted = not args.random or spec["random"] == "copy"
        if wanted and name in captured and list(captured[name].shape) == spec["shape"]:
            value = captured[name]
            sources.append("%s captured" % name)
        elif spec["random"] == "copy":
            fail("%s (%s) is missing from inputs.safetensors" % (name, spec["role"]))
        else:
            value = stand_in(torch, spec, args.seed * 1000 + i)
            sources.append("%s seeded random (seed %d)" % (name, args.seed))
        value = value.to(device)
        t[name] = value.transpose(-2, -1) if spec["transposed"] else value

    call = make_call(torch, op, t, args.emulate)
    compute, row0 = batched(torch, op, t, call, 1, "batched")
    kernels_one, out = run_profiled(torch, compute, device)
    one = row0(out).to("cpu")
    compute, row0 = batched(torch, op, t, call, args.batch, args.strategy)
    kernels_b, out = run_profiled(torch, compute, device)
    many = row0(out).to("cpu")

    print("BatchLens minimal repro: %s (%s) at canvas %d step %d, comparison %s"
          % (where, op["op"], op["canvas"], op["step"], op["comparison"]))
    print("  torch %s on %s%s, %s; %s" % (
        torch.__version__, device,
        " (%s)" % torch.cuda.get_device_name(device) if device.type == "cuda" else "",
        op["dtype"], ", ".join(sources)))
    print("  computed as: %s%s" % (
        "emulated split-K (BatchLens's labelled CPU stand-in for a GPU's split-K)"
        if args.emulate and op["op"] != "grouped_mm" else "this device's own kernels",
        "; row-wise (one call per row)" if args.strategy == "row_wise" else ""))
    if op["emulated"] and not args.emulate:
        print("  note: the experiment ran this op with emulated split-K; without --emulate this "
              "computes the real kernels of this device, which may be batch invariant")
    for label, names in (("B=1", kernels_one), ("B=%d" % args.batch, kernels_b)):
        if names is not None:
            print("  %s kernels: %s" % (label, "; ".join(names) if names else "(none)"))
    if args.exact:
        print(exact_line(torch, one, many, exact_op(torch, op, t).reshape(one.shape), args.batch))
    n = one.numel()
    oa, ob = ordered(torch, one), ordered(torch, many)
    differ = int((oa != ob).sum())
    if differ == 0:
        print("  row 0 at B=%d vs B=1: bitwise EQUAL (%d elements)" % (args.batch, n))
        return 0
    delta = (one.float() - many.float()).abs().nan_to_num(0.0).max().item()
    ulp = int((oa - ob).abs().max())
    print("  row 0 at B=%d vs B=1: DIFFERS in %d of %d elements (%.4f%%), max |delta| %.6g, "
          "max ULP %d" % (args.batch, differ, n, 100.0 * differ / max(1, n), delta, ulp))
    return 1


if __name__ == "__main__":
    sys.exit(main())
