#!/usr/bin/env python3
# SPDX-License-Identifier: Apache-2.0
"""Sums up a Chrome trace written by LibTorch's profiler (BATCHLENS_TRACE=FILE batchlens-cli run
... --no-kernels): where the device's time went and where it waited.

Prints: the span and the device's busy time (kernels, copies, sets: the union of their
intervals), the top kernels by device time, and per named range (the engine's
"engine.decode" / "engine.sample", and any other user annotation) its wall time, the device time
of the kernels launched inside it and the device's idle time during it.

    tools/trace_summary.py TRACE.json [--top N]
"""

import argparse
import bisect
import collections
import json
import sys

DEVICE_CATS = {"kernel", "gpu_memcpy", "gpu_memset"}


def union_length(intervals):
    """Total length covered by [start, end) intervals."""
    total = 0.0
    end = None
    for s, e in sorted(intervals):
        if end is None or s > end:
            total += e - s
            end = e
        elif e > end:
            total += e - end
            end = e
    return total


def clipped_union(intervals, lo, hi):
    return union_length([(max(s, lo), min(e, hi)) for s, e in intervals if e > lo and s < hi])


def short(name, width=100):
    return name if len(name) <= width else name[: width - 3] + "..."


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("trace")
    ap.add_argument("--top", type=int, default=30)
    args = ap.parse_args()
    try:
        with open(args.trace, encoding="utf-8") as f:
            doc = json.load(f)
    except (OSError, ValueError) as e:
        sys.exit(f"trace_summary: cannot read {args.trace}: {e}")
    events = doc.get("traceEvents", []) if isinstance(doc, dict) else []
    events = [e for e in events if isinstance(e, dict) and e.get("ph") == "X" and "dur" in e]
    if not events:
        sys.exit("trace_summary: no complete events in the trace")

    device = [e for e in events if e.get("cat") in DEVICE_CATS]
    intervals = [(float(e["ts"]), float(e["ts"]) + float(e["dur"])) for e in device]
    t0 = min(float(e["ts"]) for e in events)
    t1 = max(float(e["ts"]) + float(e["dur"]) for e in events)
    busy = union_length(intervals)
    print(f"span {(t1 - t0) / 1e6:.3f} s; device busy {busy / 1e6:.3f} s "
          f"({len(device)} kernels, copies and sets)")

    by_name = collections.defaultdict(lambda: [0.0, 0])
    for e in device:
        k = by_name[e.get("name", "?")]
        k[0] += float(e["dur"])
        k[1] += 1
    print(f"\ntop {args.top} on the device (ms, calls):")
    for name, (dur, n) in sorted(by_name.items(), key=lambda kv: -kv[1][0])[: args.top]:
        print(f"  {dur / 1e3:10.2f} {n:7d}  {short(name)}")

    # Launches (runtime calls) carry the correlation of the kernels they started; a graph
    # launch's kernels share its correlation.
    kernel_by_corr = collections.defaultdict(list)
    for e in device:
        c = e.get("args", {}).get("correlation")
        if c is not None:
            kernel_by_corr[c].append(e)
    launches = sorted(
        (float(e["ts"]), e.get("args", {}).get("correlation"), e)
        for e in events
        if e.get("cat") == "cuda_runtime"
    )
    launch_ts = [ts for ts, _, _ in launches]

    ranges = collections.defaultdict(list)
    for e in events:
        if e.get("cat") == "user_annotation":
            ranges[e.get("name", "?")].append((float(e["ts"]), float(e["ts"]) + float(e["dur"])))
    if ranges:
        print("\nnamed ranges: count, wall s, device time of their launches s, device idle "
              "during them s")
    for name, spans in sorted(ranges.items(), key=lambda kv: -sum(e - s for s, e in kv[1])):
        wall = sum(e - s for s, e in spans)
        dev = 0.0
        for s, e in spans:
            i = bisect.bisect_left(launch_ts, s)
            while i < len(launches) and launches[i][0] < e:
                dev += sum(float(k["dur"]) for k in kernel_by_corr.get(launches[i][1], []))
                i += 1
        idle = sum((e - s) - clipped_union(intervals, s, e) for s, e in spans)
        print(f"  {short(name, 40):40s} {len(spans):6d} {wall / 1e6:9.3f} {dev / 1e6:9.3f} "
              f"{idle / 1e6:9.3f}")

    cpu = collections.defaultdict(lambda: [0.0, 0])
    for e in events:
        if e.get("cat") in ("cpu_op", "cuda_runtime"):
            k = cpu[e.get("name", "?")]
            k[0] += float(e["dur"])
            k[1] += 1
    print(f"\ntop {min(args.top, 20)} host calls by wall (inclusive, ms, calls):")
    for name, (dur, n) in sorted(cpu.items(), key=lambda kv: -kv[1][0])[: min(args.top, 20)]:
        print(f"  {dur / 1e3:10.2f} {n:7d}  {short(name)}")


if __name__ == "__main__":
    main()
