"""An Equinox port of ``nnx_scan_stack.py``'s PyTorch model whose layers are one stacked module (built by
``eqx.filter_vmap``) run by ``jax.lax.scan``, each layer rebuilt from its slice by ``eqx.combine``, as Equinox
transformers are written: each layer's rows come from inside the scan.

    functional-gan check-port tests/corpus/equinox_scan_stack.py
"""

import equinox as eqx
import jax
import jax.numpy as jnp
from nnx_scan_stack import D, LAYERS, TorchNet, example_inputs, example_targets, jax_loss, torch_loss  # noqa: F401

EPS = 1e-5  # a planted mistake for the tests sets 1e-6
PER_SAMPLE = True


class Block(eqx.Module):
    fc: eqx.nn.Linear
    norm: eqx.nn.LayerNorm

    def __init__(self, key):
        dtype = jnp.zeros(()).dtype
        self.fc = eqx.nn.Linear(D, D, key=key, dtype=dtype)
        self.norm = eqx.nn.LayerNorm(D, eps=EPS, dtype=dtype)

    def __call__(self, x):
        return x + jnp.tanh(self.norm(self.fc(x)))


class Net(eqx.Module):
    layers: Block  # its arrays with a leading axis of LAYERS
    head: eqx.nn.Linear

    def __init__(self, key):
        stack, head = jax.random.split(key)
        self.layers = eqx.filter_vmap(Block)(jax.random.split(stack, LAYERS))
        self.head = eqx.nn.Linear(D, 2, key=head, dtype=jnp.zeros(()).dtype)

    def __call__(self, x):
        arrays, static = eqx.partition(self.layers, eqx.is_array)

        def step(x, layer_arrays):
            return eqx.combine(layer_arrays, static)(x), None

        x, _ = jax.lax.scan(step, x, arrays)
        return self.head(x)


def torch_model():
    return TorchNet()


def jax_model():
    return Net(jax.random.key(0))
