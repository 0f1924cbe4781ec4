"""The DCGAN tutorial in Flax NNX: G and D as ``nnx.Module`` objects, ``nnx.Optimizer``s, one ``nnx.jit``-ed step.

Flax's documentation now points new users to NNX. NNX brings back PyTorch's objects — a module owns
its weights and running statistics, ``model.train()`` / ``model.eval()`` switch BatchNorm, an
``nnx.Optimizer`` updates the model in place — while gradients stay functional: ``nnx.grad``
differentiates the module passed as its argument (so D's step differentiates D alone, because only D
is the argument), and ``detach()`` is still ``jax.lax.stop_gradient``.

The layers compute exactly what :mod:`functional_gan.layers` computes for Linen (the same convolution
functions, PyTorch's BatchNorm), and every submodule keeps the Linen model's name (``main_N``, after its
index in the tutorial's ``nn.Sequential``), so a Linen state moves in by name (:func:`from_linen`) and
the two steps can be compared number by number.

PyTorch                                      NNX (:func:`nnx_step`)
------------------------------------------   ----------------------------------------------------
fake = netG(noise)                           fake, G's VJP = jax.vjp of G's functional form
                                             (nnx.split / nnx.merge): G runs once, as in PyTorch
errD = BCE(netD(real), 1) +                  nnx.value_and_grad(d_loss)(D, real, fake): only D is
       BCE(netD(fake.detach()), 0)           differentiated; stop_gradient(fake) where detach() was
optimizerD.step()                            optimizer_d.update(D, grads): in place, as PyTorch's
errG = BCE(netD(fake), 1); backward()        d errG / d fake through the updated D, then G's VJP
optimizerG.step()                            optimizer_g.update(G, grads)

Two ways to run it. :func:`make_nnx_step` is the step as NNX users write it: ``nnx.jit`` over the four objects,
updated in place; each call walks their graph in Python around the compiled program. :func:`make_train_step`
(``train --api nnx``) runs the same :func:`nnx_step` on a :class:`~functional_gan.train.GANState`: the objects are
merged from the state inside a plain ``jax.jit`` and split back (:func:`to_objects`, :func:`to_state`), so it costs
what the Linen step costs per call, and the run's checkpoints, resume, ``sample`` and ``export`` are the Linen
run's own.
"""

from __future__ import annotations

import dataclasses

import jax
import jax.numpy as jnp
from flax import nnx

from functional_gan import layers
from functional_gan.config import TrainConfig
from functional_gan.losses import FAKE_LABEL, REAL_LABEL
from functional_gan.metrics import StepMetrics
from functional_gan.models import num_stride2_blocks
from functional_gan.train import GANState, jit_step, make_optimizer, step_noise


def _normal(rngs: nnx.Rngs, mean: float, std: float, shape, dtype):
    return mean + std * jax.random.normal(rngs.params(), shape, dtype)


class Conv2d(nnx.Module):
    """``nn.Conv2d(in, out, k, stride, padding, bias=False)``; ``weight`` (out, in, kH, kW), N(0, 0.02)."""

    def __init__(self, cin: int, cout: int, kernel: int, stride: int, padding: int, *, rngs: nnx.Rngs, dtype=jnp.float32):
        self.weight = nnx.Param(_normal(rngs, 0.0, 0.02, (cout, cin, kernel, kernel), dtype))
        self.stride, self.padding = stride, padding

    def __call__(self, x_NHWC):
        return layers.conv2d(x_NHWC, self.weight[...], self.stride, self.padding)


class ConvTranspose2d(nnx.Module):
    """``nn.ConvTranspose2d(in, out, k, stride, padding, bias=False)``; ``weight`` (in, out, kH, kW), N(0, 0.02)."""

    def __init__(self, cin: int, cout: int, kernel: int, stride: int, padding: int, *, rngs: nnx.Rngs, dtype=jnp.float32):
        self.weight = nnx.Param(_normal(rngs, 0.0, 0.02, (cin, cout, kernel, kernel), dtype))
        self.stride, self.padding = stride, padding

    def __call__(self, x_NHWC):
        return layers.conv_transpose2d(x_NHWC, self.weight[...], self.stride, self.padding)


