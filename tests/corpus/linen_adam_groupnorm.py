"""A correct Flax Linen port of a small conv net with GroupNorm, trained with ``optax.adam`` as PyTorch's with
``torch.optim.Adam``: Flax's defaults throughout (``use_fast_variance=True``), as a user writes it.

    functional-gan check-port tests/corpus/linen_adam_groupnorm.py --steps 2
"""

import flax.linen as nn
import jax.numpy as jnp
import numpy as np
import optax
import torch
import torch.nn.functional as F

EPSILON = 1e-5  # GroupNorm's; a planted mistake for the tests sets another


class Net(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.conv1 = torch.nn.Conv2d(3, 16, 3, padding=1)
        self.norm1 = torch.nn.GroupNorm(4, 16)
        self.conv2 = torch.nn.Conv2d(16, 32, 3, stride=2, padding=1)
        self.norm2 = torch.nn.GroupNorm(8, 32)
        self.fc = torch.nn.Linear(32, 10)

    def forward(self, x):
        x = F.relu(self.norm1(self.conv1(x)))
        x = F.relu(self.norm2(self.conv2(x)))
        return self.fc(x.mean(dim=(2, 3)))


class Port(nn.Module):
    @nn.compact
    def __call__(self, x):  # NHWC
        x = nn.relu(nn.GroupNorm(num_groups=4, epsilon=EPSILON, name="norm1")(nn.Conv(16, (3, 3), padding=1, name="conv1")(x)))
        x = nn.relu(nn.GroupNorm(num_groups=8, epsilon=1e-5, name="norm2")(
            nn.Conv(32, (3, 3), strides=2, padding=1, name="conv2")(x)))
        return nn.Dense(10, name="fc")(x.mean(axis=(1, 2)))


def torch_model():
    return Net()


def jax_model():
    return Port()


def example_inputs():
    return (np.random.default_rng(0).standard_normal((8, 3, 16, 16)).astype(np.float32),)


def example_targets():
    return (np.random.default_rng(1).integers(0, 10, 8),)


def torch_loss(output, x, target):
    return F.cross_entropy(output, target)


def jax_loss(output, x, target):
    return optax.softmax_cross_entropy_with_integer_labels(output, target).mean()


def torch_optimizer(parameters):
    return torch.optim.Adam(parameters, lr=1e-3)


def jax_optimizer():
    return optax.adam(1e-3)
