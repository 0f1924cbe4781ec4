"""A Llama 3.2-shaped port in Flax NNX against transformers' ``LlamaForCausalLM`` (written for transformers 4.57.6, the
``hf`` extra): rotary embeddings with Llama 3's frequency scaling, grouped-query attention (each key/value head
repeated for its group of query heads), RMSNorm, a SwiGLU MLP and the output layer tied to the token embedding. The
port is written as such ports are (a list of decoder layers, each called with the hidden states, the mask and the
rotary tables the model computes once); the spec has no hook on PyTorch's model: transformers' layers are called by
the check as the model calls them, with their keyword arguments (``block_to_jax`` below turns them into the port's).

    pip install -e '.[hf]'
    functional-gan check-port examples/port/llama.py                    # the tiny size, whole
    functional-gan check-port examples/port/llama.py --by-block         # each layer, then the rest of the model
    LLAMA_SIZE=1B functional-gan check-port examples/port/llama.py --by-block --memory

``LLAMA_SIZE=1B`` is Llama-3.2-1B's shape (1.24B parameters, random weights: nothing is downloaded); its whole-model
check needs more memory than a 24 GB machine has, and says so before it starts. Rows inside attention (``TAPS``):
each side's rotary embedding and key/value repeat, paired per layer.

Planted mistakes, ``LLAMA_MISTAKE=...``, each named where it is made:

- ``rope-interleaved-in-layer-1``: layer 1 rotates pairs (0, 1), (2, 3), … (GPT-J's layout) instead of the two halves:
  named at ``model.layers.1.self_attn:rope[0]``;
- ``gqa-tiled``: the key/value heads tiled (0, 1, 0, 1) instead of each repeated (0, 0, 1, 1): named at
  ``model.layers.0.self_attn:repeat_kv[0]``;
- ``rope-unscaled``: the rotary tables without Llama 3's frequency scaling (computed once, outside the layers): named at
  the rope tap whole, and by block at ``model.layers.0:block input[2]`` (the cosine table the model gives its first
  layer);
- ``final-norm-eps``: the final RMSNorm's epsilon 1e-6 instead of 1e-5: named at ``model.norm``, by block too.
"""

import math
import os

import jax
import jax.numpy as jnp
import numpy as np
import optax
import torch
from flax import nnx

SIZES = {
    "tiny": dict(vocab_size=97, hidden_size=64, intermediate_size=128, num_hidden_layers=3, num_attention_heads=4,
                 num_key_value_heads=2, head_dim=16),
    # meta-llama/Llama-3.2-1B's config.json
    "1B": dict(vocab_size=128256, hidden_size=2048, intermediate_size=8192, num_hidden_layers=16,
               num_attention_heads=32, num_key_value_heads=8, head_dim=64),
}
SIZE = os.environ.get("LLAMA_SIZE", "tiny")
if SIZE not in SIZES:
    raise ValueError(f"LLAMA_SIZE must be one of {sorted(SIZES)}, got {SIZE!r}")
CONFIG = dict(SIZES[SIZE], rms_norm_eps=1e-5, rope_theta=500000.0, max_position_embeddings=131072,
              tie_word_embeddings=True, attention_bias=False, mlp_bias=False,
              rope_scaling=dict(rope_type="llama3", factor=32.0, low_freq_factor=1.0, high_freq_factor=4.0,
                                original_max_position_embeddings=8192))
BATCH, TOKENS = (1, 32) if SIZE == "1B" else (2, 16)
MISTAKES = ("rope-interleaved-in-layer-1", "gqa-tiled", "rope-unscaled", "final-norm-eps")
MISTAKE = os.environ.get("LLAMA_MISTAKE") or None
if MISTAKE is not None and MISTAKE not in MISTAKES:
    raise ValueError(f"LLAMA_MISTAKE must be one of {list(MISTAKES)}, got {MISTAKE!r}")
OUTPUT = "logits"

# --- PyTorch: transformers' own model ---


def torch_model():
    from transformers import LlamaConfig, LlamaForCausalLM

    model = LlamaForCausalLM(LlamaConfig(**CONFIG, attention_dropout=0.0))
    model.config._attn_implementation = "eager"  # softmax(q kᵀ / √d + mask) v, as the port writes it
    return model


# --- the port ---


