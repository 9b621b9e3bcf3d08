#!/usr/bin/env python3
# SPDX-License-Identifier: Apache-2.0
"""Enforces BatchLens's layering (docs/STYLE.md of the design card):

* core/ never includes Qt, ui/ or app/ headers;
* ui/ headers never include LibTorch (ATen, c10, torch) - ui/*.cpp may;
* ui/ never includes app/;
* the core headers that ui/ and app/ include are themselves free of LibTorch;
* inside core/, a module includes only the modules CORE_MODULES allows (docs/adr/0003-core-modules.md
  has the picture); a new module must be added there.

Exits 1 and lists every violation; 0 when clean.
"""
import pathlib
import re
import sys

ROOT = pathlib.Path(__file__).resolve().parent.parent
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
    "io": {"base", "experiment", "text"},
}
CORE_INCLUDE = re.compile(r"^core/([a-z_]+)/")


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


def main():
    problems = []
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
