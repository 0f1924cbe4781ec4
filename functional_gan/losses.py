"""The GAN's losses, a parameter of the step: the tutorial's BCE pair today, others beside it.

A loss pair is two functions of the discriminator, its parameters and running statistics, and
images:

* ``discriminator(discriminator, params, batch_stats, real, fake) -> (loss, (batch_stats, d_x, d_g_z1))``
* ``generator(discriminator, params, batch_stats, fake) -> (loss, (batch_stats, d_g_z2))``

:func:`functional_gan.train.gan_step` differentiates the first with respect to D's parameters
and the second with respect to ``fake``; the config's ``loss`` names the pair in :data:`LOSSES`.
"""

from __future__ import annotations

from typing import Callable, NamedTuple

import jax
import jax.numpy as jnp

from functional_gan.layers import bce_loss
from functional_gan.models import Discriminator

REAL_LABEL = 1.0  # floats, as the tutorial (long labels once broke it)
FAKE_LABEL = 0.0


class GANLoss(NamedTuple):
    discriminator: Callable
    generator: Callable


def discriminate(discriminator: Discriminator, params, batch_stats, images_NHWC):
    """``netD(images)`` in training mode: (probabilities, updated running statistics)."""
    probabilities, updates = discriminator.apply(
        {"params": params, "batch_stats": batch_stats}, images_NHWC, mutable=["batch_stats"]
    )
    return probabilities, updates["batch_stats"]


def bce_discriminator_loss(discriminator: Discriminator, params, batch_stats, real_NHWC, fake_NHWC, detach: bool = True):
    """The tutorial's D loss ``errD = errD_real + errD_fake``; returns (errD, (batch_stats, D(x), D(G(z1)))).

    ``detach=True`` applies ``jax.lax.stop_gradient`` to ``fake`` where the tutorial wrote
    ``netD(fake.detach())``. When only D's parameters are differentiated it changes nothing (no
    gradient could reach G anyway); it matters when this loss is differentiated with respect to
    ``fake`` or G's parameters, which it then cuts to exact zeros. ``detach=False`` exists for the
    lessons that show the difference.
    """
    output, batch_stats = discriminate(discriminator, params, batch_stats, real_NHWC)
    err_real = bce_loss(output, jnp.full(output.shape, REAL_LABEL, output.dtype))
    d_x = output.mean()
    fake_input = jax.lax.stop_gradient(fake_NHWC) if detach else fake_NHWC  # PyTorch: fake.detach()
    output, batch_stats = discriminate(discriminator, params, batch_stats, fake_input)
    err_fake = bce_loss(output, jnp.full(output.shape, FAKE_LABEL, output.dtype))
    return err_real + err_fake, (batch_stats, d_x, output.mean())


def bce_generator_loss(discriminator: Discriminator, params, batch_stats, fake_NHWC):
    """The tutorial's G loss ``errG = BCE(netD(fake), 1)``; returns (errG, (batch_stats, D(G(z2))))."""
    output, batch_stats = discriminate(discriminator, params, batch_stats, fake_NHWC)
    err_g = bce_loss(output, jnp.full(output.shape, REAL_LABEL, output.dtype))
    return err_g, (batch_stats, output.mean())


BCE = GANLoss(bce_discriminator_loss, bce_generator_loss)
LOSSES: dict[str, GANLoss] = {"bce": BCE}
