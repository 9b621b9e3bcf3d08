#!/usr/bin/env python3
# SPDX-License-Identifier: Apache-2.0
"""Writes a seeded random DiffusionGemma checkpoint plus transformers' reference outputs for it.

Runs on the GPU machine (PyTorch + transformers 5.17 + safetensors). For one BatchLens preset
(an HF-style config.json with a nested "text_config") it:

1. builds `DiffusionGemmaForBlockDiffusion` with random weights (seeded), in bf16 on the device,
   SDPA attention and the chosen experts implementation (grouped_mm or eager);
2. by default gives the scale-like parameters (RMSNorm weights, router.scale,
   router.per_expert_scale, layer_scalar) random values around 1 instead of HF's all-ones
   initialisation, so that parity also covers how they are applied (--no-perturb turns it off);
3. saves the weights with `save_pretrained` (checkpoint key layout of the released model:
   model.decoder.* plus model.encoder.language_model.layers.N.layer_scalar; tied weights absent),
   checks the written key set against what BatchLens loads and repairs it from memory if needed,
   and replaces config.json by the preset (transformers' own is kept as config.hf.json);
4. writes seeded inputs (prompt ids [B,L], canvas ids [B,C]) and runs encoder prefill + one
   decoder pass twice: without self-conditioning, and with self_conditioning_logits = the first
   pass's logits at the first step's temperature (T = 0.8), rounded to bf16 as the sampler does;
5. records the decoder taps of both passes with forward hooks on the DECODER modules only and
   saves them next to the float32 logits: reference_nosc.safetensors / reference_sc.safetensors;
6. with --time, times encoder prefill and one decoder forward (with and without SC) at B=1 and
   B=4 and writes reference_timing.json.

Tap names follow BatchLens (core/probe/tap_names.h): `<tap>.<layer>` per layer, `<tap>` per step.
"""
from __future__ import annotations

import argparse
import contextlib
import copy
import inspect
import json
import os
import platform
import shutil
import statistics
import sys
import time
from pathlib import Path


def log(msg: str = "") -> None:
    print(msg, flush=True)


def die(msg: str) -> None:
    print(f"make_reference: error: {msg}", file=sys.stderr, flush=True)
    sys.exit(1)


try:
    import torch
except ImportError as exc:  # pragma: no cover - only on a machine without torch
    die(f"PyTorch is not importable ({exc}); run this on the GPU machine")

try:
    import transformers
    from transformers import AutoModel
    from transformers.models.diffusion_gemma import modeling_diffusion_gemma as mdg
    from transformers.models.diffusion_gemma.configuration_diffusion_gemma import DiffusionGemmaConfig
except ImportError as exc:  # pragma: no cover
    die(f"transformers with DiffusionGemma is not importable ({exc}); need transformers 5.17")

try:
    from safetensors import safe_open
    from safetensors.torch import load_file, save_file
except ImportError as exc:  # pragma: no cover
    die(f"safetensors is not importable ({exc})")


from tap_names import LAYER_TAPS, STEP_TAPS  # noqa: E402  (shared with the other script)

# Checkpoint keys BatchLens skips (core/model/weights.cpp is_ignored_key).
IGNORED_PREFIXES = ("model.encoder.vision_tower.", "model.encoder.embed_vision.")
ENCODER_LAYER_PREFIX = "model.encoder.language_model.layers."

# A tiny Gemma-4 vision tower, only so that DiffusionGemmaEncoderModel can be constructed
# (5.17 builds `AutoModel.from_config(config.vision_config)` unconditionally). Tried in order.
VISION_ATTEMPTS = (
    (
        "tiny gemma4_vision (32 hidden, 1 layer, 2 heads, head_dim 16)",
        {
            "model_type": "gemma4_vision",
            "hidden_size": 32,
            "intermediate_size": 64,
            "num_hidden_layers": 1,
            "num_attention_heads": 2,
            "num_key_value_heads": 2,
            "head_dim": 16,
        },
    ),
    (
        "tiny gemma4_vision without head fields",
        {
            "model_type": "gemma4_vision",
            "hidden_size": 32,
            "intermediate_size": 64,
            "num_hidden_layers": 1,
            "num_attention_heads": 2,
        },
    ),
    ("default gemma4_vision with 1 layer", {"model_type": "gemma4_vision", "num_hidden_layers": 1}),
    ("default gemma4_vision", {"model_type": "gemma4_vision"}),
    ("vision_config=None", None),
)

# Above this many parameters the CPU fp32 build would need too much host memory.
AUTO_DEVICE_BUILD_PARAMS = 4.0e9


# --------------------------------------------------------------------------------------------
# Configuration and model
# --------------------------------------------------------------------------------------------


def make_config(config_dict: dict) -> DiffusionGemmaConfig:
    try:
        return DiffusionGemmaConfig.from_dict(copy.deepcopy(config_dict))
    except Exception as first:  # noqa: BLE001 - try the plain constructor before giving up
        try:
            return DiffusionGemmaConfig(**copy.deepcopy(config_dict))
        except Exception:  # noqa: BLE001
            raise first


def probe_vision(config: DiffusionGemmaConfig) -> None:
    """Constructs the vision tower and embedder alone (on CPU) so a bad vision config fails fast."""
    if config.vision_config is None:
        return
    with torch.device("cpu"):
        tower = AutoModel.from_config(config.vision_config)
        embedder = mdg.DiffusionGemmaMultimodalEmbedder(config.vision_config, config.text_config)
    del tower, embedder


