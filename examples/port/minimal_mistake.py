"""examples/port/minimal.py with the classic mistake: Flax's ``nn.gelu`` is the tanh approximation unless told
otherwise, PyTorch's ``GELU`` the exact one.

    functional-gan check-port examples/port/minimal_mistake.py
"""
import flax.linen as nn
from minimal import (example_inputs, example_targets, jax_loss, jax_optimizer, torch_loss,  # noqa: F401
                     torch_model, torch_optimizer)


class Port(nn.Module):
    @nn.compact
    def __call__(self, x):
        return nn.Dense(3)(nn.gelu(nn.Dense(16)(x)))  # approximate=True, Flax's default


def jax_model():
    return Port()
