"""nanoGPT's transformer ``Block`` (LayerNorm, causal self-attention, GELU MLP) and a hand-written Flax port.

    functional-gan check-port examples/port/nanogpt_block.py [--dtype float64] [--steps 3]

``LayerNorm``, ``CausalSelfAttention`` (its explicit-softmax path), ``MLP`` and ``Block`` follow
karpathy/nanoGPT's model.py (MIT), with dropout 0; its optimizer is AdamW (weight decay 0.1).
Inputs are (batch, time, channels), which both frameworks share: the spec's ``to_jax`` and
``from_jax`` keep them as they are. Two defaults differ between the frameworks and a port must set
them: LayerNorm's epsilon (PyTorch 1e-5, Flax 1e-6) and GELU (PyTorch exact, ``flax.linen.gelu``
the tanh approximation).

A third difference shows only in float32, as JAX runs without ``jax_enable_x64``: optax's Adam
computes its bias corrections ``1 − βᵗ`` in float32, where β₂ = 0.999 is 0.99900001 and ``1 − β₂``
loses 1.3e-5 of its value to cancellation, while PyTorch computes them in Python's float64. Every
float32 AdamW update of ``optax.adamw`` then differs from PyTorch's by about 6.4e-6 of its size,
≈ 14 times PyTorch's own float32 error, though the same program in float64 is right: ``check-port``
reports it as a note (within √eps of each scale: exit status 0), first at ``update, ln_1.bias``, and
names optax's bias corrections as its cause, verified by the update recomputed with ``1 − βᵗ`` exact
(``FLOAT32_ONLY`` below; ``tests/test_check_port.py`` checks all of this). The port's ``adamw`` computes ``1 − βᵗ`` as
``−expm1(t · log β)``, accurate in float32, and has none.
"""

import math

import flax.linen as fnn
import jax
import jax.numpy as jnp
import numpy as np
import optax
import torch
import torch.nn as nn
import torch.nn.functional as F

N_EMBD, N_HEAD, BLOCK_SIZE = 32, 4, 8

# --- PyTorch (nanoGPT) ---


class LayerNorm(nn.Module):
    """LayerNorm but with an optional bias. PyTorch doesn't support simply bias=False"""

    def __init__(self, ndim, bias):
        super().__init__()
        self.weight = nn.Parameter(torch.ones(ndim))
        self.bias = nn.Parameter(torch.zeros(ndim)) if bias else None

    def forward(self, input):
        return F.layer_norm(input, self.weight.shape, self.weight, self.bias, 1e-5)