class BatchNorm2d(nnx.Module):
    """``nn.BatchNorm2d(c)`` with PyTorch's semantics (momentum 0.1 weighs the new batch, the running variance
    receives the unbiased batch variance, a batch counter), as :class:`functional_gan.layers.BatchNorm2d`.

    As in PyTorch, a training-mode call updates the running statistics in place; ``model.eval()`` sets
    ``use_running_average`` and the layer normalises with them (``nnx.BatchNorm`` has Flax's momentum and
    the biased variance instead)."""

    def __init__(self, c: int, *, rngs: nnx.Rngs, momentum: float = 0.1, eps: float = 1e-5, dtype=jnp.float32):
        self.weight = nnx.Param(_normal(rngs, 1.0, 0.02, (c,), dtype))
        self.bias = nnx.Param(jnp.zeros((c,), dtype))
        self.running_mean = nnx.BatchStat(jnp.zeros((c,), dtype))
        self.running_var = nnx.BatchStat(jnp.ones((c,), dtype))
        self.num_batches_tracked = nnx.BatchStat(jnp.zeros((), jnp.int32))
        self.momentum, self.eps = momentum, eps
        self.use_running_average = False

    def __call__(self, x_NHWC):
        if self.use_running_average:
            mean, var = self.running_mean[...], self.running_var[...]
            return (x_NHWC - mean) * (jax.lax.rsqrt(var + self.eps) * self.weight[...]) + self.bias[...]
        y, mean, var = layers.batch_norm(x_NHWC, self.weight[...], self.bias[...], self.eps)  # as the Linen layer
        n = x_NHWC.shape[0] * x_NHWC.shape[1] * x_NHWC.shape[2]
        m = self.momentum
        self.running_mean[...] = (1 - m) * self.running_mean[...] + m * jax.lax.stop_gradient(mean)
        self.running_var[...] = (1 - m) * self.running_var[...] + m * jax.lax.stop_gradient(
            layers.running_variance(var, n))
        self.num_batches_tracked[...] = self.num_batches_tracked[...] + 1
        return y


def _leaky_relu(x):
    return jax.nn.leaky_relu(x, negative_slope=0.2)


class Generator(nnx.Module):
    """The tutorial's ``Generator`` (see :class:`functional_gan.models.Generator`): z (N, nz) → images (N, H, W, nc)."""

    def __init__(self, nz: int, ngf: int, nc: int, image_size: int, *, rngs: nnx.Rngs, dtype=jnp.float32):
        n_up = num_stride2_blocks(image_size)
        channels = [ngf * 2 ** i for i in reversed(range(n_up))]
        self.names = []
        self._add(0, ConvTranspose2d(nz, channels[0], 4, 1, 0, rngs=rngs, dtype=dtype))
        index = 0
        for i in range(n_up):
            self._add(index + 1, BatchNorm2d(channels[i], rngs=rngs, dtype=dtype))
            out_channels = channels[i + 1] if i + 1 < n_up else nc
            index += 3
            self._add(index, ConvTranspose2d(channels[i], out_channels, 4, 2, 1, rngs=rngs, dtype=dtype))

    def _add(self, index: int, module: nnx.Module):
        setattr(self, f"main_{index}", module)
        self.names.append(f"main_{index}")

    def __call__(self, z_NZ):
        x = z_NZ.reshape(z_NZ.shape[0], 1, 1, -1)
        for name in self.names:
            x = getattr(self, name)(x)
            if isinstance(getattr(self, name), BatchNorm2d):
                x = jax.nn.relu(x)
        return jnp.tanh(x)


