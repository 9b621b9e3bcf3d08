#!/usr/bin/env python3
# SPDX-License-Identifier: Apache-2.0
"""Enforces BatchLens's layering (docs/STYLE.md of the design card):

* core/ never includes Qt, ui/ or app/ headers;
* ui/ headers never include LibTorch (ATen, c10, torch) - ui/*.cpp may;
* ui/ never includes app/;
* the core headers that ui/ and app/ include are themselves free of LibTorch;
* inside core/, a module includes only the modules CORE_MODULES allows (docs/adr/0003-core-modules.md
  has the picture); a new module must be added there;
* inside a module, its units (a .h and its .cpp, named by the stem; _cuda/_none variants are the
  same unit) include one another without a loop;
* every header of core/, ui/ and app/ opens (after its licence line) with a comment that says
  what the unit is for; in the modules of UNIT_ORDER a unit includes only
  units declared before it, and a new unit must be declared there.

Usage: check_layers.py [--root DIR] (DIR: the tree to check; default: this repository).

Exits 1 and lists every violation; 0 when clean.
"""
import pathlib
import re
import sys

ROOT = pathlib.Path(__file__).resolve().parent.parent
if len(sys.argv) == 3 and sys.argv[1] == "--root":
    ROOT = pathlib.Path(sys.argv[2]).resolve()
INCLUDE = re.compile(r'^\s*#\s*include\s*[<"]([^>"]+)[>"]', re.M)
QT = re.compile(r"^(Q[A-Za-z]+|qcustomplot\.h|Qt[A-Za-z]*/)")
TORCH = re.compile(r"^(torch|ATen|c10)/")
SOURCES = (".h", ".hpp", ".cpp", ".cc", ".cu")

# The allowed arrows between core modules (folders of core/): module -> what it may include.
# Keep in step with docs/adr/0003-core-modules.md.
CORE_MODULES = {
    "base": set(),
    "text": {"base"},
    "compat": {"base"},
    "kernels": {"base", "compat"},
    "ops": {"base", "compat", "kernels"},
    "probe": {"base", "compat", "kernels"},
    "model": {"base", "compat", "kernels", "ops", "probe"},
    "generation": {"base", "compat", "model", "ops", "probe"},
    "setup": {"base", "compat", "generation", "model", "ops", "probe", "text"},
    "experiment": {"base", "generation", "model", "ops", "probe", "setup", "text"},
    "analysis": {"base", "experiment", "generation", "model", "ops", "probe", "setup", "text"},
    "io": {"analysis", "base", "experiment", "text"},
    "remote": {"analysis", "base", "experiment", "io"},
}
CORE_INCLUDE = re.compile(r"^core/([a-z_]+)/")
UNIT_INCLUDE = re.compile(r"^core/([a-z_]+)/([A-Za-z0-9_]+)\.(?:h|hpp|cuh)$")

# The units of the modules that grow fastest, lowest first: a unit includes only units above it
# in its list. Keep in step with docs/adr/0003-core-modules.md.
UNIT_ORDER = {
    "experiment": [
        "run_vocabulary",   # run groups, roles, comparison kinds; run and comparison ids
        "kernel_provenance",  # kernel records (values, JSON)
        "causes",           # a mixed batch's causes (values, JSON)
        "exact_reference",  # the exact (fp64) reference at a divergence (values, JSON)
        "experiment",       # specs and results (values)
        "culprit_report",   # the culprit report's JSON
        "schema",           # the result fields, declared once
        "provenance",       # where and with what
        "command_line",     # the batchlens-cli command of a spec
        "plan",             # engines, comparisons, step counts
        "divergence",       # first divergence
        "stepper",          # free / lockstep ticks
        "comparator",       # per-tick comparisons
        "kernel_capture",   # recording kernel provenance
        "runner",           # run_experiment
    ],
    "analysis": [
        "story",            # the headline and its clauses
        "kernel_evidence",  # kernel lines of a divergence
        "summary",          # summary text and JSON
        "culprit",          # the culprit finder
        "causes",           # a mixed batch's causes told apart (re-runs)
        "exact",            # an op's exact (fp64) reference
        "repro",            # minimal repro export
        "explain",          # a run and what it explains (causes, exact reference)
        "sweep_spec",       # sweeps: spec, items, seeds, prompt files
        "sweep_records",    # sweeps: rows, the record folder, running, resume
        "sweep_merge",      # sweeps: validation, shards, merge
        "sweep_stats",      # sweeps: statistics per group and batch size
        "sweep_report",     # sweeps: text and JSON
        "sweep_slurm",      # sweeps: Slurm job array scripts
    ],
}
VARIANT = re.compile(r"_(cuda|none)$")


