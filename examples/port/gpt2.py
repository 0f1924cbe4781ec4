"""GPT-2 small as nanoGPT writes it (karpathy/nanoGPT's model.py, MIT: 12 layers, 12 heads, 768 wide, a vocabulary of
50,257, the output layer tied to the token embedding: 124M parameters) and a Flax Linen port written as large Linen
transformers are: one block's code, ``nn.scan`` over the layers with their parameters stacked, and the output layer
as the embedding's ``attend`` (the same array, not a copy). Trained one AdamW step (weight decay 0.1) on 2 sequences
of 64 tokens in training mode (dropout 0).

    functional-gan check-port examples/port/gpt2.py --memory            # 124M parameters, whole
    functional-gan check-port examples/port/gpt2.py --by-block          # 124M parameters, a block at a time
    GPT2_SIZE=tiny functional-gan check-port examples/port/gpt2.py      # the same code, 3 layers of 32

Measured on a 2-core machine (float32, both programs): the whole check agrees (373 quantities) at a peak of 6.4 GiB
in 82 s; block by block (``blocks()`` below: each layer of the scan against ``transformer.h.i``) at 1.5 GiB in 106 s.
In float64 the whole check with ``--program jit`` agrees (worst 1.20×, 7.2 GiB, 66 s); it named the gradient of
``transformer.h.1.ln_1.weight`` at 1.01× its allowance before PyTorch64's own matrix products were measured with their
long sums in blocks (see docs/check-port.md, "float32 and float64").

The tied weight pairs once: ``lm_head.weight = transformer.wte.weight``; its gradient is the sum over both uses on
both sides. ``OUTPUT = 0`` picks the logits from nanoGPT's ``(logits, loss)``. ``GPT2_MISTAKE=gelu-tanh-in-layer-1``
plants the tanh approximation of GELU in one layer's MLP (the scan runs the same code for every layer: the mistake
is selected by the layer's index), which the check names at ``forward, transformer.h.1.mlp.c_proj``;
``GPT2_MISTAKE=residual-detached-in-layer-1`` stops the residual stream's gradient at layer 1's input (a
``stop_gradient`` in the wrong place: every forward value and layer 1's own gradients unchanged), which the whole check
names at the gradient of the parameters before it and block by block at ``gradient, transformer.h.1 (input)``.

Its LayerNorms subtract the mean before they square (``use_fast_variance=False``), as PyTorch does: with Flax's default
E[x²] − E[x]² the 124M model's float64 check finds 67 quantities 3.0–4.8× PyTorch's own float64 error (precision
findings, exit status 3; the float32 check agrees either way).
"""

import dataclasses
import math
import os

import flax.linen as fnn
import jax
import jax.numpy as jnp
import numpy as np
import torch
import torch.nn as nn
import torch.nn.functional as F
from nanogpt_block import adamw  # noqa: F401 (the spec's folder): AdamW with PyTorch's bias corrections


@dataclasses.dataclass(frozen=True)
class GPTConfig:
    block_size: int = 1024
    vocab_size: int = 50257
    n_layer: int = 12
    n_head: int = 12
    n_embd: int = 768


SIZES = {"124M": GPTConfig(), "tiny": GPTConfig(block_size=16, vocab_size=97, n_layer=3, n_head=2, n_embd=32)}
SIZE = os.environ.get("GPT2_SIZE", "124M")
if SIZE not in SIZES:
    raise ValueError(f"GPT2_SIZE must be one of {sorted(SIZES)}, got {SIZE!r}")
CONFIG = SIZES[SIZE]
BATCH, TOKENS = (2, 64) if SIZE == "124M" else (2, 8)

# --- PyTorch (nanoGPT, dropout 0, LayerNorm with bias) ---


