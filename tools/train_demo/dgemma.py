# SPDX-License-Identifier: Apache-2.0
"""DiffusionGemma's training forward in plain PyTorch (1.13 and later), for machines without
transformers: the CI machine runs train.py --smoke with it. The H200 run trains transformers'
DiffusionGemmaForBlockDiffusion itself; this module is a port of the same math with the same
parameter names in the released checkpoint layout (spec §7), checked against BatchLens's engine
by tests/tools/train_demo_test.cpp (same weights, same inputs: the same logits).

ref: transformers 5.17 models/diffusion_gemma/modeling_diffusion_gemma.py (the classes named in
each docstring); core/model/diffusion_gemma.cpp is BatchLens's C++ port of the same.
"""

import math

import torch
import torch.nn.functional as F
from torch import nn


class RMSNorm(nn.Module):
    """ref: DiffusionGemmaRMSNorm (fp32 inside, weight multiplied as is, no 1 + w)."""

    def __init__(self, dim, eps, with_scale=True):
        super().__init__()
        self.eps = eps
        self.weight = nn.Parameter(torch.ones(dim)) if with_scale else None

    def forward(self, x):
        return OPS["rms"](x, self.weight, self.eps)


def _rms(x, weight, eps):
    """ref: DiffusionGemmaRMSNorm._norm and forward: fp32 inside, back to x's dtype."""
    y = x.float() * torch.pow(x.float().pow(2).mean(-1, keepdim=True) + eps, -0.5)
    if weight is not None:
        y = y * weight.float()
    return y.to(x.dtype)


def _gelu_mul(gate, up):
    return F.gelu(gate, approximate="tanh") * up


def gated(gate, up, down, x):
    """ref: DiffusionGemmaText4MLP.forward (gelu_pytorch_tanh)."""
    return down(OPS["gelu_mul"](gate(x), up(x)))


def rope_inv_freq(rope, head_dim):
    """ref: compute_default_rope_parameters, _compute_proportional_rope_parameters."""
    if rope.get("rope_type") == "proportional":
        angles = int(rope.get("partial_rotary_factor", 1.0) * head_dim / 2)
        inv = 1.0 / rope["rope_theta"] ** (torch.arange(0, 2 * angles, 2).float() / head_dim)
        nope = head_dim // 2 - angles
        if nope > 0:
            inv = torch.cat([inv, torch.zeros(nope)])
        return inv / rope.get("factor", 1.0)
    dim = int(head_dim * rope.get("partial_rotary_factor", 1.0))
    return 1.0 / rope["rope_theta"] ** (torch.arange(0, dim, 2).float() / dim)


def rope_tables(inv_freq, positions, dtype):
    """cos, sin [1, S, 1, D] of positions [S], or [B, S, 1, D] of per-example positions [B, S]
    (left-padded batches)."""
    freqs = positions.float()[..., None] * inv_freq.to(positions.device)  # [(B,) S, D/2]
    emb = torch.cat([freqs, freqs], -1)
    if positions.dim() == 1:
        emb = emb[None]
    return emb.cos().to(dtype)[:, :, None, :], emb.sin().to(dtype)[:, :, None, :]


def _rope(x, cos, sin):
    half = x.shape[-1] // 2
    rotated = torch.cat([-x[..., half:], x[..., :half]], -1)
    return x * cos + rotated * sin


def apply_rope(x, cos, sin):
    """ref: rotate_half, apply_rotary_pos_emb. x [B, S, H, D]."""
    return OPS["rope"](x, cos, sin)


def layer_shape(t, i):
    """(head_dim, kv_heads) of layer i: the base values on sliding layers, global_head_dim and
    num_global_key_value_heads on full ones; text_config.per_layer_config (what transformers'
    save_pretrained writes instead of the two global keys) wins where it names the layer.
    ref: DiffusionGemmaTextConfig.__post_init__"""
    sliding = t["layer_types"][i] == "sliding_attention"
    d = t["head_dim"] if sliding else t.get("global_head_dim") or t["head_dim"]
    kv = t["num_key_value_heads"] if sliding else (
        t.get("num_global_key_value_heads") or t["num_key_value_heads"])
    entry = (t.get("per_layer_config") or {}).get(str(i)) or {}
    return entry.get("head_dim") or d, entry.get("num_key_value_heads") or kv


