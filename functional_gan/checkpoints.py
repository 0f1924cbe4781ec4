"""Orbax checkpoints of a run: the whole :class:`~functional_gan.train.GANState` plus its config."""

from __future__ import annotations

import os
from pathlib import Path

import jax
import orbax.checkpoint as ocp

from functional_gan.config import TrainConfig
from functional_gan.errors import UserError
from functional_gan.train import GANState, init_state


class CheckpointError(UserError):
    """A checkpoint folder that is missing, empty or unreadable."""


def checkpoint_manager(directory: str | os.PathLike, max_to_keep: int = 3) -> ocp.CheckpointManager:
    options = ocp.CheckpointManagerOptions(max_to_keep=max_to_keep, create=True)
    return ocp.CheckpointManager(Path(directory).absolute(), options=options)


def save(manager: ocp.CheckpointManager, state: GANState, config: TrainConfig) -> int:
    """Save ``state`` under its step number (asynchronously; call ``manager.wait_until_finished()``)."""
    step = int(jax.device_get(state.step))
    manager.save(
        step,
        args=ocp.args.Composite(state=ocp.args.StandardSave(state), config=ocp.args.JsonSave(config.to_dict())),
    )
    return step


def saved_config(manager: ocp.CheckpointManager, step: int) -> TrainConfig:
    restored = manager.restore(step, args=ocp.args.Composite(config=ocp.args.JsonRestore()))
    return TrainConfig.from_dict(restored["config"])


def restore(manager: ocp.CheckpointManager, config: TrainConfig, step: int | None = None) -> GANState:
    """The state saved at ``step`` (the latest by default), restored into the structure ``config`` implies."""
    step = manager.latest_step() if step is None else step
    if step is None:
        raise CheckpointError(f"no checkpoint in {manager.directory}")
    abstract_state = jax.eval_shape(lambda: init_state(config))
    try:
        restored = manager.restore(step, args=ocp.args.Composite(state=ocp.args.StandardRestore(abstract_state)))
    except Exception as error:  # orbax raises many types (ValueError, FileNotFoundError, tensorstore errors)
        raise CheckpointError(
            f"checkpoint at step {step} in {manager.directory} cannot be read (corrupt or from another model): "
            f"{type(error).__name__}: {str(error)[:300]}"
        ) from error
    return restored["state"]


def load_latest(directory: str | os.PathLike) -> tuple[TrainConfig, GANState, int]:
    """(config, state, step) of the newest checkpoint in a checkpoint folder or a run folder."""
    directory = Path(directory)
    if not directory.exists():
        raise CheckpointError(f"checkpoint folder {str(directory)!r} does not exist")
    if (directory / "checkpoints").is_dir():
        directory = directory / "checkpoints"
    manager = checkpoint_manager(directory)
    step = manager.latest_step()
    if step is None:
        raise CheckpointError(f"no checkpoint found in {str(directory)!r}")
    try:
        config = saved_config(manager, step)
    except Exception as error:
        raise CheckpointError(f"checkpoint at step {step} in {str(directory)!r} has no readable config: {error}") from error
    return config, restore(manager, config, step), step
