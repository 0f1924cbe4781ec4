"""The GAN's losses, a parameter of the step: the tutorial's BCE pair, WGAN-GP and the hinge loss beside it.

A loss pair is two functions of the discriminator, its parameters and running statistics, and
images:

* ``discriminator(discriminator, params, batch_stats, real, fake) -> (loss, (batch_stats, d_x, d_g_z1))``
* ``generator(discriminator, params, batch_stats, fake) -> (loss, (batch_stats, d_g_z2))``

:func:`functional_gan.train.gan_step` differentiates the first with respect to D's parameters
and the second with respect to ``fake``. The config's ``loss`` names an entry of :data:`LOSSES`,
which builds the pair for a step (:func:`losses_for`): WGAN-GP's critic loss needs that step's
random interpolation weights, so its pair is made per step.
"""

from __future__ import annotations

import functools
from typing import Callable, NamedTuple

import jax
import jax.numpy as jnp

from functional_gan.config import ConfigError, TrainConfig
from functional_gan.layers import bce_loss
from functional_gan.models import Critic, Discriminator

REAL_LABEL = 1.0  # floats, as the tutorial (long labels once broke it)
FAKE_LABEL = 0.0


class GANLoss(NamedTuple):
    discriminator: Callable
    generator: Callable


def discriminate(discriminator: Discriminator | Critic, params, batch_stats, images_NHWC):
    """``netD(images)`` in training mode: (outputs, updated running statistics; ``{}`` for the critic, which has none)."""
    variables = {"params": params, "batch_stats": batch_stats} if batch_stats else {"params": params}
    outputs, updates = discriminator.apply(variables, images_NHWC, mutable=["batch_stats"])
    return outputs, updates.get("batch_stats", {})


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


def gradient_penalty(critic_fn: Callable, x_hat_NHWC: jax.Array) -> jax.Array:
    """WGAN-GP's penalty ``mean((‖∇_x̂ critic(x̂)‖₂ − 1)²)``, one gradient per image.

    ``jax.grad`` of the summed scores gives every image's input gradient at once (an image's score
    depends on that image only: the critic has no BatchNorm). Differentiating this penalty with
    respect to the critic's parameters is ``jax.grad`` of a ``jax.grad``: second order, through
    the convolutions' own VJPs. PyTorch: ``torch.autograd.grad(scores, x_hat,
    grad_outputs=torch.ones_like(scores), create_graph=True)``, which must keep the graph of the
    gradient to differentiate it again; here nothing has to be kept or asked for.
    """
    gradients = jax.grad(lambda x: jnp.sum(critic_fn(x)))(x_hat_NHWC)
    norms = jnp.linalg.norm(gradients.reshape(gradients.shape[0], -1), axis=1)  # gradients.view(N, -1).norm(2, dim=1)
    return jnp.mean((norms - 1.0) ** 2)


def wgan_gp_critic_loss(critic: Critic, params, batch_stats, real_NHWC, fake_NHWC, mix_N, gp_weight: float,
                        detach: bool = True):
    """The critic's loss ``C(G(z)) − C(x) + λ·GP`` (means over the batch) of Gulrajani et al., Algorithm 1.

    ``x̂ = ε·x + (1 − ε)·G(z)`` with ``ε = mix_N`` ~ U(0, 1) per image. Returns (loss, (batch_stats,
    mean C(x), mean C(G(z)))). ``detach`` as in :func:`bce_discriminator_loss`: ``stop_gradient``
    where PyTorch writes ``fake.detach()``.
    """
    fake = jax.lax.stop_gradient(fake_NHWC) if detach else fake_NHWC  # PyTorch: fake.detach()
    scores_real, batch_stats = discriminate(critic, params, batch_stats, real_NHWC)
    scores_fake, batch_stats = discriminate(critic, params, batch_stats, fake)
    eps = mix_N.reshape(-1, 1, 1, 1).astype(real_NHWC.dtype)
    x_hat = eps * real_NHWC + (1 - eps) * fake
    penalty = gradient_penalty(lambda x: discriminate(critic, params, batch_stats, x)[0], x_hat)
    loss = scores_fake.mean() - scores_real.mean() + gp_weight * penalty
    return loss, (batch_stats, scores_real.mean(), scores_fake.mean())


def wgan_generator_loss(critic: Critic, params, batch_stats, fake_NHWC):
    """The generator's loss ``−C(G(z))`` (mean); returns (loss, (batch_stats, mean C(G(z))))."""
    scores, batch_stats = discriminate(critic, params, batch_stats, fake_NHWC)
    return -scores.mean(), (batch_stats, scores.mean())