class Attention(nn.Module):
    """ref: DiffusionGemma{Encoder,Decoder}TextAttention: q/k RMSNorm with scale, v without,
    scaling 1.0; full layers have no v_proj (V from k_proj)."""

    # "eager": the reference's matmul, fp32 softmax, matmul; "sdpa": scaled_dot_product_attention
    # (set_kernels; train.py --fast on a GPU).
    kernel = "eager"

    def __init__(self, t, i):
        super().__init__()
        self.sliding = t["layer_types"][i] == "sliding_attention"
        sliding = self.sliding
        self.window = t["sliding_window"]
        self.d, self.kv = layer_shape(t, i)
        self.heads = t["num_attention_heads"]
        h, eps = t["hidden_size"], t["rms_norm_eps"]
        self.q_proj = nn.Linear(h, self.heads * self.d, bias=False)
        self.k_proj = nn.Linear(h, self.kv * self.d, bias=False)
        self.v_proj = nn.Linear(h, self.kv * self.d, bias=False) if sliding else None
        self.o_proj = nn.Linear(self.heads * self.d, h, bias=False)
        self.q_norm = RMSNorm(self.d, eps)
        self.k_norm = RMSNorm(self.d, eps)
        self.v_norm = RMSNorm(self.d, eps, with_scale=False)

    def forward(self, x, cos, sin, cache, encoder, pad=None):
        """cache: (k, v) [B, Hkv, P, D] of the encoder (None when encoding). Returns the output and,
        when encoding, the (k, v) the decoder reads (sliding layers: the last window - 1).
        pad [B] long: left-padded prompts (train.py's fixed-shape batches), the number of pad
        positions in front of each; no key at a pad position is seen by a real position."""
        b, s, _ = x.shape
        q = apply_rope(self.q_norm(self.q_proj(x).view(b, s, -1, self.d)), cos, sin)
        k_raw = self.k_proj(x).view(b, s, -1, self.d)
        v_raw = self.v_proj(x).view(b, s, -1, self.d) if self.v_proj is not None else k_raw
        k = apply_rope(self.k_norm(k_raw), cos, sin).transpose(1, 2)
        v = self.v_norm(v_raw).transpose(1, 2)
        q = q.transpose(1, 2)  # [B, H, S, D]
        mask = None
        if encoder:
            pos = torch.arange(s, device=x.device)
            allowed = pos[None, :] <= pos[:, None]
            if self.sliding:
                allowed = allowed & (pos[None, :] > pos[:, None] - self.window)
            mask = allowed
            if pad is not None:
                # [B, 1, S, S]: real keys only; a pad query sees itself (its row stays finite
                # and is never read: no real query sees a pad key).
                real = pos[None, :] >= pad[:, None]  # [B, S] of keys
                mask = (allowed[None] & real[:, None, :]) | torch.eye(
                    s, dtype=torch.bool, device=x.device)[None]
                mask = mask[:, None]
            keys, values = k, v
        else:
            keys = torch.cat([cache[0], k], 2)
            values = torch.cat([cache[1], v], 2)
            if len(cache) == 3:
                # [B, 1, 1, P + C]: which cached keys are real (the encoder's, left-padded).
                mask = torch.cat([cache[2], cache[2].new_ones(b, s)], 1)[:, None, None, :]
        rep = self.heads // self.kv
        ka = keys.repeat_interleave(rep, 1)
        va = values.repeat_interleave(rep, 1)
        if self.kernel == "sdpa":
            # --fast on a GPU (PyTorch >= 2.1): one fused kernel (memory-efficient attention
            # takes a mask), fp32 softmax inside, no [B, H, S, S] scores in memory; the same
            # mask (True: may attend), scaling 1.0.
            out = F.scaled_dot_product_attention(q, ka, va, attn_mask=mask, scale=1.0)
            out = out.transpose(1, 2).reshape(b, s, -1)
            return self.o_proj(out), self._cache(keys, values, pad, encoder, s, x.device)
        scores = torch.matmul(q, ka.transpose(-1, -2))  # scaling 1.0
        if mask is not None:
            scores = scores.masked_fill(~mask, float("-inf"))
        probs = torch.softmax(scores.float(), -1).to(q.dtype)
        out = torch.matmul(probs, va).transpose(1, 2).reshape(b, s, -1)
        return self.o_proj(out), self._cache(keys, values, pad, encoder, s, x.device)

    def _cache(self, keys, values, pad, encoder, s, device):
        """What the encoder leaves the decoder (sliding layers: the last window - 1 keys), with
        the real-key mask [B, keep] of a left-padded batch; None when decoding."""
        if not encoder:
            return None
        keep = min(keys.shape[2], self.window - 1) if self.sliding else keys.shape[2]
        cache = (keys[:, :, -keep:], values[:, :, -keep:])
        if pad is not None:
            pos = torch.arange(s, device=device)
            cache += ((pos >= pad[:, None])[:, -keep:],)
        return cache


