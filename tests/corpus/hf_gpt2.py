"""Hugging Face's own Flax GPT-2 against its PyTorch GPT-2 (transformers 4.57.6, the last release with Flax models):
a correct port nobody here wrote, LayerNorm-heavy, whose XLA sums show at width.

    HF_GPT2_SIZE=124M functional-gan check-port tests/corpus/hf_gpt2.py --dtype float64

The Flax module is built in the check's dtype (``jnp.zeros(()).dtype``: float64 under ``--dtype float64``); Flax's
LayerNorm keeps its default ``use_fast_variance=True`` unless ``HF_GPT2_FAST_VARIANCE=0``. Needs
``pip install --no-deps transformers==4.57.6`` (with huggingface-hub < 1 and tokenizers ≤ 0.23).
"""

import os

import jax.numpy as jnp
import numpy as np
import optax
import torch

SIZES = {"tiny": dict(n_embd=64, n_layer=2, n_head=4, vocab_size=101, n_positions=32),
         "wide": dict(n_embd=768, n_layer=2, n_head=12, vocab_size=512, n_positions=64),
         "124M": dict()}
SIZE = os.environ.get("HF_GPT2_SIZE", "tiny")
FAST_VARIANCE = os.environ.get("HF_GPT2_FAST_VARIANCE", "1") != "0"
BATCH, TOKENS = (2, 16) if SIZE == "tiny" else (2, 64)
OUTPUT = "logits"


def _config():
    from transformers import GPT2Config

    return GPT2Config(**SIZES[SIZE], resid_pdrop=0.0, embd_pdrop=0.0, attn_pdrop=0.0)


def torch_model():
    from transformers import GPT2LMHeadModel

    return GPT2LMHeadModel(_config()).to(torch.float32)


def jax_model():
    import flax.linen as nn
    from transformers.models.gpt2 import modeling_flax_gpt2 as hf

    if not FAST_VARIANCE:  # the port's LayerNorms subtracting the mean first, as PyTorch's do
        hf.nn = _SlowVarianceLinen(nn)
    return hf.FlaxGPT2LMHeadModule(_config(), dtype=jnp.zeros(()).dtype)


class _SlowVarianceLinen:
    """flax.linen as transformers' module reads it, with LayerNorm built with use_fast_variance=False."""

    def __init__(self, linen):
        self._linen = linen

    def __getattr__(self, name):
        value = getattr(self._linen, name)
        if name == "LayerNorm":
            return lambda *a, **kw: value(*a, use_fast_variance=False, **kw)
        return value


def example_inputs():
    return (np.random.default_rng(0).integers(0, SIZES[SIZE].get("vocab_size", 50257), (BATCH, TOKENS)),)


def to_jax(ids):
    ids = np.asarray(ids)
    return ids, np.ones_like(ids), np.broadcast_to(np.arange(ids.shape[1]), ids.shape)


def example_targets():
    return (np.random.default_rng(1).integers(0, SIZES[SIZE].get("vocab_size", 50257), (BATCH, TOKENS)),)


def torch_loss(logits, ids, targets):
    return torch.nn.functional.cross_entropy(logits.reshape(-1, logits.shape[-1]), targets.reshape(-1))


def jax_loss(logits, ids, mask, positions, targets):
    return optax.softmax_cross_entropy_with_integer_labels(logits.reshape(-1, logits.shape[-1]),
                                                           targets.reshape(-1)).mean()
