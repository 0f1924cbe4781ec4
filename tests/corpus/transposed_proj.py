"""A correct forward-only port whose inner layer lays its result out transposed: a ``Linear`` written as ``W x``, one
point per column, so the port's ``proj`` gives (3, N) where PyTorch's gives (N, 3). Plain functions with ``tap``.

    functional-gan check-port tests/corpus/transposed_proj.py
"""

import jax.numpy as jnp
import numpy as np
import torch

from functional_gan.testing import tap

POINTS = 1025
MISTAKE = None  # "proj-without-bias": a planted mistake for the tests


class Net(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.proj = torch.nn.Linear(8, 3)
        self.head = torch.nn.Linear(3, 2)

    def forward(self, x):
        return self.head(torch.tanh(self.proj(x)))


def torch_model():
    return Net()


def example_inputs():
    return (np.random.default_rng(0).standard_normal((POINTS, 8)).astype(np.float32),)


def jax_params():
    return {"proj": {"weight": jnp.zeros((3, 8)), "bias": jnp.zeros((3,))},
            "head": {"weight": jnp.zeros((2, 3)), "bias": jnp.zeros((2,))}}


def jax_apply(params, x):
    h = params["proj"]["weight"] @ x.T  # (3, N): a point per column
    h = tap("proj", h if MISTAKE == "proj-without-bias" else h + params["proj"]["bias"][:, None])
    return tap("head", jnp.tanh(h).T @ params["head"]["weight"].T + params["head"]["bias"])