class Router(nn.Module):
    """ref: DiffusionGemmaTextRouter.forward."""

    def __init__(self, t):
        super().__init__()
        h = t["hidden_size"]
        self.eps = t["rms_norm_eps"]
        self.top_k = t["top_k_experts"]
        self.proj = nn.Linear(h, t["num_experts"], bias=False)
        self.scale = nn.Parameter(torch.ones(h))
        self.per_expert_scale = nn.Parameter(torch.ones(t["num_experts"]))
        self.root = h ** -0.5

    def forward(self, x):
        w, idx = self.route(x)
        return w * self.per_expert_scale[idx], idx

    def route(self, x):
        """The normalised top-k weights before the per-expert scale, and the experts."""
        n = OPS["rms"](x, None, self.eps)
        probs = torch.softmax(self.proj(n * self.scale * self.root), -1, dtype=torch.float32)
        w, idx = torch.topk(probs, self.top_k, -1)
        return w / w.sum(-1, keepdim=True), idx

    def dense_weights(self, x):
        """[N, E]: each token's weight per expert, 0 where not picked, the per-expert scale
        applied densely (the same products as forward's; no indexing whose gradient
        serialises)."""
        w, idx = self.route(x)
        picked = torch.zeros(x.shape[0], self.per_expert_scale.shape[0], dtype=w.dtype,
                             device=x.device).scatter(1, idx, w)
        return picked * self.per_expert_scale