class Discriminator(nnx.Module):
    """The tutorial's ``Discriminator`` (see :class:`functional_gan.models.Discriminator`): images → probabilities (N,)."""

    def __init__(self, ndf: int, nc: int, image_size: int, *, rngs: nnx.Rngs, dtype=jnp.float32):
        n_down = num_stride2_blocks(image_size)
        channels = [ndf * 2 ** i for i in range(n_down)]
        self.names = []
        self._add(0, Conv2d(nc, channels[0], 4, 2, 1, rngs=rngs, dtype=dtype))
        index = 2
        for i in range(1, n_down):
            self._add(index, Conv2d(channels[i - 1], channels[i], 4, 2, 1, rngs=rngs, dtype=dtype))
            self._add(index + 1, BatchNorm2d(channels[i], rngs=rngs, dtype=dtype))
            index += 3
        self._add(index, Conv2d(channels[-1], 1, 4, 1, 0, rngs=rngs, dtype=dtype))

    _add = Generator._add

    def __call__(self, images_NHWC):
        x = images_NHWC
        for position, name in enumerate(self.names):
            x = getattr(self, name)(x)
            last = position == len(self.names) - 1
            if not last and (isinstance(getattr(self, name), BatchNorm2d) or name == "main_0"):
                x = _leaky_relu(x)
        return jax.nn.sigmoid(x).reshape(-1)


def make_models(config: TrainConfig, seed: int = 0, dtype=jnp.float32) -> tuple[Generator, Discriminator]:
    """``netG``, ``netD`` as NNX modules at the config's sizes, drawn with the tutorial's ``weights_init``
    (N(0, 0.02) convolutions, N(1, 0.02) BatchNorm scales) from ``nnx.Rngs(seed)``."""
    rngs = nnx.Rngs(seed)
    return (Generator(config.nz, config.ngf, config.nc, config.image_size, rngs=rngs, dtype=dtype),
            Discriminator(config.ndf, config.nc, config.image_size, rngs=rngs, dtype=dtype))


def load_linen(module: nnx.Module, params: dict, batch_stats: dict) -> None:
    """Put a Linen model's variables (``params``, ``batch_stats``: {"main_N": {name: array}}) into the NNX module."""
    for name in module.names:
        layer = getattr(module, name)
        for field, value in {**params.get(name, {}), **batch_stats.get(name, {})}.items():
            getattr(layer, field)[...] = jnp.asarray(value)


def linen_variables(module: nnx.Module) -> tuple[dict, dict]:
    """The module's (params, batch_stats) in the Linen model's layout: {"main_N": {name: array}}."""
    params, stats = {}, {}
    for name in module.names:
        layer = getattr(module, name)
        for field, variable in vars(layer).items():
            if isinstance(variable, nnx.Param):
                params.setdefault(name, {})[field] = variable[...]
            elif isinstance(variable, nnx.BatchStat):
                stats.setdefault(name, {})[field] = variable[...]
    return params, stats


def from_linen(config: TrainConfig, state) -> tuple[Generator, Discriminator]:
    """NNX models holding a Linen :class:`~functional_gan.train.GANState`'s weights and running statistics."""
    dtype = jax.tree.leaves(state.generator_params)[0].dtype
    generator, discriminator = make_models(config, dtype=dtype)
    load_linen(generator, state.generator_params, state.generator_batch_stats)
    load_linen(discriminator, state.discriminator_params, state.discriminator_batch_stats)
    return generator, discriminator


def make_optimizers(config: TrainConfig, generator: Generator, discriminator: Discriminator):
    """``optimizerG``, ``optimizerD``: the config's optax transformation (the tutorial's Adam) in ``nnx.Optimizer``s."""
    return (nnx.Optimizer(generator, make_optimizer(config), wrt=nnx.Param),
            nnx.Optimizer(discriminator, make_optimizer(config), wrt=nnx.Param))


