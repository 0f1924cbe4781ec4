"""A stack of nanoGPT's ``Block`` (PyTorch: a ``ModuleList``, one block after the other) and a Flax Linen port that
scans over its layers, as large Linen and NNX transformers are written (one block's code, its parameters stacked
along a first axis of length ``N_LAYER``, ``nn.scan`` running it once per layer).

    functional-gan check-port examples/port/nanogpt_scan.py [--dtype float64] [--steps 2]

The blocks are ``nanogpt_block.py``'s (karpathy/nanoGPT's model.py, MIT). No ``param_map``: check-port pairs
``h.3.attn.c_attn.weight`` with the slice 3 of the port's stacked ``h/attn/c_attn/kernel``, and reads each scanned
layer's output per layer (it leaves the scan through a callback), so a mistake in one layer is named there.
"""

import flax.linen as fnn
import jax.numpy as jnp
import torch.nn as nn
from nanogpt_block import (N_EMBD, Block, FlaxBlock, adamw, example_inputs, example_targets,  # noqa: F401 (the spec's folder)
                           from_jax, jax_loss, to_jax, torch_loss, torch_optimizer)

N_LAYER = 4


class Stack(nn.Module):
    def __init__(self):
        super().__init__()
        self.h = nn.ModuleList([Block() for _ in range(N_LAYER)])

    def forward(self, x):
        for block in self.h:
            x = block(x)
        return x


class ScanBlock(FlaxBlock):
    """One layer of the scan: the carry is the activations, the scanned input the layer's index."""

    mistake_layer: int = -1  # a planted mistake: the GELU's tanh approximation in this layer only

    @fnn.compact
    def __call__(self, x, index):
        x = x + _attention(self, x)
        h = fnn.LayerNorm(epsilon=1e-5, name="ln_2")(x)
        h = fnn.Dense(4 * N_EMBD, name="c_fc")(h)
        h = jnp.where(index == self.mistake_layer, fnn.gelu(h, approximate=True), fnn.gelu(h, approximate=False))
        return x + fnn.Dense(N_EMBD, name="c_proj")(h), None


def _attention(block, x):
    from nanogpt_block import FlaxAttention

    return FlaxAttention(name="attn")(fnn.LayerNorm(epsilon=1e-5, name="ln_1")(x))


class ScannedStack(fnn.Module):
    mistake_layer: int = -1

    @fnn.compact
    def __call__(self, x):
        layers = fnn.scan(ScanBlock, variable_axes={"params": 0}, split_rngs={"params": True}, length=N_LAYER)
        x, _ = layers(mistake_layer=self.mistake_layer, name="h")(x, jnp.arange(N_LAYER))
        return x


# Planted mistakes (tests/test_check_port_verdicts.py): name → (the stage, the layer the report must name).
MISTAKES = {"gelu-tanh-in-layer-2": ("forward", "h.2.mlp.c_proj")}
MISTAKE = None

torch_model = Stack  # built under the checker's torch.manual_seed(0)


def jax_model():
    return ScannedStack(mistake_layer=2 if MISTAKE == "gelu-tanh-in-layer-2" else -1)


def jax_optimizer():
    return adamw(1e-3, weight_decay=0.1)
