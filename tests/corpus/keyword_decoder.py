"""A small decoder written as transformers writes Llama: each layer called with ``attention_mask`` and
``position_embeddings=(cos, sin)`` by keyword (the rotary tables computed once in the model), rotate-half RoPE,
grouped-query attention (2 KV heads repeated for 4 query heads, as transformers' ``repeat_kv`` does), and a Flax NNX
port with a list of layers. Checked whole and ``--by-block``: block by block, each layer is called with the keyword
arguments the model gave it, and ``block_to_jax`` gets them.

    functional-gan check-port tests/corpus/keyword_decoder.py --by-block
"""

import math

import jax.numpy as jnp
import numpy as np
import torch
from flax import nnx

D, HEADS, KV_HEADS, LAYERS, VOCAB, T, B = 32, 4, 2, 3, 50, 8, 2
HEAD = D // HEADS
# planted for the tests: "rope-interleaved" in layer 1 of the port, "gqa-tiled" in every layer; outside the layers,
# "final-norm-eps" (the final LayerNorm's epsilon 1e-2, not 1e-5) or "wiring" (layer 2 fed layer 0's output)
MISTAKE = None


def _tables(positions):
    inv = 1.0 / (10000 ** (np.arange(0, HEAD, 2) / HEAD))
    freqs = np.outer(positions, inv)
    emb = np.concatenate([freqs, freqs], -1)
    return np.cos(emb), np.sin(emb)


def _rotate_half(x):
    half = x.shape[-1] // 2
    return torch.cat((-x[..., half:], x[..., :half]), dim=-1)


def apply_rotary_pos_emb(q, k, cos, sin):  # transformers' Llama
    return q * cos + _rotate_half(q) * sin, k * cos + _rotate_half(k) * sin


def repeat_kv(hidden_states, n_rep):  # transformers' Llama: each key/value head repeated n_rep times, in place
    batch, heads, tokens, dim = hidden_states.shape
    expanded = hidden_states[:, :, None, :, :].expand(batch, heads, n_rep, tokens, dim)
    return expanded.reshape(batch, heads * n_rep, tokens, dim)


