"""The DCGAN training step, written functionally, and the state it carries.

The step reads like the tutorial's loop, with ``jax.lax.stop_gradient`` standing where
``fake.detach()`` stood, and gradients returned as values instead of accumulated in ``.grad``.
"""

from __future__ import annotations

from typing import Any, NamedTuple

import flax.struct
import jax
import jax.numpy as jnp
import optax
from jax.sharding import Mesh

from functional_gan.config import TrainConfig
from functional_gan.distributed import batch_sharding, replicated
from functional_gan.losses import LOSSES, GANLoss, losses_for
from functional_gan.metrics import StepMetrics
from functional_gan.models import Critic, Discriminator, Generator


@flax.struct.dataclass
class GANState:
    """Everything a DCGAN run carries from one iteration to the next (a pytree).

    PyTorch: what the tutorial keeps in ``netG``, ``netD`` (weights and BatchNorm buffers) and
    the two ``optim.Adam`` objects, plus the iteration counter.
    """

    step: jax.Array
    generator_params: Any
    generator_batch_stats: Any
    discriminator_params: Any
    discriminator_batch_stats: Any
    generator_opt_state: Any
    discriminator_opt_state: Any


def make_models(config: TrainConfig, use_running_average: bool = False) -> tuple[Generator, Discriminator | Critic]:
    """The tutorial's ``netG`` and ``netD`` at the config's sizes (the one place models are built from settings).

    A loss that needs a critic (``wgan-gp``) gets :class:`~functional_gan.models.Critic` for ``netD``.
    """
    generator = Generator(
        nz=config.nz, ngf=config.ngf, nc=config.nc, image_size=config.image_size, use_running_average=use_running_average
    )
    discriminator = (Critic if LOSSES[config.loss].critic else Discriminator)(
        ndf=config.ndf, nc=config.nc, image_size=config.image_size, use_running_average=use_running_average
    )
    return generator, discriminator


def make_optimizer(config: TrainConfig) -> optax.GradientTransformation:
    """``optim.Adam(params, lr, betas=(beta1, beta2))``: optax's adam is the same algorithm (eps=1e-8 outside the root)."""
    return optax.adam(config.lr, b1=config.beta1, b2=config.beta2, eps=1e-8)


# Independent streams of the run's one root key, each reached by ``fold_in``.
_INIT_STREAM, _FIXED_NOISE_STREAM, _STEP_NOISE_STREAM, _STEP_MIX_STREAM = 0, 1, 2, 3


def stream_key(config: TrainConfig, stream: int) -> jax.Array:
    """The key of one random stream (weights, fixed noise, step noise, mix weights): ``fold_in(key(seed), stream)``.

    Everything random in a run derives from its one root key ``key(seed)`` this way; a step's draws fold in the step too.
    """
    return jax.random.fold_in(jax.random.key(config.seed), stream)


def init_state(config: TrainConfig, dtype=jnp.float32) -> GANState:
    """Fresh models with the tutorial's ``weights_init`` and fresh Adam states."""
    generator, discriminator = make_models(config)
    key_g, key_d = jax.random.split(stream_key(config, _INIT_STREAM))
    # lazy_init: the same initializers on the same keys as init (the same values), without running the forward pass.
    z = jax.ShapeDtypeStruct((2, config.nz), dtype)
    images = jax.ShapeDtypeStruct((2, config.image_size, config.image_size, config.nc), dtype)
    return state_from_variables(config, generator.lazy_init(key_g, z), discriminator.lazy_init(key_d, images))


def state_from_variables(config: TrainConfig, generator_vars, discriminator_vars) -> GANState:
    """A GANState at step 0 holding the given Flax variables ({'params', 'batch_stats'}) and fresh Adam states."""
    optimizer = make_optimizer(config)
    return GANState(
        step=jnp.zeros((), jnp.int32),
        generator_params=generator_vars["params"],
        generator_batch_stats=generator_vars["batch_stats"],
        discriminator_params=discriminator_vars["params"],
        discriminator_batch_stats=discriminator_vars.get("batch_stats", {}),  # the critic has none
        generator_opt_state=optimizer.init(generator_vars["params"]),
        discriminator_opt_state=optimizer.init(discriminator_vars["params"]),
    )


