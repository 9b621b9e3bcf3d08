#!/usr/bin/env python3
# SPDX-License-Identifier: Apache-2.0
"""Replays a BatchLens generation through transformers' DiffusionGemma `generate` and compares.

Runs on the GPU machine. Input: a checkpoint directory (make_reference.py's output) and the
record of `batchlens-cli generate --checkpoint DIR --record FILE` on it. The reference then runs
`model.generate` on the same prompt and generation settings, with its random draws replaced by
the ones BatchLens recorded:

- `EntropyBoundSampler.initialize_canvas` (canvas start) returns BatchLens's first canvas;
- `torch.multinomial` returns BatchLens's sampled tokens of that step (and the script checks
  that each has non-zero probability under the reference's distribution);
- `EntropyBoundSampler.renoise_canvas` puts BatchLens's next-step canvas at the rejected
  positions (rejected by the REFERENCE's own acceptance mask).

Everything else (decoder, temperature, softmax, argmax, entropy-bound acceptance, stopping,
EOS handling) is the reference's own. Per step it compares the decoder's input canvas, the
argmax canvas, the acceptance mask and the finished flags; at the end the sequences. The
verdict names the first step and field that differ.

A mixed batch (`generate --companions`, issue #35): the record's "prompt" is the left-padded
[B, L] batch with its "attention_mask"; the reference gets both, as a server would pass them
(transformers' generate positions every row from the padded length: only `--positions shared`
has a reference). With `--record-logits` the decoder's raw logits at each canvas's first step
are compared bitwise too (every row).
"""
from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
import make_reference as mr  # noqa: E402  (model construction and checkpoint loading)

import torch  # noqa: E402
from safetensors import safe_open  # noqa: E402
from transformers.models.diffusion_gemma import generation_diffusion_gemma as gdg  # noqa: E402


def log(msg: str = "") -> None:
    print(msg, flush=True)


def die(msg: str) -> None:
    print(f"generate_reference: error: {msg}", file=sys.stderr, flush=True)
    sys.exit(1)


def load_record(path: Path):
    tensors = {}
    with safe_open(str(path), framework="pt") as f:
        meta = f.metadata() or {}
        for key in f.keys():
            tensors[key] = f.get_tensor(key)
    if "prompt" not in tensors or "generation_config" not in meta:
        die(f"{path} is not a batchlens-cli generate --record file")
    return tensors, meta


