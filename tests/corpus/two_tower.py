"""A correct contrastive two-tower port, as CLIP trains one: an image tower and a text tower (a Linear each), both
embeddings normalised, their products scaled by ``exp(logit_scale)`` into batch × batch logits, the symmetric
cross-entropy over the matching pairs. The output has the batch on both axes. Flax Linen, AdamW on both sides.

    functional-gan check-port tests/corpus/two_tower.py
"""

import math

import flax.linen as nn
import jax.numpy as jnp
import numpy as np
import optax
import torch

BATCH = 16
MISTAKE = None  # "logits-10pct": the port's logits 10% too large (a planted mistake for the tests)


class TwoTower(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.image = torch.nn.Linear(12, 8)
        self.text = torch.nn.Linear(6, 8)
        self.logit_scale = torch.nn.Parameter(torch.tensor(math.log(1 / 0.07)))

    def forward(self, images, texts):
        a = torch.nn.functional.normalize(self.image(images), dim=-1)
        b = torch.nn.functional.normalize(self.text(texts), dim=-1)
        return self.logit_scale.exp() * a @ b.T  # logits_per_image: (B, B)


class Port(nn.Module):
    @nn.compact
    def __call__(self, images, texts):
        a = nn.Dense(8, name="image")(images)
        b = nn.Dense(8, name="text")(texts)
        a = a / jnp.maximum(jnp.linalg.norm(a, axis=-1, keepdims=True), 1e-12)
        b = b / jnp.maximum(jnp.linalg.norm(b, axis=-1, keepdims=True), 1e-12)
        scale = self.param("logit_scale", lambda key: jnp.asarray(math.log(1 / 0.07), images.dtype))
        logits = jnp.exp(scale) * a @ b.T
        return logits * 1.1 if MISTAKE == "logits-10pct" else logits


def torch_model():
    return TwoTower()


def jax_model():
    return Port()


def example_inputs():
    rng = np.random.default_rng(0)
    return (rng.normal(size=(BATCH, 12)).astype(np.float32), rng.normal(size=(BATCH, 6)).astype(np.float32))


def torch_loss(logits, images, texts):
    labels = torch.arange(logits.shape[0])
    return (torch.nn.functional.cross_entropy(logits, labels) + torch.nn.functional.cross_entropy(logits.T, labels)) / 2


def jax_loss(logits, images, texts):
    labels = jnp.arange(logits.shape[0])
    return (optax.softmax_cross_entropy_with_integer_labels(logits, labels).mean()
            + optax.softmax_cross_entropy_with_integer_labels(logits.T, labels).mean()) / 2


def torch_optimizer(parameters):
    return torch.optim.AdamW(parameters, lr=1e-3)


def jax_optimizer():
    return optax.adamw(1e-3, weight_decay=1e-2)  # torch.optim.AdamW's default decay (optax's is 1e-4)