def inverse_frequencies(scaled: bool = True) -> np.ndarray:
    """RoPE's frequencies, with Llama 3's scaling: wavelengths beyond the original context divided by ``factor``,
    those below a quarter of it kept, a smooth blend between."""
    dim, scaling = CONFIG["head_dim"], CONFIG["rope_scaling"]
    inv = 1.0 / CONFIG["rope_theta"] ** (np.arange(0, dim, 2) / dim)
    if not scaled:
        return inv
    old = scaling["original_max_position_embeddings"]
    low, high, factor = scaling["low_freq_factor"], scaling["high_freq_factor"], scaling["factor"]
    wavelength = 2 * math.pi / inv
    smooth = np.clip((old / wavelength - low) / (high - low), 0.0, 1.0)
    return (1 - smooth) * inv / factor + smooth * inv


def rotary_tables(positions, dtype):
    """cos and sin of (batch, tokens, head_dim): each frequency twice, for the two halves."""
    freqs = positions[..., None] * jnp.asarray(inverse_frequencies(MISTAKE != "rope-unscaled"), dtype)
    angles = jnp.concatenate([freqs, freqs], axis=-1)
    return jnp.cos(angles), jnp.sin(angles)


def apply_rope(q, k, cos, sin, interleaved=False):
    cos, sin = cos[:, None], sin[:, None]  # over the heads

    def rotate(x):
        if interleaved:  # the mistake: pairs (0, 1), (2, 3), … rotated
            pairs = x.reshape(*x.shape[:-1], -1, 2)
            return jnp.stack([-pairs[..., 1], pairs[..., 0]], -1).reshape(x.shape)
        half = x.shape[-1] // 2
        return jnp.concatenate([-x[..., half:], x[..., :half]], axis=-1)

    return q * cos + rotate(q) * sin, k * cos + rotate(k) * sin


def repeat_kv(x, n_rep):
    """(batch, kv_heads, tokens, head_dim) → (batch, kv_heads · n_rep, …), each head repeated n_rep times in place."""
    if MISTAKE == "gqa-tiled":
        return jnp.tile(x, (1, n_rep, 1, 1))
    return jnp.repeat(x, n_rep, axis=1)


def _dtype():
    return jnp.zeros(()).dtype  # float64 under --dtype float64


class RMSNorm(nnx.Module):
    def __init__(self, size, eps):
        self.weight = nnx.Param(jnp.ones((size,), _dtype()))
        self.eps = eps

    def __call__(self, x):
        return self.weight * (x * jax.lax.rsqrt(jnp.mean(x * x, axis=-1, keepdims=True) + self.eps))


def _linear(n_in, n_out, rngs):
    return nnx.Linear(n_in, n_out, use_bias=False, param_dtype=_dtype(), rngs=rngs)


class Attention(nnx.Module):
    def __init__(self, index, rngs):
        d, heads, kv, hd = (CONFIG[k] for k in ("hidden_size", "num_attention_heads", "num_key_value_heads", "head_dim"))
        self.index, self.heads, self.kv_heads, self.head_dim = index, heads, kv, hd
        self.q_proj, self.k_proj = _linear(d, heads * hd, rngs), _linear(d, kv * hd, rngs)
        self.v_proj, self.o_proj = _linear(d, kv * hd, rngs), _linear(heads * hd, d, rngs)

    def __call__(self, x, mask, cos, sin):
        b, t, _ = x.shape
        q = self.q_proj(x).reshape(b, t, self.heads, self.head_dim).transpose(0, 2, 1, 3)
        k = self.k_proj(x).reshape(b, t, self.kv_heads, self.head_dim).transpose(0, 2, 1, 3)
        v = self.v_proj(x).reshape(b, t, self.kv_heads, self.head_dim).transpose(0, 2, 1, 3)
        q, k = apply_rope(q, k, cos, sin, interleaved=MISTAKE == "rope-interleaved-in-layer-1" and self.index == 1)
        group = self.heads // self.kv_heads
        k, v = repeat_kv(k, group), repeat_kv(v, group)
        scores = q @ k.transpose(0, 1, 3, 2) / math.sqrt(self.head_dim) + mask
        out = jax.nn.softmax(scores, axis=-1) @ v
        return self.o_proj(out.transpose(0, 2, 1, 3).reshape(b, t, -1))


