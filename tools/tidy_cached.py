#!/usr/bin/python3
# SPDX-License-Identifier: Apache-2.0
"""clang-tidy over project files, skipping files whose result is known to be clean.

Usage: tools/tidy_cached.py BUILD_DIR FILE...   (tools/run_tidy.sh passes the file list)

A file is skipped when a marker for its key is in the cache. The key is a SHA-256 of:
the file's content; its compile command from BUILD_DIR/compile_commands.json (source and
build paths replaced, so clones and build dirs share results); every .clang-tidy from the
file's directory up to the root; the content of each project header it includes, followed
transitively through #include "..." lines; clang-tidy's version and the versions of the
Debian packages whose headers the code sees. A file that checks clean gets a marker; a file
with findings never does, so it is checked again next time. The cache lives in
$BL_TIDY_CACHE (default ~/.cache/batchlens-tidy); BL_TIDY_NO_CACHE=1 checks everything.
"""
import concurrent.futures
import hashlib
import json
import os
import re
import shlex
import subprocess
import sys
import time

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
PACKAGES = ["clang-tidy-22", "libtorch-dev", "qt6-base-dev", "libqcustomplot-dev", "libhdf5-dev",
            "nlohmann-json3-dev", "libcli11-dev", "libgtest-dev", "libstdc++-12-dev"]
INCLUDE_RE = re.compile(rb'^\s*#\s*include\s*"([^"]+)"', re.M)


def sha(data):
    return hashlib.sha256(data).hexdigest()


def read(path):
    with open(path, "rb") as f:
        return f.read()


# clang-tidy 22 skips the declarations of system headers (LibTorch, Qt, CLI11) that 14 matched
# against every check: 2-3x faster on this code (issue #31). BL_CLANG_TIDY picks another.
TIDY = os.environ.get("BL_CLANG_TIDY", "clang-tidy-22")

# The static analyzer's budget per top-level function: 75,000 exploded-graph nodes (clang's
# "shallow" value; "deep", the default, is 225,000). The functions that exhaust the deep budget
# took two thirds of this step's time on the 2-core CI (core/analysis/culprit.cpp: 26 s in all,
# 4 s of it parsing; 12 s with this budget), and the step was the longest of a CI run that went
# over its 45 minutes on an AVX2-only VM (docs/build.md). Set as `clang-analyzer-max-nodes` in
# .clang-tidy's CheckOptions it changed nothing (measured): it goes on the command line.
ANALYZER_ARGS = ["--extra-arg=-Xclang", "--extra-arg=-analyzer-config",
                 "--extra-arg=-Xclang", "--extra-arg=max-nodes=75000"]


def environment_key():
    version = subprocess.run([TIDY, "--version"], capture_output=True).stdout
    pkgs = subprocess.run(["dpkg-query", "-W", "-f", "${Package} ${Version}\\n"] + PACKAGES,
                          capture_output=True).stdout
    return sha(version + b"\0" + pkgs)


def project_headers(path, build, seen):
    """Project files reached from `path` through quoted includes, into `seen` (path -> digest)."""
    for inc in INCLUDE_RE.findall(read(path)):
        inc = inc.decode()
        for base in (os.path.dirname(path), ROOT, build):
            cand = os.path.normpath(os.path.join(base, inc))
            if os.path.isfile(cand):
                if cand not in seen:
                    seen[cand] = sha(read(cand))
                    project_headers(cand, build, seen)
                break


def without_pch(args):
    """A compile command without CMake's precompiled header (-include .../cmake_pch.hxx)."""
    out = []
    skip = False
    for i, a in enumerate(args):
        if skip:
            skip = False
            continue
        if a == "-include" and i + 1 < len(args) and "cmake_pch" in args[i + 1]:
            skip = True
            continue
        if a == "-Winvalid-pch" or (a.startswith("-include") and "cmake_pch" in a):
            continue
        # clang-tidy 22 has no omp.h of its own (Debian's libomp-22-dev); the GEMM's OpenMP
        # pragmas are then ignored, the code around them still checked.
        if a == "-fopenmp":
            continue
        out.append(a)
    return out


UNITY_RE = re.compile(r"/Unity/unity_\d+_cxx\.cxx$")
UNITY_INCLUDE_RE = re.compile(r'^#include "([^"]+)"', re.M)


