#!/usr/bin/env python3
# SPDX-License-Identifier: Apache-2.0
"""Checks BatchLens's tokenizer against Hugging Face `tokenizers` (the Rust library) on the
tokenizer.json files BatchLens generates for its presets.

Runs where `tokenizers` is importable (the GPU machine). For each preset it exports the
tokenizer (`batchlens-cli tokenize --preset P --export F`), then encodes and decodes a set of
strings with both and compares ids and text. Exit status 1 when anything differs.

    tools/parity/tokenizer_check.py --cli build/app/batchlens-cli [--presets tiny demo mid]
"""
from __future__ import annotations

import argparse
import subprocess
import sys
import tempfile
from pathlib import Path

try:
    from tokenizers import Tokenizer
except ImportError as exc:  # pragma: no cover
    print(f"tokenizer_check: `tokenizers` is not importable ({exc})", file=sys.stderr)
    sys.exit(1)

SAMPLES = [
    "Write a long essay about Portugal.",
    "the cat sat on the mat",
    "  leading and trailing spaces  ",
    "two\n\nnewlines\nand one",
    "Ol\u00e1, a\u00e7\u00e3o \u2603 \u65e5\u672c \U0001F642",
    "<bos><|turn>user\nhello there<turn|>\n<|turn>model\n<|channel>thought\n<channel|>",
    "<|tool_call>call:f{}<tool_call|><|tool_response>",
    "numbers 0123456789 and punctuation ;:!?\"-()",
    "CamelCase Words And UPPER",
]


def cli(args: list[str]) -> str:
    r = subprocess.run(args, capture_output=True, text=True, check=False)
    if r.returncode != 0:
        raise RuntimeError(f"{' '.join(args)} failed ({r.returncode}): {r.stderr.strip()}")
    return r.stdout


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--cli", required=True)
    p.add_argument("--presets", nargs="+", default=["tiny", "demo", "mid"])
    args = p.parse_args()
    failures = 0
    with tempfile.TemporaryDirectory() as tmp:
        for preset in args.presets:
            path = Path(tmp) / f"{preset}.json"
            cli([args.cli, "tokenize", "--preset", preset, "--export", str(path)])
            hf = Tokenizer.from_file(str(path))
            for s in SAMPLES:
                theirs = hf.encode(s, add_special_tokens=False).ids
                ours = [int(x) for x in cli([args.cli, "tokenize", "--tokenizer", str(path), s]).strip().split(",") if x]
                ok = ours == theirs
                text_ours = cli([args.cli, "tokenize", "--tokenizer", str(path), "--decode",
                                 ",".join(map(str, theirs))])[:-1]
                text_theirs = hf.decode(theirs, skip_special_tokens=False)
                ok_text = text_ours == text_theirs
                failures += (not ok) + (not ok_text)
                status = "same" if ok and ok_text else "DIFFERENT"
                print(f"{preset:5} {status:9} {len(theirs):3} ids  {s[:40]!r}")
                if not ok:
                    print(f"      ours   {ours[:24]}\n      theirs {theirs[:24]}")
                if not ok_text:
                    print(f"      decode ours {text_ours!r}\n      decode theirs {text_theirs!r}")
    print(f"TOKENIZER PARITY: {'IDENTICAL' if failures == 0 else f'{failures} DIFFERENCES'}")
    return 1 if failures else 0


if __name__ == "__main__":
    sys.exit(main())