def step_noise(config: TrainConfig, step: jax.Array, batch_size: int, dtype=jnp.float32) -> jax.Array:
    """The noise of iteration ``step``: ``fold_in(root, step)``, so a resumed run draws the same noise."""
    return jax.random.normal(jax.random.fold_in(stream_key(config, _STEP_NOISE_STREAM), step), (batch_size, config.nz), dtype)


def step_mix(config: TrainConfig, step: jax.Array, batch_size: int, dtype=jnp.float32) -> jax.Array | None:
    """The interpolation weights ε ~ U(0, 1) of iteration ``step``, one per image, for a loss that draws them
    (WGAN-GP's; its entry's ``mix``); None for the others."""
    if not LOSSES[config.loss].mix:
        return None
    return jax.random.uniform(jax.random.fold_in(stream_key(config, _STEP_MIX_STREAM), step), (batch_size,), dtype)


FIXED_NOISE_ROWS = 64  # the tutorial's fixed_noise = torch.randn(64, nz, 1, 1)


def fixed_noise(config: TrainConfig, num: int = FIXED_NOISE_ROWS) -> jax.Array:
    """The run's fixed noise for progress grids (the tutorial's ``fixed_noise``), ``num`` rows.

    Rows come in blocks of 64 drawn from the run's fixed-noise stream, so the first 64 rows are
    always the ones the training grids used, whatever ``num`` is.
    """
    key = stream_key(config, _FIXED_NOISE_STREAM)
    blocks = [jax.random.normal(key, (FIXED_NOISE_ROWS, config.nz))]
    blocks += [
        jax.random.normal(jax.random.fold_in(key, block), (FIXED_NOISE_ROWS, config.nz))
        for block in range(1, -(-num // FIXED_NOISE_ROWS))
    ]
    return jnp.concatenate(blocks)[:num]


def gan_step(
    config: TrainConfig, state: GANState, real_NHWC: jax.Array, noise_NZ: jax.Array, losses: GANLoss | None = None,
    mix_N: jax.Array | None = None,
) -> tuple[GANState, StepMetrics]:
    """One iteration of the tutorial's loop, as a pure function of the state, the batch and the noise.

    PyTorch: the body of the tutorial's ``for i, data in enumerate(dataloader)`` loop. ``losses``
    (default: the pair the config names, the tutorial's BCE) supplies D's and G's losses;
    ``mix_N`` are WGAN-GP's interpolation weights (one per image; that loss only).

    PyTorch                                      here
    ------------------------------------------   ------------------------------------------------
    fake = netG(noise)                           fake, generator_vjp = jax.vjp(G, params_G)
    errD_real = BCE(netD(real), 1)               ─┐ d_loss(params_D), differentiated only with
    errD_fake = BCE(netD(fake.detach()), 0)       │ respect to params_D; stop_gradient(fake)
    errD_real.backward(); errD_fake.backward()   ─┘ stands where detach() stood
    optimizerD.step()                            optax update of D
    errG = BCE(netD(fake), 1)  # updated D       g_loss(fake) through the *updated* D
    errG.backward(); optimizerG.step()           generator_vjp(d errG / d fake), optax update of G

    ``fake`` is computed once and G's VJP is reused, as PyTorch reuses the graph it kept alive
    because of ``detach()``. D's running statistics update three times (real, detached fake, fake
    through the updated D) and G's once, as in PyTorch.

    With ``config.n_critic = k > 1`` (WGAN-GP's 5) D updates every iteration and G only every k-th
    (when ``(step + 1) % k == 0``), as ``if i % n_critic == 0: update G`` loops do; ``errG`` is still
    computed every iteration for the log, and on the other iterations nothing of G (nor the
    running statistics of that pass through D) changes: a ``lax.cond`` inside the one program.
    """
    generator, discriminator = make_models(config)
    optimizer = make_optimizer(config)
    losses = losses or losses_for(config, mix_N)
    fake, generator_vjp, generator_batch_stats = generate(generator, state, noise_NZ)

    # (1) Update D: maximize log(D(x)) + log(1 - D(G(z))).
    d_step = discriminator_update(discriminator, optimizer, losses, state, real_NHWC, fake)

    # (2) Update G: maximize log(D(G(z))), through the updated D, on the same `fake`.
    def update_generator(_):
        g_step = generator_update(discriminator, optimizer, losses, state, d_step.params, d_step.batch_stats, fake, generator_vjp)
        return g_step.params, g_step.opt_state, g_step.discriminator_batch_stats, g_step.loss, g_step.d_g_z2

    def keep_generator(_):  # errG is still computed for the log; nothing of G, nor of that pass through D, changes
        loss_g, (_, d_g_z2) = losses.generator(discriminator, d_step.params, d_step.batch_stats, fake)
        return state.generator_params, state.generator_opt_state, d_step.batch_stats, loss_g, d_g_z2

    if config.n_critic == 1:
        generator_params, generator_opt_state, discriminator_batch_stats, loss_g, d_g_z2 = update_generator(None)
    else:
        generator_params, generator_opt_state, discriminator_batch_stats, loss_g, d_g_z2 = jax.lax.cond(
            (state.step + 1) % config.n_critic == 0, update_generator, keep_generator, None
        )

    new_state = GANState(
        step=state.step + 1,
        generator_params=generator_params,
        generator_batch_stats=generator_batch_stats,
        discriminator_params=d_step.params,
        discriminator_batch_stats=discriminator_batch_stats,
        generator_opt_state=generator_opt_state,
        discriminator_opt_state=d_step.opt_state,
    )
    return new_state, StepMetrics(d_step.loss, loss_g, d_step.d_x, d_step.d_g_z1, d_g_z2)


# The three parts of ``gan_step``, public so that the divergence finder runs the step itself, part by part
# (and can start the G part from PyTorch's updated D).


def generate(generator: Generator, state: GANState, noise_NZ: jax.Array):
    """``fake = netG(noise)``: (fake, G's VJP for the G step, G's updated running statistics)."""

    def forward(generator_params):
        fake, updates = generator.apply(
            {"params": generator_params, "batch_stats": state.generator_batch_stats}, noise_NZ, mutable=["batch_stats"]
        )
        return fake, updates["batch_stats"]

    return jax.vjp(forward, state.generator_params, has_aux=True)


class DiscriminatorUpdate(NamedTuple):
    loss: jax.Array  # errD (errD_real + errD_fake for the tutorial's BCE)
    grads: Any
    params: Any  # after the optimizer step
    opt_state: Any
    batch_stats: Any  # after the passes on real and on stop_gradient(fake)
    d_x: jax.Array
    d_g_z1: jax.Array


def discriminator_update(discriminator, optimizer, losses: GANLoss, state: GANState, real_NHWC, fake_NHWC) -> DiscriminatorUpdate:
    """D's half of the iteration: D's loss on real and on ``stop_gradient(fake)``, its gradients, one optimizer step."""
    (loss_d, (batch_stats, d_x, d_g_z1)), grads = jax.value_and_grad(losses.discriminator, argnums=1, has_aux=True)(
        discriminator, state.discriminator_params, state.discriminator_batch_stats, real_NHWC, fake_NHWC
    )
    updates, opt_state = optimizer.update(grads, state.discriminator_opt_state, state.discriminator_params)
    return DiscriminatorUpdate(loss_d, grads, optax.apply_updates(state.discriminator_params, updates), opt_state,
                               batch_stats, d_x, d_g_z1)


class GeneratorUpdate(NamedTuple):
    loss: jax.Array  # errG
    fake_cotangent: jax.Array  # d errG / d fake
    grads: Any
    params: Any  # after the optimizer step
    opt_state: Any
    discriminator_batch_stats: Any  # after the pass of fake through the updated D
    d_g_z2: jax.Array


def generator_update(discriminator, optimizer, losses: GANLoss, state: GANState, discriminator_params,
                     discriminator_batch_stats, fake_NHWC, generator_vjp) -> GeneratorUpdate:
    """G's half: errG through the given (updated) D on the same ``fake``, G's gradients by its VJP, one optimizer step."""
    (loss_g, (stats_after_pass, d_g_z2)), fake_cotangent = jax.value_and_grad(losses.generator, argnums=3, has_aux=True)(
        discriminator, discriminator_params, discriminator_batch_stats, fake_NHWC
    )
    (grads,) = generator_vjp(fake_cotangent)
    updates, opt_state = optimizer.update(grads, state.generator_opt_state, state.generator_params)
    return GeneratorUpdate(loss_g, fake_cotangent, grads, optax.apply_updates(state.generator_params, updates), opt_state,
                           stats_after_pass, d_g_z2)


def step_function(config: TrainConfig):
    """``train_step(state, real_NHWC) -> (state, metrics)``, not jitted: the training step with its noise (and
    WGAN-GP's ε) drawn inside from the step's counter. :func:`make_train_step` jits it; a ``lax.scan`` can run it."""

    def train_step(state: GANState, real_NHWC: jax.Array):
        noise = step_noise(config, state.step, real_NHWC.shape[0], real_NHWC.dtype)
        mix = step_mix(config, state.step, real_NHWC.shape[0], real_NHWC.dtype)
        return gan_step(config, state, real_NHWC, noise, mix_N=mix)

    return train_step


def make_train_step(config: TrainConfig, mesh: Mesh | None = None):
    """``train_step(state, real_NHWC) -> (state, metrics)``, jitted whole (loss, gradients and updates).

    The noise is drawn inside from ``fold_in(stream_key(config, noise stream), state.step)``. With a ``mesh``, the batch
    is sharded along its first axis and the state replicated: still one program, and BatchNorm's
    statistics are over the global batch, as one device computes them (XLA inserts the
    reductions). The state's buffers are donated on accelerators (CPU ignores donation).
    """

    return jit_step(step_function(config), mesh)


def jit_step(train_step, mesh: Mesh | None = None):
    """``train_step(state, real_NHWC)`` jitted as :func:`make_train_step` describes (also for the NNX port's step)."""
    donate = (0,) if jax.default_backend() != "cpu" else ()
    if mesh is None:
        return jax.jit(train_step, donate_argnums=donate)
    return jax.jit(
        train_step,
        in_shardings=(replicated(mesh), batch_sharding(mesh)),
        out_shardings=(replicated(mesh), replicated(mesh)),
        donate_argnums=donate,
    )


def make_gan_step(config: TrainConfig):
    """``gan_step`` jitted with the noise as an argument: ``step(state, real_NHWC, noise_NZ, mix_N=None)``.

    For replaying a PyTorch run, whose noise (and WGAN-GP's ε) comes from ``torch.randn`` (``torch.rand``).
    """
    return jax.jit(lambda state, real_NHWC, noise_NZ, mix_N=None: gan_step(config, state, real_NHWC, noise_NZ, mix_N=mix_N))


def make_sampler(config: TrainConfig, use_running_average: bool = False):
    """``sample(state, noise) -> images_NHWC`` in [−1, 1], a pure function (jitted).

    ``use_running_average=False`` is the tutorial's train-mode BatchNorm (it never calls
    ``.eval()``). Unlike PyTorch, sampling here leaves G's running statistics unchanged: it is a
    pure function of the state, not an update of it.
    """
    generator, _ = make_models(config, use_running_average)

    @jax.jit
    def sample(state: GANState, noise_NZ: jax.Array) -> jax.Array:
        variables = {"params": state.generator_params, "batch_stats": state.generator_batch_stats}
        return generator.apply(variables, noise_NZ)

    return sample