class Experts(nn.Module):
    """ref: DiffusionGemmaTextExperts.forward (the eager loop)."""

    def __init__(self, t):
        super().__init__()
        e, h, i = t["num_experts"], t["hidden_size"], t["moe_intermediate_size"]
        self.gate_up_proj = nn.Parameter(torch.empty(e, 2 * i, h))
        self.down_proj = nn.Parameter(torch.empty(e, h, i))

    # "loop": the reference's eager loop (a host sync per expert: torch.where); for training on
    # a GPU (train.py --fast, set_kernels), without a host sync: "dense", every expert on every
    # token weighted 0 where the router did not pick it (top_k/E of its products count), or
    # "grouped", the picked (token, expert) pairs sorted by expert through one grouped product
    # per projection.
    kernel = "loop"

    def forward(self, x, idx, w):
        out = torch.zeros_like(x)
        for e in range(self.gate_up_proj.shape[0]):
            tok, slot = torch.where(idx == e)
            if tok.numel() == 0:
                continue
            gate, up = F.linear(x[tok], self.gate_up_proj[e]).chunk(2, -1)
            h = F.linear(OPS["gelu_mul"](gate, up), self.down_proj[e])
            out = out.index_add(0, tok, (h * w[tok, slot, None]).to(out.dtype))
        return out


    def forward_grouped(self, x, idx, w):
        """The eager loop's sum, each picked (token, expert) pair once: the pairs sorted by
        expert, one grouped product per projection over the experts' row ranges (offsets on the
        device: no host sync, capturable in a CUDA graph), summed back per token in slot order.
        x [N, H], idx and w [N, K] (Router.forward). ref: transformers' grouped_mm experts."""
        n, k = idx.shape
        flat = idx.reshape(-1)  # [N*K] expert of pair j = token j // K, slot j % K
        order = torch.sort(flat, stable=True).indices  # [N*K] pairs grouped by expert
        counts = torch.histc(flat.float() if x.device.type == "cpu" else flat.int(),
                             bins=self.gate_up_proj.shape[0], min=0,
                             max=self.gate_up_proj.shape[0] - 1)
        offs = torch.cumsum(counts, 0, dtype=torch.int32)  # [E] end row of each expert
        # Each token repeated K times, then permuted: the backward of a permutation and of an
        # expand is a plain sum (no atomic adds in a run-dependent order).
        rows = x[:, None, :].expand(n, k, x.shape[1]).reshape(n * k, -1)[order]  # [N*K, H]
        gate, up = grouped_mm(rows, self.gate_up_proj.transpose(1, 2), offs).chunk(2, -1)
        h = grouped_mm(OPS["gelu_mul"](gate, up), self.down_proj.transpose(1, 2),
                       offs)  # [N*K, H] in expert order
        back = torch.empty_like(order)
        back[order] = torch.arange(n * k, device=x.device)
        h = h[back].view(n, k, -1) * w[..., None].to(h.dtype)  # [N, K, H] in slot order
        return h.sum(1).to(x.dtype)

    def forward_dense(self, x, weights):
        """The eager loop's sum over the top-k experts, in exact arithmetic: the experts not
        picked have weight 0. x [N, H], weights [N, E] (Router.dense_weights)."""
        gate_up = torch.einsum("nh,eih->eni", x, self.gate_up_proj)  # [E, N, 2I]
        gate, up = gate_up.chunk(2, -1)
        h = torch.einsum("eni,ehi->enh", OPS["gelu_mul"](gate, up),
                         self.down_proj)  # [E, N, H]
        return torch.einsum("enh,ne->nh", h, weights.to(h.dtype)).to(x.dtype)


class Layer(nn.Module):
    """ref: DiffusionGemma{Encoder,Decoder}TextLayer.forward."""

    def __init__(self, t, i):
        super().__init__()
        h, eps, inter = t["hidden_size"], t["rms_norm_eps"], t["intermediate_size"]
        self.self_attn = Attention(t, i)
        names = ["input_layernorm", "post_attention_layernorm", "pre_feedforward_layernorm",
                 "post_feedforward_layernorm_1", "pre_feedforward_layernorm_2",
                 "post_feedforward_layernorm_2", "post_feedforward_layernorm"]
        for name in names:
            setattr(self, name, RMSNorm(h, eps))
        self.mlp = nn.Module()
        self.mlp.gate_proj = nn.Linear(h, inter, bias=False)
        self.mlp.up_proj = nn.Linear(h, inter, bias=False)
        self.mlp.down_proj = nn.Linear(inter, h, bias=False)
        self.router = Router(t)
        self.experts = Experts(t)
        self.register_buffer("layer_scalar", torch.ones(1))

    def forward(self, x, cos, sin, cache, encoder, layer_scalar, pad=None):
        residual = x
        h, new_cache = self.self_attn(self.input_layernorm(x), cos, sin, cache, encoder, pad)
        x = residual + self.post_attention_layernorm(h)
        residual = x
        m = self.mlp
        h1 = self.post_feedforward_layernorm_1(
            gated(m.gate_proj, m.up_proj, m.down_proj, self.pre_feedforward_layernorm(x)))
        flat = residual.reshape(-1, residual.shape[-1])
        if self.experts.kernel == "grouped":
            w, idx = self.router(flat)
            h2 = self.experts.forward_grouped(self.pre_feedforward_layernorm_2(flat), idx,
                                              w).view_as(residual)
        elif self.experts.kernel == "dense":
            h2 = self.experts.forward_dense(self.pre_feedforward_layernorm_2(flat),
                                            self.router.dense_weights(flat)).view_as(residual)
        else:
            w, idx = self.router(flat)
            h2 = self.experts(self.pre_feedforward_layernorm_2(flat), idx, w).view_as(residual)
        h = self.post_feedforward_layernorm(h1 + self.post_feedforward_layernorm_2(h2))
        return (residual + h) * layer_scalar, new_cache


