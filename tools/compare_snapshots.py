#!/usr/bin/env python3
# SPDX-License-Identifier: Apache-2.0
"""Compares two behaviour snapshots (tools/behaviour_snapshot.sh) file by file.

Experiment files (.h5): every dataset's dtype, shape and bytes, and every attribute except those
that record when, how long and with which build (created_utc, tool_version, wall_time_s and the
attribute digests that cover them). safetensors: header and bytes of every tensor. JSON: parsed
values. Folders and other files: bytes.

Usage: /usr/bin/python3 tools/compare_snapshots.py BEFORE_DIR AFTER_DIR
Exits 0 when equal, 1 listing every difference, 2 on bad arguments.
"""
import json
import pathlib
import struct
import sys

# Attributes that differ between two runs of the same code: (group suffix, name).
VOLATILE = {"created_utc", "tool_version", "wall_time_s", "host"}
# JSON attributes whose text holds timings (kernel provenance, the culprit report): compared as
# parsed JSON without these keys.
JSON_ATTRIBUTES = {"provenance_json", "report_json", "culprit_json"}
TIMING_KEYS = {"seconds", "wall_s", "total_us"}


def without_timings(value):
    if isinstance(value, dict):
        return {k: without_timings(v) for k, v in value.items() if k not in TIMING_KEYS}
    if isinstance(value, list):
        return [without_timings(v) for v in value]
    return value


def json_attribute(value):
    text = value.decode() if isinstance(value, bytes) else str(value)
    return without_timings(json.loads(text))


def h5_differences(a_path, b_path):
    import h5py  # python3-h5py, Debian's

    out = []

    def attrs(obj):
        keys = set(obj.attrs.keys())
        volatile = keys & VOLATILE
        timed = keys & JSON_ATTRIBUTES
        kept = {}
        for k in keys - VOLATILE:
            # A group's digest covers its attributes; it moves with the volatile ones.
            if k == "attrs_crc32" and (volatile or timed):
                continue
            kept[k] = json_attribute(obj.attrs[k]) if k in timed else obj.attrs[k]
        return kept

    with h5py.File(a_path, "r") as a, h5py.File(b_path, "r") as b:
        names_a, names_b = [], []
        a.visit(names_a.append)
        b.visit(names_b.append)
        if sorted(names_a) != sorted(names_b):
            out.append(f"objects differ: only before {sorted(set(names_a) - set(names_b))}, "
                       f"only after {sorted(set(names_b) - set(names_a))}")
        for name in ["/"] + sorted(set(names_a) & set(names_b)):
            oa, ob = a[name], b[name]
            if type(oa) is not type(ob):
                out.append(f"{name}: a {type(oa).__name__} before, a {type(ob).__name__} after")
                continue
            xa, xb = attrs(oa), attrs(ob)
            if set(xa) != set(xb):
                out.append(f"{name}: attributes {sorted(xa)} before, {sorted(xb)} after")
            for k in sorted(set(xa) & set(xb)):
                va, vb = xa[k], xb[k]
                same = va == vb if k in JSON_ATTRIBUTES else (
                    getattr(va, "tobytes", lambda: repr(va))() ==
                    getattr(vb, "tobytes", lambda: repr(vb))())
                if not same:
                    out.append(f"{name}@{k}: {str(va)[:60]!r} before, {str(vb)[:60]!r} after")
            if isinstance(oa, h5py.Dataset):
                if oa.dtype != ob.dtype or oa.shape != ob.shape:
                    out.append(f"{name}: {oa.dtype}{oa.shape} before, {ob.dtype}{ob.shape} after")
                elif oa[()].tobytes() != ob[()].tobytes():
                    out.append(f"{name}: values differ")
    return out


def safetensors_parts(path):
    data = path.read_bytes()
    (n,) = struct.unpack("<Q", data[:8])
    header = json.loads(data[8:8 + n])
    body = data[8 + n:]
    tensors = {}
    for k, v in header.items():
        if k == "__metadata__":
            continue
        lo, hi = v["data_offsets"]
        tensors[k] = (v["dtype"], tuple(v["shape"]), body[lo:hi])
    return header.get("__metadata__", {}), tensors


def file_differences(a, b):
    if a.suffix == ".h5":
        return h5_differences(a, b)
    if a.suffix == ".safetensors":
        ma, ta = safetensors_parts(a)
        mb, tb = safetensors_parts(b)
        out = [] if ma == mb else [f"metadata {ma} before, {mb} after"]
        if set(ta) != set(tb):
            out.append(f"tensors differ: only before {sorted(set(ta) - set(tb))}, "
                       f"only after {sorted(set(tb) - set(ta))}")
        out += [f"{k}: differs" for k in sorted(set(ta) & set(tb)) if ta[k] != tb[k]]
        return out
    if a.suffix == ".json":
        return [] if json.loads(a.read_text()) == json.loads(b.read_text()) else ["JSON differs"]
    return [] if a.read_bytes() == b.read_bytes() else ["bytes differ"]


def main(argv):
    if len(argv) != 3:
        print(__doc__, file=sys.stderr)
        return 2
    before, after = pathlib.Path(argv[1]), pathlib.Path(argv[2])
    if not before.is_dir() or not after.is_dir():
        print("compare_snapshots: both arguments must be folders", file=sys.stderr)
        return 2
    files_a = {p.relative_to(before) for p in before.rglob("*") if p.is_file()}
    files_b = {p.relative_to(after) for p in after.rglob("*") if p.is_file()}
    problems = [f"only before: {p}" for p in sorted(files_a - files_b)]
    problems += [f"only after: {p}" for p in sorted(files_b - files_a)]
    for rel in sorted(files_a & files_b):
        problems += [f"{rel}: {d}" for d in file_differences(before / rel, after / rel)]
    for p in problems:
        print(p)
    print(f"compare_snapshots: {len(files_a & files_b)} files compared, "
          f"{len(problems)} difference(s)", file=sys.stderr)
    return 1 if problems else 0


if __name__ == "__main__":
    sys.exit(main(sys.argv))
