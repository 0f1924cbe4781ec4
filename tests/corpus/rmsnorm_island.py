"""A correct Flax Linen port of a small block with RMSNorms written as Hugging Face writes them: transformers'
``LlamaRMSNorm`` casts its input to float32 whatever the model's dtype, and its Flax ``FlaxLlamaRMSNorm`` computes the
variance in float32 (both copied from transformers 4.57.6). Checked in float64, each is a float32 island inside a
float64 model.

    functional-gan check-port tests/corpus/rmsnorm_island.py --dtype float64

``ISLAND`` says on which side the RMSNorm upcasts: "both" (as transformers has it), "torch" (PyTorch's only, the port
computing in its inputs' dtype) or "port" (the port's only).
"""

import flax.linen as nn
import jax.numpy as jnp
import numpy as np
import torch

ISLAND = "both"
OUT_SCALED = 0.0  # a planted mistake for the tests: the middle Linear's output scaled by 1 + OUT_SCALED in the port


class LlamaRMSNorm(torch.nn.Module):
    def __init__(self, hidden_size, eps=1e-6):
        super().__init__()
        self.weight = torch.nn.Parameter(torch.ones(hidden_size))
        self.variance_epsilon = eps

    def forward(self, hidden_states):
        input_dtype = hidden_states.dtype
        if ISLAND in ("both", "torch"):
            hidden_states = hidden_states.to(torch.float32)
        variance = hidden_states.pow(2).mean(-1, keepdim=True)
        hidden_states = hidden_states * torch.rsqrt(variance + self.variance_epsilon)
        return self.weight * hidden_states.to(input_dtype)


class Block(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.up = torch.nn.Linear(16, 64)
        self.norm1 = LlamaRMSNorm(64)
        self.mid = torch.nn.Linear(64, 64)
        self.norm2 = LlamaRMSNorm(64)
        self.down = torch.nn.Linear(64, 8)

    def forward(self, x):
        h = self.norm1(self.up(x))
        h = h + torch.nn.functional.silu(self.mid(h))
        return self.down(self.norm2(h))


class FlaxLlamaRMSNorm(nn.Module):
    hidden_size: int
    epsilon: float = 1e-6
    dtype: jnp.dtype = None

    def setup(self):
        self.weight = self.param("weight", lambda _, shape: jnp.ones(shape), self.hidden_size)

    def __call__(self, hidden_states):
        variance = jnp.asarray(hidden_states, dtype=jnp.float32) if ISLAND in ("both", "port") else hidden_states
        variance = jnp.power(variance, 2)
        variance = variance.mean(-1, keepdims=True)
        # use `jax.numpy.sqrt` as `jax.lax.rsqrt` does not match `torch.rsqrt`
        hidden_states = hidden_states / jnp.sqrt(variance + self.epsilon)
        return self.weight * jnp.asarray(hidden_states, dtype=self.dtype or hidden_states.dtype)


class Port(nn.Module):
    @nn.compact
    def __call__(self, x):
        h = FlaxLlamaRMSNorm(64, name="norm1")(nn.Dense(64, name="up")(x))
        mid = nn.Dense(64, name="mid")(h) * (1 + OUT_SCALED)
        h = h + nn.silu(mid)
        return nn.Dense(8, name="down")(FlaxLlamaRMSNorm(64, name="norm2")(h))


def torch_model():
    return Block()


def jax_model():
    return Port()


def example_inputs():
    return (np.random.default_rng(0).standard_normal((32, 16)).astype(np.float32),)


def example_targets():
    return (np.random.default_rng(1).standard_normal((32, 8)).astype(np.float32),)


def torch_loss(output, x, target):
    return torch.mean((output - target) ** 2)


def jax_loss(output, x, target):
    return jnp.mean((output - target) ** 2)


def torch_optimizer(parameters):
    return torch.optim.SGD(parameters, lr=0.1)


def jax_optimizer():
    import optax

    return optax.sgd(0.1)