class CausalSelfAttention(nn.Module):
    def __init__(self, config):
        super().__init__()
        self.c_attn = nn.Linear(config.n_embd, 3 * config.n_embd)
        self.c_proj = nn.Linear(config.n_embd, config.n_embd)
        self.n_head, self.n_embd = config.n_head, config.n_embd

    def forward(self, x):
        B, T, C = x.size()
        q, k, v = self.c_attn(x).split(self.n_embd, dim=2)
        k = k.view(B, T, self.n_head, C // self.n_head).transpose(1, 2)
        q = q.view(B, T, self.n_head, C // self.n_head).transpose(1, 2)
        v = v.view(B, T, self.n_head, C // self.n_head).transpose(1, 2)
        att = (q @ k.transpose(-2, -1)) * (1.0 / math.sqrt(k.size(-1)))
        mask = torch.tril(torch.ones(T, T, dtype=torch.bool, device=x.device))
        att = F.softmax(att.masked_fill(~mask, float("-inf")), dim=-1)
        y = (att @ v).transpose(1, 2).contiguous().view(B, T, C)
        return self.c_proj(y)


class MLP(nn.Module):
    def __init__(self, config):
        super().__init__()
        self.c_fc = nn.Linear(config.n_embd, 4 * config.n_embd)
        self.gelu = nn.GELU()
        self.c_proj = nn.Linear(4 * config.n_embd, config.n_embd)

    def forward(self, x):
        return self.c_proj(self.gelu(self.c_fc(x)))


class Block(nn.Module):
    def __init__(self, config):
        super().__init__()
        self.ln_1 = nn.LayerNorm(config.n_embd)
        self.attn = CausalSelfAttention(config)
        self.ln_2 = nn.LayerNorm(config.n_embd)
        self.mlp = MLP(config)

    def forward(self, x):
        x = x + self.attn(self.ln_1(x))
        return x + self.mlp(self.ln_2(x))


class GPT(nn.Module):
    def __init__(self, config=CONFIG):
        super().__init__()
        self.config = config
        self.transformer = nn.ModuleDict(dict(
            wte=nn.Embedding(config.vocab_size, config.n_embd),
            wpe=nn.Embedding(config.block_size, config.n_embd),
            h=nn.ModuleList([Block(config) for _ in range(config.n_layer)]),
            ln_f=nn.LayerNorm(config.n_embd),
        ))
        self.lm_head = nn.Linear(config.n_embd, config.vocab_size, bias=False)
        self.transformer.wte.weight = self.lm_head.weight  # weight tying
        self.apply(self._init_weights)
        for name, p in self.named_parameters():  # scaled init of the residual projections, per GPT-2's paper
            if name.endswith("c_proj.weight"):
                torch.nn.init.normal_(p, mean=0.0, std=0.02 / math.sqrt(2 * config.n_layer))

    def _init_weights(self, module):
        if isinstance(module, nn.Linear):
            torch.nn.init.normal_(module.weight, mean=0.0, std=0.02)
            if module.bias is not None:
                torch.nn.init.zeros_(module.bias)
        elif isinstance(module, nn.Embedding):
            torch.nn.init.normal_(module.weight, mean=0.0, std=0.02)

    def forward(self, idx, targets=None):
        pos = torch.arange(0, idx.size(1), dtype=torch.long, device=idx.device)
        x = self.transformer.wte(idx) + self.transformer.wpe(pos)
        for block in self.transformer.h:
            x = block(x)
        logits = self.lm_head(self.transformer.ln_f(x))
        loss = None if targets is None else F.cross_entropy(logits.view(-1, logits.size(-1)), targets.view(-1))
        return logits, loss


# --- Flax Linen: the layers scanned ---


class FlaxBlock(fnn.Module):
    config: GPTConfig
    mistake_layer: int = -1  # a planted mistake (MISTAKES below) in this layer only
    mistake: str | None = None

    @fnn.compact
    def __call__(self, x, index):
        C, H = self.config.n_embd, self.config.n_head
        B, T, _ = x.shape
        h = fnn.LayerNorm(epsilon=1e-5, use_fast_variance=False, name="ln_1")(x)
        q, k, v = jnp.split(fnn.Dense(3 * C, name="c_attn")(h), 3, axis=2)
        heads = lambda t: t.reshape(B, T, H, C // H).transpose(0, 2, 1, 3)  # noqa: E731
        q, k, v = heads(q), heads(k), heads(v)
        att = (q @ k.transpose(0, 1, 3, 2)) * (1.0 / math.sqrt(C // H))
        att = jnp.where(jnp.tril(jnp.ones((T, T), bool)), att, -jnp.inf)
        y = (jax.nn.softmax(att, axis=-1) @ v).transpose(0, 2, 1, 3).reshape(B, T, C)
        if self.mistake == "residual-detached-in-layer-1":  # the residual stream's gradient stopped, not the block's
            x = jnp.where(index == self.mistake_layer, jax.lax.stop_gradient(x), x)
        x = x + fnn.Dense(C, name="c_proj")(y)
        h = fnn.Dense(4 * C, name="c_fc")(fnn.LayerNorm(epsilon=1e-5, use_fast_variance=False, name="ln_2")(x))
        gelu_layer = self.mistake_layer if self.mistake == "gelu-tanh-in-layer-1" else -1
        h = jnp.where(index == gelu_layer, fnn.gelu(h, approximate=True), fnn.gelu(h, approximate=False))
        return x + fnn.Dense(C, name="mlp_c_proj")(h), None


class FlaxGPT(fnn.Module):
    config: GPTConfig = CONFIG
    mistake_layer: int = -1
    mistake: str | None = None

    @fnn.compact
    def __call__(self, idx):
        config = self.config
        wte = fnn.Embed(config.vocab_size, config.n_embd, name="wte")
        x = wte(idx) + fnn.Embed(config.block_size, config.n_embd, name="wpe")(jnp.arange(idx.shape[1]))[None]
        layers = fnn.scan(FlaxBlock, variable_axes={"params": 0}, split_rngs={"params": True}, length=config.n_layer)
        x, _ = layers(config, self.mistake_layer, self.mistake, name="h")(x, jnp.arange(config.n_layer))
        return wte.attend(fnn.LayerNorm(epsilon=1e-5, use_fast_variance=False, name="ln_f")(x))  # the tied output layer


# --- the spec ---

# a planted mistake and where the whole-model check names it: the second, a residual stream whose gradient stops at
# layer 1 (forward and layer 1's own gradients untouched), shows in the gradients of the parameters before it; block by
# block, in the gradient with respect to layer 1's input
MISTAKES = {"gelu-tanh-in-layer-1": ("forward", "transformer.h.1.mlp.c_proj"),
            "residual-detached-in-layer-1": ("gradient", "transformer.wte.weight")}
MISTAKE = os.environ.get("GPT2_MISTAKE") or None
if MISTAKE is not None and MISTAKE not in MISTAKES:
    raise ValueError(f"GPT2_MISTAKE must be one of {sorted(MISTAKES)}, got {MISTAKE!r}")
OUTPUT = 0  # nanoGPT returns (logits, loss)

torch_model = GPT  # built under the checker's torch.manual_seed(0)


def jax_model():
    return FlaxGPT(CONFIG, mistake_layer=1 if MISTAKE else -1, mistake=MISTAKE)


def example_inputs():
    return (np.random.default_rng(0).integers(0, CONFIG.vocab_size, (BATCH, TOKENS)),)


def example_targets():
    return (np.random.default_rng(1).integers(0, CONFIG.vocab_size, (BATCH, TOKENS)),)


def to_jax(idx):
    return (idx,)


def from_jax(logits):
    return np.asarray(logits)


def torch_loss(logits, idx, targets):
    return F.cross_entropy(logits.reshape(-1, logits.size(-1)), targets.reshape(-1))


def jax_loss(logits, idx, targets):
    log_probs = jax.nn.log_softmax(logits.reshape(-1, logits.shape[-1]))
    return -jnp.mean(jnp.take_along_axis(log_probs, targets.reshape(-1, 1), axis=1))


# --- block by block (check-port --by-block): PyTorch's transformer.h.i against one layer of the scan ---


class FlaxLayer(fnn.Module):
    """Layer ``index`` of the scan, as a block of its own: the scanned block's code with its index fixed."""

    config: GPTConfig
    index: int
    mistake_layer: int = -1
    mistake: str | None = None

    @fnn.compact
    def __call__(self, x):
        return FlaxBlock(self.config, self.mistake_layer, self.mistake, name="layer")(x, self.index)[0]


def blocks():
    return [(f"transformer.h.{i}", FlaxLayer(CONFIG, i, 1 if MISTAKE else -1, MISTAKE)) for i in range(CONFIG.n_layer)]


def block_to_jax(x):  # (batch, tokens, channels) on both sides
    return (x,)


def block_from_jax(x):
    return np.asarray(x)


def torch_optimizer(parameters):
    return torch.optim.AdamW(parameters, lr=6e-4, weight_decay=0.1)


def jax_optimizer():
    return adamw(6e-4, weight_decay=0.1)
