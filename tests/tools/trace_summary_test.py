#!/usr/bin/env python3
# SPDX-License-Identifier: Apache-2.0
"""tools/trace_summary.py on small Chrome traces made here: the device's busy time is the union
of its intervals, each named range gets the device time of the kernels its launches started (a
graph launch's kernels share its correlation) and the device's idle time inside it, and a file
that is not a trace is refused with exit status 1. Run by CTest (tests/CMakeLists.txt)."""
import json
import pathlib
import re
import subprocess
import sys
import tempfile
import unittest

TOOL = pathlib.Path(__file__).resolve().parents[2] / "tools" / "trace_summary.py"


def event(cat, name, ts, dur, **args):
    return {"ph": "X", "cat": cat, "name": name, "ts": ts, "dur": dur, "pid": 1, "tid": 1,
            "args": args}


class TraceSummary(unittest.TestCase):
    def run_tool(self, doc):
        with tempfile.TemporaryDirectory() as d:
            path = pathlib.Path(d) / "trace.json"
            path.write_text(doc if isinstance(doc, str) else json.dumps(doc), encoding="utf-8")
            return subprocess.run([sys.executable, str(TOOL), str(path)], capture_output=True,
                                  text=True, check=False)

    def test_ranges_get_their_launches_kernels_and_idle_time(self):
        ms = 1000.0  # trace times are in microseconds
        trace = {"traceEvents": [
            # engine.decode 0..100 ms: one graph launch whose two kernels run 10..60 and 50..90
            event("user_annotation", "engine.decode", 0, 100 * ms),
            event("cuda_runtime", "cudaGraphLaunch", 5 * ms, 3, correlation=1),
            event("kernel", "gemm", 10 * ms, 50 * ms, correlation=1),
            event("kernel", "norm", 50 * ms, 40 * ms, correlation=1),
            # engine.sample 100..300 ms: one kernel 250..300, so 150 ms idle inside it
            event("user_annotation", "engine.sample", 100 * ms, 200 * ms),
            event("cuda_runtime", "cudaLaunchKernel", 110 * ms, 2, correlation=2),
            event("kernel", "softmax", 250 * ms, 50 * ms, correlation=2),
            event("cpu_op", "aten::item", 120 * ms, 170 * ms),
        ]}
        done = self.run_tool(trace)
        self.assertEqual(done.returncode, 0, done.stderr)
        out = done.stdout
        # busy: the union [10, 90) + [250, 300) = 130 ms of a 300 ms span
        self.assertIn("span 0.300 s; device busy 0.130 s (3 kernels", out)
        rows = {m.group(1): [float(x) for x in m.group(2).split()]
                for m in re.finditer(r"^\s+(engine\.\w+)\s+(.*)$", out, re.M)}
        # count, wall, device time of its launches, idle during it
        self.assertEqual(rows["engine.decode"], [1, 0.1, 0.09, 0.02])
        self.assertEqual(rows["engine.sample"], [1, 0.2, 0.05, 0.15])
        self.assertIn("50.00       1  gemm", out)
        self.assertIn("170.00       1  aten::item", out)

    def test_times_are_summed_in_the_units_printed(self):
        ms = 1000.0
        trace = {"traceEvents": [
            event("user_annotation", "engine.sample", 0, 2000 * ms),
            event("cuda_runtime", "cudaLaunchKernel", 1, 1, correlation=7),
            event("kernel", "softmax", 500 * ms, 1000 * ms, correlation=7),
        ]}
        done = self.run_tool(trace)
        self.assertEqual(done.returncode, 0, done.stderr)
        self.assertIn("span 2.000 s; device busy 1.000 s (1 kernels", done.stdout)
        line = next(l for l in done.stdout.splitlines() if l.strip().startswith("engine.sample"))
        count, wall, device, idle = (float(x) for x in line.split()[1:])
        self.assertEqual((count, wall, device, idle), (1, 2.0, 1.0, 1.0))
        self.assertIn("1000.00       1  softmax", done.stdout)

    def test_a_file_that_is_not_a_trace_is_refused(self):
        for doc in ("not json", {"traceEvents": []}, [1, 2]):
            done = self.run_tool(doc)
            self.assertEqual(done.returncode, 1, doc)
            self.assertIn("trace_summary:", done.stderr)


if __name__ == "__main__":
    unittest.main()