class DiffusionGemmaPort(nn.Module):
    """DiffusionGemmaForBlockDiffusion's forward (encode the prompt, denoise one canvas) with its
    parameters under the released names: model.decoder.* and the encoder's layer_scalar."""

    is_port = True

    def __init__(self, config):
        super().__init__()
        t = config["text_config"]
        self.t = t
        self.model = nn.Module()
        dec = self.model.decoder = nn.Module()
        dec.embed_tokens = nn.Embedding(t["vocab_size"], t["hidden_size"],
                                        padding_idx=t["pad_token_id"])
        types = t["layer_types"]
        dec.layers = nn.ModuleList([Layer(t, i) for i in range(len(types))])
        dec.norm = RMSNorm(t["hidden_size"], t["rms_norm_eps"])
        sc = dec.self_conditioning = nn.Module()
        sc.pre_norm = RMSNorm(t["hidden_size"], t["rms_norm_eps"])
        sc.post_norm = RMSNorm(t["hidden_size"], t["rms_norm_eps"], with_scale=False)
        sc.gate_proj = nn.Linear(t["hidden_size"], t["intermediate_size"], bias=False)
        sc.up_proj = nn.Linear(t["hidden_size"], t["intermediate_size"], bias=False)
        sc.down_proj = nn.Linear(t["intermediate_size"], t["hidden_size"], bias=False)
        enc = self.model.encoder = nn.Module()
        enc.language_model = nn.Module()
        enc.language_model.layers = nn.ModuleList()
        for _ in types:
            holder = nn.Module()
            holder.register_buffer("layer_scalar", torch.ones(1))
            enc.language_model.layers.append(holder)
        inv = {}
        for name, rope in t["rope_parameters"].items():
            if name in types:
                inv[name] = rope_inv_freq(rope, layer_shape(t, types.index(name))[0])
        self.inv_freq = inv
        self.init_weights(t.get("initializer_range", 0.02))

    def init_weights(self, std):
        """ref: DiffusionGemmaPreTrainedModel._init_weights (normal weights, ones for norms and
        router scales, a zero padding row)."""
        for name, p in self.named_parameters():
            if name.endswith("norm.weight") or "layernorm" in name or name.endswith(
                    ("router.scale", "per_expert_scale")):
                nn.init.ones_(p)
            else:
                nn.init.normal_(p, 0.0, std)
        with torch.no_grad():
            self.model.decoder.embed_tokens.weight[self.t["pad_token_id"]].zero_()

    def embed(self, ids):
        w = self.model.decoder.embed_tokens.weight
        scale = torch.tensor(math.sqrt(self.t["hidden_size"])).to(w.dtype)
        return F.embedding(ids, w, padding_idx=self.t["pad_token_id"]) * scale

    def tables(self, positions, dtype):
        # inv_freq moves to the positions' device once (a host copy per call would also stop
        # train.py from capturing the step in a CUDA graph).
        dev = positions.device
        if getattr(self, "_inv_device", None) != dev:
            self.inv_freq = {k: v.to(dev) for k, v in self.inv_freq.items()}
            self._inv_device = dev
        return {k: rope_tables(v, positions, dtype) for k, v in self.inv_freq.items()}

    def forward(self, input_ids, decoder_input_ids, self_conditioning_logits=None,
                self_conditioning_mask=None, prompt_pad=None):
        """prompt_pad [B] long (train.py's fixed-shape batches): input_ids is left-padded, with
        that many pad positions in front of each prompt; positions count from its first real
        token, and no real position attends to a pad one. None: no padding (the reference)."""
        dec = self.model.decoder
        enc_layers = self.model.encoder.language_model.layers
        types = self.t["layer_types"]
        b, p = input_ids.shape
        c = decoder_input_ids.shape[1]
        pad = prompt_pad
        dev = input_ids.device
        # Encoder: the prompt, causally, into the cache the decoder reads.
        x = self.embed(input_ids)
        positions = torch.arange(p, device=dev)
        if pad is not None:
            positions = (positions[None, :] - pad[:, None]).clamp(min=0)  # [B, P]
        tab = self.tables(positions, x.dtype)
        caches = []
        for i, layer in enumerate(dec.layers):
            cos, sin = tab[types[i]]
            if i == len(dec.layers) - 1:
                _, cache = layer.self_attn(layer.input_layernorm(x), cos, sin, None, True, pad)
                caches.append(cache)
                break
            x, cache = layer(x, cos, sin, None, True, enc_layers[i].layer_scalar, pad)
            caches.append(cache)
        # Decoder: the canvas, bidirectionally over the cache and itself.
        e = self.embed(decoder_input_ids)
        if self_conditioning_logits is not None:
            probs = torch.softmax(self_conditioning_logits, -1, dtype=torch.float32).to(
                dec.embed_tokens.weight.dtype)
            soft = torch.matmul(probs, dec.embed_tokens.weight) * torch.tensor(
                math.sqrt(self.t["hidden_size"])).to(e.dtype)
            if self_conditioning_mask is not None:
                soft = soft * self_conditioning_mask.to(soft.dtype)[:, None, None]
        else:
            soft = torch.zeros_like(e)
        sc = dec.self_conditioning
        x = sc.post_norm(e + gated(sc.gate_proj, sc.up_proj, sc.down_proj, sc.pre_norm(soft)))
        positions = torch.arange(p, p + c, device=dev)
        if pad is not None:
            positions = positions[None, :] - pad[:, None]  # [B, C]
        tab = self.tables(positions, x.dtype)
        for i, layer in enumerate(dec.layers):
            cos, sin = tab[types[i]]
            x, _ = layer(x, cos, sin, caches[i], False, layer.layer_scalar)
        logits = F.linear(dec.norm(x), dec.embed_tokens.weight)  # [B, C, V]
        return OPS["softcap"](logits, self.t["final_logit_softcapping"])  # fp32


