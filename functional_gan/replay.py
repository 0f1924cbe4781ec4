"""Replay a PyTorch DCGAN run step by step in JAX.

Given the tutorial models' initial ``state_dict``s and the exact data and noise each iteration
used, run the same iterations with :func:`functional_gan.train.gan_step` and return the tutorial's
per-step metrics and the final weights as ``state_dict`` arrays (running statistics and
``num_batches_tracked`` included), ready to load into the tutorial's models.
"""

from __future__ import annotations

import dataclasses
import os
from pathlib import Path

import jax
import jax.numpy as jnp
import numpy as np

from functional_gan import state_dicts
from functional_gan.losses import LOSSES
from functional_gan.config import TUTORIAL, TrainConfig
from functional_gan.errors import UserError
from functional_gan.metrics import METRIC_NAMES
from functional_gan.train import GANState, init_state, make_gan_step, state_from_variables


class ReplayInputError(UserError):
    """Inputs that do not describe a replayable run; the message says which and why."""


@dataclasses.dataclass
class ReplayResult:
    metrics: dict[str, np.ndarray]  # each (steps,)
    generator_state_dict: dict[str, np.ndarray]
    discriminator_state_dict: dict[str, np.ndarray]
    config: TrainConfig


def config_from_state_dicts(generator_sd, discriminator_sd, batch_size: int, settings: TrainConfig = TUTORIAL) -> TrainConfig:
    """``settings`` (its optimizer and loss settings) with the model widths and image size read off the state_dict shapes."""
    g = state_dicts.infer_generator_shape(generator_sd)
    d = state_dicts.infer_discriminator_shape(discriminator_sd)
    if g["nc"] != d["nc"] or g["image_size"] != d["image_size"]:
        raise ReplayInputError(f"generator ({g}) and discriminator ({d}) disagree on channels or image size")
    return dataclasses.replace(
        settings, batch_size=batch_size, image_size=g["image_size"], nc=g["nc"], nz=g["nz"], ngf=g["ngf"], ndf=d["ndf"]
    ).validate()


def state_from_state_dicts(config: TrainConfig, generator_sd, discriminator_sd, dtype=jnp.float32) -> GANState:
    """A GANState with fresh Adam states holding the given weights (``state_dict`` arrays), cast to ``dtype``.

    Either state_dict may be None: that network is initialised as a fresh run's would be
    (``init_state(config)``). Raises :class:`~functional_gan.state_dicts.CheckpointFormatError` naming
    each key whose shape does not fit the models ``config`` describes (and each missing or
    unexpected key).

    PyTorch: ``netG.load_state_dict(torch.load(path))``, then new ``optim.Adam`` objects.
    """
    # Fresh weights only where a state_dict is missing; else the models' shapes alone, nothing drawn (a fresh
    # initialisation compiles a random normal per kernel shape: about 4 s for the DCGAN's on a CPU core, jaxlib 0.10.2).
    fresh = init_state(config) if generator_sd is None or discriminator_sd is None \
        else jax.eval_shape(lambda: init_state(config))
    variables = {}
    for name, state_dict in (("generator", generator_sd), ("discriminator", discriminator_sd)):
        params, batch_stats = getattr(fresh, f"{name}_params"), getattr(fresh, f"{name}_batch_stats")
        if state_dict is None:
            variables[name] = {"params": params, "batch_stats": batch_stats}
        else:
            state_dicts.check_state_dict(state_dict, state_dicts.state_dict_shapes(params, batch_stats), name)
            variables[name] = state_dicts.state_dict_to_variables(state_dict)

    def cast(tree):
        return jax.tree_util.tree_map(lambda a: jnp.asarray(a, dtype if np.issubdtype(np.asarray(a).dtype, np.floating) else None), tree)

    return state_from_variables(config, cast(variables["generator"]), cast(variables["discriminator"]))


def check_batches(real_NCHW: np.ndarray, noise_NCHW: np.ndarray, config: TrainConfig) -> None:
    if real_NCHW.ndim != 5:
        raise ReplayInputError(f"'real' must be (steps, batch, nc, H, W), got shape {real_NCHW.shape}")
    if noise_NCHW.ndim != 5 or noise_NCHW.shape[3:] != (1, 1):
        raise ReplayInputError(f"'noise' must be (steps, batch, nz, 1, 1), got shape {noise_NCHW.shape}")
    steps, batch = real_NCHW.shape[:2]
    expected_real = (config.nc, config.image_size, config.image_size)
    if real_NCHW.shape[2:] != expected_real:
        raise ReplayInputError(f"'real' images are {real_NCHW.shape[2:]}, the models expect {expected_real}")
    if noise_NCHW.shape[:3] != (steps, batch, config.nz):
        raise ReplayInputError(f"'noise' has shape {noise_NCHW.shape}, expected {(steps, batch, config.nz, 1, 1)}")
    if steps == 0 or batch == 0:
        raise ReplayInputError("no steps to replay (empty batches)")
    if not (np.all(np.isfinite(real_NCHW)) and np.all(np.isfinite(noise_NCHW))):
        raise ReplayInputError("'real' or 'noise' contains NaN or infinite values")


