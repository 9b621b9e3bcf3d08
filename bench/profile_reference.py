#!/usr/bin/env python3
# SPDX-License-Identifier: Apache-2.0
"""Where the decoder forward's GPU time goes, and what the experts' GEMMs could cost (issue #7).

Runs on the GPU machine (PyTorch + transformers 5.17). BatchLens's engine launches the same ATen
ops as transformers (bitwise parity requires it), so the reference's kernel profile is BatchLens's
kernel profile. For one preset it

1. builds the seeded random model on the device (tools/parity/make_reference.py's helpers);
2. profiles the decoder forward with self-conditioning at each --batch (torch.profiler, CUDA
   kernels, summed per kernel name and per op) and prints the tables;
3. for a few decoder layers, takes the experts' real inputs (a forward hook) and times the
   grouped GEMMs of transformers' grouped_mm_experts_forward against variants that read the same
   weights in another layout or launch other kernels, and says for each whether its output is
   bitwise equal to the reference's (`--experts-variants`).

    python3 bench/profile_reference.py --config resources/models/26b-a4b.json --batch 1 4
"""
from __future__ import annotations

import argparse
import json
import statistics
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "tools" / "parity"))
sys.path.insert(0, str(Path(__file__).resolve().parent))

import torch  # noqa: E402
import torch.nn.functional as F  # noqa: E402

import make_reference as mr  # noqa: E402
from cuda_timing import graph_ms  # noqa: E402


def log(msg: str = "") -> None:
    print(msg, flush=True)


def kernel_table(prof, limit: int) -> list:
    rows = {}
    for evt in prof.events():
        dev = getattr(evt, "device_type", None)
        if dev is None or "CUDA" not in str(dev):
            continue
        name = evt.name
        entry = rows.setdefault(name, [0.0, 0])
        entry[0] += evt.device_time_total if hasattr(evt, "device_time_total") else evt.cuda_time_total
        entry[1] += 1
    total = sum(v[0] for v in rows.values())
    ordered = sorted(rows.items(), key=lambda kv: -kv[1][0])
    log(f"  kernels: {len(rows)} distinct, {sum(v[1] for v in rows.values())} launches, {total / 1000:.3f} ms summed")
    for name, (us, count) in ordered[:limit]:
        log(f"  {us / 1000:9.3f} ms {100 * us / max(total, 1e-9):5.1f}% {count:6d}x  {name[:150]}")
    return [{"name": n, "us": v[0], "count": v[1]} for n, v in ordered]


def profile_decoder(model, prompt1, canvas1, b: int, sc_args, reps: int, limit: int) -> dict:
    from torch.profiler import ProfilerActivity, profile

    prompt = prompt1[:1].repeat(b, 1)
    canvas = canvas1[:1].repeat(b, 1)
    with torch.inference_mode():
        cache = model.model.encoder(input_ids=prompt).past_key_values
        first = model(past_key_values=cache, decoder_input_ids=canvas)
        sc, _ = mr.self_conditioning_logits(first.logits, *sc_args)
        del first

        def fwd():
            return model(past_key_values=cache, decoder_input_ids=canvas, self_conditioning_logits=sc)

        eager = mr.time_ms(fwd, 3, 10)["median"]
        log(f"B={b}: reference decoder forward (SC) eager {eager:.3f} ms")
        try:
            replay = graph_ms(lambda: fwd(), reps=10)
            log(f"B={b}: reference decoder forward (SC) as a CUDA graph {replay:.3f} ms")
        except Exception as exc:  # noqa: BLE001 - the reference may not be capturable
            replay = None
            log(f"B={b}: reference not capturable as a CUDA graph: {type(exc).__name__}: {exc}")
        torch.cuda.synchronize()
        with profile(activities=[ProfilerActivity.CPU, ProfilerActivity.CUDA]) as prof:
            for _ in range(reps):
                fwd()
            torch.cuda.synchronize()
        log(f"B={b}: kernel time per forward, {reps} forwards profiled:")
        table = kernel_table(prof, limit)
        try:
            log(prof.key_averages().table(sort_by="self_cuda_time_total", row_limit=limit, max_name_column_width=60))
        except Exception as exc:  # noqa: BLE001
            log(f"  op table unavailable: {exc}")
    return {"eager_ms": eager, "graph_ms": replay, "kernels": table[:60], "reps": reps}


def experts_inputs(model, prompt1, canvas1, layers) -> dict:
    captured = {}
    handles = []
    decoder = model.model.decoder
    for i in layers:
        def hook(module, args, kwargs, i=i):
            hs, idx, w = (list(args) + [kwargs.get(k) for k in ("hidden_states", "top_k_index", "top_k_weights")])[:3]
            captured[i] = (hs.detach().clone(), idx.detach().clone(), w.detach().clone())
        handles.append(decoder.layers[i].experts.register_forward_pre_hook(hook, with_kwargs=True))
    with torch.inference_mode():
        cache = model.model.encoder(input_ids=prompt1[:1]).past_key_values
        model(past_key_values=cache, decoder_input_ids=canvas1[:1])
    for h in handles:
        h.remove()
    return captured


