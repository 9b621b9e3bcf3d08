#!/usr/bin/env python3
# SPDX-License-Identifier: Apache-2.0
"""Trains BatchLens's `demo-trained` model: a small DiffusionGemma (transformers'
DiffusionGemmaForBlockDiffusion, the architecture BatchLens runs) on the King James Bible.

  prepare   corpus from Debian's bible-kjv (installed when missing) + BPE tokenizer -> WORK/
  train     block-diffusion training, resumable (WORK/state.pt); --smoke: a tiny config, a few
            steps, on the CPU in seconds
  export    bf16 model.safetensors (released key layout) + config + tokenizer + generation
            config -> OUT/, then samples at B=1 through transformers' generate
  check-tokenizer   our encoder == Hugging Face `tokenizers` on the corpus (where installed)

The objective is the model's own: a clean prompt (the chat template around one verse) is encoded
causally into the KV cache; the canvas after it (the next verse and <turn|>, pads after it)
is corrupted by replacing each token, with probability t ~ U(0, 1) per example, by a token drawn
uniformly from the whole vocabulary (uniform-state diffusion: no mask token, as the sampler's
initial canvas and renoise); cross-entropy on every canvas position (--loss-positions; the
first runs counted the corrupted ones only, and their model never learnt to keep a right token).
Self-conditioning is trained the two-pass way: for half of the examples a first no-grad pass,
whose logits (temperature-scaled as the sampler's are) are fed back as self_conditioning_logits.
Every batch is drawn from a generator seeded by (seed, step), so a resumed run sees the same
batches as an uninterrupted one.
"""

import argparse
import contextlib
import json
import math
import os
import random
import re
import shutil
import subprocess
import sys
import time

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)
import bpe  # noqa: E402

EOS, TURN_END, PAD, BOS = 1, 106, 0, 2
VOCAB = 4096
CANVAS = 32
MAX_CANVASES = 3  # answers longer than this many canvases are left out


# ---------------------------------------------------------------- corpus and tokenizer

def dump_kjv():
    """The King James Bible as (book, chapter, verse, text), from Debian's `bible` program."""
    if shutil.which("bible") is None:
        sudo = [] if os.geteuid() == 0 else ["sudo", "-n"]
        print("installing Debian's bible-kjv (the corpus) ...", flush=True)
        subprocess.run(sudo + ["apt-get", "install", "-y", "-q", "bible-kjv"], check=True)
    text = subprocess.run(["bible", "-l100000", "Gen1:1-Rev22:21"], check=True,
                          capture_output=True, text=True).stdout
    verses = []
    book = chapter = None
    for line in text.splitlines():
        m = re.match(r"^(\S.*) (\d+)$", line)
        if m:
            book, chapter = m.group(1), int(m.group(2))
            continue
        m = re.match(r"^\s+(\d+) (.+)$", line)
        if m:
            verses.append((book, chapter, int(m.group(1)), m.group(2).strip()))
    if len(verses) != 31102:
        raise SystemExit("expected the 31102 verses of the KJV, got %d" % len(verses))
    return verses


def chat_prompt(user):
    """The Gemma chat template (non-thinking) exactly as BatchLens builds it
    (core/text/chat_template.cpp)."""
    return ("<bos><|turn>user\n" + user.strip() + "<turn|>\n<|turn>model\n"
            "<|channel>thought\n<channel|>")


def held_out(chapter_index):
    """One chapter in 40 is held out (never trained on) for the held-out loss."""
    return chapter_index % 40 == 17


def by_chapter(verses):
    """(chapter index over the whole Bible, first verse of its chapter?, verse) per verse."""
    index, prev = -1, None
    for v in verses:
        first = (v["book"], v["chapter"]) != prev
        if first:
            index, prev = index + 1, (v["book"], v["chapter"])
        yield index, first, v


def write_atomic(path, text):
    """`text` to `path` through a temporary file beside it: never half a file."""
    tmp = path + ".tmp"
    with open(tmp, "w", encoding="utf-8") as f:
        f.write(text)
    os.replace(tmp, path)


def prepare(args):
    work = args.work
    os.makedirs(work, exist_ok=True)
    corpus = os.path.join(work, "kjv.jsonl")
    if args.corpus_only or not os.path.exists(corpus) or shutil.which("bible") is not None:
        verses = dump_kjv()
        write_atomic(corpus, "".join(
            json.dumps({"book": b, "chapter": c, "verse": v, "text": t}) + "\n"
            for b, c, v, t in verses))
        if args.corpus_only:
            print("corpus: %d verses -> %s" % (len(verses), corpus))
            return
    else:
        # A machine without Debian's bible-kjv (the GPU server): the corpus dumped elsewhere.
        with open(corpus, encoding="utf-8") as f:
            verses = [(v["book"], v["chapter"], v["verse"], v["text"])
                      for v in map(json.loads, f)]
        if len(verses) != 31102:
            raise SystemExit("%s: expected the 31102 verses of the KJV, got %d" %
                             (corpus, len(verses)))
    texts = [t for _, _, _, t in verses] + ["user", "model", "thought", "system"] * 1000
    tok = bpe.train(texts, VOCAB, progress=lambda n, v: print("  %d merges" % n, flush=True))
    write_atomic(os.path.join(work, "tokenizer.json"), tok.to_json())
    n = sum(len(tok.encode(t)) for t in texts[:31102])
    print("corpus: %d verses, %d tokens; tokenizer: %d ids, %d merges -> %s" %
          (len(verses), n, tok.vocab_size(), len(tok.merges), work))


def load_work(work):
    with open(os.path.join(work, "tokenizer.json"), encoding="utf-8") as f:
        tok = bpe.Bpe.from_json(f.read())
    with open(os.path.join(work, "kjv.jsonl"), encoding="utf-8") as f:
        verses = [json.loads(line) for line in f]
    return tok, verses


def examples(tok, verses):
    """(context ids, canvas target ids, held out) for every canvas of every training pair: the
    user turn is the previous verse (or, for a chapter's first verse, its reference), the answer
    is the verse and <turn|>; a canvas's context is the prompt plus the answer's earlier
    canvases."""
    out = []
    for chapter_index, first, v in by_chapter(verses):
        if first:
            user = "%s %d" % (v["book"], v["chapter"])
        prompt = tok.encode(chat_prompt(user))
        answer = tok.encode(v["text"]) + [TURN_END]
        user = v["text"]
        if len(answer) > CANVAS * MAX_CANVASES:
            continue
        for k in range(0, len(answer), CANVAS):
            target = answer[k:k + CANVAS]
            target += [PAD] * (CANVAS - len(target))
            out.append((prompt + answer[:k], target, held_out(chapter_index)))
    return out


# ---------------------------------------------------------------- model

def model_config(smoke):
    """The demo-trained architecture: DiffusionGemma's layout (5 sliding + 1 full attention
    layer, a dense MLP beside 8 experts, top-2), sized to 9.1 M
    parameters (18.3 MB in bf16; with the tokenizer the bundle stays under 20 MB)."""
    text = {
        "attention_bias": False, "attention_dropout": 0.0, "bos_token_id": BOS,
        "eos_token_id": EOS, "final_logit_softcapping": 30.0, "global_head_dim": 128,
        "head_dim": 64, "hidden_activation": "gelu_pytorch_tanh", "hidden_size": 256,
        "initializer_range": 0.02, "intermediate_size": 384,
        "layer_types": ["sliding_attention"] * 5 + ["full_attention"],
        "max_position_embeddings": 4096, "model_type": "diffusion_gemma_text",
        "moe_intermediate_size": 128, "num_attention_heads": 4, "num_experts": 8,
        "num_global_key_value_heads": 1, "num_hidden_layers": 6, "num_key_value_heads": 2,
        "pad_token_id": PAD, "rms_norm_eps": 1e-06,
        "rope_parameters": {
            "sliding_attention": {"rope_type": "default", "rope_theta": 10000.0},
            "full_attention": {"rope_type": "proportional", "partial_rotary_factor": 0.25,
                               "rope_theta": 1000000.0}},
        "sliding_window": 128, "tie_word_embeddings": True, "top_k_experts": 2,
        "use_bidirectional_attention": "vision", "vocab_size": VOCAB, "dtype": "bfloat16"}
    if smoke:
        text.update({"hidden_size": 64, "intermediate_size": 96, "moe_intermediate_size": 32,
                     "head_dim": 16, "global_head_dim": 32, "num_experts": 4,
                     "layer_types": ["sliding_attention", "full_attention"],
                     "num_hidden_layers": 2, "sliding_window": 16})  # prompts pass the window
    return {"architectures": ["DiffusionGemmaForBlockDiffusion"], "model_type": "diffusion_gemma",
            "canvas_length": CANVAS, "boi_token_id": VOCAB - 3, "image_token_id": VOCAB - 2,
            "eoi_token_id": VOCAB - 1, "eos_token_id": [EOS, TURN_END], "dtype": "bfloat16",
            "initializer_range": 0.02, "tie_word_embeddings": True, "text_config": text}