def includes(path):
    return INCLUDE.findall(path.read_text(encoding="utf-8", errors="replace"))


def files(folder):
    base = ROOT / folder
    return sorted(p for p in base.rglob("*") if p.suffix in SOURCES) if base.exists() else []


def torch_reaching(header, seen):
    """The chain by which a project header reaches LibTorch, or None."""
    if header in seen:
        return None
    seen.add(header)
    path = ROOT / header
    if not path.exists():
        return None
    for inc in includes(path):
        if TORCH.match(inc):
            return [header, inc]
        if inc.startswith("core/"):
            chain = torch_reaching(inc, seen)
            if chain:
                return [header] + chain
    return None


def unit_of(path):
    return VARIANT.sub("", path.stem)


def unit_loops(module, edges):
    """Each include loop among a module's units, as 'a -> b -> a'."""
    loops, state, stack = [], {}, []

    def visit(u):
        state[u] = "open"
        stack.append(u)
        for v in sorted(edges.get(u, ())):
            if state.get(v) == "open":
                loops.append(" -> ".join(stack[stack.index(v):] + [v]))
            elif v not in state:
                visit(v)
        stack.pop()
        state[u] = "done"

    for u in sorted(edges):
        if u not in state:
            visit(u)
    return [f"core/{module}: include loop between units {loop}" for loop in loops]


def check_units(problems):
    edges = {}  # module -> unit -> units it includes
    for f in files("core"):
        rel = f.relative_to(ROOT)
        if len(rel.parts) <= 2:
            continue
        module, unit = rel.parts[1], unit_of(f)
        order = UNIT_ORDER.get(module)
        if order is not None and unit not in order:
            problems.append(f"{rel}: unit '{unit}' is not declared in UNIT_ORDER['{module}'] "
                            "(tools/check_layers.py)")
        for inc in includes(f):
            m = UNIT_INCLUDE.match(inc)
            if not m or m.group(1) != module or m.group(2) == unit:
                continue
            edges.setdefault(module, {}).setdefault(unit, set()).add(m.group(2))
            if order is not None and unit in order and \
                    (m.group(2) not in order or order.index(m.group(2)) > order.index(unit)):
                problems.append(f"{rel}: unit '{unit}' includes {inc}, declared after it in "
                                f"UNIT_ORDER['{module}'] (an include running back up)")
    for module in sorted(edges):
        problems.extend(unit_loops(module, edges[module]))


def check_header_comments(problems):
    for folder in ("core", "ui", "app"):
        for f in files(folder):
            if f.suffix not in (".h", ".hpp"):
                continue
            lines = f.read_text(encoding="utf-8", errors="replace").splitlines()
            body = [ln for ln in lines if not ln.startswith("// SPDX-License-Identifier")]
            if not body or not body[0].startswith("//"):
                problems.append(f"{f.relative_to(ROOT)}: no opening comment saying what the unit "
                                "is for")


def main():
    problems = []
    check_units(problems)
    check_header_comments(problems)
    for f in files("core"):
        rel = f.relative_to(ROOT)
        module = rel.parts[1] if len(rel.parts) > 2 else None
        if module is not None and module not in CORE_MODULES:
            problems.append(f"{rel}: core module '{module}' is not in CORE_MODULES "
                            "(tools/check_layers.py, docs/adr/0003-core-modules.md)")
        for inc in includes(f):
            m = CORE_INCLUDE.match(inc)
            if m and module in CORE_MODULES and m.group(1) != module and \
                    m.group(1) not in CORE_MODULES[module]:
                problems.append(f"{rel}: core module '{module}' includes {inc} "
                                f"('{module}' may include: "
                                f"{', '.join(sorted(CORE_MODULES[module])) or 'nothing'})")
            if QT.match(inc):
                problems.append(f"{rel}: core includes Qt header <{inc}>")
            if inc.startswith(("ui/", "app/")):
                problems.append(f"{rel}: core includes {inc}")
    for f in files("ui"):
        rel = f.relative_to(ROOT)
        for inc in includes(f):
            if inc.startswith("app/"):
                problems.append(f"{rel}: ui includes {inc}")
            if f.suffix in (".h", ".hpp"):
                if TORCH.match(inc):
                    problems.append(f"{rel}: ui header includes LibTorch <{inc}>")
                elif inc.startswith("core/"):
                    chain = torch_reaching(inc, set())
                    if chain:
                        problems.append(f"{rel}: ui header reaches LibTorch via "
                                        + " -> ".join(chain))
    for p in problems:
        print("layer violation:", p)
    print(f"check_layers: {len(files('core')) + len(files('ui')) + len(files('app'))} files, "
          f"{len(problems)} violations")
    return 1 if problems else 0


if __name__ == "__main__":
    sys.exit(main())
