"""pytorch/examples' MNIST classifier (mnist/main.py, ``Net``) and an Equinox port.

    functional-gan check-port examples/port/mnist_cnn_equinox.py [--dtype float64]

(needs ``pip install equinox``, or the project's ``port`` extra). The PyTorch side is ``mnist_cnn.py``'s,
imported from the spec's own folder. The port is written the Equinox way: a module of
``eqx.nn`` layers that acts on **one sample** (``PER_SAMPLE = True``: the checker vmaps it over the
batch, as a training loop would), in PyTorch's channels-first layout, so the inputs go in as PyTorch
takes them and the weights keep PyTorch's layouts (but a convolution's bias is ``(out, 1, 1)``).
Compared in eval mode (``TRAIN = False``: ``eqx.nn.inference_mode`` turns the dropouts off).
"""

import equinox as eqx
import jax
import jax.numpy as jnp
import optax

from mnist_cnn import example_inputs, example_targets, jax_loss, torch_loss, torch_model, torch_optimizer  # noqa: F401  (the spec's folder)

TRAIN = False
PER_SAMPLE = True


class EquinoxNet(eqx.Module):
    conv1: eqx.nn.Conv2d
    conv2: eqx.nn.Conv2d
    pool: eqx.nn.MaxPool2d
    dropout1: eqx.nn.Dropout
    dropout2: eqx.nn.Dropout
    fc1: eqx.nn.Linear
    fc2: eqx.nn.Linear
    mistake: str | None = eqx.field(static=True, default=None)

    def __init__(self, key, mistake=None):
        keys = jax.random.split(key, 4)
        self.conv1 = eqx.nn.Conv2d(1, 32, 3, key=keys[0])
        self.conv2 = eqx.nn.Conv2d(32, 64, 3, key=keys[1])
        self.pool = eqx.nn.MaxPool2d(2, 2)
        self.dropout1 = eqx.nn.Dropout(0.25)
        self.dropout2 = eqx.nn.Dropout(0.5)
        self.fc1 = eqx.nn.Linear(9216, 128, key=keys[2])
        self.fc2 = eqx.nn.Linear(128, 10, key=keys[3])
        self.mistake = mistake

    def __call__(self, x):  # x: (1, 28, 28), one sample, channels first
        x = jax.nn.relu(self.conv2(jax.nn.relu(self.conv1(x))))
        x = self.dropout1(self.pool(x))
        if self.mistake == "flatten-hwc":
            x = jnp.transpose(x, (1, 2, 0))  # a channels-last habit carried over
        x = self.dropout2(jax.nn.relu(self.fc1(x.reshape(-1))))
        return jax.nn.log_softmax(self.fc2(x))


# Planted mistakes (tests/test_check_port_apis.py): name → (the stage, the layer the report must name).
MISTAKES = {"flatten-hwc": ("forward", "fc1"), "adadelta-eps": ("update", "conv1.weight")}
MISTAKE = None


def jax_model():
    return EquinoxNet(jax.random.key(0), mistake=MISTAKE)


def jax_optimizer():
    return optax.adadelta(1.0, rho=0.9, eps=1e-4 if MISTAKE == "adadelta-eps" else 1e-6)