def replay(
    generator_sd: dict[str, np.ndarray],
    discriminator_sd: dict[str, np.ndarray],
    real_NCHW: np.ndarray,
    noise_NCHW: np.ndarray,
    dtype: str = "float32",
    settings: TrainConfig = TUTORIAL,
    mix: np.ndarray | None = None,
) -> ReplayResult:
    """Run the tutorial's iterations in JAX on PyTorch's data and noise (NCHW, as PyTorch holds them).

    Args:
      generator_sd, discriminator_sd: the tutorial models' ``state_dict()`` as NumPy arrays.
      real_NCHW: (steps, batch, nc, H, W) real images in [−1, 1], one batch per iteration.
      noise_NCHW: (steps, batch, nz, 1, 1), the ``torch.randn`` noise of each iteration.
      dtype: "float32" or "float64" (float64 turns on ``jax_enable_x64`` for the replay only).
      settings: a config holding Adam's settings (lr, beta1, beta2) of the run being replayed, and
        its loss (``loss``, ``n_critic``, ``gp_weight``); the widths are read off the state_dicts.
      mix: (steps, batch) WGAN-GP's interpolation weights ``alpha`` of each iteration (that loss only).

    Returns:
      Per-step metrics and the final state_dicts (float arrays in ``dtype``, counters int64).
    """
    if dtype not in ("float32", "float64"):
        raise ReplayInputError(f"dtype must be float32 or float64, got {dtype!r}")
    real_NCHW, noise_NCHW = np.asarray(real_NCHW), np.asarray(noise_NCHW)
    config = config_from_state_dicts(generator_sd, discriminator_sd, real_NCHW.shape[1] if real_NCHW.ndim == 5 else 1, settings)
    check_batches(real_NCHW, noise_NCHW, config)
    needs_mix = LOSSES[config.loss].mix
    if needs_mix != (mix is not None):
        raise ReplayInputError("'mix' (the interpolation weights, (steps, batch)) is needed by the "
                               f"{' and '.join(s.name for s in LOSSES.values() if s.mix)} loss and only by it; "
                               f"the loss is {config.loss!r}")
    if mix is not None and np.shape(mix) != real_NCHW.shape[:2]:
        raise ReplayInputError(f"'mix' has shape {np.shape(mix)}, expected (steps, batch) = {real_NCHW.shape[:2]}")
    with jax.enable_x64(dtype == "float64"):
        jdtype = jnp.float64 if dtype == "float64" else jnp.float32
        state = state_from_state_dicts(config, generator_sd, discriminator_sd, jdtype)
        if config.api == "nnx":  # the Flax NNX port of the same step
            from functional_gan import nnx_dcgan

            step = nnx_dcgan.make_gan_step(config)
        else:
            step = make_gan_step(config)
        metrics = []
        for t in range(real_NCHW.shape[0]):
            real = jnp.asarray(real_NCHW[t].transpose(0, 2, 3, 1), jdtype)
            noise = jnp.asarray(noise_NCHW[t, :, :, 0, 0], jdtype)
            state, m = step(state, real, noise, None if mix is None else jnp.asarray(mix[t], jdtype))
            metrics.append(m)
        metrics = jax.device_get(metrics)
        result = ReplayResult(
            metrics={k: np.array([float(getattr(m, k)) for m in metrics]) for k in METRIC_NAMES},
            generator_state_dict=state_dicts.variables_to_state_dict(state.generator_params, state.generator_batch_stats),
            discriminator_state_dict=state_dicts.variables_to_state_dict(state.discriminator_params, state.discriminator_batch_stats),
            config=config,
        )
    return result


def replay_files(
    generator: str | os.PathLike,
    discriminator: str | os.PathLike,
    batches: str | os.PathLike,
    out: str | os.PathLike,
    dtype: str = "float32",
    settings: TrainConfig = TUTORIAL,
    out_generator: str | os.PathLike | None = None,
    out_discriminator: str | os.PathLike | None = None,
) -> ReplayResult:
    """:func:`replay` on files: state_dicts (``.pt``/``.pth`` read weights-only, or ``.safetensors``) and an
    ``.npz`` of batches (``real``, ``noise``, and ``mix`` when ``settings.loss``'s entry draws interpolation weights); writes the
    per-step metrics (``.npz``) and, if asked, the final state_dicts.

    Everything is read and checked before anything is written.
    """
    generator_sd = state_dicts.load_state_dict_file(generator)
    discriminator_sd = state_dicts.load_state_dict_file(discriminator)
    real, noise = load_batches(batches)
    mix = load_batches(batches, "mix")[0] if LOSSES[settings.loss].mix else None
    result = replay(generator_sd, discriminator_sd, real, noise, dtype, settings, mix)
    save_metrics(result, out)
    if out_generator:
        state_dicts.save_state_dict_file(result.generator_state_dict, out_generator)
    if out_discriminator:
        state_dicts.save_state_dict_file(result.discriminator_state_dict, out_discriminator)
    return result


def load_batches(path: str | os.PathLike, *names: str) -> tuple[np.ndarray, ...]:
    """The arrays ``names`` (default: ``real`` and ``noise``) from an .npz file (no pickles: ``allow_pickle=False``)."""
    names = names or ("real", "noise")
    path = Path(path)
    if not path.is_file():
        raise ReplayInputError(f"batches file {str(path)!r} does not exist")
    try:
        with np.load(path, allow_pickle=False) as data:
            missing = set(names) - set(data.files)
            if missing:
                raise ReplayInputError(f"{str(path)!r} lacks {', '.join(sorted(missing))} (it has {', '.join(data.files)})")
            return tuple(np.asarray(data[name]) for name in names)
    except ReplayInputError:
        raise
    except Exception as error:  # zipfile.BadZipFile, ValueError (object arrays) ...
        raise ReplayInputError(f"cannot read {str(path)!r} as an .npz of arrays: {type(error).__name__}: {error}") from error


def save_metrics(result: ReplayResult, path: str | os.PathLike) -> None:
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    np.savez(path, **result.metrics)