def generation_config():
    return {"max_new_tokens": 2 * CANVAS, "max_denoising_steps": 48, "t_min": 0.4, "t_max": 0.8,
            "sampler_config": {"_cls_name": "EntropyBoundSamplerConfig", "entropy_bound": 0.1},
            "stability_threshold": 1,
            "confidence_threshold": 0.005, "eos_token_id": [EOS, TURN_END, 50],
            "pad_token_id": PAD, "bos_token_id": BOS}


def transformers_available():
    try:
        import transformers  # noqa: F401
        return hasattr(transformers, "DiffusionGemmaForBlockDiffusion")
    except ImportError:
        return False


def build_model(args, device):
    """transformers' DiffusionGemmaForBlockDiffusion where transformers is installed (the H200
    run), else the plain-PyTorch port in dgemma.py (--backend port; the CI smoke run)."""
    import torch
    torch.manual_seed(args.seed)
    config = model_config(args.smoke)
    if args.backend == "auto":
        args.backend = "transformers" if transformers_available() else "port"
    if args.backend == "transformers":
        from transformers import DiffusionGemmaConfig, DiffusionGemmaForBlockDiffusion
        # 5.17 builds the encoder's vision tower unconditionally: the smallest one that builds
        # (as tools/parity/make_reference.py found). It is never trained (not in the
        # optimizer) and never exported (released_layout).
        config["vision_config"] = {"model_type": "gemma4_vision", "hidden_size": 32,
                                   "intermediate_size": 64, "num_hidden_layers": 1,
                                   "num_attention_heads": 2, "num_key_value_heads": 2,
                                   "head_dim": 16}
        cfg = DiffusionGemmaConfig.from_dict(config)
        for c in (cfg, cfg.text_config):
            c._attn_implementation = "sdpa"
            c._experts_implementation = "eager"
        model = DiffusionGemmaForBlockDiffusion(cfg)
    else:
        import dgemma
        model = dgemma.DiffusionGemmaPort(config)
    return model.to(device=device, dtype=torch.float32)


def forward(model, ctx, canvas, sc_logits=None, sc_mask=None, pad=None):
    """Logits [B, C, V] fp32 of one canvas after a clean prompt, either backend. pad [B]: ctx is
    left-padded (the port only: --fast's fixed-shape batches)."""
    if getattr(model, "is_port", False):
        return model(input_ids=ctx, decoder_input_ids=canvas, self_conditioning_logits=sc_logits,
                     self_conditioning_mask=sc_mask, prompt_pad=pad)
    # transformers: the encoder must write the cache the decoder reads, also in training mode
    return model(input_ids=ctx, decoder_input_ids=canvas, self_conditioning_logits=sc_logits,
                 self_conditioning_mask=sc_mask, use_cache=True).logits


# ---------------------------------------------------------------- training

class Batches:
    """Batches of one context length (no padding anywhere: the encoder sees a clean prompt as
    at B=1). Step s draws from a generator seeded by (seed, s)."""

    def __init__(self, exs):
        self.exs = exs
        self.by_len = {}
        for i, (ctx, _, _) in enumerate(exs):
            self.by_len.setdefault(len(ctx), []).append(i)

    def draw(self, rng, size):
        first = rng.randrange(len(self.exs))
        pool = self.by_len[len(self.exs[first][0])]
        return [self.exs[first]] + [self.exs[rng.choice(pool)] for _ in range(size - 1)]


# --fast: contexts are left-padded to a multiple of this (--bucket). Each width is a shape of its
# own: on CUDA a captured graph each, ~8 s of warm-up and capture apiece (the H100's 10,000-step
# call spent 125 s on 11 of them). Padding of the KJV canvases' contexts (mean 56 tokens) per
# width: 16 -> 11 shapes, 14 %; 24 -> 8, 21 %; 32 -> 6, 29 %; 48 -> 4, 38 %.
BUCKET = 16