def _bce(output, label: float):
    return layers.bce_loss(output, jnp.full(output.shape, label, output.dtype))


def _d_loss(discriminator: Discriminator, real_NHWC, fake_NHWC):
    output = discriminator(real_NHWC)
    err_real, d_x = _bce(output, REAL_LABEL), output.mean()
    output = discriminator(jax.lax.stop_gradient(fake_NHWC))  # PyTorch: netD(fake.detach())
    return err_real + _bce(output, FAKE_LABEL), (d_x, output.mean())


def _g_loss(fake_NHWC, discriminator: Discriminator):
    output = discriminator(fake_NHWC)
    return _bce(output, REAL_LABEL), output.mean()


def nnx_step(generator: Generator, discriminator: Discriminator, optimizer_g: nnx.Optimizer,
             optimizer_d: nnx.Optimizer, real_NHWC: jax.Array, noise_NZ: jax.Array) -> StepMetrics:
    """One iteration of the tutorial's loop (the BCE pair), updating the four objects in place; returns the metrics.

    Not jitted: :func:`make_nnx_step` wraps it in ``nnx.jit``."""
    # fake = netG(noise): G's functional form, so that G runs once and its VJP serves the G step.
    graph, params, rest = nnx.split(generator, nnx.Param, ...)

    def forward(params):
        model = nnx.merge(graph, params, rest, copy=True)
        return model(noise_NZ), nnx.state(model, nnx.BatchStat)

    fake, generator_vjp, generator_stats = jax.vjp(forward, params, has_aux=True)
    nnx.update(generator, generator_stats)

    # (1) D: only D is the argument, so only D is differentiated.
    (loss_d, (d_x, d_g_z1)), grads_d = nnx.value_and_grad(_d_loss, has_aux=True)(discriminator, real_NHWC, fake)
    optimizer_d.update(discriminator, grads_d)

    # (2) G: errG through the updated D on the same fake (its running statistics updated by the pass), G's VJP.
    (loss_g, d_g_z2), fake_cotangent = nnx.value_and_grad(_g_loss, has_aux=True)(fake, discriminator)
    (grads_g,) = generator_vjp(fake_cotangent)
    optimizer_g.update(generator, grads_g)
    return StepMetrics(loss_d, loss_g, d_x, d_g_z1, d_g_z2)


def make_nnx_step(config: TrainConfig):
    """``step(generator, discriminator, optimizer_g, optimizer_d, real_NHWC) -> StepMetrics``, ``nnx.jit``-ed, the noise
    drawn from the step's counter as the Linen step draws it (:func:`functional_gan.train.step_noise`)."""
    check_config(config)

    @nnx.jit
    def step(generator, discriminator, optimizer_g, optimizer_d, real_NHWC):
        noise = step_noise(config, optimizer_d.step[...].astype(jnp.int32), real_NHWC.shape[0], real_NHWC.dtype)
        return nnx_step(generator, discriminator, optimizer_g, optimizer_d, real_NHWC, noise)

    return step


# --------------------------------------------------------------------------------------------
# The functional form: the same NNX step on a GANState, so that training, checkpoints, resume, sample and
# export work on one state whichever API ran the step.
# --------------------------------------------------------------------------------------------


def check_config(config: TrainConfig) -> None:
    """The NNX port is the tutorial's step (the BCE pair, one D update per G update): a clear error for another."""
    dataclasses.replace(config, api="nnx").validate()


def _objects(config: TrainConfig, dtype=jnp.float32):
    generator, discriminator = make_models(config, dtype=dtype)
    return (generator, discriminator, *make_optimizers(config, generator, discriminator))


def _optimizer_pure(opt_state, step) -> dict:
    """An optax state (a tuple of NamedTuples, the empty ones skipped) and its step count as ``nnx.Optimizer``'s pure dict."""
    return {"opt_state": {i: part._asdict() for i, part in enumerate(opt_state) if part._fields}, "step": step}