def experts_variants(model, captured: dict) -> dict:
    """The grouped GEMMs of grouped_mm_experts_forward (ref: transformers integrations/moe.py)."""
    report = {}
    decoder = model.model.decoder
    for i, (hs, idx, w) in captured.items():
        experts = decoder.layers[i].experts
        E = experts.num_experts
        with torch.inference_mode():
            k = idx.size(-1)
            ids = idx.reshape(-1)
            ids_g, perm = torch.sort(ids)
            x = hs[perm // k]  # [S, H] bf16
            counts = torch.histc(ids_g.int(), bins=E, min=0, max=E - 1)
            offs = torch.cumsum(counts, dim=0, dtype=torch.int32)
            c = counts.to("cpu").tolist()
            log(f"layer {i}: {x.shape[0]} rows over {E} experts: min {min(c):.0f}, median "
                f"{statistics.median(c):.0f}, max {max(c):.0f}, empty {sum(1 for v in c if v == 0)}")
            gu = experts.gate_up_proj  # [E, 2I, H]
            dn = experts.down_proj  # [E, H, I]
            inter = torch.empty(x.shape[0], dn.shape[-1], dtype=x.dtype, device=x.device).normal_()
            entry = {}
            for label, weight, inp in (("gate_up", gu, x), ("down", dn, inter)):
                ref = F.grouped_mm(inp, weight.transpose(-2, -1), offs=offs)
                nbytes = weight.numel() * weight.element_size()
                res = {"weight_GB": nbytes / 1e9}
                t = graph_ms(lambda: F.grouped_mm(inp, weight.transpose(-2, -1), offs=offs))
                res["grouped_mm_transposed_view_ms"] = t
                wt = weight.transpose(-2, -1).contiguous()
                out = F.grouped_mm(inp, wt, offs=offs)
                res["grouped_mm_contiguous_equal"] = bool(torch.equal(out, ref))
                res["grouped_mm_contiguous_ms"] = graph_ms(lambda: F.grouped_mm(inp, wt, offs=offs))
                del wt
                bounds = [0] + torch.cumsum(counts, 0).long().to("cpu").tolist()

                def loop_linear():
                    outs = []
                    for e in range(E):
                        s, t_ = int(bounds[e]), int(bounds[e + 1])
                        outs.append(F.linear(inp[s:t_], weight[e]))
                    return torch.cat(outs)

                out = loop_linear()
                res["per_expert_linear_equal"] = bool(torch.equal(out, ref))
                res["per_expert_linear_ms"] = graph_ms(loop_linear)
                copy_dst = torch.empty_like(weight)
                res["weight_copy_ms"] = graph_ms(lambda: copy_dst.copy_(weight))
                res["weight_read_floor_ms"] = res["weight_copy_ms"] / 2
                del copy_dst
                log(f"layer {i} {label}: " + json.dumps(res))
                entry[label] = res
            report[str(i)] = entry
    return report


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--config", required=True, type=Path)
    p.add_argument("--batch", type=int, nargs="+", default=[1, 4])
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--prompt-len", type=int, default=20)
    p.add_argument("--reps", type=int, default=3)
    p.add_argument("--limit", type=int, default=35)
    p.add_argument("--experts-variants", action="store_true")
    p.add_argument("--layers", type=int, nargs="+", default=[0, 5])
    p.add_argument("--json", type=Path)
    args = p.parse_args()
    if not torch.cuda.is_available():
        log("profile_reference: CUDA is not available")
        return 1
    mr.configure_backends()
    preset = json.loads(args.config.read_text())
    config = mr.build_config(preset)
    mr.set_config_implementations(config, "sdpa", "grouped_mm")
    device = torch.device("cuda")
    model = mr.build_model(config, device, args.seed, True)
    mr.select_implementations(model, "grouped_mm")
    mr.perturb_scales(model, args.seed)
    mr.sync_encoder_with_decoder(model)
    tc = config.text_config
    canvas_len = int(getattr(config, "canvas_length", None) or preset.get("canvas_length", 256))
    prompt, canvas = mr.make_inputs(int(tc.vocab_size), args.prompt_len, canvas_len, 1, args.seed,
                                    getattr(config, "image_token_id", None), False)
    prompt, canvas = prompt.to(device), canvas.to(device)
    sc_args = (48, 48, 0.4, 0.8)
    report = {"preset": str(args.config), "torch": torch.__version__, "device": torch.cuda.get_device_name()}
    for b in args.batch:
        report[f"B{b}"] = profile_decoder(model, prompt, canvas, b, sc_args, args.reps, args.limit)
    if args.experts_variants:
        report["experts"] = experts_variants(model, experts_inputs(model, prompt, canvas, args.layers))
    if args.json:
        args.json.write_text(json.dumps(report, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