def build_config(preset: dict) -> DiffusionGemmaConfig:
    if not isinstance(preset.get("text_config"), dict):
        die('the preset has no nested "text_config" object (expected the HF config.json layout)')
    failures = []
    for label, vision in VISION_ATTEMPTS:
        config_dict = copy.deepcopy(preset)
        config_dict["vision_config"] = copy.deepcopy(vision)
        try:
            config = make_config(config_dict)
            probe_vision(config)
        except Exception as exc:  # noqa: BLE001 - report every attempt, then fall back
            failures.append(f"  - {label}: {type(exc).__name__}: {exc}")
            log(f"config: vision_config attempt '{label}' failed: {type(exc).__name__}: {exc}")
            continue
        log(f"config: vision_config = {label}")
        return config
    die("could not construct DiffusionGemmaConfig with any vision_config:\n" + "\n".join(failures))
    raise AssertionError  # unreachable


def set_config_implementations(config: DiffusionGemmaConfig, attn: str, experts: str) -> None:
    """Before construction: transformers 5 reads config._attn_implementation and
    config._experts_implementation (the experts read them from the TEXT config)."""
    for cfg in (config, config.text_config):
        for attr, value in (("_attn_implementation", attn), ("_experts_implementation", experts)):
            try:
                setattr(cfg, attr, value)
            except Exception as exc:  # noqa: BLE001
                log(f"config: could not set {type(cfg).__name__}.{attr}={value!r}: {exc}")


def estimate_text_params(text: dict) -> float:
    try:
        h = int(text["hidden_size"])
        head = max(int(text.get("head_dim", 0)), int(text.get("global_head_dim", 0)))
        per_layer = (
            int(text.get("num_experts") or 0) * 3 * int(text.get("moe_intermediate_size") or 0) * h
            + 3 * int(text["intermediate_size"]) * h
            + 4 * int(text["num_attention_heads"]) * head * h
        )
        return float(int(text["vocab_size"]) * h + int(text["num_hidden_layers"]) * per_layer)
    except (KeyError, TypeError, ValueError):
        return 0.0


@contextlib.contextmanager
def default_dtype(dtype: "torch.dtype"):
    previous = torch.get_default_dtype()
    torch.set_default_dtype(dtype)
    try:
        yield
    finally:
        torch.set_default_dtype(previous)


def snapshot_inv_freq(model: "torch.nn.Module") -> dict:
    """The rotary inverse-frequency buffers are fp32 in a normally loaded model
    (from_pretrained(dtype=bf16)); `.to(torch.bfloat16)` would round them to bf16."""
    keep = {}
    for module_name, module in model.named_modules():
        for buffer_name, buffer in module.named_buffers(recurse=False):
            if buffer is not None and buffer_name.endswith("inv_freq") and buffer.dtype == torch.float32:
                keep[(module_name, buffer_name)] = buffer.detach().clone()
    return keep


def restore_inv_freq(model: "torch.nn.Module", keep: dict, device: "torch.device") -> None:
    modules = dict(model.named_modules())
    for (module_name, buffer_name), value in keep.items():
        setattr(modules[module_name], buffer_name, value.to(device=device, dtype=torch.float32))
    bad = [
        f"{m}.{b}"
        for (m, b) in keep
        if getattr(modules[m], b).dtype != torch.float32
    ]
    if bad:
        die(f"rotary buffers not fp32 after restore: {bad[:4]}")
    log(f"model: {len(keep)} rotary inv_freq buffers kept in fp32")


def build_model(config: DiffusionGemmaConfig, device: "torch.device", seed: int, on_device: bool):
    cls = mdg.DiffusionGemmaForBlockDiffusion
    torch.manual_seed(seed)
    t0 = time.time()
    try:
        if on_device:
            log(f"model: constructing directly on {device} in bf16 (--build-on-device)")
            with default_dtype(torch.bfloat16), torch.device(device):
                model = cls(config)
        else:
            log("model: constructing on CPU in float32")
            with default_dtype(torch.float32):
                model = cls(config)
    except Exception as exc:  # noqa: BLE001
        hint = ""
        if config.vision_config is None:
            hint = " (vision_config is None: DiffusionGemmaEncoderModel may need a vision config)"
        die(f"could not construct DiffusionGemmaForBlockDiffusion: {type(exc).__name__}: {exc}{hint}")
    keep = snapshot_inv_freq(model)
    model = model.to(torch.bfloat16).to(device)
    restore_inv_freq(model, keep, device)
    model.eval()
    log(f"model: built in {time.time() - t0:.1f} s")
    return model


def select_implementations(model, experts: str) -> dict:
    """Sets SDPA attention and the experts implementation and checks what the decoder modules
    will dispatch on (they read `self.config`, which is the text config)."""
    if hasattr(model, "set_attn_implementation"):
        try:
            model.set_attn_implementation("sdpa")
        except Exception as exc:  # noqa: BLE001
            log(f"model: set_attn_implementation('sdpa') failed: {type(exc).__name__}: {exc}")
    if hasattr(model, "set_experts_implementation"):
        try:
            model.set_experts_implementation(experts)
        except Exception as exc:  # noqa: BLE001
            die(
                f"set_experts_implementation({experts!r}) failed: {type(exc).__name__}: {exc}. "
                "On the H200 with torch 2.11 grouped_mm should be available; try --experts eager."
            )
    else:
        log("model: no set_experts_implementation(); setting config._experts_implementation only")

    decoder = model.model.decoder
    experts_cfg = decoder.layers[0].experts.config
    attn_cfg = decoder.layers[0].self_attn.config
    if getattr(experts_cfg, "_experts_implementation", None) != experts:
        try:
            experts_cfg._experts_implementation = experts
        except Exception:  # noqa: BLE001
            experts_cfg._experts_implementation_internal = experts
    if getattr(attn_cfg, "_attn_implementation", None) != "sdpa":
        try:
            attn_cfg._attn_implementation = "sdpa"
        except Exception:  # noqa: BLE001
            attn_cfg._attn_implementation_internal = "sdpa"
    got_experts = getattr(experts_cfg, "_experts_implementation", None)
    got_attn = getattr(attn_cfg, "_attn_implementation", None)
    for i, layer in enumerate(decoder.layers):
        if getattr(layer.experts.config, "_experts_implementation", None) != experts:
            die(f"decoder layer {i} experts would dispatch on "
                f"{layer.experts.config._experts_implementation!r}, not {experts!r}")
        if getattr(layer.self_attn.config, "_attn_implementation", None) != "sdpa":
            die(f"decoder layer {i} attention uses {layer.self_attn.config._attn_implementation!r}")
    log(f"model: attention = {got_attn}, experts = {got_experts} (decoder text config)")
    return {"attn_implementation": got_attn, "experts_implementation": got_experts}


