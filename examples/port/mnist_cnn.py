"""pytorch/examples' MNIST classifier (mnist/main.py, ``Net``) and a hand-written Flax port.

    functional-gan check-port examples/port/mnist_cnn.py [--dtype float64]

The PyTorch model is the example's, line for line; its optimizer is the example's Adadelta
(lr 1.0). Compared in eval mode (``TRAIN = False``): dropout draws random masks that two
frameworks cannot share. The port flattens channels-first before ``fc1``, as PyTorch does: a
channels-last flatten would need ``fc1``'s rows permuted, a classic porting mistake (planted below).
"""

import flax.linen as fnn
import jax.numpy as jnp
import numpy as np
import optax
import torch
import torch.nn as nn
import torch.nn.functional as F

TRAIN = False


class Net(nn.Module):  # pytorch/examples, mnist/main.py
    def __init__(self):
        super().__init__()
        self.conv1 = nn.Conv2d(1, 32, 3, 1)
        self.conv2 = nn.Conv2d(32, 64, 3, 1)
        self.dropout1 = nn.Dropout(0.25)
        self.dropout2 = nn.Dropout(0.5)
        self.fc1 = nn.Linear(9216, 128)
        self.fc2 = nn.Linear(128, 10)

    def forward(self, x):
        x = self.conv1(x)
        x = F.relu(x)
        x = self.conv2(x)
        x = F.relu(x)
        x = F.max_pool2d(x, 2)
        x = self.dropout1(x)
        x = torch.flatten(x, 1)
        x = self.fc1(x)
        x = F.relu(x)
        x = self.dropout2(x)
        x = self.fc2(x)
        output = F.log_softmax(x, dim=1)
        return output


class FlaxNet(fnn.Module):
    mistake: str | None = None

    @fnn.compact
    def __call__(self, x):  # x: NHWC
        x = fnn.relu(fnn.Conv(32, (3, 3), padding="VALID")(x))
        x = fnn.relu(fnn.Conv(64, (3, 3), padding="VALID")(x))
        x = fnn.max_pool(x, (2, 2), strides=(2, 2))
        if self.mistake != "flatten-nhwc":
            x = jnp.transpose(x, (0, 3, 1, 2))  # flatten in PyTorch's (C, H, W) order
        x = x.reshape(x.shape[0], -1)
        x = fnn.relu(fnn.Dense(128)(x))
        x = fnn.Dense(10)(x)
        return fnn.log_softmax(x, axis=-1)


# Planted mistakes (tests/test_check_port.py): name → (the stage, the layer the report must name).
MISTAKES = {"flatten-nhwc": ("forward", "fc1"), "adadelta-rho": ("update", "conv1.weight")}
MISTAKE = None


torch_model = Net  # built under the checker's torch.manual_seed(0)


def jax_model():
    return FlaxNet(mistake=MISTAKE)


def example_inputs():
    return (np.random.default_rng(0).normal(0.0, 1.0, (8, 1, 28, 28)).astype(np.float32),)


def example_targets():
    return (np.random.default_rng(1).integers(0, 10, 8),)


def torch_loss(output, x, target):
    return F.nll_loss(output, target)


def jax_loss(output, x, target):
    return -jnp.mean(jnp.take_along_axis(output, target[:, None], axis=1))


def torch_optimizer(parameters):
    return torch.optim.Adadelta(parameters, lr=1.0)


def jax_optimizer():
    return optax.adadelta(1.0, rho=0.95 if MISTAKE == "adadelta-rho" else 0.9, eps=1e-6)
