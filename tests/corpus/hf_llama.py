"""Hugging Face's own Flax Llama against its PyTorch Llama (transformers 4.57.6, the last release with Flax models): a
correct port nobody here wrote, with grouped-query attention, whose float64 build computes in float32 in places on
both sides: transformers' ``LlamaRMSNorm`` casts its input to float32 whatever the model's dtype, and
``FlaxLlamaRMSNorm`` computes the variance in float32 (and its attention's softmax in float32 where its dtype is not
float32).

    functional-gan check-port tests/corpus/hf_llama.py --dtype float64

The Flax module is built in the check's dtype (``jnp.zeros(()).dtype``: float64 under ``--dtype float64``). Needs
``pip install --no-deps transformers==4.57.6`` (with huggingface-hub < 1 and tokenizers ≤ 0.23).
"""

import jax.numpy as jnp
import numpy as np
import optax
import torch

CONFIG = dict(vocab_size=97, hidden_size=64, intermediate_size=128, num_hidden_layers=2, num_attention_heads=4,
              num_key_value_heads=2, max_position_embeddings=64, tie_word_embeddings=False)
BATCH, TOKENS = 2, 16
OUTPUT = "logits"
# The Flax modules are defined in another order than PyTorch's (each layer's input_layernorm first): paired by name
_LAYER = ["self_attn.q_proj", "self_attn.k_proj", "self_attn.v_proj", "self_attn.o_proj", "mlp.gate_proj",
          "mlp.up_proj", "mlp.down_proj", "input_layernorm", "post_attention_layernorm"]
param_map = {"model.embed_tokens": "model/embed_tokens", "model.norm": "model/norm", "lm_head": "lm_head",
             **{f"model.layers.{i}.{m}": f"model/layers/{i}/{m.replace('.', '/')}"
                for i in range(CONFIG["num_hidden_layers"]) for m in _LAYER}}


def _config():
    from transformers import LlamaConfig

    return LlamaConfig(**CONFIG, attention_dropout=0.0)


def torch_model():
    from transformers import LlamaForCausalLM

    model = LlamaForCausalLM(_config()).to(torch.float32)
    model.config._attn_implementation = "eager"
    return model


def jax_model():
    from transformers.models.llama import modeling_flax_llama as hf

    return hf.FlaxLlamaForCausalLMModule(_config(), dtype=jnp.zeros(()).dtype)


def example_inputs():
    return (np.random.default_rng(0).integers(0, CONFIG["vocab_size"], (BATCH, TOKENS)),)


def to_jax(ids):
    ids = np.asarray(ids)
    return ids, np.ones_like(ids), np.broadcast_to(np.arange(ids.shape[1]), ids.shape)


def example_targets():
    return (np.random.default_rng(1).integers(0, CONFIG["vocab_size"], (BATCH, TOKENS)),)


def torch_loss(logits, ids, targets):
    return torch.nn.functional.cross_entropy(logits.reshape(-1, logits.shape[-1]), targets.reshape(-1))


def jax_loss(logits, ids, mask, positions, targets):
    return optax.softmax_cross_entropy_with_integer_labels(logits.reshape(-1, logits.shape[-1]),
                                                           targets.reshape(-1)).mean()