def perturb_scales(model, seed: int) -> None:
    """Random values for the parameters HF initialises to ones, drawn from a CPU generator so
    they do not depend on the device. Encoder copies follow through the weight tying
    (sync_encoder_with_decoder); the encoder layer_scalar buffers get the decoder's values, as
    the released converter writes them."""
    gen = torch.Generator().manual_seed(seed + 3)
    decoder = model.model.decoder

    def fill(param, low: float, high: float) -> None:
        values = torch.rand(tuple(param.shape), generator=gen, dtype=torch.float32) * (high - low) + low
        param.copy_(values.to(device=param.device, dtype=param.dtype))

    counts = {"norm": 0, "router": 0, "layer_scalar": 0}
    with torch.no_grad():
        for _, module in decoder.named_modules():
            kind = type(module).__name__
            if kind == "DiffusionGemmaRMSNorm" and getattr(module, "with_scale", False):
                fill(module.weight, 0.5, 1.5)
                counts["norm"] += 1
            elif kind == "DiffusionGemmaTextRouter":
                fill(module.scale, 0.5, 1.5)
                fill(module.per_expert_scale, 0.5, 1.5)
                counts["router"] += 1
        encoder_layers = model.model.encoder.language_model.layers
        for i, layer in enumerate(decoder.layers):
            fill(layer.layer_scalar, 0.5, 1.0)
            encoder_layers[i].layer_scalar.copy_(layer.layer_scalar)
            counts["layer_scalar"] += 1
    log(
        f"weights: perturbed {counts['norm']} RMSNorm weights (U[0.5,1.5]), {counts['router']} routers "
        f"(scale, per_expert_scale U[0.5,1.5]), {counts['layer_scalar']} layer_scalar (U[0.5,1.0])"
    )


def sync_encoder_with_decoder(model) -> None:
    """The released model ties every encoder text weight to the decoder's (and lm_head to the
    embedding). Checks that; where a tensor is not shared, copies the decoder value so the
    reference computes exactly what a checkpoint without encoder weights means."""
    encoder = model.model.encoder.language_model
    decoder = model.model.decoder
    shared = equal = copied = 0
    with torch.no_grad():
        pairs = []
        for name, param in encoder.named_parameters():
            try:
                pairs.append((f"encoder.{name}", param, decoder.get_parameter(name)))
            except AttributeError:
                log(f"weights: WARNING encoder parameter {name} has no decoder counterpart")
        pairs.append(("lm_head.weight", model.lm_head.weight, decoder.embed_tokens.weight))
        for name, enc, dec in pairs:
            if enc.data_ptr() == dec.data_ptr() and enc.shape == dec.shape:
                shared += 1
            elif enc.shape == dec.shape and torch.equal(enc, dec):
                equal += 1
            else:
                if enc.shape != dec.shape:
                    die(f"{name}: encoder shape {tuple(enc.shape)} != decoder {tuple(dec.shape)}")
                enc.copy_(dec)
                copied += 1
                if copied <= 4:
                    log(f"weights: WARNING {name} was not tied to the decoder; copied the decoder value")
        for i, layer in enumerate(decoder.layers):
            if not torch.equal(encoder.layers[i].layer_scalar, layer.layer_scalar):
                log(f"weights: note: layer {i} encoder layer_scalar != decoder layer_scalar")
    log(f"weights: encoder/lm_head vs decoder: {shared} shared, {equal} equal copies, {copied} copied")


def weight_sanity(model) -> None:
    """Every decoder tensor finite, and a few standard deviations printed, so uninitialised
    memory (or an init that did not run) shows up before anything is saved."""
    decoder = model.model.decoder
    with torch.no_grad():
        bad = [name for name, t in decoder.state_dict().items() if not bool(torch.isfinite(t).all())]
        if bad:
            die(f"non-finite decoder weights: {bad[:6]}")
        layer = decoder.layers[0]
        probes = {
            "embed_tokens": decoder.embed_tokens.weight,
            "layers.0.q_proj": layer.self_attn.q_proj.weight,
            "layers.0.experts.gate_up_proj": layer.experts.gate_up_proj,
            "layers.0.router.proj": layer.router.proj.weight,
            "layers.0.input_layernorm": layer.input_layernorm.weight,
        }
        stats = ", ".join(
            f"{name} mean {float(t.float().mean()):.4f} std {float(t.float().std()):.4f}" for name, t in probes.items()
        )
    log(f"weights: all decoder tensors finite; {stats}")


# --------------------------------------------------------------------------------------------
# Checkpoint files
# --------------------------------------------------------------------------------------------