def _merge_dicts(a: dict, b: dict) -> dict:
    return {name: {**a.get(name, {}), **b.get(name, {})} for name in {*a, *b}}


def to_objects(config: TrainConfig, state: GANState):
    """``(generator, discriminator, optimizer_g, optimizer_d)`` holding the state: weights, running statistics, Adam's
    moments and counts. Nothing is initialised (the objects' shapes come from ``nnx.eval_shape``), so it costs nothing
    inside a jitted function."""
    dtype = jax.tree.leaves(state.generator_params)[0].dtype
    graph, abstract = nnx.split(nnx.eval_shape(lambda: _objects(config, dtype)))
    pure = {
        0: _merge_dicts(state.generator_params, state.generator_batch_stats),
        1: _merge_dicts(state.discriminator_params, state.discriminator_batch_stats),
        2: _optimizer_pure(state.generator_opt_state, state.step),
        3: _optimizer_pure(state.discriminator_opt_state, state.step),
    }
    nnx.replace_by_pure_dict(abstract, pure)
    return nnx.merge(graph, abstract)


def _optax_state(optimizer: nnx.Optimizer, like):
    """The optimizer's state in the optax layout of ``like`` (same transformation, same parameters)."""
    leaves = jax.tree.leaves(nnx.state(optimizer.opt_state))
    return jax.tree.unflatten(jax.tree.structure(like), leaves)


def to_state(objects, like: GANState) -> GANState:
    """The four objects as a :class:`GANState` (the layout ``like`` has): the inverse of :func:`to_objects`."""
    generator, discriminator, optimizer_g, optimizer_d = objects
    g_params, g_stats = linen_variables(generator)
    d_params, d_stats = linen_variables(discriminator)
    return GANState(step=optimizer_d.step[...].astype(like.step.dtype), generator_params=g_params,
                    generator_batch_stats=g_stats, discriminator_params=d_params, discriminator_batch_stats=d_stats,
                    generator_opt_state=_optax_state(optimizer_g, like.generator_opt_state),
                    discriminator_opt_state=_optax_state(optimizer_d, like.discriminator_opt_state))


def step_function(config: TrainConfig):
    """``train_step(state, real_NHWC) -> (state, metrics)`` on a :class:`GANState`, not jitted, like
    :func:`functional_gan.train.step_function`: the NNX objects are merged from the state, stepped in place by
    :func:`nnx_step` and split back (``nnx.split`` / ``nnx.merge`` around a plain ``jax.jit``: no graph work per call)."""
    check_config(config)

    def train_step(state: GANState, real_NHWC: jax.Array):
        return gan_step(config, state, real_NHWC, step_noise(config, state.step, real_NHWC.shape[0], real_NHWC.dtype))

    return train_step


def gan_step(config: TrainConfig, state: GANState, real_NHWC: jax.Array, noise_NZ: jax.Array):
    """:func:`nnx_step` as a pure function of the state, the batch and the noise, as
    :func:`functional_gan.train.gan_step` is the Linen one: ``(state, metrics)``."""
    objects = to_objects(config, state)
    metrics = nnx_step(*objects, real_NHWC, noise_NZ)
    return to_state(objects, state), metrics


def make_gan_step(config: TrainConfig):
    """:func:`gan_step` jitted with the noise as an argument, ``step(state, real_NHWC, noise_NZ)``: the NNX step
    replaying a PyTorch run (as :func:`functional_gan.train.make_gan_step` does for Linen)."""
    check_config(config)
    return jax.jit(lambda state, real_NHWC, noise_NZ, mix_N=None: gan_step(config, state, real_NHWC, noise_NZ))


def make_train_step(config: TrainConfig, mesh=None):
    """:func:`step_function` jitted as :func:`functional_gan.train.make_train_step` jits the Linen step (the same
    shardings over a mesh): the step ``train --api nnx`` runs."""
    return jit_step(step_function(config), mesh)
