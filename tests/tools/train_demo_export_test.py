#!/usr/bin/env python3
# SPDX-License-Identifier: Apache-2.0
"""tools/train_demo/train.py's export keeps its state dict whole through transformers'
save_pretrained, which changes the dict it is given (transformers 5.17 left none of its keys,
and the parity load after it failed: issue #33). CI trains the port, which never calls
save_pretrained; this test gives the export's helper a model whose save_pretrained empties and
rewrites its argument, as the H200 run's did. Run by CTest (tests/CMakeLists.txt)."""
import pathlib
import sys
import tempfile
import unittest

sys.path.insert(0, str(pathlib.Path(__file__).resolve().parents[2] / "tools" / "train_demo"))
import train  # noqa: E402


class DestructiveModel:
    """save_pretrained as far as the export sees it: writes config.json, then takes the tied
    and renamed keys out of the dict it was given."""

    def __init__(self):
        self.saved_keys = None

    def save_pretrained(self, folder, state_dict):
        (pathlib.Path(folder) / "config.json").write_text("{}", encoding="utf-8")
        self.saved_keys = sorted(state_dict)
        for key in list(state_dict):
            state_dict["renamed." + key] = state_dict.pop(key)
        state_dict.clear()


class ExportTest(unittest.TestCase):
    def test_state_dict_survives_save_pretrained(self):
        rounded = {"model.decoder.embed_tokens.weight": [1, 2], "model.norm.weight": [3]}
        before = dict(rounded)
        model = DestructiveModel()
        with tempfile.TemporaryDirectory() as folder:
            train.save_config_only(model, folder, rounded)
            self.assertTrue((pathlib.Path(folder) / "config.json").is_file())
        self.assertEqual(rounded, before)
        self.assertEqual(model.saved_keys, sorted(before))

    def test_a_changed_dict_is_an_error_not_a_silent_export(self):
        class Sharing(DestructiveModel):
            def save_pretrained(self, folder, state_dict):
                rounded.pop("model.norm.weight")  # reaches the caller's dict itself

        rounded = {"model.decoder.embed_tokens.weight": [1, 2], "model.norm.weight": [3]}
        with tempfile.TemporaryDirectory() as folder:
            with self.assertRaisesRegex(RuntimeError, "changed the exported state dict"):
                train.save_config_only(Sharing(), folder, rounded)


if __name__ == "__main__":
    unittest.main()
