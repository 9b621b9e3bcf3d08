#!/usr/bin/env python3
# SPDX-License-Identifier: Apache-2.0
"""Summarises a Chrome trace from `batchlens-cli forward --profile FILE` (LibTorch's Kineto
profiler): GPU kernel time per kernel name, per decoder pass.

    bench/kernel_table.py TRACE.json [--passes 3] [--limit 40]
"""
import argparse
import json
import sys
from collections import defaultdict


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("trace")
    p.add_argument("--passes", type=int, default=3, help="decoder passes in the trace")
    p.add_argument("--limit", type=int, default=40)
    args = p.parse_args()
    with open(args.trace) as f:
        events = json.load(f).get("traceEvents", [])
    total = defaultdict(float)
    count = defaultdict(int)
    for e in events:
        if e.get("cat") not in ("kernel", "gpu_memcpy", "gpu_memset"):
            continue
        total[e["name"]] += float(e.get("dur", 0.0))
        count[e["name"]] += 1
    if not total:
        print("kernel_table: no kernel events in the trace", file=sys.stderr)
        return 1
    n = max(args.passes, 1)
    whole = sum(total.values())
    print(f"{len(total)} kernels, {sum(count.values()) / n:.0f} launches and "
          f"{whole / n / 1000:.3f} ms of kernel time per pass")
    print("| ms / pass | share | launches / pass | kernel |")
    print("|---|---|---|---|")
    for name, us in sorted(total.items(), key=lambda kv: -kv[1])[:args.limit]:
        print(f"| {us / n / 1000:.3f} | {100 * us / whole:.1f} % | {count[name] / n:.0f} | {name[:110]} |")
    return 0


if __name__ == "__main__":
    sys.exit(main())
