"""The smallest check-port spec: a PyTorch MLP and its Flax Linen port, one training step (the first page of
docs/check-port.md).

    functional-gan check-port examples/port/minimal.py
"""
import flax.linen as nn
import jax.numpy as jnp
import numpy as np
import optax
import torch


def torch_model():  # the PyTorch model, as it is
    return torch.nn.Sequential(torch.nn.Linear(4, 16), torch.nn.GELU(), torch.nn.Linear(16, 3))


class Port(nn.Module):  # the JAX port being checked
    @nn.compact
    def __call__(self, x):
        return nn.Dense(3)(nn.gelu(nn.Dense(16)(x), approximate=False))


def jax_model():
    return Port()


def example_inputs():  # what PyTorch's model takes, as NumPy arrays
    return (np.random.default_rng(0).normal(size=(8, 4)).astype(np.float32),)


def example_targets():
    return (np.random.default_rng(1).integers(0, 3, 8),)


def torch_loss(logits, x, labels):
    return torch.nn.functional.cross_entropy(logits, labels)


def jax_loss(logits, x, labels):
    return optax.softmax_cross_entropy_with_integer_labels(logits, labels).mean()


def torch_optimizer(parameters):
    return torch.optim.SGD(parameters, lr=0.1)


def jax_optimizer():
    return optax.sgd(0.1)