class MLP(nnx.Module):
    def __init__(self, rngs):
        d, h = CONFIG["hidden_size"], CONFIG["intermediate_size"]
        self.gate_proj, self.up_proj, self.down_proj = _linear(d, h, rngs), _linear(d, h, rngs), _linear(h, d, rngs)

    def __call__(self, x):
        return self.down_proj(jax.nn.silu(self.gate_proj(x)) * self.up_proj(x))


class DecoderLayer(nnx.Module):
    def __init__(self, index, rngs):
        d, eps = CONFIG["hidden_size"], CONFIG["rms_norm_eps"]
        self.input_layernorm, self.self_attn = RMSNorm(d, eps), Attention(index, rngs)
        self.post_attention_layernorm, self.mlp = RMSNorm(d, eps), MLP(rngs)

    def __call__(self, x, mask, cos, sin):
        x = x + self.self_attn(self.input_layernorm(x), mask, cos, sin)
        return x + self.mlp(self.post_attention_layernorm(x))


class Model(nnx.Module):
    def __init__(self, rngs):
        self.embed_tokens = nnx.Embed(CONFIG["vocab_size"], CONFIG["hidden_size"], param_dtype=_dtype(), rngs=rngs)
        self.embed_tokens.dtype = None  # computes in its table's dtype (built, nnx.Embed turns dtype=None into float32)
        self.layers = nnx.List([DecoderLayer(i, rngs) for i in range(CONFIG["num_hidden_layers"])])
        eps = 1e-6 if MISTAKE == "final-norm-eps" else CONFIG["rms_norm_eps"]
        self.norm = RMSNorm(CONFIG["hidden_size"], eps)

    def __call__(self, ids):
        h = self.embed_tokens(ids)
        b, t = ids.shape
        positions = jnp.broadcast_to(jnp.arange(t, dtype=h.dtype), (b, t))
        cos, sin = rotary_tables(positions, h.dtype)
        mask = jnp.triu(jnp.full((t, t), jnp.finfo(h.dtype).min, h.dtype), 1)
        mask = jnp.broadcast_to(mask, (b, 1, t, t))
        for layer in self.layers:
            h = layer(h, mask, cos, sin)
        return self.norm(h)


class LlamaForCausalLM(nnx.Module):
    def __init__(self, rngs):
        self.model = Model(rngs)

    def __call__(self, ids):
        return self.model.embed_tokens.attend(self.model(ids))  # the head tied to the embedding


def jax_model():
    return LlamaForCausalLM(nnx.Rngs(0))


def example_inputs():
    return (np.random.default_rng(0).integers(0, CONFIG["vocab_size"], (BATCH, TOKENS)),)


def example_targets():
    return (np.random.default_rng(1).integers(0, CONFIG["vocab_size"], (BATCH, TOKENS)),)


def to_jax(ids):
    return (ids,)


def torch_loss(logits, ids, targets):
    return torch.nn.functional.cross_entropy(logits.reshape(-1, logits.shape[-1]), targets.reshape(-1))


def jax_loss(logits, ids, targets):
    return optax.softmax_cross_entropy_with_integer_labels(logits.reshape(-1, logits.shape[-1]),
                                                           targets.reshape(-1)).mean()


def torch_optimizer(parameters):
    return torch.optim.AdamW(parameters, lr=1e-4, weight_decay=0.01)


def jax_optimizer():
    return optax.adamw(1e-4, weight_decay=0.01)  # optax's default decay is 1e-4, PyTorch's 0.01: said here


# Rows inside attention: the rotary embedding and the key/value repeat on each side, paired per layer and call
TAPS = {"rope": ("transformers.models.llama.modeling_llama:apply_rotary_pos_emb", apply_rope),
        "repeat_kv": ("transformers.models.llama.modeling_llama:repeat_kv", repeat_kv)}


# --- block by block: transformers calls each decoder layer with keyword arguments; the port's layer takes four ---


def block_to_jax(hidden_states, attention_mask=None, position_embeddings=None, **_):
    """PyTorch's layer arguments (as ``LlamaModel`` passes them: also position_ids, cache_position, past_key_values)
    to the port's layer's."""
    cos, sin = position_embeddings
    return hidden_states, attention_mask, cos, sin


def block_from_jax(output):
    return np.asarray(output)