def read_keymap(directory: Path) -> tuple[dict, Path | None]:
    """key -> file, from the shards themselves (and the index, which must agree)."""
    index = directory / "model.safetensors.index.json"
    single = directory / "model.safetensors"
    keymap: dict = {}
    if index.exists():
        weight_map = json.loads(index.read_text())["weight_map"]
        for fname in sorted(set(weight_map.values())):
            with safe_open(str(directory / fname), framework="pt", device="cpu") as handle:
                for key in handle.keys():
                    keymap[key] = directory / fname
        stale = sorted(set(weight_map) ^ set(keymap))
        if stale:
            log(f"checkpoint: WARNING index and shards disagree on {len(stale)} keys, e.g. {stale[:4]}")
        return keymap, index
    if single.exists():
        with safe_open(str(single), framework="pt", device="cpu") as handle:
            for key in handle.keys():
                keymap[key] = single
        return keymap, None
    die(f"no model.safetensors or model.safetensors.index.json in {directory}")
    raise AssertionError  # unreachable


def key_group(key: str) -> str:
    if key.startswith("model.decoder.layers."):
        return "model.decoder.layers.*"
    if key.startswith("model.decoder."):
        return "model.decoder (global)"
    if key.startswith(ENCODER_LAYER_PREFIX) and key.endswith(".layer_scalar"):
        return "model.encoder.language_model.layers.*.layer_scalar"
    if key.startswith("model.encoder.language_model."):
        return "model.encoder.language_model (other)"
    for prefix in IGNORED_PREFIXES:
        if key.startswith(prefix):
            return prefix + "* (ignored by BatchLens)"
    return "other"


def expected_checkpoint_keys(state: dict) -> set:
    """What BatchLens loads: every persistent decoder tensor plus the encoder layer_scalar buffers."""
    keys = {k for k in state if k.startswith("model.decoder.")}
    keys |= {k for k in state if k.startswith(ENCODER_LAYER_PREFIX) and k.endswith(".layer_scalar")}
    return keys


def clean_old_checkpoint(directory: Path) -> None:
    removed = []
    for path in sorted(directory.glob("model*.safetensors")) + [directory / "model.safetensors.index.json"]:
        if path.exists():
            path.unlink()
            removed.append(path.name)
    if removed:
        log(f"checkpoint: removed old files {removed}")


def check_disk(directory: Path, needed: int) -> None:
    free = shutil.disk_usage(directory).free
    log(f"checkpoint: about {needed / 2**30:.2f} GiB to write, {free / 2**30:.1f} GiB free in {directory}")
    if free < needed * 1.05 + (1 << 30):
        die(f"not enough free disk space in {directory}: need about {needed / 2**30:.1f} GiB "
            f"(+1 GiB for inputs/references), have {free / 2**30:.1f} GiB")


def save_checkpoint(model, directory: Path, max_shard_size: str) -> None:
    state = model.state_dict()
    seen, needed = set(), 0
    for tensor in state.values():
        if tensor.data_ptr() in seen:
            continue
        seen.add(tensor.data_ptr())
        needed += tensor.numel() * tensor.element_size()
    check_disk(directory, needed)
    clean_old_checkpoint(directory)
    kwargs = {"max_shard_size": max_shard_size}
    if "safe_serialization" in inspect.signature(model.save_pretrained).parameters:
        kwargs["safe_serialization"] = True
    t0 = time.time()
    model.save_pretrained(str(directory), **kwargs)
    log(f"checkpoint: save_pretrained({kwargs}) took {time.time() - t0:.1f} s")
    hf_config = directory / "config.json"
    if hf_config.exists():
        shutil.move(str(hf_config), str(directory / "config.hf.json"))


def cpu_copy(tensor: "torch.Tensor") -> "torch.Tensor":
    return tensor.detach().to("cpu").contiguous().clone()


def verify_checkpoint(model, directory: Path, repair: bool) -> dict:
    """Lists the written keys by group, and checks them against what BatchLens loads: no key
    missing, none unexpected (BatchLens rejects unknown keys other than vision ones), values
    equal to the model's. With `repair`, fixes the files from the in-memory model."""
    keymap, index = read_keymap(directory)
    state = model.state_dict()
    expected = expected_checkpoint_keys(state)
    saved = set(keymap)
    groups: dict = {}
    for key in saved:
        groups[key_group(key)] = groups.get(key_group(key), 0) + 1
    files = sorted({p.name for p in keymap.values()})
    log(f"checkpoint: {len(saved)} tensors in {len(files)} file(s): {files[:3]}{' ...' if len(files) > 3 else ''}")
    for group in sorted(groups):
        log(f"  {groups[group]:6d}  {group}")
    missing = sorted(expected - saved)
    unexpected = sorted(k for k in saved - expected if not k.startswith(IGNORED_PREFIXES))

    total = sum(state[k].numel() * state[k].element_size() for k in expected)
    check_all = total <= 8 * 2**30
    mismatched, not_bf16 = [], []
    by_file: dict = {}
    for key in sorted(saved & expected):
        by_file.setdefault(keymap[key], []).append(key)
    checked = 0
    for path, keys in by_file.items():
        with safe_open(str(path), framework="pt", device="cpu") as handle:
            for key in keys:
                ref = state[key]
                if not check_all and ref.numel() > (1 << 24):
                    continue
                got = handle.get_tensor(key)
                checked += 1
                if got.dtype != torch.bfloat16:
                    not_bf16.append(f"{key}:{got.dtype}")
                if got.dtype != ref.dtype or tuple(got.shape) != tuple(ref.shape) or not torch.equal(
                    got, ref.detach().to("cpu")
                ):
                    mismatched.append(key)
    log(
        f"checkpoint: expected {len(expected)} keys for BatchLens; missing {len(missing)}, "
        f"unexpected {len(unexpected)}, value-checked {checked} ({'all' if check_all else '<=16M elements'}), "
        f"mismatched {len(mismatched)}"
    )
    for what, keys in (("missing", missing), ("unexpected", unexpected), ("mismatched", mismatched)):
        if keys:
            log(f"  {what}: {keys[:6]}{' ...' if len(keys) > 6 else ''}")
    if not_bf16:
        log(f"  WARNING non-bf16 tensors: {not_bf16[:6]}")
    result = {"missing": missing, "unexpected": unexpected, "mismatched": mismatched}
    if not (missing or unexpected or mismatched):
        return result
    if not repair:
        log("checkpoint: WARNING the checkpoint does not match what BatchLens loads (not repaired: --no-save-weights)")
        return result

    log("checkpoint: repairing from the in-memory model")
    unexpected_set, mismatched_set = set(unexpected), set(mismatched)
    touched = sorted({keymap[k] for k in unexpected_set | mismatched_set})
    for path in touched:
        with safe_open(str(path), framework="pt", device="cpu") as handle:
            metadata = handle.metadata() or {"format": "pt"}
        tensors = load_file(str(path))
        for key in list(tensors):
            if key in unexpected_set:
                del tensors[key]
            elif key in mismatched_set:
                tensors[key] = cpu_copy(state[key])
        save_file(tensors, str(path), metadata=metadata)
        log(f"  rewrote {path.name}")
        del tensors
    if missing:
        extra = {k: cpu_copy(state[k]) for k in missing}
        if index is None:
            single = directory / "model.safetensors"
            with safe_open(str(single), framework="pt", device="cpu") as handle:
                metadata = handle.metadata() or {"format": "pt"}
            tensors = load_file(str(single))
            tensors.update(extra)
            save_file(tensors, str(single), metadata=metadata)
            log(f"  added {len(extra)} tensors to model.safetensors")
        else:
            save_file(extra, str(directory / "model-extra.safetensors"), metadata={"format": "pt"})
            log(f"  wrote {len(extra)} tensors to model-extra.safetensors")
    if index is not None:
        data = json.loads(index.read_text())
        weight_map = data["weight_map"]
        for key in unexpected_set:
            weight_map.pop(key, None)
        for key in missing:
            weight_map[key] = "model-extra.safetensors"
        index.write_text(json.dumps(data, indent=2, sort_keys=True) + "\n")
    again = verify_checkpoint(model, directory, repair=False)
    if again["missing"] or again["unexpected"] or again["mismatched"]:
        die("the checkpoint still does not match after the repair")
    return result


