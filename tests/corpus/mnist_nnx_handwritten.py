"""A hand-written Flax NNX port of pytorch/examples' MNIST ``Net`` (mnist/main.py), as a user writes it: its own
module, PyTorch's flatten order, trained with Adadelta. A correct port whose float64 rows sit near the old allowance.

    functional-gan check-port tests/corpus/mnist_nnx_handwritten.py --dtype float64
"""

import jax
import jax.numpy as jnp
import numpy as np
import optax
import torch
import torch.nn as nn
import torch.nn.functional as F
from flax import nnx

TRAIN = False
BATCH = 32
# A planted mistake for the tests: fc1's output scaled by 1 + FC1_SCALED (None: the correct port)
FC1_SCALED = None


class Net(nn.Module):
    def __init__(self):
        super().__init__()
        self.conv1 = nn.Conv2d(1, 32, 3, 1)
        self.conv2 = nn.Conv2d(32, 64, 3, 1)
        self.dropout1 = nn.Dropout(0.25)
        self.dropout2 = nn.Dropout(0.5)
        self.fc1 = nn.Linear(9216, 128)
        self.fc2 = nn.Linear(128, 10)

    def forward(self, x):
        x = F.relu(self.conv1(x))
        x = F.max_pool2d(F.relu(self.conv2(x)), 2)
        x = torch.flatten(self.dropout1(x), 1)
        x = self.dropout2(F.relu(self.fc1(x)))
        return F.log_softmax(self.fc2(x), dim=1)


class Port(nnx.Module):
    def __init__(self, rngs):
        dtype = jnp.zeros(()).dtype
        self.conv1 = nnx.Conv(1, 32, (3, 3), padding="VALID", param_dtype=dtype, rngs=rngs)
        self.conv2 = nnx.Conv(32, 64, (3, 3), padding="VALID", param_dtype=dtype, rngs=rngs)
        self.fc1 = nnx.Linear(9216, 128, param_dtype=dtype, rngs=rngs)
        self.fc2 = nnx.Linear(128, 10, param_dtype=dtype, rngs=rngs)

    def __call__(self, x):  # NHWC
        x = jax.nn.relu(self.conv1(x))
        x = nnx.max_pool(jax.nn.relu(self.conv2(x)), (2, 2), strides=(2, 2))
        x = jnp.transpose(x, (0, 3, 1, 2)).reshape(x.shape[0], -1)
        hidden = self.fc1(x) * (1 + FC1_SCALED) if FC1_SCALED else self.fc1(x)
        return jax.nn.log_softmax(self.fc2(jax.nn.relu(hidden)), axis=-1)


def torch_model():
    return Net()


def jax_model():
    return Port(nnx.Rngs(0))


def example_inputs():  # MNIST-normalised noise in [0, 1]
    pixels = np.random.default_rng(7).random((BATCH, 1, 28, 28), dtype=np.float32)
    return ((pixels - 0.1307) / 0.3081,)


def example_targets():
    return (np.random.default_rng(8).integers(0, 10, BATCH),)


def torch_loss(output, x, target):
    return F.nll_loss(output, target)


def jax_loss(output, x, target):
    return -jnp.take_along_axis(output, target[:, None], axis=1).mean()


def torch_optimizer(parameters):
    return torch.optim.Adadelta(parameters, lr=1.0)


def jax_optimizer():
    return optax.adadelta(1.0, rho=0.9, eps=1e-6)
