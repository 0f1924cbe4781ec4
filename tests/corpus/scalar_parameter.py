"""A correct port with a 0-d parameter: a linear projection times ``exp(logit_scale)``, as CLIP scales its logits
(``nn.Parameter(torch.tensor(x))``, a tensor of no axes). Flax Linen, trained with Adam.

    functional-gan check-port tests/corpus/scalar_parameter.py --dtype float64
"""

import math

import flax.linen as nn
import jax.numpy as jnp
import numpy as np
import optax
import torch


class Scaled(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.proj = torch.nn.Linear(6, 4)
        self.logit_scale = torch.nn.Parameter(torch.tensor(math.log(1 / 0.07)))

    def forward(self, x):
        return self.proj(x) * self.logit_scale.exp()


class Port(nn.Module):
    @nn.compact
    def __call__(self, x):
        scale = self.param("logit_scale", lambda key: jnp.asarray(math.log(1 / 0.07), x.dtype))
        return nn.Dense(4, name="proj")(x) * jnp.exp(scale)


def torch_model():
    return Scaled()


def jax_model():
    return Port()


def example_inputs():
    return (np.random.default_rng(0).normal(size=(8, 6)).astype(np.float32),)


def example_targets():
    return (np.random.default_rng(1).integers(0, 4, 8),)


def torch_loss(logits, x, labels):
    return torch.nn.functional.cross_entropy(logits, labels)


def jax_loss(logits, x, labels):
    return optax.softmax_cross_entropy_with_integer_labels(logits, labels).mean()


def torch_optimizer(parameters):
    return torch.optim.Adam(parameters, lr=1e-3)


def jax_optimizer():
    return optax.adam(1e-3)