def load_checkpoint_into(model, directory: Path, device: "torch.device") -> None:
    """--no-save-weights: loads DIR's existing checkpoint into the freshly built model."""
    keymap, _ = read_keymap(directory)
    state_keys = set(model.state_dict().keys())
    loaded, unexpected = set(), []
    with torch.no_grad():
        for path in sorted(set(keymap.values())):
            tensors = load_file(str(path), device=str(device))
            result = model.load_state_dict(tensors, strict=False)
            unexpected.extend(result.unexpected_keys)
            loaded |= set(tensors) & state_keys
            del tensors
    expected = expected_checkpoint_keys(model.state_dict())
    not_loaded = sorted(expected - loaded)
    log(f"weights: loaded {len(loaded)} tensors from {directory}; {len(unexpected)} unexpected")
    if unexpected:
        log(f"  unexpected: {sorted(unexpected)[:6]}")
    if not_loaded:
        die(f"{len(not_loaded)} tensors BatchLens needs are not in {directory}, e.g. {not_loaded[:6]}")


# --------------------------------------------------------------------------------------------
# Taps
# --------------------------------------------------------------------------------------------


class DecoderTaps:
    """Forward hooks on the decoder modules (never the encoder's: they are separate instances)."""

    def __init__(self, decoder, batch: int, canvas: int):
        self.batch, self.canvas = batch, canvas
        self.taps: dict = {}
        self.rope: dict = {}
        self.handles = []
        self.num_layers = len(decoder.layers)
        self.apply_rope = mdg.apply_rotary_pos_emb
        for i, layer in enumerate(decoder.layers):
            attn = layer.self_attn
            self._add(attn.register_forward_pre_hook(self._attn_pre(i), with_kwargs=True))
            self._add(attn.q_norm.register_forward_hook(self._rotated("attn.q", i)))
            self._add(attn.k_norm.register_forward_hook(self._rotated("attn.k", i)))
            self._add(attn.v_norm.register_forward_hook(self._plain("attn.v", i)))
            self._add(attn.o_proj.register_forward_hook(self._o_proj(i)))
            self._add(layer.mlp.register_forward_hook(self._plain("mlp.out", i)))
            self._add(layer.router.proj.register_forward_hook(self._plain("router.scores", i, flat=True)))
            self._add(layer.router.register_forward_hook(self._router(i)))
            self._add(layer.experts.register_forward_hook(self._plain("moe.out", i, flat=True)))
            self._add(layer.register_forward_hook(self._plain("layer.out", i)))
        self._add(decoder.self_conditioning.register_forward_hook(self._selfcond, with_kwargs=True))

    def _add(self, handle) -> None:
        self.handles.append(handle)

    def remove(self) -> None:
        for handle in self.handles:
            handle.remove()
        self.handles = []

    def _put(self, name: str, tensor: "torch.Tensor", flat: bool = False) -> None:
        if name in self.taps:
            raise RuntimeError(f"tap {name} recorded twice in one forward")
        tensor = tensor.detach()
        if flat:  # [B*C, X] -> [B, C, X]
            tensor = tensor.reshape(self.batch, self.canvas, -1)
        if tensor.shape[0] != self.batch or tensor.shape[1] != self.canvas:
            raise RuntimeError(f"tap {name}: unexpected shape {tuple(tensor.shape)}")
        self.taps[name] = tensor.to("cpu").contiguous().clone()

    @staticmethod
    def _first(output):
        return output[0] if isinstance(output, (tuple, list)) else output

    def _attn_pre(self, i: int):
        def hook(module, args, kwargs):
            pe = kwargs.get("position_embeddings")
            if pe is None and len(args) > 1:
                pe = args[1]
            self.rope[i] = pe

        return hook

    def _rotated(self, tap: str, i: int):
        # q_norm / k_norm output [B, C, H, D]; the attention applies RoPE next with exactly this
        # call, so recomputing it here gives the same bits.
        def hook(module, args, output):
            cos, sin = self.rope[i]
            self._put(f"{tap}.{i}", self.apply_rope(output, cos, sin, unsqueeze_dim=2))

        return hook

    def _plain(self, tap: str, i: int, flat: bool = False):
        def hook(module, args, output):
            self._put(f"{tap}.{i}", self._first(output), flat=flat)

        return hook

    def _o_proj(self, i: int):
        def hook(module, args, output):
            self._put(f"attn.out.{i}", args[0])
            self._put(f"attn.o_proj.{i}", output)

        return hook

    def _router(self, i: int):
        def hook(module, args, output):
            _, weights, ids = output
            self._put(f"router.topk_weights.{i}", weights, flat=True)
            self._put(f"router.topk_ids.{i}", ids, flat=True)

        return hook

    def _selfcond(self, module, args, kwargs, output):
        soft = args[1] if len(args) > 1 else kwargs.get("self_conditioning_signal")
        self._put("selfcond.soft_embed", soft)
        self._put("selfcond.out", output)

    def check_complete(self) -> None:
        want = [f"{t}.{i}" for i in range(self.num_layers) for t in LAYER_TAPS] + list(STEP_TAPS)
        missing = [n for n in want if n not in self.taps]
        if missing:
            die(f"hooks did not record {len(missing)} taps, e.g. {missing[:6]}")