class CausalSelfAttention(nn.Module):
    def __init__(self):
        super().__init__()
        self.c_attn = nn.Linear(N_EMBD, 3 * N_EMBD)
        self.c_proj = nn.Linear(N_EMBD, N_EMBD)
        self.n_head, self.n_embd = N_HEAD, N_EMBD
        self.register_buffer("bias", torch.tril(torch.ones(BLOCK_SIZE, BLOCK_SIZE)).view(1, 1, BLOCK_SIZE, BLOCK_SIZE),
                             persistent=False)

    def forward(self, x):
        B, T, C = x.size()
        q, k, v = self.c_attn(x).split(self.n_embd, dim=2)
        k = k.view(B, T, self.n_head, C // self.n_head).transpose(1, 2)
        q = q.view(B, T, self.n_head, C // self.n_head).transpose(1, 2)
        v = v.view(B, T, self.n_head, C // self.n_head).transpose(1, 2)
        att = (q @ k.transpose(-2, -1)) * (1.0 / math.sqrt(k.size(-1)))
        att = att.masked_fill(self.bias[:, :, :T, :T] == 0, float("-inf"))
        att = F.softmax(att, dim=-1)
        y = att @ v
        y = y.transpose(1, 2).contiguous().view(B, T, C)
        return self.c_proj(y)


class MLP(nn.Module):
    def __init__(self):
        super().__init__()
        self.c_fc = nn.Linear(N_EMBD, 4 * N_EMBD)
        self.gelu = nn.GELU()
        self.c_proj = nn.Linear(4 * N_EMBD, N_EMBD)

    def forward(self, x):
        return self.c_proj(self.gelu(self.c_fc(x)))


class Block(nn.Module):
    def __init__(self):
        super().__init__()
        self.ln_1 = LayerNorm(N_EMBD, bias=True)
        self.attn = CausalSelfAttention()
        self.ln_2 = LayerNorm(N_EMBD, bias=True)
        self.mlp = MLP()

    def forward(self, x):
        x = x + self.attn(self.ln_1(x))
        x = x + self.mlp(self.ln_2(x))
        return x


# --- Flax ---


class FlaxAttention(fnn.Module):
    @fnn.compact
    def __call__(self, x):
        B, T, C = x.shape
        q, k, v = jnp.split(fnn.Dense(3 * C, name="c_attn")(x), 3, axis=2)
        heads = lambda t: t.reshape(B, T, N_HEAD, C // N_HEAD).transpose(0, 2, 1, 3)  # noqa: E731
        q, k, v = heads(q), heads(k), heads(v)
        att = (q @ k.transpose(0, 1, 3, 2)) * (1.0 / math.sqrt(C // N_HEAD))
        att = jnp.where(jnp.tril(jnp.ones((T, T), bool)), att, -jnp.inf)
        y = jax.nn.softmax(att, axis=-1) @ v
        return fnn.Dense(C, name="c_proj")(y.transpose(0, 2, 1, 3).reshape(B, T, C))


class FlaxBlock(fnn.Module):
    mistake: str | None = None

    @fnn.compact
    def __call__(self, x):
        eps = 1e-6 if self.mistake == "layernorm-eps" else 1e-5
        x = x + FlaxAttention(name="attn")(fnn.LayerNorm(epsilon=eps, name="ln_1")(x))
        h = fnn.LayerNorm(epsilon=eps, name="ln_2")(x)
        h = fnn.gelu(fnn.Dense(4 * N_EMBD, name="c_fc")(h), approximate=self.mistake == "gelu-tanh")
        return x + fnn.Dense(N_EMBD, name="c_proj")(h)


# Planted mistakes (tests/test_check_port.py): name → (the stage, the layer the report must name).
MISTAKES = {"layernorm-eps": ("forward", "ln_1"), "gelu-tanh": ("forward", "mlp.c_proj"),
            "adam-eps-in-root": ("update", "ln_1.weight")}
# Not a mistake of the port's logic, a float32 weakness of optax's: where check-port first names it.
FLOAT32_ONLY = {"optax-bias-correction": ("update", "ln_1.bias")}
MISTAKE = None


torch_model = Block  # built under the checker's torch.manual_seed(0)


def jax_model():
    return FlaxBlock(mistake=MISTAKE)


def example_inputs():
    return (np.random.default_rng(0).normal(0.0, 1.0, (4, BLOCK_SIZE, N_EMBD)).astype(np.float32),)


def example_targets():
    return (np.random.default_rng(1).normal(0.0, 1.0, (4, BLOCK_SIZE, N_EMBD)).astype(np.float32),)


def to_jax(x):
    return (x,)


def from_jax(output):
    return np.asarray(output)


def torch_loss(output, x, target):
    return F.mse_loss(output, target)


def jax_loss(output, x, target):
    return jnp.mean((output - target) ** 2)


def torch_optimizer(parameters):
    return torch.optim.AdamW(parameters, lr=1e-3, weight_decay=0.1)


def scale_by_adam(b1=0.9, b2=0.999, eps=1e-8):
    """Adam's direction as PyTorch computes it: the bias corrections 1 − βᵗ as −expm1(t·log β) (no cancellation)."""

    def init(params):
        zeros = jax.tree.map(jnp.zeros_like, params)
        return optax.ScaleByAdamState(count=jnp.zeros([], jnp.int32), mu=zeros, nu=zeros)

    def update(updates, state, params=None):
        count = state.count + 1
        mu = jax.tree.map(lambda m, g: b1 * m + (1 - b1) * g, state.mu, updates)
        nu = jax.tree.map(lambda v, g: b2 * v + (1 - b2) * g * g, state.nu, updates)
        c1, c2 = (-jnp.expm1(count * math.log(b)) for b in (b1, b2))
        direction = jax.tree.map(lambda m, v: (m / c1) / (jnp.sqrt(v / c2) + eps), mu, nu)
        return direction, optax.ScaleByAdamState(count=count, mu=mu, nu=nu)

    return optax.GradientTransformation(init, update)


def adamw(lr, weight_decay):
    return optax.chain(scale_by_adam(), optax.add_decayed_weights(weight_decay), optax.scale(-lr))


def jax_optimizer():
    if MISTAKE == "adam-eps-in-root":  # sqrt(v̂ + eps) instead of sqrt(v̂) + eps
        return optax.adamw(1e-3, eps=0.0, eps_root=1e-8, weight_decay=0.1)
    if MISTAKE == "optax-bias-correction":  # optax's own AdamW: 1 − βᵗ in float32
        return optax.adamw(1e-3, weight_decay=0.1)
    return adamw(1e-3, weight_decay=0.1)
