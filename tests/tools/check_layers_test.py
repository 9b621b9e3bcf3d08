#!/usr/bin/env python3
# SPDX-License-Identifier: Apache-2.0
"""tools/check_layers.py on small trees made here: it passes a clean tree and fails (exit 1,
naming the files) on an include loop inside a module, an include running back up UNIT_ORDER,
an undeclared unit, a module including one it may not, and a header without its opening
comment. Run by CTest (tests/CMakeLists.txt)."""
import pathlib
import subprocess
import sys
import tempfile
import unittest

CHECK = pathlib.Path(__file__).resolve().parents[2] / "tools" / "check_layers.py"


def write(root, rel, text):
    path = root / rel
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(text, encoding="utf-8")


def header(includes=(), comment="// What this unit is for.\n"):
    return ("// SPDX-License-Identifier: Apache-2.0\n" + comment + "#pragma once\n" +
            "".join(f'#include "{i}"\n' for i in includes))


def source(own, includes=()):
    return "".join(f'#include "{i}"\n' for i in (own,) + tuple(includes))


class CheckLayers(unittest.TestCase):
    def tree(self):
        d = tempfile.TemporaryDirectory()
        self.addCleanup(d.cleanup)
        root = pathlib.Path(d.name)
        # experiment: run_vocabulary <- experiment <- plan; analysis: story <- summary
        write(root, "core/experiment/run_vocabulary.h", header())
        write(root, "core/experiment/experiment.h",
              header(["core/experiment/run_vocabulary.h"]))
        write(root, "core/experiment/plan.h", header(["core/experiment/experiment.h"]))
        write(root, "core/experiment/plan.cpp", source("core/experiment/plan.h"))
        write(root, "core/analysis/story.h", header(["core/experiment/experiment.h"]))
        write(root, "core/analysis/summary.h", header(["core/analysis/story.h"]))
        write(root, "core/model/a.h", header())
        write(root, "core/model/b.h", header(["core/model/a.h"]))
        return root

    def run_check(self, root):
        p = subprocess.run([sys.executable, str(CHECK), "--root", str(root)],
                           capture_output=True, text=True, check=False)
        return p.returncode, p.stdout + p.stderr

    def test_a_clean_tree_passes(self):
        rc, out = self.run_check(self.tree())
        self.assertEqual(rc, 0, out)
        self.assertIn("0 violations", out)

    def test_an_include_running_back_up_the_declared_order_fails(self):
        root = self.tree()
        # experiment.cpp including plan.h: experiment -> plan -> experiment, a loop.
        write(root, "core/experiment/experiment.cpp",
              source("core/experiment/experiment.h", ["core/experiment/plan.h"]))
        rc, out = self.run_check(root)
        self.assertEqual(rc, 1, out)
        self.assertIn("core/experiment/experiment.cpp: unit 'experiment' includes "
                      "core/experiment/plan.h", out)
        self.assertIn("include loop between units experiment -> plan -> experiment", out)

    def test_a_loop_in_a_module_without_declared_order_fails(self):
        root = self.tree()
        write(root, "core/model/a.cpp", source("core/model/a.h", ["core/model/b.h"]))
        rc, out = self.run_check(root)
        self.assertEqual(rc, 1, out)
        self.assertIn("core/model: include loop between units a -> b -> a", out)

    def test_variants_of_a_unit_are_the_unit(self):
        root = self.tree()
        write(root, "core/model/a_cuda.cpp", source("core/model/a.h"))
        write(root, "core/model/a_none.cpp", source("core/model/a.h"))
        rc, out = self.run_check(root)
        self.assertEqual(rc, 0, out)

    def test_an_undeclared_unit_fails(self):
        root = self.tree()
        write(root, "core/analysis/verdict.h", header(["core/analysis/story.h"]))
        rc, out = self.run_check(root)
        self.assertEqual(rc, 1, out)
        self.assertIn("unit 'verdict' is not declared in UNIT_ORDER['analysis']", out)

    def test_a_module_including_one_above_it_fails(self):
        root = self.tree()
        write(root, "core/experiment/plan.cpp",
              source("core/experiment/plan.h", ["core/analysis/story.h"]))
        rc, out = self.run_check(root)
        self.assertEqual(rc, 1, out)
        self.assertIn("core module 'experiment' includes core/analysis/story.h", out)

    def test_a_header_without_its_opening_comment_fails(self):
        root = self.tree()
        write(root, "ui/view.h", header(comment=""))
        rc, out = self.run_check(root)
        self.assertEqual(rc, 1, out)
        self.assertIn("ui/view.h: no opening comment", out)


if __name__ == "__main__":
    unittest.main()
