# SPDX-License-Identifier: Apache-2.0
"""Tap names shared by make_reference.py and compare.py. Must match core/probe/tap_names.cpp."""

# Per-layer taps, in dataflow order.
LAYER_TAPS = (
    "attn.q",
    "attn.k",
    "attn.v",
    "attn.out",
    "attn.o_proj",
    "mlp.out",
    "router.scores",
    "router.topk_ids",
    "router.topk_weights",
    "moe.out",
    "layer.out",
)
# Per-step taps recorded before the layers.
STEP_TAPS = ("selfcond.soft_embed", "selfcond.out")