# --------------------------------------------------------------------------------------------
# Inputs, self-conditioning, timing
# --------------------------------------------------------------------------------------------


def make_inputs(vocab: int, prompt_len: int, canvas: int, batch: int, seed: int,
                image_token_id, keep_image_token: bool):
    gen_prompt = torch.Generator().manual_seed(seed + 1)
    prompt = torch.randint(3, vocab, (1, prompt_len), generator=gen_prompt, dtype=torch.int64)
    if not keep_image_token and image_token_id is not None and 0 <= int(image_token_id) < vocab:
        hits = prompt == int(image_token_id)
        if bool(hits.any()):
            # The encoder replaces image placeholders by pad before the lookup (vision path);
            # text-only parity does not cover that, so keep them out of the prompt.
            log(f"inputs: replaced {int(hits.sum())} image_token_id ({image_token_id}) prompt tokens by 3")
            prompt[hits] = 3
    gen_canvas = torch.Generator().manual_seed(seed + 2)
    canvas_ids = torch.randint(0, vocab, (1, canvas), generator=gen_canvas, dtype=torch.int64)
    return prompt.repeat(batch, 1).contiguous(), canvas_ids.repeat(batch, 1).contiguous()


def self_conditioning_logits(logits, step: int, steps: int, t_min: float, t_max: float):
    """What the sampler feeds back: processed = logits / T(step), then .to(embedding dtype).
    Uses the generation code's own processor so the division is the same op."""
    cur_step = torch.tensor(step, device=logits.device, dtype=torch.int32)
    temperature = t_min + ((t_max - t_min) * (cur_step / steps))
    try:
        from transformers.models.diffusion_gemma.generation_diffusion_gemma import (
            LinearTemperatureScheduleLogitsProcessor,
        )

        processor = LinearTemperatureScheduleLogitsProcessor(t_min=t_min, t_max=t_max, max_denoising_steps=steps)
        processed = processor(None, logits, cur_step=cur_step)
    except ImportError:
        processed = logits / temperature
    return processed.to(torch.bfloat16), float(temperature)


def time_ms(fn, warmup: int, reps: int) -> dict:
    for _ in range(warmup):
        fn()
    torch.cuda.synchronize()
    samples = []
    for _ in range(reps):
        start = torch.cuda.Event(enable_timing=True)
        end = torch.cuda.Event(enable_timing=True)
        start.record()
        fn()
        end.record()
        end.synchronize()
        samples.append(start.elapsed_time(end))
    return {
        "median": statistics.median(samples),
        "mean": statistics.fmean(samples),
        "min": min(samples),
        "max": max(samples),
        "samples": samples,
    }


def run_timing(model, prompt1, canvas1, batches, warmup, reps, sc_args) -> dict:
    result = {}
    with torch.inference_mode():
        for b in batches:
            prompt = prompt1[:1].repeat(b, 1)
            canvas = canvas1[:1].repeat(b, 1)
            cache = model.model.encoder(input_ids=prompt).past_key_values
            first = model(past_key_values=cache, decoder_input_ids=canvas)
            sc, _ = self_conditioning_logits(first.logits, *sc_args)
            del first
            entry = {
                "encode_ms": time_ms(lambda: model.model.encoder(input_ids=prompt), warmup, reps),
                "decode_nosc_ms": time_ms(
                    lambda: model(past_key_values=cache, decoder_input_ids=canvas), warmup, reps
                ),
                "decode_sc_ms": time_ms(
                    lambda: model(past_key_values=cache, decoder_input_ids=canvas, self_conditioning_logits=sc),
                    warmup,
                    reps,
                ),
            }
            result[str(b)] = entry
            log(
                f"timing: B={b}: encode {entry['encode_ms']['median']:.3f} ms, decode "
                f"{entry['decode_nosc_ms']['median']:.3f} ms (no SC), {entry['decode_sc_ms']['median']:.3f} ms (SC)"
                " [median]"
            )
            del cache, sc
            torch.cuda.empty_cache()
    return result


# --------------------------------------------------------------------------------------------
# Main
# --------------------------------------------------------------------------------------------


