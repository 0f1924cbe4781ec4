"""A correct Flax Linen port of ``torch.nn.LSTM`` (batch_first, 2 layers) and a Linear head, written by a new user trying
check-port: PyTorch's parameters under their own names and layouts (the four gates i, f, g, o packed in one matrix,
two biases), the recurrence a ``jax.lax.scan``. Both the LSTM and the port's module return a tuple, the sequence's
outputs first (PyTorch: ``(output, (h_n, c_n))``): each layer's row compares the first array (check-port crashed on
a tuple before, on either side).

    functional-gan check-port tests/corpus/lstm_torch_layout.py --dtype float64 --steps 2
"""
import flax.linen as nn
import jax
import jax.numpy as jnp
import numpy as np
import optax
import torch

I, H, C, B, T = 5, 8, 3, 4, 6


GATES = "ifgo"  # the order of the packed gates, PyTorch's; a planted mistake for the tests sets another


class TorchLSTM(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.lstm = torch.nn.LSTM(I, H, num_layers=2, batch_first=True)
        self.head = torch.nn.Linear(H, C)

    def forward(self, x):
        out, _ = self.lstm(x)
        return self.head(out[:, -1])


torch_model = TorchLSTM


class TorchLayoutLSTM(nn.Module):
    """torch.nn.LSTM's parameters, names and layouts (gates i, f, g, o packed in one matrix)."""
    hidden: int
    num_layers: int

    @nn.compact
    def __call__(self, x):  # x: (B, T, in)
        k = 1.0 / np.sqrt(self.hidden)
        init = lambda key, shape: jax.random.uniform(key, shape, jnp.float32, -k, k)
        hs, cs = [], []
        for layer in range(self.num_layers):
            n_in = x.shape[-1]
            w_ih = self.param(f"weight_ih_l{layer}", init, (4 * self.hidden, n_in))
            w_hh = self.param(f"weight_hh_l{layer}", init, (4 * self.hidden, self.hidden))
            b_ih = self.param(f"bias_ih_l{layer}", init, (4 * self.hidden,))
            b_hh = self.param(f"bias_hh_l{layer}", init, (4 * self.hidden,))
            xs = x @ w_ih.T + b_ih  # (B, T, 4H)

            def step(carry, xt):
                h, c = carry
                z = xt + h @ w_hh.T + b_hh
                gate = dict(zip(GATES, jnp.split(z, 4, axis=-1)))
                i, f, g, o = gate["i"], gate["f"], gate["g"], gate["o"]
                c = jax.nn.sigmoid(f) * c + jax.nn.sigmoid(i) * jnp.tanh(g)
                h = jax.nn.sigmoid(o) * jnp.tanh(c)
                return (h, c), h

            zeros = jnp.zeros((x.shape[0], self.hidden), x.dtype)
            (h, c), ys = jax.lax.scan(step, (zeros, zeros), jnp.swapaxes(xs, 0, 1))
            x = jnp.swapaxes(ys, 0, 1)
            hs.append(h)
            cs.append(c)
        return x, (jnp.stack(hs), jnp.stack(cs))  # as PyTorch's: (output, (h_n, c_n))


class Port(nn.Module):
    @nn.compact
    def __call__(self, x):
        out, _ = TorchLayoutLSTM(H, 2, name="lstm")(x)
        return nn.Dense(C, name="head")(out[:, -1])


def jax_model():
    return Port()


def example_inputs():
    return (np.random.default_rng(0).normal(size=(B, T, I)).astype(np.float32),)


def example_targets():
    return (np.random.default_rng(1).integers(0, C, B),)


def to_jax(x):  # (batch, time, features) on both sides: not a channels-first array
    return (x,)


def from_jax(out):
    return np.asarray(out)


def torch_loss(logits, x, labels):
    return torch.nn.functional.cross_entropy(logits, labels)


def jax_loss(logits, x, labels):
    return optax.softmax_cross_entropy_with_integer_labels(logits, labels).mean()


def torch_optimizer(parameters):
    return torch.optim.SGD(parameters, lr=0.1)


def jax_optimizer():
    return optax.sgd(0.1)