def without_unity(entries):
    """The database with each unity batch (a unity build's Unity/unity_N_cxx.cxx, which
    #includes its target's sources) replaced by one entry per source it includes, compiled with
    the batch's command: clang-tidy checks every file on its own, as in a build without unity."""
    out = []
    for entry in entries:
        path = os.path.normpath(os.path.join(entry["directory"], entry["file"]))
        if not UNITY_RE.search(path):
            out.append(entry)
            continue
        with open(path, encoding="utf-8") as f:
            sources = UNITY_INCLUDE_RE.findall(f.read())
        for source in sources:
            args = [source if a in (entry["file"], path) else a for a in entry["arguments"]]
            out.append({"directory": entry["directory"], "file": source, "arguments": args})
    return out


def tidy_configs(path):
    parts = []
    d = os.path.dirname(path)
    while True:
        cfg = os.path.join(d, ".clang-tidy")
        if os.path.isfile(cfg):
            parts.append(os.path.relpath(cfg, ROOT) + ":" + sha(read(cfg)))
        if d == ROOT or len(d) <= 1:
            break
        d = os.path.dirname(d)
    return parts


def main():
    if len(sys.argv) < 3:
        print(__doc__, file=sys.stderr)
        return 2
    build = os.path.abspath(sys.argv[1])
    files = [os.path.abspath(f) for f in sys.argv[2:]]
    commands = {}
    entries = json.load(open(os.path.join(build, "compile_commands.json")))
    for entry in entries:
        entry["arguments"] = without_pch(entry.get("arguments") or shlex.split(entry["command"]))
        entry.pop("command", None)
    entries = without_unity(entries)
    for entry in entries:
        path = os.path.normpath(os.path.join(entry["directory"], entry["file"]))
        # The key leaves out the object file (a unity batch's name, which moves as files are
        # added) and names the file itself <file>.
        args = entry["arguments"]
        key_args = [a for i, a in enumerate(args) if a != "-o" and (i == 0 or args[i - 1] != "-o")]
        commands[path] = (shlex.join(key_args).replace(path, "<file>")
                          .replace(build, "<build>").replace(ROOT, "<src>"))
    # clang-tidy reads the database without GCC's precompiled header (clang would take the
    # .gch for its own format): every file is checked as it includes what it uses.
    database = os.path.join(build, "tidy")
    os.makedirs(database, exist_ok=True)
    with open(os.path.join(database, "compile_commands.json"), "w") as f:
        json.dump(entries, f)
    cache = os.environ.get("BL_TIDY_CACHE") or os.path.expanduser("~/.cache/batchlens-tidy")
    use_cache = os.environ.get("BL_TIDY_NO_CACHE", "0") != "1"
    os.makedirs(cache, exist_ok=True)
    env_key = environment_key()

    keys = {}
    todo = []
    for f in files:
        seen = {}
        project_headers(f, build, seen)
        parts = [env_key, os.path.relpath(f, ROOT), sha(read(f)), commands.get(f, "no command"),
                 " ".join(ANALYZER_ARGS)]
        parts += tidy_configs(f)
        parts += sorted(os.path.relpath(h, ROOT).replace(os.path.relpath(build, ROOT), "<build>")
                        + ":" + d for h, d in seen.items())
        keys[f] = sha("\n".join(parts).encode())
        if not (use_cache and os.path.exists(os.path.join(cache, keys[f][:2], keys[f]))):
            todo.append(f)
    # The largest files first (the slowest to check, roughly): a long one started last would
    # leave the other jobs idle at the end.
    todo.sort(key=lambda f: -os.path.getsize(f))

    def check(f):
        t0 = time.monotonic()
        p = subprocess.run([TIDY, "-p", database, "--quiet", *ANALYZER_ARGS, f], capture_output=True)
        out = p.stdout.decode(errors="replace")
        clean = p.returncode == 0 and not re.search(r"(warning|error):", out)
        return f, clean, out, time.monotonic() - t0

    bad = []
    jobs = int(os.environ.get("BL_TIDY_JOBS", os.cpu_count() or 1))
    with concurrent.futures.ThreadPoolExecutor(max_workers=jobs) as pool:
        for f, clean, out, secs in pool.map(check, todo):
            rel = os.path.relpath(f, ROOT)
            if clean:
                marker = os.path.join(cache, keys[f][:2], keys[f])
                os.makedirs(os.path.dirname(marker), exist_ok=True)
                open(marker, "w").close()
                print(f"  clean {rel} ({secs:.1f} s)")
            else:
                bad.append(rel)
                print(out, end="")
                print(f"  FINDINGS {rel} ({secs:.1f} s)")
    cached = len(files) - len(todo)
    print(f"run_tidy: {len(files)} files, {cached} clean from the cache ({cache}), "
          f"{len(todo)} checked, {len(bad)} with findings")
    if bad:
        print("run_tidy: clang-tidy found problems in " + " ".join(bad), file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
