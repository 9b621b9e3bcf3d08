#!/usr/bin/env python3
# SPDX-License-Identifier: Apache-2.0
"""Times one full block-diffusion canvas of transformers' DiffusionGemma generate (the reference).

Runs model.generate on a checkpoint written by tools/parity/make_reference.py, with BatchLens's
default generation settings (48 denoising steps, t 0.8 -> 0.4, entropy bound 0.1, stability 1,
confidence 0.005), max_new_tokens = canvas_length (one canvas), B = 1 and B = 4 identical rows
of the checkpoint's prompt, after one warm-up generate. Prints and writes JSON with the median
of --reps timings (CUDA events) and the number of denoising steps each generate took.
Usage: bench/reference_canvas_time.py --checkpoint DIR [--reps 3] [--json OUT]
"""
import argparse
import json
import statistics
import sys
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "tools" / "parity"))
import generate_reference as gr  # noqa: E402
import make_reference as mr  # noqa: E402
from safetensors.torch import load_file  # noqa: E402


def main() -> int:
    p = argparse.ArgumentParser()
    p.add_argument("--checkpoint", required=True, type=Path)
    p.add_argument("--experts", default="grouped_mm")
    p.add_argument("--reps", type=int, default=3)
    p.add_argument("--batches", default="1,4")
    p.add_argument("--json", type=Path)
    a = p.parse_args()
    mr.configure_backends()
    device = torch.device("cuda")
    model, _ = gr.build_model(a.checkpoint, a.experts, device)
    preset = json.loads((a.checkpoint / "config.json").read_text())
    canvas = int(preset["canvas_length"])
    prompt = load_file(str(a.checkpoint / "inputs_nosc.safetensors"))["input_ids"][:1].to(device)
    steps = {"n": 0}
    inner = model._denoising_step

    def counted(*args, **kwargs):
        steps["n"] += 1
        return inner(*args, **kwargs)

    model._denoising_step = counted
    result = {"canvas_length": canvas, "batches": {}}
    for b in (int(x) for x in a.batches.split(",")):
        ids = prompt.expand(b, -1).contiguous()

        def run():
            with torch.inference_mode():
                model.generate(input_ids=ids, max_new_tokens=canvas, max_denoising_steps=48,
                               t_min=0.4, t_max=0.8,
                               sampler_config=gr.gdg.EntropyBoundSamplerConfig(entropy_bound=0.1),
                               stability_threshold=1, confidence_threshold=0.005,
                               disable_compile=True)

        run()  # warm-up
        torch.cuda.synchronize()
        samples, counts = [], []
        for _ in range(a.reps):
            steps["n"] = 0
            start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
            start.record()
            run()
            end.record()
            end.synchronize()
            samples.append(start.elapsed_time(end))
            counts.append(steps["n"])
        entry = {"median_ms": statistics.median(samples), "min_ms": min(samples),
                 "samples_ms": samples, "denoising_steps": counts}
        result["batches"][str(b)] = entry
        print(f"reference canvas: B={b}: median {entry['median_ms']:.1f} ms, "
              f"steps {counts}", flush=True)
    if a.json:
        a.json.write_text(json.dumps(result, indent=2))
    return 0


if __name__ == "__main__":
    sys.exit(main())