class Layer(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.input_layernorm = torch.nn.LayerNorm(D)
        self.q_proj = torch.nn.Linear(D, D, bias=False)
        self.k_proj = torch.nn.Linear(D, KV_HEADS * HEAD, bias=False)
        self.v_proj = torch.nn.Linear(D, KV_HEADS * HEAD, bias=False)
        self.o_proj = torch.nn.Linear(D, D, bias=False)
        self.post_attention_layernorm = torch.nn.LayerNorm(D)
        self.up = torch.nn.Linear(D, 2 * D)
        self.down = torch.nn.Linear(2 * D, D)

    def forward(self, hidden_states, attention_mask=None, position_embeddings=None, use_cache=False):
        cos, sin = position_embeddings
        b, t, _ = hidden_states.shape
        h = self.input_layernorm(hidden_states)
        q = self.q_proj(h).view(b, t, HEADS, HEAD).transpose(1, 2)
        k = self.k_proj(h).view(b, t, KV_HEADS, HEAD).transpose(1, 2)
        v = self.v_proj(h).view(b, t, KV_HEADS, HEAD).transpose(1, 2)
        q, k = apply_rotary_pos_emb(q, k, cos, sin)
        k, v = repeat_kv(k, HEADS // KV_HEADS), repeat_kv(v, HEADS // KV_HEADS)
        scores = q @ k.transpose(-1, -2) / math.sqrt(HEAD) + attention_mask
        out = (torch.softmax(scores, -1) @ v).transpose(1, 2).reshape(b, t, D)
        x = hidden_states + self.o_proj(out)
        return x + self.down(torch.nn.functional.gelu(self.up(self.post_attention_layernorm(x))))


class Decoder(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.embed_tokens = torch.nn.Embedding(VOCAB, D)
        self.layers = torch.nn.ModuleList(Layer() for _ in range(LAYERS))
        self.norm = torch.nn.LayerNorm(D)
        self.lm_head = torch.nn.Linear(D, VOCAB, bias=False)

    def forward(self, ids):
        h = self.embed_tokens(ids)
        cos, sin = (torch.as_tensor(a, dtype=h.dtype) for a in _tables(np.arange(ids.shape[1])))
        mask = torch.full((ids.shape[1], ids.shape[1]), torch.finfo(h.dtype).min, dtype=h.dtype).triu(1)
        for layer in self.layers:
            h = layer(h, attention_mask=mask, position_embeddings=(cos, sin), use_cache=False)
        return self.lm_head(self.norm(h))


def port_repeat_kv(x, n_rep):
    if MISTAKE == "gqa-tiled":  # the mistake: the heads tiled (0, 1, 0, 1) instead of each repeated (0, 0, 1, 1)
        return jnp.tile(x, (1, n_rep, 1, 1))
    return jnp.repeat(x, n_rep, axis=1)


def _rope(x, cos, sin, interleaved=False):
    if interleaved:  # the mistake: pairs (0, 1), (2, 3), … rotated instead of the two halves
        pairs = x.reshape(*x.shape[:-1], -1, 2)
        rotated = jnp.stack([-pairs[..., 1], pairs[..., 0]], -1).reshape(x.shape)
        return x * cos + rotated * sin
    half = x.shape[-1] // 2
    return x * cos + jnp.concatenate([-x[..., half:], x[..., :half]], -1) * sin


class PortLayer(nnx.Module):
    def __init__(self, index, rngs):
        dtype = jnp.zeros(()).dtype
        kw = dict(param_dtype=dtype, rngs=rngs)
        self.index = index
        self.input_layernorm = nnx.LayerNorm(D, epsilon=1e-5, use_fast_variance=False, **kw)
        self.q_proj = nnx.Linear(D, D, use_bias=False, **kw)
        self.k_proj = nnx.Linear(D, KV_HEADS * HEAD, use_bias=False, **kw)
        self.v_proj = nnx.Linear(D, KV_HEADS * HEAD, use_bias=False, **kw)
        self.o_proj = nnx.Linear(D, D, use_bias=False, **kw)
        self.post_attention_layernorm = nnx.LayerNorm(D, epsilon=1e-5, use_fast_variance=False, **kw)
        self.up = nnx.Linear(D, 2 * D, **kw)
        self.down = nnx.Linear(2 * D, D, **kw)

    def __call__(self, x, mask, cos, sin):
        b, t, _ = x.shape
        h = self.input_layernorm(x)
        q = self.q_proj(h).reshape(b, t, HEADS, HEAD).transpose(0, 2, 1, 3)
        k = self.k_proj(h).reshape(b, t, KV_HEADS, HEAD).transpose(0, 2, 1, 3)
        v = self.v_proj(h).reshape(b, t, KV_HEADS, HEAD).transpose(0, 2, 1, 3)
        wrong = MISTAKE == "rope-interleaved" and self.index == 1
        q, k = _rope(q, cos, sin, wrong), _rope(k, cos, sin, wrong)
        k, v = port_repeat_kv(k, HEADS // KV_HEADS), port_repeat_kv(v, HEADS // KV_HEADS)
        scores = q @ k.transpose(0, 1, 3, 2) / math.sqrt(HEAD) + mask
        out = (nnx.softmax(scores, -1) @ v).transpose(0, 2, 1, 3).reshape(b, t, D)
        x = x + self.o_proj(out)
        return x + self.down(nnx.gelu(self.up(self.post_attention_layernorm(x)), approximate=False))


class PortDecoder(nnx.Module):
    def __init__(self, rngs):
        dtype = jnp.zeros(()).dtype
        self.embed_tokens = nnx.Embed(VOCAB, D, param_dtype=dtype, rngs=rngs)
        self.embed_tokens.dtype = None  # computes in its table's dtype (built, nnx.Embed takes param_dtype as dtype)
        self.layers = nnx.List([PortLayer(i, rngs) for i in range(LAYERS)])
        eps = 1e-2 if MISTAKE == "final-norm-eps" else 1e-5
        self.norm = nnx.LayerNorm(D, epsilon=eps, use_fast_variance=False, param_dtype=dtype, rngs=rngs)
        self.lm_head = nnx.Linear(D, VOCAB, use_bias=False, param_dtype=dtype, rngs=rngs)

    def __call__(self, ids):
        h = self.embed_tokens(ids)
        cos, sin = (jnp.asarray(a, h.dtype) for a in _tables(np.arange(ids.shape[1])))
        mask = jnp.triu(jnp.full((ids.shape[1], ids.shape[1]), jnp.finfo(h.dtype).min, h.dtype), 1)
        previous = h
        for i, layer in enumerate(self.layers):
            h, previous = layer(previous if MISTAKE == "wiring" and i == 2 else h, mask, cos, sin), h
        return self.lm_head(self.norm(h))


def torch_model():
    return Decoder()


def jax_model():
    return PortDecoder(nnx.Rngs(0))


def example_inputs():
    return (np.random.default_rng(0).integers(0, VOCAB, (B, T)),)


def example_targets():
    return (np.random.default_rng(1).integers(0, VOCAB, (B, T)),)


def to_jax(ids):
    return (ids,)


def torch_loss(logits, ids, targets):
    return torch.nn.functional.cross_entropy(logits.reshape(-1, VOCAB), targets.reshape(-1))


def jax_loss(logits, ids, targets):
    import optax

    return optax.softmax_cross_entropy_with_integer_labels(logits.reshape(-1, VOCAB), targets.reshape(-1)).mean()


# Rows inside attention: each side's rotary embedding and key/value repeat, paired call by call
TAPS = {"rope": (apply_rotary_pos_emb, _rope), "repeat_kv": (repeat_kv, port_repeat_kv)}


def block_to_jax(hidden_states, attention_mask=None, position_embeddings=None, use_cache=False):
    """A decoder layer's arguments, as the model passed them to PyTorch's layer, to the port's layer's."""
    cos, sin = position_embeddings
    return hidden_states, attention_mask, cos, sin


def block_from_jax(output):
    return np.asarray(output)