class BucketBatches:
    """--fast's batches: fixed shapes, on the GPU. Every context is left-padded to the next
    multiple of `width` (--bucket, default BUCKET; the port masks the pad positions and counts positions from the first
    real token: the same logits as unpadded, tests/tools/train_demo_test.cpp); a batch is drawn
    from one bucket. Step s: the bucket and the first example from the step's Python generator,
    the rest as indices drawn on the device from its torch generator, gathered into `out` (a
    graph's static inputs) without a copy from the host."""

    def __init__(self, torch, exs, device, width=BUCKET):
        if width < 1:
            raise SystemExit("--bucket must be at least 1, not %d" % width)
        groups = {}
        for ctx, tgt, _ in exs:
            groups.setdefault(-(-len(ctx) // width) * width, []).append((ctx, tgt))
        self.pools = {}
        self.order = []  # (bucket, index in it) of every example, as Batches counts them
        for length, members in sorted(groups.items()):
            ctx = torch.zeros(len(members), length, dtype=torch.long)
            pad = torch.zeros(len(members), dtype=torch.long)
            for k, (c, _) in enumerate(members):
                ctx[k, length - len(c):] = torch.tensor(c)
                pad[k] = length - len(c)
                self.order.append((length, k))
            tgt = torch.tensor([t for _, t in members])
            self.pools[length] = (ctx.to(device), pad.to(device), tgt.to(device))

    def lengths(self):
        return sorted(self.pools)

    def draw(self, torch, rng, gen, size, out_for=None):
        """(ctx [B, L], pad [B], target [B, C]) of the step; into out_for(L) when given."""
        length, first = self.order[rng.randrange(len(self.order))]
        return self.gather(torch, length, first, gen, size,
                           out_for(length) if out_for else None)

    def gather(self, torch, length, first, gen, size, out=None):
        ctx, pad, tgt = self.pools[length]
        rest = torch.randint(0, ctx.shape[0], (size - 1,), generator=gen, device=ctx.device)
        pick = torch.cat([rest.new_full((1,), first), rest])
        if out is None:
            return ctx.index_select(0, pick), pad.index_select(0, pick), tgt.index_select(0, pick)
        for pool, dst in zip((ctx, pad, tgt), out):
            torch.index_select(pool, 0, pick, out=dst)
        return out


class GraphedSteps:
    """--fast on CUDA: the whole training step (the no-grad self-conditioning pass, the pass
    with gradients, backward, clipping, fused AdamW) captured once per context bucket as a CUDA
    graph and replayed; the step's batch, noise and learning rate are written into the graph's
    static inputs first. One launch per step instead of ~6,000 (the step was host-bound:
    310 ms of host time for 70 ms of GPU work, issue #33). The warm-up steps that capturing
    needs are undone (parameters and optimizer state restored), so a graphed run trains on the
    same batches and noise as an eager one."""

    def __init__(self, torch, model, opt, params, batches, batch, autocast, positions="all"):
        self.torch, self.model, self.opt, self.params = torch, model, opt, params
        self.positions = positions
        self.autocast = autocast
        self.graphs = {}
        dev = next(model.parameters()).device
        saved = [p.detach().clone() for p in params]
        state = {id(p): {k: v.clone() for k, v in opt.state[p].items()
                         if torch.is_tensor(v)} for p in params if p in opt.state}
        t0 = time.time()
        inputs = {}
        gen = torch.Generator(device=dev)
        gen.manual_seed(0)
        for length in batches.lengths():
            # Static inputs, filled with real examples of the bucket for the warm-up.
            static = [torch.empty(batch, length, dtype=torch.long, device=dev),
                      torch.empty(batch, dtype=torch.long, device=dev),
                      torch.empty(batch, CANVAS, dtype=torch.long, device=dev)]
            batches.gather(torch, length, 0, gen, batch, static)
            noise = draw_noise(torch, gen, batch, CANVAS, VOCAB, True, dev)
            inputs[length] = (static, noise)
        # Seconds per bucket: the two warm-up steps (compilation included) and the capture.
        self.warm_seconds, self.graph_seconds = {}, {}
        side = torch.cuda.Stream()
        side.wait_stream(torch.cuda.current_stream())
        with torch.cuda.stream(side):
            for length, (static, noise) in inputs.items():
                t = time.time()
                for _ in range(2):
                    opt.zero_grad(set_to_none=True)
                    self.body(static, noise)
                side.synchronize()
                self.warm_seconds[length] = time.time() - t
        torch.cuda.current_stream().wait_stream(side)
        pool = None
        for length, (static, noise) in inputs.items():
            t = time.time()
            graph = torch.cuda.CUDAGraph()
            opt.zero_grad(set_to_none=True)
            with torch.cuda.graph(graph, pool=pool):
                loss = self.body(static, noise)
            pool = graph.pool()
            self.graphs[length] = (graph, static, noise, loss)
            torch.cuda.synchronize()
            self.graph_seconds[length] = time.time() - t
        with torch.no_grad():
            for p, v in zip(params, saved):
                p.copy_(v)
            for p in params:
                for k, v in opt.state[p].items():
                    if torch.is_tensor(v):
                        v.copy_(state[id(p)][k]) if id(p) in state else v.zero_()
        torch.cuda.synchronize()
        self.capture_seconds = time.time() - t0

    def body(self, static, noise):
        torch = self.torch
        ctx, pad, tgt = static
        with self.autocast(cache_enabled=False):
            loss = diffusion_loss(torch, self.model, ctx, tgt, noise, masked_mean=True, pad=pad,
                                  positions=self.positions)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(self.params, 1.0, foreach=True)
        self.opt.step()
        return loss.detach()

    def step(self, batches, rng, gen, batch):
        """One training step: returns its loss (a device tensor of its own)."""
        torch = self.torch
        chosen = []
        static = batches.draw(torch, rng, gen, batch,
                              lambda length: chosen.append(length) or self.graphs[length][1])
        graph, _, noise_in, loss = self.graphs[chosen[0]]
        noise = draw_noise(torch, gen, batch, CANVAS, VOCAB, True, static[0].device)
        for k, v in noise.items():
            noise_in[k].copy_(v)
        graph.replay()
        return loss.clone()


def draw_noise(torch, gen, b, c, vocab, self_cond, device):
    """A step's randomness, drawn before its passes (so that --fast's CUDA graphs take it as an
    input): per example the noise level t ~ U(0, 1) [B, 1], the uniforms u [B, C] that pick the
    corrupted positions, the replacement tokens [B, C]; with self-conditioning the temperature
    [B, 1, 1] of the fed-back logits. Self-conditioning goes to the batch's first half (the
    examples are drawn at random, so that is a random half), and only that half runs the
    no-grad pass: a fixed shape, and half of that pass's work."""
    out = {"t": torch.rand(b, 1, generator=gen, device=device),
           "u": torch.rand(b, c, generator=gen, device=device),
           "tokens": torch.randint(0, vocab, (b, c), generator=gen, device=device)}
    if self_cond:
        out["temp"] = 0.4 + 0.4 * torch.rand(b // 2, 1, 1, generator=gen, device=device)
    return out


def corrupt(torch, target, noise):
    """Uniform-state corruption: per example a noise level t; each position replaced, with
    probability t, by a uniform token over the whole vocabulary; at least one position is
    corrupted. Returns (canvas, corrupted mask)."""
    u = noise["u"]
    # The least u is corrupted too (written without an index_put: the same in a CUDA graph).
    mask = (u < noise["t"]) | (u == u.min(dim=1, keepdim=True).values)
    return torch.where(mask, noise["tokens"], target), mask


LOSS_POSITIONS = ("all", "corrupted")


def diffusion_loss(torch, model, ctx, target, noise, masked_mean=False, pad=None,
                   positions="all", both=False):
    """The step's loss under `noise` (draw_noise; self-conditioning when it has "temp").
    positions: the cross-entropy's mean over every canvas position ("all": the objective, issue
    #33) or over the corrupted ones only (the first runs' objective). Why every position: the
    sampler keeps a token only while the model predicts it with low entropy (the entropy bound),
    and commits the argmax of every position; a model never trained on the clean positions does
    not learn to keep a right token, so its canvas never builds up and the argmax falls back to
    the commonest words ("the the ,,,"). masked_mean: the corrupted mean without selecting them
    (a boolean index waits for the GPU to count them: --fast). pad: ctx is left-padded (--fast).
    both: returns (all, corrupted), the held-out evaluation's pair."""
    import torch.nn.functional as F
    canvas, mask = corrupt(torch, target, noise)
    sc_logits = sc_mask = None
    if "temp" in noise:
        half = noise["temp"].shape[0]
        with torch.no_grad():
            first = forward(model, ctx[:half], canvas[:half],
                            pad=None if pad is None else pad[:half])
        # The sampler feeds the temperature-scaled logits rounded to bf16. [B, C, V] fp32
        sc_logits = torch.zeros(target.shape + (first.shape[-1],), device=first.device)
        sc_logits[:half] = (first.float() / noise["temp"]).to(torch.bfloat16).float()
        sc_mask = torch.arange(target.shape[0], device=target.device) < half
    logits = forward(model, ctx, canvas, sc_logits, sc_mask, pad)
    import dgemma
    each = dgemma.OPS["cross_entropy"](logits, target)  # [B * C] fp32
    weight = mask.flatten().float()
    corrupted = ((each * weight).sum() / weight.sum() if masked_mean or both
                 else F.cross_entropy(logits[mask].float(), target[mask]))
    if both:
        return each.mean(), corrupted
    return each.mean() if positions == "all" else corrupted


def warmup_steps(args, total):
    """--warmup steps, or --warmup-share of the schedule once its length is known."""
    if args.warmup_share is not None and total:
        return max(1, int(args.warmup_share * total))
    return args.warmup


def lr_at(step, total, peak, warmup):
    if step < warmup:
        return peak * (step + 1) / warmup
    p = min(1.0, (step - warmup) / max(1, total - warmup))
    return peak * (0.1 + 0.9 * 0.5 * (1 + math.cos(math.pi * p)))


def held_out_loss(torch, model, batches, device, autocast, count=16, size=128):
    """Mean loss over fixed held-out batches and fixed noise (seeded), self-conditioning off:
    (over every position, over the corrupted positions)."""
    rng = random.Random(1234)
    gen = torch.Generator(device=device)
    gen.manual_seed(1234)
    total = [0.0, 0.0]
    model.eval()
    with torch.no_grad(), autocast():
        for _ in range(count):
            ex = batches.draw(rng, size)
            ctx = torch.tensor([e[0] for e in ex], device=device)
            tgt = torch.tensor([e[1] for e in ex], device=device)
            noise = draw_noise(torch, gen, tgt.shape[0], tgt.shape[1], VOCAB, False, device)
            for i, value in enumerate(diffusion_loss(torch, model, ctx, tgt, noise, both=True)):
                total[i] += float(value)
    model.train()
    return total[0] / count, total[1] / count


def trained_parameters(model):
    """(name, parameter) of what is trained: everything but transformers' vision tower."""
    return [(n, p) for n, p in model.named_parameters()
            if not n.startswith(("model.encoder.vision_tower.", "model.encoder.embed_vision."))]


def param_groups(model):
    """AdamW groups: weight decay 0.1 on matrices (embedding, projections, experts), none on the
    norm gains and router scales (multiplied as they are: decay would pull them to 0)."""
    decay, keep = [], []
    for n, p in trained_parameters(model):
        (keep if p.dim() < 2 else decay).append(p)
    return [{"params": decay, "weight_decay": 0.1}, {"params": keep, "weight_decay": 0.0}]


def deterministic(torch, on):
    """torch.use_deterministic_algorithms(on), which train() runs with (a resumed run equals an
    uninterrupted one), without its debugging aid of filling every new uninitialised tensor with
    NaN (torch.utils.deterministic.fill_uninitialized_memory, on by default since 2.1): one extra
    kernel per allocation, thousands per training step, and no effect on any result that reads
    only what it wrote. On the H100 the deterministic step ran at 23.0 steps/s against 27.5
    without determinism (docs/benchmarks.md); the fills are the suspected part of that gap."""
    torch.use_deterministic_algorithms(on, warn_only=True)
    try:
        import torch.utils.deterministic as fills
    except ImportError:  # PyTorch < 2.1: no fills
        return
    if hasattr(fills, "fill_uninitialized_memory"):
        fills.fill_uninitialized_memory = False


def train(args):
    entered = time.time()  # --max-seconds counts from here: compilation and capture included
    import torch
    deterministic(torch, True)
    device = args.device
    tok, verses = load_work(args.work)
    # The smoke run: Genesis and Exodus (2 held-out chapters), to start in a second.
    exs = examples(tok, verses[:2000] if args.smoke else verses)
    train_b = Batches([e for e in exs if not e[2]])
    held_b = Batches([e for e in exs if e[2]] or exs[:200])
    model = build_model(args, device)
    n_params = sum(p.numel() for _, p in trained_parameters(model))
    # --fast (the H200 run): the port with dense experts, fixed-shape batches drawn on the GPU,
    # the loss without a boolean index, AdamW fused, the host waiting for the GPU only every
    # --log-every steps; on CUDA the whole step as one CUDA graph per context bucket.
    fast = args.fast and getattr(model, "is_port", False)
    cuda = torch.device(device).type == "cuda"
    graphs = fast and cuda and not args.no_graphs
    if fast:
        import dgemma
        kernels = fast_kernels(args, cuda)
        dgemma.set_kernels(model, *kernels)
        print("--fast: experts %s, attention %s, fusion %s" % kernels, flush=True)
        compile_cache = (compile_cache_path(torch, args.work)
                         if cuda and kernels[2] == "compiled" else None)
        if compile_cache:
            load_compile_cache(torch, compile_cache)
        gpu_b = BucketBatches(torch, train_b.exs, device, args.bucket)
    # A graph reads the learning rate from a device tensor (AdamW's capturable form).
    lr0 = torch.tensor(args.lr, device=device) if graphs else args.lr
    opt = torch.optim.AdamW(param_groups(model), lr=lr0, betas=(0.9, 0.95),
                            **({"fused": True} if fast and cuda else {}),
                            **({"capturable": True} if graphs else {}))
    state_path = os.path.join(args.work, "state-smoke.pt" if args.smoke else "state.pt")
    log_path = os.path.join(args.work, "log-smoke.jsonl" if args.smoke else "log.jsonl")
    best_path = best_state_path(args)
    step, elapsed, total = 0, 0.0, args.steps
    best = float("inf")  # the lowest held-out loss so far (all positions), its state in best.pt
    if os.path.exists(state_path) and not args.fresh:
        st = torch.load(state_path, map_location=device)
        if st.get("loss_positions", "corrupted") != args.loss_positions:
            raise SystemExit("%s was trained with --loss-positions %s, not %s: --fresh starts "
                             "again" % (state_path, st.get("loss_positions", "corrupted"),
                                        args.loss_positions))
        if fast and st.get("bucket", BUCKET) != args.bucket:
            # Another width draws other batches: the resumed run would not be the run it
            # continues.
            raise SystemExit("%s was trained with --bucket %d, not %d: --fresh starts again"
                             % (state_path, st.get("bucket", BUCKET), args.bucket))
        model.load_state_dict(st["model"])
        opt.load_state_dict(st["opt"])
        if graphs:
            for g in opt.param_groups:
                g["lr"] = lr0
        step, elapsed, total = st["step"], st["elapsed"], st["total"] or total
        print("resumed at step %d of %s (%.0f s trained)" % (step, total, elapsed), flush=True)
        if os.path.exists(best_path):
            kept = torch.load(best_path, map_location="cpu")
            if kept["step"] <= step:
                best = kept["held_out"]
        # Records written after the state was saved (a crash between saves) are run again.
        if os.path.exists(log_path):
            with open(log_path, encoding="utf-8") as f:
                kept = [line for line in f if line.strip() and json.loads(line)["step"] <= step]
            with open(log_path, "w", encoding="utf-8") as f:
                f.writelines(kept)
    elif os.path.exists(log_path):
        os.remove(log_path)
    if best == float("inf") and os.path.exists(best_path):
        os.remove(best_path)  # another run's
    print("%d parameters (%s), %d training / %d held-out canvases, device %s" %
          (n_params, args.backend, len(train_b.exs), len(held_b.exs), device), flush=True)

    def autocast(**kw):
        return torch.autocast(device_type=torch.device(device).type, dtype=torch.bfloat16,
                              enabled=torch.device(device).type == "cuda", **kw)

    def save():
        tmp = state_path + ".tmp"
        torch.save({"model": model.state_dict(), "opt": opt.state_dict(), "step": step,
                    "elapsed": elapsed, "total": total,
                    "loss_positions": args.loss_positions, "bucket": args.bucket}, tmp)
        os.replace(tmp, state_path)

    def keep_if_best(held):
        """The state with the lowest held-out loss so far to best.pt (export's default: a
        schedule that runs past the point where the model starts to overfit keeps its best)."""
        nonlocal best
        if held[0] < best:
            best = held[0]
            tmp = best_path + ".tmp"
            torch.save({"model": {k: v.detach().cpu() for k, v in model.state_dict().items()},
                        "step": step, "held_out": held[0]}, tmp)
            os.replace(tmp, best_path)

    model.train()
    graphed = None
    if graphs:
        graphed = GraphedSteps(torch, model, opt, [p for _, p in trained_parameters(model)],
                               gpu_b, args.batch, autocast, args.loss_positions)
        print("captured %d CUDA graphs (context buckets %s) in %.1f s" % (
            len(graphed.graphs), gpu_b.lengths(), graphed.capture_seconds), flush=True)
        print("  per bucket, warm-up (2 steps) + capture: %s" % ", ".join(
            "%d: %.1f + %.1f s" % (n, graphed.warm_seconds[n], graphed.graph_seconds[n])
            for n in gpu_b.lengths()), flush=True)
        if compile_cache:
            kept = save_compile_cache(torch, compile_cache)
            if kept:
                print("compile cache written: %s (%.1f MB)" % (
                    os.path.basename(compile_cache), kept / 1e6), flush=True)
    start = time.time()
    t10 = None
    log = open(log_path, "a", encoding="utf-8")
    pending = []  # (step, loss on the device, lr) not yet written (--fast)
    base = elapsed

    def flush():
        """Writes the records of the pending steps (one wait for the GPU for all of them)."""
        nonlocal elapsed
        if not pending:
            return
        losses = torch.stack([p[1] for p in pending]).tolist()
        if fast:
            if cuda:
                torch.cuda.synchronize()
            elapsed = base + time.time() - start
        for (st, _, lr, held), value in zip(pending, losses):
            rec = {"step": st, "loss": value, "lr": lr, "seconds": round(elapsed, 2),
                   "total": total}
            if held is not None:
                rec["held_out"], rec["held_out_corrupted"] = held
                print("step %d  loss %.3f  held-out %.3f (corrupted positions %.3f)  %.0f s"
                      % (st, value, held[0], held[1], elapsed), flush=True)
            log.write(json.dumps(rec) + "\n")
        pending.clear()

    while total is None or step < total:
        # The whole invocation (the H100 run of issue #33 spent 125 s compiling and capturing
        # before its first step, and a limit that counted from the loop ran past the call's).
        if time.time() - entered > args.max_seconds or (args.stop_at and step >= args.stop_at):
            break
        if total is None and step == 40:
            # The schedule's length, fixed once from the measured step time (steps 10-40) so
            # that training takes --budget-seconds; stored in state.pt and the log, so a
            # resumed run keeps it and `--steps N` reproduces it.
            flush()
            per_step = (elapsed - t10) / 30 if t10 is not None else elapsed / 40
            # The budget counts from the invocation's start: what compilation and capture took
            # is not left for steps.
            total = int(max(args.budget_seconds - (start - entered), 60.0) / per_step)
            print("schedule: %d steps for a %.0f s budget (%.1f steps/s)"
                  % (total, args.budget_seconds, 1.0 / per_step), flush=True)
        if step == 10:
            flush()
            t10 = elapsed
        t0 = time.time()
        rng = random.Random(args.seed * 1000003 + step)
        gen = torch.Generator(device=device)
        gen.manual_seed(args.seed * 1000003 + step)
        lr = lr_at(step, total or 10**9, args.lr, warmup_steps(args, total))
        if graphed:
            lr0.fill_(lr)
            loss = graphed.step(gpu_b, rng, gen, args.batch)
        else:
            pad = None
            if fast:
                ctx, pad, tgt = gpu_b.draw(torch, rng, gen, args.batch)
            else:
                ex = train_b.draw(rng, args.batch)
                ctx = torch.tensor([e[0] for e in ex], device=device)
                tgt = torch.tensor([e[1] for e in ex], device=device)
            for g in opt.param_groups:
                g["lr"] = lr
            noise = draw_noise(torch, gen, tgt.shape[0], CANVAS, VOCAB, True, device)
            with autocast():
                loss = diffusion_loss(torch, model, ctx, tgt, noise, masked_mean=fast, pad=pad,
                                      positions=args.loss_positions)
            opt.zero_grad(set_to_none=True)
            loss.backward()
            torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
            opt.step()
        step += 1
        if not fast:
            elapsed += time.time() - t0
        held = None
        if step % args.eval_every == 0 or step == total:
            held = held_out_loss(torch, model, held_b, device, autocast,
                                 count=2 if args.smoke else 16, size=16 if args.smoke else 128)
            keep_if_best(held)
        pending.append((step, loss.detach(), lr, held))
        if not fast or held is not None or step % args.log_every == 0:
            flush()
            log.flush()
        if step % args.save_every == 0:
            flush()
            log.flush()
            save()
    flush()
    log.close()
    save()
    print("stopped at step %d of %s (%.0f s trained)" % (step, total, elapsed), flush=True)
    return model, tok


def fast_kernels(args, cuda):
    """(experts, attention, fusion) of --fast: --experts, --attention and --fusion, where
    "auto" is dense experts, the reference's attention (grouped products and
    scaled_dot_product_attention were no faster on the H100, docs/benchmarks.md) and, on a GPU
    with torch.compile, the compiled elementwise pieces."""
    experts, attention, fusion = args.experts, args.attention, args.fusion
    if experts == "auto":
        experts = "dense"
    if attention == "auto":
        attention = "eager"
    if fusion == "auto":
        # torch.compile of the elementwise pieces: 24.75 steps/s against 17.0 on the H100
        # (docs/benchmarks.md), gradients checked in fp32 (cosine 0.99999 to the reference).
        fusion = "compiled" if cuda and hasattr(__import__("torch"), "compile") else "none"
    if fusion == "compiled" and not (cuda and hasattr(__import__("torch"), "compile")):
        raise SystemExit("--fusion compiled needs a GPU and PyTorch >= 2.1")
    return experts, attention, fusion


def compile_cache_path(torch, work):
    """Where --fusion compiled keeps torch.compile's artifacts (PyTorch's mega-cache) between
    invocations: WORK/compile-cache-<torch>-<GPU>.bin. Compiling the elementwise pieces took 76 s
    of the H100's 10,000-step call (the first bucket's warm-up, docs/benchmarks.md); with the
    artifacts of an earlier call inductor's code generation is skipped, and it took 55 s (the
    rest is not in them). Named per PyTorch version and GPU: artifacts of another are never
    offered."""
    gpu = torch.cuda.get_device_name() if torch.cuda.is_available() else "cpu"
    tag = re.sub(r"[^A-Za-z0-9.]+", "_", "%s-%s" % (torch.__version__, gpu)).strip("_")
    return os.path.join(work, "compile-cache-%s.bin" % tag)


def load_compile_cache(torch, path):
    """Hands `path`'s artifacts to torch.compile; True when it took them. PyTorch without the
    mega-cache (< 2.7), no file or artifacts it refuses: False, and compiling happens as
    without."""
    compiler = getattr(torch, "compiler", None)
    if not (os.path.exists(path) and hasattr(compiler, "load_cache_artifacts")):
        return False
    with open(path, "rb") as f:
        data = f.read()
    try:
        compiler.load_cache_artifacts(data)
    except Exception as e:  # noqa: BLE001 - a cache it cannot use is only slower
        print("compile cache %s not used (%s): compiling" % (path, e), flush=True)
        return False
    print("compile cache: %s (%.1f MB)" % (os.path.basename(path), len(data) / 1e6), flush=True)
    return True


def save_compile_cache(torch, path):
    """Writes what torch.compile compiled so far to `path` (a temporary file renamed into place);
    the number of bytes, 0 when there is nothing to write or no mega-cache."""
    compiler = getattr(torch, "compiler", None)
    if not hasattr(compiler, "save_cache_artifacts"):
        return 0
    got = compiler.save_cache_artifacts()
    if not got or not got[0]:
        return 0
    tmp = path + ".tmp"
    with open(tmp, "wb") as f:
        f.write(got[0])
    os.replace(tmp, path)
    return len(got[0])


def kernel_check(torch, model, params, batches, batch, autocast, kernels):
    """One step's loss and gradients with `kernels` against the reference's (the eager expert
    loop, matmul attention) on the same batch and noise: the relative loss difference and the
    cosine of the gradients (bf16 autocast both ways)."""
    import dgemma
    rng = random.Random(99)
    gen = torch.Generator(device=params[0].device)
    gen.manual_seed(99)
    ctx, pad, tgt = batches.draw(torch, rng, gen, batch)
    noise = draw_noise(torch, gen, batch, CANVAS, VOCAB, True, params[0].device)
    out = []
    for k in (("loop", "eager", "none"), kernels):
        dgemma.set_kernels(model, *k)
        for p in params:
            p.grad = None
        with autocast():
            loss = diffusion_loss(torch, model, ctx, tgt, noise, True, pad)
        loss.backward()
        out.append((float(loss.detach()),
                    torch.cat([(p.grad if p.grad is not None else torch.zeros_like(p)).detach()
                               .float().flatten() for p in params])))
        for p in params:
            p.grad = None
    (ref, g_ref), (got, g_got) = out
    cos = float(torch.nn.functional.cosine_similarity(g_ref, g_got, dim=0))
    # The parameters whose gradients agree least (where a kernel's backward goes wrong).
    names = [n for n, _ in trained_parameters(model)]
    worst, at = [], 0
    for name, p in zip(names, params):
        a, b = g_ref[at:at + p.numel()], g_got[at:at + p.numel()]
        at += p.numel()
        if a.norm() > 0 or b.norm() > 0:
            c = float(torch.nn.functional.cosine_similarity(a, b, dim=0))
            worst.append((round(c, 4), name, round(float(b.norm() / (a.norm() + 1e-30)), 4)))
    worst.sort()
    return {"check_loss_rel": round(abs(got - ref) / abs(ref), 6), "check_grad_cos": round(cos, 6),
            "check_worst": worst[:6]}


def check_kernels(args):
    """--fast's kernel variants (--bench-variants) against the reference kernels on one batch of
    --batch: loss and gradients (overall cosine and the parameters that agree least), without
    timing; one JSON line each."""
    import torch
    tok, verses = load_work(args.work)
    exs = [e for e in examples(tok, verses) if not e[2]]
    for variant in args.bench_variants.split(","):
        args.backend = "port"
        model = build_model(args, args.device)
        params = [p for _, p in trained_parameters(model)]
        batches = BucketBatches(torch, exs, args.device, args.bucket)

        def autocast(**kw):
            # fp32 by default: in bf16 the gradients of a fresh model are dominated by rounding
            # (every pair, dense included, agreed to a cosine of 0.13-0.31 on the H100).
            kind = torch.device(args.device).type
            return torch.autocast(device_type=kind, dtype=torch.bfloat16,
                                  enabled=kind == "cuda" and args.check_dtype == "bf16", **kw)

        rec = {"variant": variant, "dtype": args.check_dtype}
        try:
            rec.update(kernel_check(torch, model, params, batches, args.batch, autocast,
                                    tuple(variant.split("/"))))
        except Exception as e:  # noqa: BLE001 (reported)
            rec["error"] = "%s: %s" % (type(e).__name__, str(e).splitlines()[0][:300])
        print(json.dumps(rec), flush=True)


def profile_steps(torch, one, n):
    """Where an eager step's GPU time goes (bench's mode "profile"): the GPU kernels of n steps
    under torch.profiler, per step: their count and time, and the 25 costliest by name."""
    from torch.profiler import ProfilerActivity, profile
    with profile(activities=[ProfilerActivity.CUDA]) as prof:
        for step in range(n):
            one(200 + step)
        torch.cuda.synchronize()
    kernels = {}
    for e in prof.events():
        if getattr(e, "device_type", None) != torch.autograd.DeviceType.CUDA:
            continue
        us = getattr(e, "device_time", None)
        if us is None:
            us = e.cuda_time
        k = kernels.setdefault(e.name[:90], [0, 0.0])
        k[0] += 1
        k[1] += us
    top = sorted(kernels.items(), key=lambda kv: -kv[1][1])
    return {"profile_kernels_per_step": round(sum(c for c, _ in kernels.values()) / n),
            "profile_gpu_ms_per_step": round(sum(t for _, t in kernels.values()) / n / 1e3, 2),
            "profile_top": [[name, round(c / n), round(t / n / 1e3, 3)] for name, (c, t) in
                            top[:25]]}


def bench(args):
    """Training throughput of the port (--fast's step: fixed-shape batches) at each
    --bench-batches size, per --bench-variants kernel pair (experts/attention) and --bench-modes
    (eager steps, CUDA graphs): steps/s, tokens/s (real context and canvas tokens), the model's
    FLOPs per step (torch.utils.flop_counter over steps with the reference kernels: picked
    experts only) and model FLOP utilisation against --peak-tflops; first (--bench-check) the
    variant's loss and gradients against the reference kernels'. The model is fresh and nothing
    is saved. One JSON line per measurement on stdout and in WORK/bench.jsonl."""
    import torch
    from torch.utils.flop_counter import FlopCounterMode
    import dgemma
    device = args.device
    tok, verses = load_work(args.work)
    exs = [e for e in examples(tok, verses) if not e[2]]
    real_tokens = sum(len(e[0]) for e in exs) / len(exs) + CANVAS
    out = open(os.path.join(args.work, "bench.jsonl"), "a", encoding="utf-8")
    name = torch.cuda.get_device_name() if device.startswith("cuda") else "cpu"
    if device.startswith("cuda") and "compiled" in args.bench_variants:
        load_compile_cache(torch, compile_cache_path(torch, args.work))  # as train() does

    def autocast(**kw):
        return torch.autocast(device_type="cuda", dtype=torch.bfloat16, **kw)

    useful = {}  # batch -> the model's FLOPs per step
    checks = {}  # kernel variant -> kernel_check's record
    runs = [(int(b), v.split("/"), m, d) for b in args.bench_batches.split(",")
            for v in args.bench_variants.split(",") for m in args.bench_modes.split(",")
            for d in args.bench_deterministic.split(",")]
    for batch, kernels, mode, mode_on in runs:
        # train() runs deterministic (a resumed run equals an uninterrupted one); "on" measures
        # the step as training takes it, "off" what that costs.
        if mode_on not in ("on", "off"):
            raise SystemExit("--bench-deterministic: on or off, not %r" % mode_on)
        deterministic(torch, mode_on == "on")
        args.backend = "port"
        model = build_model(args, device)
        params = [p for _, p in trained_parameters(model)]
        batches = BucketBatches(torch, exs, device, args.bucket)
        graphs = mode == "graphs"
        lr = torch.tensor(args.lr, device=device)
        opt = torch.optim.AdamW(param_groups(model), lr=lr if graphs else args.lr,
                                betas=(0.9, 0.95), fused=True,
                                **({"capturable": True} if graphs else {}))
        kernels = (kernels + ["none"])[:3]
        rec = {"device": name, "batch": batch, "mode": mode, "experts": kernels[0],
               "attention": kernels[1], "fusion": kernels[2], "torch": torch.__version__,
               "deterministic": mode_on}
        graphed = None

        def one(step):
            rng = random.Random(step)
            gen = torch.Generator(device=device)
            gen.manual_seed(step)
            if graphed:
                return graphed.step(batches, rng, gen, batch)
            ctx, pad, tgt = batches.draw(torch, rng, gen, batch)
            noise = draw_noise(torch, gen, batch, CANVAS, VOCAB, True, device)
            with autocast():
                loss = diffusion_loss(torch, model, ctx, tgt, noise, True, pad)
            opt.zero_grad(set_to_none=True)
            loss.backward()
            torch.nn.utils.clip_grad_norm_(params, 1.0, foreach=True)
            opt.step()
            return loss.detach()

        try:
            if args.bench_check:
                # Once per variant, in every row of it. In fp32: under bf16 rounding dominates
                # a fresh model's gradients.
                if tuple(kernels) not in checks:
                    checks[tuple(kernels)] = kernel_check(
                        torch, model, params, batches, batch,
                        lambda **kw: contextlib.nullcontext(), tuple(kernels))
                rec.update(checks[tuple(kernels)])
            if batch not in useful:
                # The model's FLOPs: the reference kernels' (picked experts only), whatever
                # the variant computes (dense experts compute top_k/E of theirs in vain).
                dgemma.set_kernels(model, "loop", "eager", "none")
                counter = FlopCounterMode(display=False)
                with counter:
                    for step in range(4):
                        one(10**6 + step)
                useful[batch] = counter.get_total_flops() / 4
            rec["model_gflop_per_step"] = round(useful[batch] / 1e9, 1)
            dgemma.set_kernels(model, *kernels)
            t_warm = time.time()
            if graphs:
                graphed = GraphedSteps(torch, model, opt, params, batches, batch, autocast)
                rec["capture_s"] = round(graphed.capture_seconds, 1)
            for step in range(10):
                one(step)
            torch.cuda.synchronize()
            rec["warm_s"] = round(time.time() - t_warm, 1)  # compilation, capture, 10 steps
            n = args.bench_steps
            if mode == "profile":
                rec.update(profile_steps(torch, one, 5))
            t0 = time.time()
            losses = [one(100 + step) for step in range(n)]
            torch.cuda.synchronize()
            seconds = time.time() - t0
            rec.update({"steps": n, "seconds": round(seconds, 2),
                        "steps_per_s": round(n / seconds, 2),
                        "mfu_pct": round(100 * useful[batch] * n / seconds / 1e12
                                         / args.peak_tflops, 2),
                        "tokens_per_s": round(n * batch * real_tokens / seconds),
                        "last_loss": round(float(losses[-1]), 3),
                        "peak_gib": round(torch.cuda.max_memory_allocated() / 2**30, 1)})
        except Exception as e:  # noqa: BLE001 (a measurement that fails is reported)
            rec["error"] = "%s: %s" % (type(e).__name__, str(e).splitlines()[0][:300])
        line = json.dumps(rec)
        print(line, flush=True)
        out.write(line + "\n")
        out.flush()
        model = opt = graphed = None  # the next measurement starts from free memory
        torch.cuda.empty_cache()
        torch.cuda.reset_peak_memory_stats()
    out.close()


# ---------------------------------------------------------------- export and samples

SAMPLE_PROMPTS = ["In the beginning God created the heaven and the earth.",
                  "The LORD is my shepherd; I shall not want.",
                  "Write a long essay about Portugal.",
                  "Blessed are the poor in spirit: for theirs is the kingdom of heaven.",
                  "Tell me about the sea.",
                  "And the king said unto his servants,",
                  "Psalms 23",
                  "What is wisdom?"]


def released_layout(state):
    """The released checkpoint's tensors (spec §7): model.decoder.* and the encoder's
    layer_scalar buffers; the encoder's text weights and lm_head are tied to the decoder's."""
    return {k: v.detach().contiguous().clone() for k, v in state.items()
            if k.startswith("model.decoder.") or re.fullmatch(
                r"model\.encoder\.language_model\.layers\.\d+\.layer_scalar", k)}


def save_config_only(model, folder, rounded):
    """transformers' save_pretrained into `folder` (config.json as a released checkpoint has it)
    with `rounded` as its state dict. save_pretrained changes the dict it is given (5.17 left
    none of its keys for the parity load that follows): it gets a copy, and `rounded` is checked
    whole afterwards (tests/tools/train_demo_export_test.py gives it one that empties its
    argument)."""
    keys = sorted(rounded)
    model.save_pretrained(folder, state_dict=dict(rounded))
    if sorted(rounded) != keys:
        raise RuntimeError("save_pretrained changed the exported state dict")


def best_state_path(args):
    return os.path.join(args.work, "best-smoke.pt" if args.smoke else "best.pt")


def export(args):
    """OUT/: config.json, model.safetensors (bf16, released layout), tokenizer.json,
    generation_config.json; plus OUT/parity/ (fixed prompt/canvas ids and this backend's fp32
    logits of the exported bf16 weights, without and with self-conditioning) for the test that
    runs BatchLens's engine on the same weights."""
    import torch
    import dgemma
    tok, verses = load_work(args.work)
    model = build_model(args, "cpu")
    last = os.path.join(args.work, "state-smoke.pt" if args.smoke else "state.pt")
    path = best_state_path(args) if args.export_state == "best" else last
    if not os.path.exists(path):
        path = last  # a run without a held-out evaluation yet
    st = torch.load(path, map_location="cpu")
    model.load_state_dict(st["model"])
    print("export: the state of step %d (%s)" % (
        st["step"], "lowest held-out loss %.3f" % st["held_out"] if "held_out" in st
        else "the last state"), flush=True)
    tmp = args.out + ".tmp"
    shutil.rmtree(tmp, ignore_errors=True)
    os.makedirs(tmp)
    # Every tensor rounded to bf16 once; the model itself stays fp32 (a .to(bf16) would also
    # round the rotary inv_freq buffers, which a loaded model keeps in fp32).
    rounded = {k: v.to(torch.bfloat16) for k, v in model.state_dict().items()}
    weights = released_layout(rounded)
    if args.backend == "transformers":
        # save_pretrained writes transformers' config.json (per_layer_config and all, what a
        # released checkpoint carries); its tensors are then replaced by the released layout.
        model.config.dtype = model.config.text_config.dtype = torch.bfloat16
        save_config_only(model, tmp, rounded)
    else:
        with open(os.path.join(tmp, "config.json"), "w", encoding="utf-8") as f:
            json.dump(model_config(args.smoke), f, indent=2)
    dgemma.save_safetensors(os.path.join(tmp, "model.safetensors"), weights, {"format": "pt"})
    with open(os.path.join(tmp, "tokenizer.json"), "w", encoding="utf-8") as f:
        f.write(tok.to_json())
    with open(os.path.join(tmp, "generation_config.json"), "w", encoding="utf-8") as f:
        json.dump(generation_config(), f, indent=2)
    if args.backend == "transformers":
        from transformers import DiffusionGemmaForBlockDiffusion
        DiffusionGemmaForBlockDiffusion.from_pretrained(tmp)  # loads what BatchLens loads
    # Parity: the exported (bf16-rounded) weights in fp32, on fixed inputs.
    with torch.no_grad():
        model.load_state_dict({k: v.float() for k, v in rounded.items()})
        model.eval()
        prompt = torch.tensor([tok.encode(chat_prompt(verses[0]["text"]))])
        gen = torch.Generator()
        gen.manual_seed(7)
        canvas = torch.randint(0, VOCAB, (1, CANVAS), generator=gen)
        first = forward(model, prompt, canvas)
        second = forward(model, prompt, canvas, (first / 0.8).to(torch.bfloat16).float())
    sc_logits = (first / 0.8).to(torch.bfloat16).float()
    os.makedirs(os.path.join(tmp, "parity"))
    par = os.path.join(tmp, "parity")
    dgemma.save_safetensors(os.path.join(par, "inputs.safetensors"), {
        "input_ids": prompt, "decoder_input_ids": canvas})
    dgemma.save_safetensors(os.path.join(par, "inputs_sc.safetensors"), {
        "input_ids": prompt, "decoder_input_ids": canvas, "self_conditioning_logits": sc_logits})
    dgemma.save_safetensors(os.path.join(par, "expected.safetensors"), {
        "logits": first, "logits_self_conditioned": second}, {"backend": args.backend})
    texts = [chat_prompt(v["text"]) for v in verses[::97]] + [
        "naïve café ☃ 𝄞 x\n\ny  z", "  leading and trailing  ", "\n\n\n"]
    with open(os.path.join(tmp, "parity", "tokens.jsonl"), "w", encoding="utf-8") as f:
        for t in texts:
            f.write(json.dumps({"text": t, "ids": tok.encode(t)}, ensure_ascii=False) + "\n")
    shutil.rmtree(args.out, ignore_errors=True)
    os.replace(tmp, args.out)
    size = os.path.getsize(os.path.join(args.out, "model.safetensors"))
    print("exported %s (%s backend, model.safetensors %.1f MB)" % (args.out, args.backend,
                                                                   size / 1e6))


def held_out_verses(verses):
    return [v["text"] for index, _, v in by_chapter(verses) if held_out(index)]


def eval_prompts(args):
    """The prompts generated at B=1: SAMPLE_PROMPTS to read, then --eos-prompts held-out verses
    evenly spread, for the share that stops with an EOS within the budget (2 canvases)."""
    _, verses = load_work(args.work)
    held = held_out_verses(verses)
    return SAMPLE_PROMPTS + held[::max(1, len(held) // args.eos_prompts)][:args.eos_prompts]


def report_generations(args, engine, generate):
    """Runs generate(prompt, seed) -> (stop position or -1, text) on eval_prompts, prints the
    samples and the EOS share, writes WORK/samples-ENGINE.json."""
    results = []
    for i, p in enumerate(eval_prompts(args)):
        stop, text = generate(p, i)
        sample = i < len(SAMPLE_PROMPTS)
        results.append({"prompt": p, "seed": i, "eos_at": stop, "text": text, "sample": sample})
        if sample:
            print("[%s] -> %s%s" % (p, text, "" if stop >= 0 else "  (no EOS)"), flush=True)
    held = [r for r in results if not r["sample"]]
    stopped = sum(r["eos_at"] >= 0 for r in held)
    share = stopped / max(1, len(held))
    print("%s, %s: EOS within %d tokens for %d/%d held-out prompts (%.0f %%)" %
          (engine, args.device, 2 * CANVAS, stopped, len(held), 100 * share))
    tok, _ = load_work(args.work)
    quality = quality_table(tok, held, share, os.path.join(args.work, "log.jsonl"))
    write_atomic(os.path.join(args.work, "samples-%s.json" % engine), json.dumps(
        {"engine": engine, "device": args.device, "eos_share": share, "budget": 2 * CANVAS,
         "quality": quality, "results": results}, indent=1))


def longest_run(ids):
    """The most times one token follows itself in a row."""
    best = run = 0
    for i, t in enumerate(ids):
        run = run + 1 if i and t == ids[i - 1] else 1
        best = max(best, run)
    return best


def quality_table(tok, held, eos_share, log_path):
    """The demo model's quality bar (issue #33) on the held-out generations, printed as a table:
    EOS within the budget >= 90 %; distinct-2 (distinct token bigrams / all bigrams, over every
    text) >= 0.5; >= 90 % of the texts without a token more than 3 times in a row; the last
    held-out loss of WORK/log.jsonl (its curve: `plot`). Returns the rows."""
    texts = [tok.encode(r["text"]) for r in held]
    bigrams = [tuple(t[i:i + 2]) for t in texts for i in range(len(t) - 1)]
    distinct2 = len(set(bigrams)) / max(1, len(bigrams))
    no_runs = sum(longest_run(t) <= 3 for t in texts) / max(1, len(texts))
    loss = None
    if os.path.exists(log_path):
        with open(log_path, encoding="utf-8") as f:
            held_losses = [json.loads(line).get("held_out") for line in f if line.strip()]
        held_losses = [h for h in held_losses if h is not None]
        loss = held_losses[-1] if held_losses else None
    rows = [("EOS within %d tokens" % (2 * CANVAS), eos_share, ">= 0.90", eos_share >= 0.9),
            ("distinct-2", distinct2, ">= 0.50", distinct2 >= 0.5),
            ("no token > 3x in a row", no_runs, ">= 0.90", no_runs >= 0.9)]
    print("| measure (%d held-out prompts) | value | bar | met |" % len(held))
    print("|---|---|---|---|")
    for name, value, bar, met in rows:
        print("| %s | %.2f | %s | %s |" % (name, value, bar, "yes" if met else "**no**"))
    print("| held-out loss (last eval) | %s | (curve: loss.png) | |" %
          ("%.3f" % loss if loss is not None else "n/a"))
    return [{"measure": n, "value": v, "bar": b, "met": m} for n, v, b, m in rows] + [
        {"measure": "held-out loss", "value": loss}]


def samples(args):
    """B=1 generations through transformers' own generate."""
    import torch
    from transformers import DiffusionGemmaForBlockDiffusion
    tok, _ = load_work(args.work)
    model = DiffusionGemmaForBlockDiffusion.from_pretrained(args.out, dtype=torch.bfloat16)
    model = model.to(args.device).eval()

    def generate(prompt, seed):
        ids = torch.tensor([tok.encode(chat_prompt(prompt))], device=args.device)
        torch.manual_seed(seed)
        out = model.generate(input_ids=ids, max_new_tokens=2 * CANVAS)
        seq = out.sequences[0, ids.shape[1]:].tolist()  # sequences include the prompt
        stop = next((j for j, t in enumerate(seq) if t in (EOS, TURN_END, 50)), -1)
        return stop, tok.decode(seq[:stop + 1] if stop >= 0 else seq, skip_special=True)

    report_generations(args, "transformers", generate)


def evaluate(args):
    """The same through BatchLens's engine (`batchlens-cli generate --json`, B=1, this machine's
    CPU by default)."""
    model = ["--checkpoint", args.out] if os.path.isdir(args.out) else ["--preset", args.out]

    def generate(prompt, seed):
        run = subprocess.run([args.cli, "generate", *model, "--device", args.device,
                              "--prompt", prompt, "--gen-seed", str(seed), "--json"],
                             capture_output=True, text=True)
        if run.returncode != 0:
            raise SystemExit("batchlens-cli generate failed: " + run.stderr[-2000:])
        row = json.loads(run.stdout)["rows"][0]
        return row["stop_position"], row["text"]

    report_generations(args, "batchlens", generate)


def plot(args):
    """WORK/loss.png: training loss (smoothed) and held-out loss against step, from log.jsonl."""
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    with open(os.path.join(args.work, "log-smoke.jsonl" if args.smoke else "log.jsonl"),
              encoding="utf-8") as f:
        log = [json.loads(line) for line in f if line.strip()]
    steps = [r["step"] for r in log]
    losses = [r["loss"] for r in log]
    k = max(1, len(losses) // 200)
    smooth = [sum(losses[max(0, i - k):i + 1]) / len(losses[max(0, i - k):i + 1])
              for i in range(len(losses))]
    held = [(r["step"], r["held_out"]) for r in log if "held_out" in r]
    fig, ax = plt.subplots(figsize=(8, 4.5), dpi=120)
    ax.plot(steps, losses, color="#c8d6e5", linewidth=0.6, label="training batch")
    ax.plot(steps, smooth, color="#2e86de", linewidth=1.5, label="training (mean of %d)" % k)
    ax.plot([h[0] for h in held], [h[1] for h in held], "o-", color="#ee5253", markersize=3,
            label="held-out chapters")
    corrupted = [(r["step"], r["held_out_corrupted"]) for r in log if "held_out_corrupted" in r]
    if corrupted:
        ax.plot([h[0] for h in corrupted], [h[1] for h in corrupted], "s--", color="#8e44ad",
                markersize=3, label="held-out, corrupted positions only")
    ax.set_xlabel("step (batch of %d canvases)" % args.batch)
    ax.set_ylabel("cross-entropy (nats): every position%s" %
                  ("" if corrupted else " (old runs: corrupted positions)"))
    ax.set_title("demo-trained: block-diffusion training on the KJV (%.0f s on %s)" %
                 (log[-1]["seconds"], args.device_name))
    ax.grid(alpha=0.3)
    ax.legend()
    fig.tight_layout()
    out = os.path.join(args.work, "loss.png")
    fig.savefig(out)
    print("wrote %s (%d steps, last held-out %.3f)" % (out, steps[-1], held[-1][1] if held
                                                       else float("nan")))


def check_port(args):
    """dgemma.py's port on an export's weights and parity inputs gives the logits the exporting
    backend computed (on the H200: transformers' own, so the port the CI runs is checked against
    the reference there)."""
    import torch
    import dgemma
    with open(os.path.join(args.out, "config.json"), encoding="utf-8") as f:
        config = json.load(f)
    port = dgemma.DiffusionGemmaPort(config)
    weights = dgemma.load_safetensors(os.path.join(args.out, "model.safetensors"))
    state = port.state_dict()
    missing = sorted(set(state) - set(weights))
    if missing:
        raise SystemExit("the export lacks %d of the port's tensors, e.g. %s" %
                         (len(missing), missing[:3]))
    port.load_state_dict({k: weights[k].float() for k in state})
    port.eval()
    par = os.path.join(args.out, "parity")
    inputs = dgemma.load_safetensors(os.path.join(par, "inputs_sc.safetensors"))
    expected = dgemma.load_safetensors(os.path.join(par, "expected.safetensors"))
    with torch.no_grad():
        got = {"logits": forward(port, inputs["input_ids"], inputs["decoder_input_ids"]),
               "logits_self_conditioned": forward(port, inputs["input_ids"],
                                                  inputs["decoder_input_ids"],
                                                  inputs["self_conditioning_logits"])}
    worst = max(float((got[k] - expected[k]).abs().max()) for k in got)
    print("port vs the exporting backend's logits: max |diff| %.3g (logits up to %.3g)" %
          (worst, float(expected["logits"].abs().max())))
    if worst > 1e-3:
        raise SystemExit(1)


def check_tokenizer(args):
    from tokenizers import Tokenizer
    tok, verses = load_work(args.work)
    hf = Tokenizer.from_file(os.path.join(args.work, "tokenizer.json"))
    texts = [chat_prompt(v["text"]) for v in verses[::7]] + ["naïve café ☃ 𝄞 x\n\ny  z"]
    bad = [t for t in texts if hf.encode(t, add_special_tokens=False).ids != tok.encode(t)]
    print("tokenizer parity with HF tokenizers: %d/%d texts identical" %
          (len(texts) - len(bad), len(texts)))
    for t in bad[:3]:
        print("  differs:", repr(t[:80]), hf.encode(t).ids[:20], tok.encode(t)[:20])
    if bad:
        raise SystemExit(1)


def main():
    ap = argparse.ArgumentParser(description=__doc__,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("command", choices=["prepare", "train", "export", "samples", "evaluate",
                                        "plot", "check-tokenizer", "check-port", "bench",
                                        "check-kernels"])
    ap.add_argument("--work", default=os.path.join(HERE, "..", "..", ".train_demo"),
                    help="corpus, tokenizer, state.pt, log.jsonl (default: .train_demo/)")
    ap.add_argument("--out", default=None, help="export folder (default: WORK/demo-trained)")
    ap.add_argument("--device", default="cuda")
    ap.add_argument("--backend", choices=["auto", "transformers", "port"], default="auto",
                    help="the model class: transformers' (where installed) or dgemma.py's port")
    ap.add_argument("--smoke", action="store_true",
                    help="tiny config, few steps, CPU-sized: checks the pipeline in seconds")
    ap.add_argument("--fresh", action="store_true", help="ignore WORK/state.pt")
    ap.add_argument("--corpus-only", action="store_true",
                    help="prepare: only dump the corpus to WORK/kjv.jsonl (a machine without "
                         "bible-kjv then trains the tokenizer from it)")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--steps", type=int, default=None,
                    help="total steps of the schedule (default: as many as --budget-seconds "
                         "allows, measured over steps 10-40)")
    ap.add_argument("--budget-seconds", type=float, default=840,
                    help="training time the schedule is sized for (default 840 = 14 min)")
    ap.add_argument("--max-seconds", type=float, default=1e9,
                    help="stop (resumably) after this long in this invocation (counted from its "
                         "start: model build, compilation and CUDA-graph capture included)")
    ap.add_argument("--stop-at", type=int, default=None,
                    help="stop (resumably) after this step (tests resuming)")
    ap.add_argument("--batch", type=int, default=None)
    ap.add_argument("--lr", type=float, default=2e-3)
    ap.add_argument("--warmup", type=int, default=300)
    ap.add_argument("--warmup-share", type=float, default=None,
                    help="warm-up as a share of the schedule's steps (e.g. 0.03); wins over "
                         "--warmup once the schedule's length is fixed")
    ap.add_argument("--fast", action="store_true",
                    help="GPU training of the port: grouped or dense experts, fused attention, "
                         "batches drawn on the GPU, "
                         "no host sync per step (the H200 run)")
    ap.add_argument("--no-graphs", action="store_true",
                    help="--fast on CUDA without CUDA graphs (eager steps; for comparison)")
    ap.add_argument("--bench-batches", default="256,1024",
                    help="bench: the batch sizes measured")
    ap.add_argument("--bench-steps", type=int, default=100, help="bench: timed steps each")
    ap.add_argument("--bench-variants", default="dense/eager,grouped/eager,grouped/sdpa",
                    help="bench: EXPERTS/ATTENTION[/FUSION] kernel variants measured")
    ap.add_argument("--bench-modes", default="eager,graphs",
                    help="bench: eager steps, CUDA-graphed steps (graphs), eager steps whose "
                         "kernels are profiled first (profile)")
    ap.add_argument("--bench-deterministic", default="off",
                    help="bench: torch.use_deterministic_algorithms per row, on and/or off "
                         "(train runs with it on), e.g. on,off")
    ap.add_argument("--peak-tflops", type=float, default=989.0,
                    help="bench: the GPU's dense bf16 peak for model FLOP utilisation "
                         "(H100 and H200 SXM: 989)")
    ap.add_argument("--bench-check", type=int, default=1,
                    help="bench: check each variant's loss and gradients against the "
                         "reference kernels first (1) or not (0)")
    ap.add_argument("--check-dtype", choices=["fp32", "bf16"], default="fp32",
                    help="check-kernels: compare in fp32 (a wrong backward shows) or under bf16 "
                         "autocast (as training runs)")
    ap.add_argument("--experts", choices=["auto", "loop", "dense", "grouped"], default="auto",
                    help="--fast: the expert kernel (auto: dense; grouped: torch grouped_mm "
                         "products of the picked pairs)")
    ap.add_argument("--attention", choices=["auto", "eager", "sdpa"], default="auto",
                    help="--fast: the attention kernel (auto: the reference's matmuls; sdpa: "
                         "scaled_dot_product_attention)")
    ap.add_argument("--fusion", choices=["auto", "none", "compiled"], default="auto",
                    help="--fast: the elementwise pieces (RMSNorm, rotation, gate, softcap, "
                         "loss) eager (none; auto) or each fused by torch.compile (compiled)")
    ap.add_argument("--bucket", type=int, default=BUCKET,
                    help="--fast: contexts are left-padded to a multiple of this (default %d); "
                         "each multiple is one captured CUDA graph" % BUCKET)
    ap.add_argument("--log-every", type=int, default=50,
                    help="--fast: steps between waits for the GPU (log records are written then)")
    ap.add_argument("--eval-every", type=int, default=250)
    ap.add_argument("--loss-positions", choices=LOSS_POSITIONS, default="all",
                    help="train: the cross-entropy over every canvas position (default) or only "
                    "the corrupted ones (the first runs' objective)")
    ap.add_argument("--save-every", type=int, default=500)
    ap.add_argument("--export-state", choices=["best", "last"], default="best",
                    help="export: the state with the lowest held-out loss (best.pt, default) or "
                         "the last one (state.pt)")
    ap.add_argument("--device-name", default="an NVIDIA H200", help="plot: where it trained")
    ap.add_argument("--eos-prompts", type=int, default=48,
                    help="held-out verses the EOS share is measured on")
    ap.add_argument("--cli", default=os.path.join(HERE, "..", "..", "build", "ci", "app",
                                                  "batchlens-cli"),
                    help="evaluate: the batchlens-cli to run (default: build/ci's)")
    args = ap.parse_args()
    args.work = os.path.abspath(args.work)
    args.out = os.path.abspath(args.out or os.path.join(args.work, "demo-trained"))
    if args.smoke:
        args.steps = args.steps or 6
        args.batch = args.batch or 8
        args.eval_every = min(args.eval_every, 3)
        args.save_every = min(args.save_every, 3)
        args.warmup = min(args.warmup, 2)
    args.batch = args.batch or 256
    {"prepare": prepare, "train": train, "export": export, "samples": samples,
     "evaluate": evaluate, "plot": plot, "check-port": check_port,
     "check-tokenizer": check_tokenizer, "bench": bench,
     "check-kernels": check_kernels}[args.command](args)

if __name__ == "__main__":
    main()
