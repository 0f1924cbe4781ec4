"""pytorch/examples' MNIST classifier (mnist/main.py, ``Net``) and a Flax NNX port.

    functional-gan check-port examples/port/mnist_cnn_nnx.py [--dtype float64]

The PyTorch side is ``mnist_cnn.py``'s (the example's ``Net``, Adadelta with lr 1.0), imported from
the spec's own folder. The port is written as Flax's documentation now teaches new users: an
``nnx.Module`` that owns its layers, built eagerly with ``nnx.Rngs``; NNX layers keep Flax's layouts
(``nnx.Conv`` kernels (kH, kW, in, out), ``nnx.Linear`` kernels (in, out)), so the weights move in as
for Linen, and the checker reads each layer's output with ``nnx.capture``. Compared in eval mode
(``TRAIN = False``: ``model.eval()`` turns the dropouts off).
"""

import jax.numpy as jnp
import optax
from flax import nnx

from mnist_cnn import example_inputs, example_targets, jax_loss, torch_loss, torch_model, torch_optimizer  # noqa: F401  (the spec's folder)

TRAIN = False


class NNXNet(nnx.Module):
    def __init__(self, rngs: nnx.Rngs, mistake: str | None = None):
        self.mistake = mistake
        self.conv1 = nnx.Conv(1, 32, (3, 3), padding="VALID", rngs=rngs)
        self.conv2 = nnx.Conv(32, 64, (3, 3), padding="VALID", rngs=rngs)
        self.dropout1 = nnx.Dropout(0.25, rngs=rngs)
        self.dropout2 = nnx.Dropout(0.5, rngs=rngs)
        self.fc1 = nnx.Linear(9216, 128, rngs=rngs)
        self.fc2 = nnx.Linear(128, 10, rngs=rngs)

    def __call__(self, x):  # x: NHWC
        x = nnx.relu(self.conv2(nnx.relu(self.conv1(x))))
        x = self.dropout1(nnx.max_pool(x, (2, 2), strides=(2, 2)))
        if self.mistake != "flatten-nhwc":
            x = jnp.transpose(x, (0, 3, 1, 2))  # flatten in PyTorch's (C, H, W) order
        x = self.dropout2(nnx.relu(self.fc1(x.reshape(x.shape[0], -1))))
        x = self.fc2(x)
        if self.mistake == "log-softmax-axis":
            return nnx.log_softmax(x, axis=0)
        return nnx.log_softmax(x, axis=-1)


# Planted mistakes (tests/test_check_port_apis.py): name → (the stage, the layer the report must name).
MISTAKES = {"flatten-nhwc": ("forward", "fc1"), "log-softmax-axis": ("output", "output"),
            "adadelta-rho": ("update", "conv1.weight")}
MISTAKE = None


def jax_model():
    return NNXNet(nnx.Rngs(0), mistake=MISTAKE)


def jax_optimizer():
    return optax.adadelta(1.0, rho=0.95 if MISTAKE == "adadelta-rho" else 0.9, eps=1e-6)