def configure_backends() -> dict:
    for setter in (
        lambda: setattr(torch.backends.cuda.matmul, "allow_tf32", False),
        lambda: setattr(torch.backends.cudnn, "allow_tf32", False),
    ):
        try:
            setter()
        except Exception as exc:  # noqa: BLE001
            log(f"backends: {exc}")

    def read(obj, attr):
        try:
            return bool(getattr(obj, attr))
        except Exception as exc:  # noqa: BLE001
            return f"unreadable: {exc}"

    return {
        "cuda.matmul.allow_tf32": read(torch.backends.cuda.matmul, "allow_tf32"),
        "cudnn.allow_tf32": read(torch.backends.cudnn, "allow_tf32"),
        "cuda.matmul.allow_bf16_reduced_precision_reduction": read(
            torch.backends.cuda.matmul, "allow_bf16_reduced_precision_reduction"
        ),
        "cuda.matmul.allow_fp16_reduced_precision_reduction": read(
            torch.backends.cuda.matmul, "allow_fp16_reduced_precision_reduction"
        ),
    }


def parse_args(argv=None):
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--config", required=True, type=Path, help="BatchLens preset json (HF config.json layout)")
    p.add_argument("--out", required=True, type=Path, help="output directory (checkpoint + inputs + references)")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--batch", type=int, default=1, help="rows (all identical)")
    p.add_argument("--prompt-len", type=int, default=20)
    p.add_argument("--experts", choices=("grouped_mm", "eager"), default="grouped_mm")
    p.add_argument("--device", default="cuda")
    p.add_argument("--no-save-weights", action="store_true",
                   help="reuse the checkpoint already in --out instead of writing new random weights")
    p.add_argument("--build-on-device", action="store_true",
                   help="construct in bf16 directly on the device (automatic above 4e9 parameters)")
    p.add_argument("--max-shard-size", default="5GB", help="save_pretrained max_shard_size")
    p.add_argument("--no-perturb", action="store_true",
                   help="keep HF's init (all norm weights, router scales and layer_scalar = 1)")
    p.add_argument("--keep-image-token", action="store_true",
                   help="allow image_token_id in the random prompt (HF then embeds pad in its place)")
    p.add_argument("--t-min", type=float, default=0.4)
    p.add_argument("--t-max", type=float, default=0.8)
    p.add_argument("--denoising-steps", type=int, default=48)
    p.add_argument("--sc-step", type=int, default=48,
                   help="cur_step whose temperature scales the SC logits (48 = first step, T = t_max)")
    p.add_argument("--time", action="store_true", help="time prefill and decoder forward at B=1 and B=4")
    p.add_argument("--time-warmup", type=int, default=3)
    p.add_argument("--time-reps", type=int, default=10)
    p.add_argument("--no-repeat-check", action="store_true",
                   help="skip re-running the no-SC forward to check the reference is repeatable")
    return p.parse_args(argv)