class LossSpec(NamedTuple):
    """An entry of :data:`LOSSES`: everything the project knows about one GAN loss, in one place.

    The command line (``--loss`` and its help, the defaults' help), :func:`config_for_loss`,
    the training step, ``replay``, the comparisons and the stats line all read it; no code tests a loss's name.
    """

    name: str
    summary: str  # one line, for --loss's help
    build: Callable  # (config, mix_N or None) -> GANLoss, the pair for one step
    critic: bool  # True: the critic (no BatchNorm, no Sigmoid) instead of the tutorial's Discriminator
    defaults: dict = {}  # what the loss changes in the tutorial's settings unless flags say otherwise
    own_settings: tuple = ()  # TrainConfig fields only this loss reads (giving them to another loss is an error)
    mix: bool = False  # draws per-image interpolation weights ε ~ U(0, 1) each step (the step's mix_N)
    labels: tuple = ("D(x)", "D(G(z))")  # how the stats line names d_x and d_g_z1 / d_g_z2
    derived: dict = {}  # {label: fn(metrics) -> float}: metrics shown after the others and plotted with the losses
    torch_reference: str = ""  # the PyTorch reference module: make_models(config, dtype), iteration(...) (see below)


def _build_wgan_gp(config, mix_N) -> GANLoss:
    if mix_N is None:
        raise ValueError("the wgan-gp loss needs the step's interpolation weights (mix_N, one U(0, 1) per image)")
    return GANLoss(functools.partial(wgan_gp_critic_loss, mix_N=mix_N, gp_weight=config.gp_weight), wgan_generator_loss)


def _wasserstein_estimate(metrics) -> float:
    return metrics["d_x"] - metrics["d_g_z1"]


BCE_LOSS = LossSpec(
    "bce", "the tutorial's BCELoss pair, Discriminator with BatchNorm and Sigmoid", lambda config, mix_N: BCE, False,
    torch_reference="functional_gan.pytorch.dcgan",
)
# Gulrajani et al. (2017), Algorithm 1's defaults: λ = 10, n_critic = 5, Adam(α = 1e-4, β1 = 0, β2 = 0.9).
WGAN_GP_LOSS = LossSpec(
    "wgan-gp", "Wasserstein loss with gradient penalty (Gulrajani et al. 2017), critic without BatchNorm or Sigmoid",
    _build_wgan_gp, True, defaults={"lr": 1e-4, "beta1": 0.0, "beta2": 0.9, "n_critic": 5, "gp_weight": 10.0},
    own_settings=("gp_weight",), mix=True, labels=("C(x)", "C(G(z))"), derived={"W": _wasserstein_estimate},
    torch_reference="functional_gan.pytorch.wgan_gp",
)


# --- the hinge loss (Lim & Ye 2017; SNGAN, Miyato et al. 2018; BigGAN): its whole definition ------------------------


def hinge_discriminator_loss(critic: Critic, params, batch_stats, real_NHWC, fake_NHWC, detach: bool = True):
    """``mean(relu(1 − D(x))) + mean(relu(1 + D(G(z))))`` on raw scores; returns (loss, (batch_stats, mean D(x), mean D(G(z))))."""
    fake = jax.lax.stop_gradient(fake_NHWC) if detach else fake_NHWC  # PyTorch: fake.detach()
    scores_real, batch_stats = discriminate(critic, params, batch_stats, real_NHWC)
    scores_fake, batch_stats = discriminate(critic, params, batch_stats, fake)
    loss = jax.nn.relu(1.0 - scores_real).mean() + jax.nn.relu(1.0 + scores_fake).mean()
    return loss, (batch_stats, scores_real.mean(), scores_fake.mean())


HINGE_LOSS = LossSpec(
    "hinge", "the hinge loss of SNGAN and BigGAN, relu(1 − D(x)) + relu(1 + D(G(z))) for D and −D(G(z)) for G, "
    "critic without BatchNorm or Sigmoid", lambda config, mix_N: GANLoss(hinge_discriminator_loss, wgan_generator_loss),
    True, torch_reference="functional_gan.pytorch.hinge",
)

LOSSES: dict[str, LossSpec] = {spec.name: spec for spec in (BCE_LOSS, WGAN_GP_LOSS, HINGE_LOSS)}


def loss_entry(name: str) -> LossSpec:
    """The entry of :data:`LOSSES` called ``name``; :class:`ConfigError` naming the known ones otherwise."""
    if name not in LOSSES:
        raise ConfigError(f"--loss {name!r} is not known; choose one of {tuple(LOSSES)}")
    return LOSSES[name]


def losses_for(config, mix_N: jax.Array | None = None) -> GANLoss:
    """The loss pair ``config.loss`` names, for a step whose interpolation weights are ``mix_N`` (WGAN-GP only)."""
    return loss_entry(config.loss).build(config, mix_N)


def config_for_loss(loss: str, **given) -> TrainConfig:
    """A TrainConfig for ``loss``: the tutorial's settings, then the loss's defaults, then ``given`` (None: not given).

    ``config_for_loss("wgan-gp", lr=None)`` has WGAN-GP's lr 1e-4; ``lr=3e-4`` keeps 3e-4. The defaults
    are the loss's entry's (:data:`LOSSES`).
    """
    spec = loss_entry(loss)
    for name, value in given.items():
        owners = [s.name for s in LOSSES.values() if name in s.own_settings]
        if value is not None and owners and loss not in owners:
            raise ConfigError(f"--{name.replace('_', '-')} is a setting of the {' and '.join(owners)} loss; "
                              f"--loss {loss} does not use it")
    values = {**spec.defaults, **{k: v for k, v in given.items() if v is not None}}
    return TrainConfig(loss=loss, **values)
