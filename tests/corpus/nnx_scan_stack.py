"""A Flax NNX port whose layers are one stacked module run by ``nnx.scan`` (created by ``nnx.vmap``), as large NNX
transformers are written, against a PyTorch ``ModuleList``: each layer's rows come from inside the scan.

    functional-gan check-port tests/corpus/nnx_scan_stack.py
"""

import jax.numpy as jnp
import numpy as np
import torch
from flax import nnx

LAYERS, D = 3, 16
EPSILON = 1e-5  # nnx.LayerNorm's default is 1e-6, PyTorch's 1e-5: a planted mistake for the tests sets 1e-6


class TorchBlock(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.fc = torch.nn.Linear(D, D)
        self.norm = torch.nn.LayerNorm(D)

    def forward(self, x):
        return x + torch.tanh(self.norm(self.fc(x)))


class TorchNet(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.layers = torch.nn.ModuleList(TorchBlock() for _ in range(LAYERS))
        self.head = torch.nn.Linear(D, 2)

    def forward(self, x):
        for layer in self.layers:
            x = layer(x)
        return self.head(x)


class Block(nnx.Module):
    def __init__(self, rngs):
        dtype = jnp.zeros(()).dtype
        self.fc = nnx.Linear(D, D, param_dtype=dtype, rngs=rngs)
        self.norm = nnx.LayerNorm(D, epsilon=EPSILON, use_fast_variance=False, param_dtype=dtype, rngs=rngs)

    def __call__(self, x):
        return x + jnp.tanh(self.norm(self.fc(x)))


class Net(nnx.Module):
    def __init__(self, rngs):
        @nnx.split_rngs(splits=LAYERS)
        @nnx.vmap(in_axes=(0,), out_axes=0)
        def create(rngs):
            return Block(rngs)

        self.layers = create(rngs)  # one Block whose parameters have a leading axis of LAYERS
        self.head = nnx.Linear(D, 2, param_dtype=jnp.zeros(()).dtype, rngs=rngs)

    def __call__(self, x):
        @nnx.scan(in_axes=(nnx.Carry, 0), out_axes=nnx.Carry)
        def step(x, layer):
            return layer(x)

        return self.head(step(x, self.layers))


def torch_model():
    return TorchNet()


def jax_model():
    return Net(nnx.Rngs(0))


def example_inputs():
    return (np.random.default_rng(0).normal(size=(8, D)).astype(np.float32),)


def example_targets():
    return (np.random.default_rng(1).normal(size=(8, 2)).astype(np.float32),)


def torch_loss(output, x, target):
    return ((output - target) ** 2).mean()


def jax_loss(output, x, target):
    return ((output - target) ** 2).mean()
