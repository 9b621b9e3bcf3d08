#!/usr/bin/env python3
# SPDX-License-Identifier: Apache-2.0
"""Turns the files bench/gpu_bench.sh leaves in a folder into Markdown tables (docs/benchmarks.md).

Usage: bench/gpu_bench_report.py DIR   (prints Markdown)
"""
import json
import re
import statistics
import sys
from pathlib import Path

NAMES = {"mid": "mid", "26b-a4b": "26B-A4B"}


def forward(path: Path) -> dict:
    """Parses `batchlens-cli forward --repeat N --cuda-graph` output."""
    if not path.exists():
        return {}
    text = path.read_text()
    got = {}
    for key, pat in (("eager", r"decode x\d+: median ([\d.]+) ms, min ([\d.]+)"),
                     ("nosync", r"no-sync eager x\d+: median ([\d.]+) ms, min ([\d.]+)"),
                     ("graph", r"cuda graph x\d+: median ([\d.]+) ms, min ([\d.]+)")):
        m = re.search(pat, text)
        if m:
            got[key] = (float(m.group(1)), float(m.group(2)))
    m = re.search(r"logits (bitwise equal|DIFFER) to eager", text)
    if m:
        got["graph_bitwise"] = m.group(1) == "bitwise equal"
    for key, pat in (("fused_nosync", r"fused no-sync eager x\d+: median ([\d.]+) ms"),
                     ("fused_graph", r"fused cuda graph x\d+: median ([\d.]+) ms")):
        m = re.search(pat, text)
        if m:
            got[key] = (float(m.group(1)),)
    m = re.search(r"logits (bitwise equal|DIFFER) to unfused eager", text)
    if m:
        got["fused_bitwise"] = m.group(1) == "bitwise equal"
    return got


def yes_no(f: dict, key: str) -> str:
    return "yes" if f.get(key) else "NO" if key in f else "—"


def first(f: dict, key: str):
    return f.get(key, (None,))[0]


def fmt(x, digits=1):
    return "—" if x is None else f"{x:.{digits}f}"


SUFFIXES = ("", "-r2", "-r3", "-r4", "-r5")  # repeated capture runs (gpu_bench.sh CAPTURE_RUNS)


def phases_of(txt):
    """The `time:` line of a batchlens-cli run log as seconds: load, engines, metrics, file."""
    if not txt.exists():
        return None
    line = re.search(r"^time: (.*)$", txt.read_text(), re.M)
    if not line:
        return None

    def part(name):  # "<name> X s" anywhere in the line (the line grew parts over time)
        m = re.search(r"(?:^|, )" + name + r" ([0-9.]+) s", line.group(1))
        return float(m.group(1)) if m else 0.0

    load, engines, file = part("load"), part("engines"), part("file")
    comparisons, results = part("per-tick copies and comparisons"), part("results")
    return {"load": load, "engines": engines, "metrics": comparisons + results, "file": file}