def _softcap(logits, cap):
    """ref: DiffusionGemmaForBlockDiffusion.forward's final_logit_softcapping, in fp32."""
    logits = logits.float()
    return torch.tanh(logits / cap) * cap


def _cross_entropy(logits, target):
    """Per position, fp32 (train.py's loss)."""
    return F.cross_entropy(logits.float().flatten(0, 1), target.flatten(), reduction="none")


# The elementwise pieces of the step, each one function: eager as written, or (set_kernels'
# fusion="compiled", train.py --fast on a GPU, PyTorch >= 2.1) each through torch.compile, so
# that the fp32 RMSNorms, rotations, gates, softcap and loss are one fused kernel each instead
# of 5-15 small memory-bound ones (the step's cost at hidden 256, issue #33). Same math.
EAGER_OPS = {"rms": _rms, "rope": _rope, "gelu_mul": _gelu_mul, "softcap": _softcap,
             "cross_entropy": _cross_entropy}
OPS = dict(EAGER_OPS)
_COMPILED = {}


def set_fusion(fusion):
    """"none": the eager functions; "compiled": torch.compile of each (dynamic shapes: one
    compilation serves every context bucket and batch)."""
    if fusion == "compiled":
        if not _COMPILED:
            import torch._dynamo
            # One compilation per dtype, rank, weight or none and grad mode of each function:
            # more than the default limit (64 in 2.11), past which Dynamo falls back to eager.
            for name in ("cache_size_limit", "recompile_limit"):
                if hasattr(torch._dynamo.config, name):
                    setattr(torch._dynamo.config, name, 1024)
            _COMPILED.update({k: torch.compile(f, dynamic=True) for k, f in EAGER_OPS.items()})
        OPS.update(_COMPILED)
    elif fusion == "none":
        OPS.update(EAGER_OPS)
    else:
        raise ValueError("fusion: none or compiled, not %r" % fusion)