def build_model(checkpoint: Path, experts: str, device: torch.device):
    preset = json.loads((checkpoint / "config.json").read_text())
    config = mr.build_config(preset)
    mr.set_config_implementations(config, "sdpa", experts)
    params = mr.estimate_text_params(preset.get("text_config") or {})
    on_device = device.type == "cuda" and params > mr.AUTO_DEVICE_BUILD_PARAMS
    model = mr.build_model(config, device, 0, on_device)
    impl = mr.select_implementations(model, experts)
    mr.load_checkpoint_into(model, checkpoint, device)
    mr.sync_encoder_with_decoder(model)
    model.eval()
    return model, impl


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--checkpoint", required=True, type=Path)
    p.add_argument("--record", required=True, type=Path, help="batchlens-cli generate --record file")
    p.add_argument("--experts", choices=("grouped_mm", "eager"), default="grouped_mm")
    p.add_argument("--device", default="cuda")
    p.add_argument("--json", type=Path, help="write the comparison here")
    args = p.parse_args(argv)

    device = torch.device(args.device)
    backends = mr.configure_backends()
    ours, meta = load_record(args.record)
    gc = json.loads(meta["generation_config"])
    batch = int(meta.get("batch", "1"))
    mixed = "attention_mask" in ours
    if mixed and meta.get("positions", "shared") != "shared":
        die("transformers' generate positions a padded batch from its padded length: only a "
            "record of --positions shared has a reference")
    if meta.get("rng") != "per_row" and batch > 1:
        log("note: a shared-RNG batch replays the same way (the draws are recorded per row)")
    model, impl = build_model(args.checkpoint, args.experts, device)
    log(f"reference: torch {torch.__version__}, {impl}, backends {backends}")

    state = {"canvas": -1, "step": 0, "min_prob": 1.0, "missing": []}
    ref_steps = []
    ref_logits = {}  # canvas -> the reference's raw logits at its first step

    def recorded(canvas: int, step: int, field: str):
        return ours.get(f"c{canvas}.s{step}.{field}")

    orig_init = gdg.EntropyBoundSampler.initialize_canvas
    orig_multinomial = torch.multinomial

    def fake_init(self, batch_size, device):
        state["canvas"] += 1
        state["step"] = 0
        t = recorded(state["canvas"], 1, "canvas_in")
        if t is None:  # the reference runs a canvas BatchLens did not: nothing to replay
            state["missing"].append(f"canvas {state['canvas']} start")
            return orig_init(self, batch_size, device)
        return t.to(device)

    def fake_renoise(self, accepted_canvas, cur_step):
        nxt = recorded(state["canvas"], state["step"] + 1, "canvas_in")
        if nxt is None:  # BatchLens stopped here: this step's renoise is never used
            nxt = orig_init(self, accepted_canvas.shape[0], accepted_canvas.device)
        return torch.where(~self.accepted_token_mask, nxt.to(accepted_canvas.device), accepted_canvas)

    def fake_multinomial(probs, num_samples, *a, **k):
        state["step"] += 1
        t = recorded(state["canvas"], state["step"], "sampled")
        if t is None:
            state["missing"].append(f"canvas {state['canvas']} step {state['step']} draws")
            return orig_multinomial(probs, num_samples, *a, **k)
        idx = t.reshape(-1, 1).to(probs.device)
        state["min_prob"] = min(state["min_prob"], float(probs.gather(1, idx).min()))
        return idx

    orig_step = model._denoising_step

    def traced_step(*a, **kw):
        canvas_in = kw["current_canvas"].clone()
        if state["step"] == 0 and "decoder_forward" in kw:  # the canvas's first step
            forward = kw["decoder_forward"]

            def capture(*fa, **fk):
                out = forward(*fa, **fk)
                ref_logits[state["canvas"]] = out.logits.detach().cpu()
                return out
            kw["decoder_forward"] = capture
        out = orig_step(*a, **kw)
        ref_steps.append({
            "canvas": state["canvas"], "step": state["step"],
            "canvas_in": canvas_in.cpu(), "argmax": out[1].cpu(),
            "accepted": kw["sampler"].accepted_token_mask.cpu(), "finished": out[3].cpu(),
        })
        return out

    gdg.EntropyBoundSampler.initialize_canvas = fake_init
    gdg.EntropyBoundSampler.renoise_canvas = fake_renoise
    torch.multinomial = fake_multinomial
    model._denoising_step = traced_step
    try:
        with torch.inference_mode():
            prompt = ours["prompt"].to(device)
            extra = {}
            if mixed:  # left-padded rows and their mask, as given
                extra["attention_mask"] = ours["attention_mask"].to(device).bool()
            else:
                prompt = prompt.expand(batch, -1).contiguous()
            out = model.generate(
                input_ids=prompt, **extra,
                max_new_tokens=int(gc["max_new_tokens"]),
                max_denoising_steps=int(gc["max_denoising_steps"]),
                sampler_config=gdg.EntropyBoundSamplerConfig(
                    entropy_bound=float(gc["sampler_config"]["entropy_bound"])),
                t_min=float(gc["t_min"]), t_max=float(gc["t_max"]),
                stability_threshold=int(gc["stability_threshold"]),
                confidence_threshold=float(gc["confidence_threshold"]),
                eos_token_id=list(gc["eos_token_id"]), pad_token_id=int(gc["pad_token_id"]),
                disable_compile=True, return_dict_in_generate=True)
    finally:
        torch.multinomial = orig_multinomial
        gdg.EntropyBoundSampler.initialize_canvas = orig_init
    sequences = (out.sequences if hasattr(out, "sequences") else out).cpu()

    # ---- compare
    first = None
    rows = []
    ours_steps = sorted({(int(k.split(".")[0][1:]), int(k.split(".")[1][1:]))
                         for k in ours if k.startswith("c")})
    for r in ref_steps:
        c, s = r["canvas"], r["step"]
        row = {"canvas": c, "step": s}
        for field in ("canvas_in", "argmax", "accepted", "finished"):
            mine = recorded(c, s, field)
            if mine is None:
                row[field] = "missing in BatchLens"
            else:
                theirs = r[field].to(torch.int64)
                mine = mine.to(torch.int64).reshape(theirs.shape)
                diff = int((mine != theirs).sum())
                row[field] = diff
                if diff and first is None:
                    first = f"canvas {c} step {s}: {field} differs at {diff} of {theirs.numel()} positions"
        rows.append(row)
    if first is None and len(ref_steps) != len(ours_steps):
        first = f"step counts differ: reference {len(ref_steps)}, BatchLens {len(ours_steps)}"
    logit_rows = []
    for c in sorted(ref_logits):
        mine = recorded(c, 1, "logits")
        if mine is None:
            continue
        theirs = ref_logits[c]
        same_dtype = mine.dtype == theirs.dtype
        rows_equal = [bool(torch.equal(mine[r].float(), theirs[r].float()))
                      for r in range(theirs.shape[0])] if mine.shape == theirs.shape else []
        logit_rows.append({"canvas": c, "dtype": f"{mine.dtype} / {theirs.dtype}",
                           "rows_bitwise_equal": rows_equal,
                           "max_abs_diff": float((mine.float() - theirs.float()).abs().max())
                           if mine.shape == theirs.shape else None})
        if first is None and (not same_dtype or not rows_equal or not all(rows_equal)):
            first = f"canvas {c} step 1: raw logits differ (rows equal: {rows_equal})"
    seq_equal = tuple(sequences.shape) == tuple(ours["sequences"].shape) and bool(
        torch.equal(sequences, ours["sequences"]))
    if first is None and not seq_equal:
        first = "final sequences differ"
    verdict = "IDENTICAL" if first is None else f"DIFFERENT (first: {first})"

    log(f"steps: reference {len(ref_steps)}, BatchLens {len(ours_steps)}")
    log("| canvas | step | canvas_in | argmax | accepted | finished |")
    log("|---|---|---|---|---|---|")
    for row in rows:
        log(f"| {row['canvas']} | {row['step']} | {row['canvas_in']} | {row['argmax']} | "
            f"{row['accepted']} | {row['finished']} |")
    log(f"(cells: positions that differ)  min reference probability of a BatchLens draw: {state['min_prob']:.3g}")
    if state["missing"]:
        log(f"not replayable (reference ran past BatchLens): {state['missing'][:5]}")
    for row in logit_rows:
        log(f"canvas {row['canvas']} step 1 raw logits ({row['dtype']}): rows bitwise equal "
            f"{row['rows_bitwise_equal']}, max |diff| {row['max_abs_diff']}")
    if mixed:
        log(f"mixed batch: rows padded {[int((~m.bool()).sum()) for m in ours['attention_mask']]}")
    log(f"final sequences equal: {seq_equal}")
    log(f"GENERATE PARITY: {verdict}")
    if args.json:
        args.json.write_text(json.dumps({
            "verdict": verdict, "steps": rows, "sequences_equal": seq_equal,
            "first_step_logits": logit_rows, "mixed": mixed,
            "min_draw_probability": state["min_prob"], "missing": state["missing"],
            "implementations": impl, "torch": torch.__version__,
        }, indent=2) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