def main() -> int:
    d = Path(sys.argv[1])
    presets = [p for p in ("mid", "26b-a4b") if (d / f"reference-timing-{p}.json").exists()
               or (d / f"forward-{p}-b1.txt").exists()
               or (d / f"canvas-{p}-taps_none-wa_none.txt").exists()]
    print("| model | B | transformers 5.17 (ms) | BatchLens eager, straight port (ms) "
          "| + no host syncs (ms) | + CUDA graph (ms) | + fused kernels, graph (ms) "
          "| logits: graph = eager, fused = unfused | BatchLens / reference |")
    print("|---|---|---|---|---|---|---|---|---|")
    for p in presets:
        ref = {}
        rp = d / f"reference-timing-{p}.json"
        if rp.exists():
            ref = json.loads(rp.read_text()).get("batches", {})
        for b in (1, 4):
            f = forward(d / f"forward-{p}-b{b}.txt")
            r = ref.get(str(b), {}).get("decode_sc_ms", {}).get("median")
            best = (f.get("fused_graph") or f.get("graph") or f.get("nosync") or f.get("eager")
                    or (None,))[0]
            ratio = f"{best / r:.2f}" if best and r else "—"
            print(f"| {NAMES[p]} | {b} | {fmt(r)} | {fmt(first(f, 'eager'))} "
                  f"| {fmt(first(f, 'nosync'))} | {fmt(first(f, 'graph'))} "
                  f"| {fmt(first(f, 'fused_graph'))} "
                  f"| {yes_no(f, 'graph_bitwise')}, {yes_no(f, 'fused_bitwise')} | {ratio} |")
    print()
    print("Parity of the timed build with transformers (decoder forward, B = 1, self-conditioning, "
          "every tap):")
    print()
    for p in presets:
        pm = d / f"parity-{p}.md"
        verdict = [ln for ln in pm.read_text().splitlines() if ln.startswith("PARITY")] if pm.exists() else []
        print(f"- {NAMES[p]}: {verdict[-1] if verdict else 'not run'}")
    for p in presets:
        km = d / f"kernels-{p}-b1.md"
        if km.exists():
            lines = km.read_text().splitlines()
            print()
            print(f"Where the {NAMES[p]} decoder pass spends GPU time (B = 1, fused kernels, eager, "
                  f"`forward --profile` + bench/kernel_table.py; {lines[0] if lines else ''}):")
            print()
            print("\n".join(lines[1:18]))
    print()
    print("Row-wise workaround (issue_workaround: router_proj + selfcond_matmul per row), "
          "decoder forward at B = 4:")
    print()
    print("| model | default eager (ms) | issue_workaround eager (ms) | default graph (ms) "
          "| issue_workaround graph (ms) | default fused graph (ms) | issue_workaround fused graph (ms) |")
    print("|---|---|---|---|---|---|---|")
    for p in presets:
        a = forward(d / f"forward-{p}-b4.txt")
        w = forward(d / f"forward-{p}-b4-issue_workaround.txt")
        print(f"| {NAMES[p]} | {fmt(first(a, 'eager'))} | {fmt(first(w, 'eager'))} "
              f"| {fmt(first(a, 'graph'))} | {fmt(first(w, 'graph'))} "
              f"| {fmt(first(a, 'fused_graph'))} | {fmt(first(w, 'fused_graph'))} |")
    print()
    print("One full canvas (48 denoising steps requested; steps actually taken in brackets):")
    print()
    print("| model | B | transformers generate (s) | BatchLens engine, taps off (s) |")
    print("|---|---|---|---|")
    for p in presets:
        cr = d / f"canvas-reference-{p}.json"
        ref = json.loads(cr.read_text())["batches"] if cr.exists() else {}
        ours = d / f"canvas-{p}-taps_none-wa_none.json"
        runs = {r["id"]: r for r in json.loads(ours.read_text())["runs"]} if ours.exists() else {}
        for b, rid in ((1, "repeat1"), (4, "b4")):
            r = ref.get(str(b))
            o = runs.get(rid)
            rs = f"{r['median_ms'] / 1000:.2f} ({r['denoising_steps'][0]})" if r else "—"
            os_ = f"{o['wall_time_s']:.2f} ({sum(o['steps'])})" if o else "—"
            print(f"| {NAMES[p]} | {b} | {rs} | {os_} |")
    print()
    print("Capture overhead: the experiment (B = 1 reference, B = 1 repeat, B = 4; one canvas) "
          "with every tap compared on every step vs `--taps none` (tokens and sampler state only), "
          "from the `time:` line of each `batchlens-cli run`. *Engines* is the stepping of all "
          "three engines (the reference's includes its warm-up and graph capture); *metrics* is "
          "what the runner does besides stepping: queueing the per-tick comparisons, reading them "
          "back once per canvas and assembling the results. Each configuration ran two or more "
          "times, alternating; the fastest run of each is shown.")
    print()
    print("| model | engines, taps none (s) | engines, all taps (s) | metrics none / all (s) "
          "| engines + metrics, none / all (s) | overhead, taps + metrics | median of the runs, "
          "none / all (s) | file none / all (s) | process wall none / all (s) |")
    print("|---|---|---|---|---|---|---|---|---|")
    for p in presets:
        best = {}
        every = {"none": [], "all": []}
        for t in ("none", "all"):
            for suffix in SUFFIXES:
                txt = d / f"canvas-{p}-taps_{t}-wa_none{suffix}.txt"
                js = d / f"canvas-{p}-taps_{t}-wa_none{suffix}.json"
                ph = phases_of(txt)
                if not ph:
                    continue
                ph["process"] = json.loads(js.read_text()).get("process_wall_s", 0) if js.exists() else 0
                ph["stepping"] = ph["engines"] + ph["metrics"]
                every[t].append(ph["stepping"])
                if t not in best or ph["stepping"] < best[t]["stepping"]:
                    best[t] = ph
        if len(best) < 2:
            continue
        n, a = best["none"], best["all"]
        over = (a["stepping"] / n["stepping"] - 1.0) * 100.0 if n["stepping"] > 0 else 0.0
        med = [statistics.median(every[t]) for t in ("none", "all")]
        mover = (med[1] / med[0] - 1.0) * 100.0 if med[0] > 0 else 0.0
        print(f"| {NAMES[p]} | {n['engines']:.2f} | {a['engines']:.2f} "
              f"| {n['metrics']:.2f} / {a['metrics']:.2f} | {n['stepping']:.2f} / {a['stepping']:.2f} "
              f"| {over:+.1f} % | {med[0]:.2f} / {med[1]:.2f} ({mover:+.1f} %) "
              f"| {n['file']:.2f} / {a['file']:.2f} | {n['process']:.1f} / {a['process']:.1f} |")
    phases = []
    for p in presets:
        for t in ("none", "all"):
            for suffix in SUFFIXES:
                txt = d / f"canvas-{p}-taps_{t}-wa_none{suffix}.txt"
                m = re.search(r"^time: (.*)$", txt.read_text(), re.M) if txt.exists() else None
                if m:
                    run = f" (run {suffix[2:]})" if suffix else ""
                    phases.append(f"- {NAMES[p]}, taps {t}{run}: {m.group(1)}")
    if phases:
        print()
        print("Where each `batchlens-cli run` spent its time (`time:` line of its output):")
        print()
        print("\n".join(phases))
    for p in presets:
        paths = [d / f"canvas-{p}-taps_none-wa_{w}.json" for w in ("none", "issue_workaround")]
        if all(x.exists() for x in paths):
            js = [json.loads(x.read_text()) for x in paths]
            runs = {r["id"]: r for r in js[1]["runs"]}
            if "b4" in runs and "wa.b4" in runs:
                print()
                print(f"Row-wise workaround in the {NAMES[p]} experiment engine (B = 4 canvas, taps off): "
                      f"{runs['b4']['wall_time_s']:.2f} s default, {runs['wa.b4']['wall_time_s']:.2f} s "
                      f"with issue_workaround.")
    return 0


if __name__ == "__main__":
    sys.exit(main())