def grouped_mm(a, b, offs):
    """a [M, K] @ b[g] [K, N] for the rows of each group g (offs [G] int32: the end row of each):
    PyTorch's grouped product on a GPU in bf16 (as transformers calls it under autocast), else
    a loop over the groups (fp32 checks, the CPU and PyTorch 1.13: the tests)."""
    fn = getattr(F, "grouped_mm", None) or getattr(torch, "_grouped_mm", None)
    if fn is not None and a.is_cuda and (torch.is_autocast_enabled() or b.dtype == torch.bfloat16):
        return fn(a.to(torch.bfloat16), b.to(torch.bfloat16), offs=offs)
    out = []
    start = 0
    for g, end in enumerate(offs.tolist()):
        out.append(a[start:end].matmul(b[g].to(a.dtype)))
        start = end
    return torch.cat(out)


def has_grouped_mm():
    return hasattr(F, "grouped_mm") or hasattr(torch, "_grouped_mm")


def has_sdpa():
    return hasattr(F, "scaled_dot_product_attention")


def set_kernels(model, experts, attention, fusion="none"):
    """How the port computes its experts ("loop", "dense", "grouped"), attention ("eager",
    "sdpa") and elementwise pieces ("none", "compiled": set_fusion): the same math, other
    kernels (train.py --fast). Fusion is global to the module (every model)."""
    set_fusion(fusion)
    for m in model.modules():
        if isinstance(m, Experts):
            m.kernel = experts
        elif isinstance(m, Attention):
            m.kernel = attention


def save_safetensors(path, tensors, metadata=None):
    """A .safetensors file (https://github.com/huggingface/safetensors) without the package."""
    import json
    import struct
    names = {torch.bfloat16: "BF16", torch.float32: "F32", torch.int64: "I64"}
    header, blobs, offset = {}, [], 0
    for name in sorted(tensors):
        t = tensors[name].detach().cpu().contiguous()
        raw = t.view(torch.uint8).numpy().tobytes() if t.numel() else b""
        header[name] = {"dtype": names[t.dtype], "shape": list(t.shape),
                        "data_offsets": [offset, offset + len(raw)]}
        blobs.append(raw)
        offset += len(raw)
    if metadata:
        header["__metadata__"] = metadata
    text = json.dumps(header, separators=(",", ":")).encode()
    text += b" " * (-len(text) % 8)
    with open(path, "wb") as f:
        f.write(struct.pack("<Q", len(text)))
        f.write(text)
        for raw in blobs:
            f.write(raw)


def load_safetensors(path):
    """The tensors of a .safetensors file (BF16, F32, I64), without the package."""
    import json
    import struct
    types = {"BF16": torch.bfloat16, "F32": torch.float32, "I64": torch.int64}
    with open(path, "rb") as f:
        data = f.read()
    n = struct.unpack("<Q", data[:8])[0]
    header = json.loads(data[8:8 + n])
    out = {}
    for name, e in header.items():
        if name == "__metadata__":
            continue
        begin, end = e["data_offsets"]
        raw = bytearray(data[8 + n + begin:8 + n + end])
        out[name] = torch.frombuffer(raw, dtype=types[e["dtype"]]).reshape(e["shape"]) \
            if raw else torch.empty(e["shape"], dtype=types[e["dtype"]])
    return out