def main(argv=None) -> int:
    args = parse_args(argv)
    try:  # the shard-writing progress bar only clutters the report
        transformers.utils.logging.disable_progress_bar()
    except Exception:  # noqa: BLE001
        pass
    device = torch.device(args.device)
    if device.type == "cuda" and not torch.cuda.is_available():
        die("CUDA is not available")
    backends = configure_backends()
    out = args.out
    out.mkdir(parents=True, exist_ok=True)
    preset = json.loads(args.config.read_text())
    text = preset.get("text_config") or {}

    log(f"make_reference: preset {args.config} -> {out}")
    log(f"  python {platform.python_version()}, torch {torch.__version__} (CUDA {torch.version.cuda}), "
        f"transformers {transformers.__version__}")
    if device.type == "cuda":
        log(f"  device {torch.cuda.get_device_name(device)}")
    log(f"  backends {backends}")

    config = build_config(preset)
    set_config_implementations(config, "sdpa", args.experts)
    tc = config.text_config
    vocab, hidden = int(tc.vocab_size), int(tc.hidden_size)
    canvas_len = int(getattr(config, "canvas_length", None) or preset.get("canvas_length", 256))
    num_experts, top_k = int(tc.num_experts), int(tc.top_k_experts)
    log(f"config: vocab {vocab}, hidden {hidden}, layers {tc.num_hidden_layers} {list(tc.layer_types)}, "
        f"experts {num_experts} top-{top_k}, canvas {canvas_len}, sliding_window {tc.sliding_window}")

    params = estimate_text_params(text) if text else 0.0
    on_device = args.build_on_device
    if not on_device and device.type == "cuda" and params > AUTO_DEVICE_BUILD_PARAMS:
        log(f"model: ~{params / 1e9:.1f} B parameters: building on the device (as --build-on-device)")
        on_device = True
    model = build_model(config, device, args.seed, on_device)
    impl = select_implementations(model, args.experts)

    if args.no_save_weights:
        load_checkpoint_into(model, out, device)
    elif not args.no_perturb:
        perturb_scales(model, args.seed)
    sync_encoder_with_decoder(model)
    weight_sanity(model)

    if not args.no_save_weights:
        save_checkpoint(model, out, args.max_shard_size)
    checkpoint_report = verify_checkpoint(model, out, repair=not args.no_save_weights)
    if args.config.resolve() != (out / "config.json").resolve():
        shutil.copyfile(str(args.config), str(out / "config.json"))
    log("checkpoint: config.json = the preset (transformers' config, if written, is config.hf.json)")

    # ---- inputs
    prompt, canvas = make_inputs(vocab, args.prompt_len, canvas_len, args.batch, args.seed,
                                 getattr(config, "image_token_id", None), args.keep_image_token)
    prompt_d, canvas_d = prompt.to(device), canvas.to(device)
    meta = {
        "seed": str(args.seed), "batch": str(args.batch), "prompt_len": str(args.prompt_len),
        "canvas_len": str(canvas_len), "experts": args.experts, "preset": str(args.config),
    }

    # ---- reference forwards
    decoder = model.model.decoder
    with torch.inference_mode():
        taps = DecoderTaps(decoder, args.batch, canvas_len)
        out_a = model(input_ids=prompt_d, decoder_input_ids=canvas_d)
        taps.check_complete()
        taps.remove()
        logits_a = out_a.logits
        if logits_a.dtype != torch.float32 or tuple(logits_a.shape) != (args.batch, canvas_len, vocab):
            die(f"unexpected logits {logits_a.dtype} {tuple(logits_a.shape)}")
        if not bool(torch.isfinite(logits_a).all()):
            die("the reference logits are not finite")
        log(f"reference: logits mean {float(logits_a.mean()):.4f} std {float(logits_a.std()):.4f}, "
            f"max |logit| {float(logits_a.abs().max()):.4f}")
        ref_a = dict(taps.taps)
        ref_a["logits"] = logits_a.detach().to("cpu").contiguous().clone()
        del out_a

        sc, temperature = self_conditioning_logits(logits_a, args.sc_step, args.denoising_steps,
                                                   args.t_min, args.t_max)
        log(f"self-conditioning: logits / T with T = {temperature!r} (step {args.sc_step}/{args.denoising_steps}), bf16")
        taps = DecoderTaps(decoder, args.batch, canvas_len)
        out_b = model(input_ids=prompt_d, decoder_input_ids=canvas_d, self_conditioning_logits=sc)
        taps.check_complete()
        taps.remove()
        ref_b = dict(taps.taps)
        ref_b["logits"] = out_b.logits.detach().to("cpu").contiguous().clone()
        del out_b

        repeat_ok = None
        if not args.no_repeat_check:
            again = model(input_ids=prompt_d, decoder_input_ids=canvas_d).logits
            repeat_ok = bool(torch.equal(again, logits_a))
            log(f"reference: re-run of the no-SC forward is {'bitwise equal' if repeat_ok else 'NOT bitwise equal'}")
            del again
        rows_equal = None
        if args.batch > 1:
            rows_equal = [bool(torch.equal(logits_a[r], logits_a[0])) for r in range(args.batch)]
            log(f"reference: rows bitwise equal to row 0 (no SC): {rows_equal}")
        sc_cpu = sc.detach().to("cpu").contiguous().clone()
        del sc, logits_a

    def saveable(tensors: dict) -> dict:  # clone outside inference mode: plain tensors, own storage
        return {k: v.clone().contiguous() for k, v in tensors.items()}

    save_file(saveable({"input_ids": prompt, "decoder_input_ids": canvas}),
              str(out / "inputs_nosc.safetensors"), metadata=meta)
    save_file(saveable({"input_ids": prompt, "decoder_input_ids": canvas, "self_conditioning_logits": sc_cpu}),
              str(out / "inputs_sc.safetensors"), metadata={**meta, "sc_temperature": repr(temperature)})
    save_file(saveable(ref_a), str(out / "reference_nosc.safetensors"), metadata={**meta, "self_conditioning": "no"})
    save_file(saveable(ref_b), str(out / "reference_sc.safetensors"), metadata={**meta, "self_conditioning": "yes"})
    log(f"wrote inputs_nosc/inputs_sc and reference_nosc/reference_sc ({len(ref_a)} tensors each) in {out}")

    info = {
        "preset": str(args.config), "seed": args.seed, "batch": args.batch, "prompt_len": args.prompt_len,
        "canvas_len": canvas_len, "vocab": vocab, "perturbed_scales": not args.no_perturb and not args.no_save_weights,
        "built_on_device": on_device, "sc_temperature": temperature, "sc_step": args.sc_step,
        "torch": torch.__version__, "cuda": torch.version.cuda, "transformers": transformers.__version__,
        "device": torch.cuda.get_device_name(device) if device.type == "cuda" else str(device),
        "backends": backends, **impl, "reference_repeatable": repeat_ok, "rows_equal_to_row0": rows_equal,
        "checkpoint_repairs": {k: len(v) for k, v in checkpoint_report.items()},
        "vision_config": None if config.vision_config is None else config.vision_config.to_dict(),
    }

    if args.time:
        if device.type != "cuda":
            log("timing: skipped (needs CUDA)")
        else:
            timing = {
                "device": info["device"], "experts": args.experts, "canvas_len": canvas_len,
                "prompt_len": args.prompt_len, "warmup": args.time_warmup, "reps": args.time_reps,
                "what": "encode = model.model.encoder(input_ids); decode = model(past_key_values=cache, "
                        "decoder_input_ids=canvas[, self_conditioning_logits]) incl. lm_head + softcap",
                "batches": run_timing(model, prompt_d, canvas_d, (1, 4), args.time_warmup, args.time_reps,
                                      (args.sc_step, args.denoising_steps, args.t_min, args.t_max)),
            }
            (out / "reference_timing.json").write_text(json.dumps(timing, indent=2) + "\n")
            log(f"wrote {out / 'reference_timing.json'}")

    (out / "reference_meta.json").write_text(json.dumps(info, indent=2, default=str) + "\n")
    log(f"wrote {out / 'reference_meta.json'}")
    log("next: batchlens-cli forward --checkpoint "
        f"{out} --inputs {out / 'inputs_nosc.safetensors'} --out {out / 'ours_nosc.safetensors'} "
        f"--device {args.device} --dtype bf16 --experts {args.experts} --taps all")
    return 0


if __name__ == "__main__":
    os.environ.setdefault("PYTHONUNBUFFERED", "1")
    sys.exit(main())
