"""A correct Flax NNX port of a MobileNet-style block (depthwise and pointwise convolutions, BatchNorm, ReLU6) in
train mode with Adam, written by a new user trying check-port: PyTorch's BatchNorm2d as an NNX module of its own
(running variance unbiased, momentum 0.1), its running statistics updated in place (``self.running_mean[...] = ...``).

In float64 over 2 steps, the op-by-op program's rows were judged by the compiled program's float32 rounding, about a
third of its own here, and three gradients read as a divergence of the op-by-op program alone (3.5-5.0×); op by op
alone, the in-place update met a NumPy array in the variable in the float32 run. Both are the checker's, fixed.

    functional-gan check-port tests/corpus/mobilenet_nnx_block.py --dtype float64 --steps 2
"""

import jax
import jax.numpy as jnp
import numpy as np
import optax
import torch
from flax import nnx

CIN, COUT, NCLS, B, S = 8, 16, 3, 4, 8


class TorchNet(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.dw = torch.nn.Conv2d(CIN, CIN, 3, padding=1, groups=CIN, bias=False)
        self.bn1 = torch.nn.BatchNorm2d(CIN)
        self.pw = torch.nn.Conv2d(CIN, COUT, 1, bias=False)
        self.bn2 = torch.nn.BatchNorm2d(COUT)
        self.fc = torch.nn.Linear(COUT, NCLS)

    def forward(self, x):
        x = torch.nn.functional.relu6(self.bn1(self.dw(x)))
        x = torch.nn.functional.relu6(self.bn2(self.pw(x)))
        return self.fc(x.mean(dim=(2, 3)))


torch_model = TorchNet


class BatchNorm2d(nnx.Module):
    """PyTorch's BatchNorm2d, train mode, on NHWC: batch statistics, unbiased running variance, momentum 0.1."""
    def __init__(self, c, momentum=0.1, eps=1e-5):
        self.weight = nnx.Param(jnp.ones(c))
        self.bias = nnx.Param(jnp.zeros(c))
        self.running_mean = nnx.BatchStat(jnp.zeros(c))
        self.running_var = nnx.BatchStat(jnp.ones(c))
        self.momentum, self.eps = momentum, eps

    def __call__(self, x):
        mean = x.mean(axis=(0, 1, 2))
        var = ((x - mean) ** 2).mean(axis=(0, 1, 2))
        n = x.size // x.shape[-1]
        m = self.momentum
        self.running_mean[...] = (1 - m) * self.running_mean[...] + m * mean
        self.running_var[...] = (1 - m) * self.running_var[...] + m * var * n / (n - 1)
        return (x - mean) / jnp.sqrt(var + self.eps) * self.weight[...] + self.bias[...]


class NNXNet(nnx.Module):
    def __init__(self, rngs):
        self.dw = nnx.Conv(CIN, CIN, (3, 3), padding=1, feature_group_count=CIN, use_bias=False, rngs=rngs)
        self.bn1 = BatchNorm2d(CIN)
        self.pw = nnx.Conv(CIN, COUT, (1, 1), use_bias=False, rngs=rngs)
        self.bn2 = BatchNorm2d(COUT)
        self.fc = nnx.Linear(COUT, NCLS, rngs=rngs)

    def __call__(self, x):  # NHWC
        x = jax.nn.relu6(self.bn1(self.dw(x)))
        x = jax.nn.relu6(self.bn2(self.pw(x)))
        return self.fc(x.mean(axis=(1, 2)))


def jax_model():
    return NNXNet(nnx.Rngs(0))


def example_inputs():
    return (np.random.default_rng(0).normal(size=(B, CIN, S, S)).astype(np.float32),)


def example_targets():
    return (np.random.default_rng(1).integers(0, NCLS, B),)


def torch_loss(logits, x, labels):
    return torch.nn.functional.cross_entropy(logits, labels)


def jax_loss(logits, x, labels):
    return optax.softmax_cross_entropy_with_integer_labels(logits, labels).mean()


def torch_optimizer(parameters):
    return torch.optim.Adam(parameters, lr=1e-3)


def jax_optimizer():
    return optax.adam(1e-3)
