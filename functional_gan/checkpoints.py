"""Orbax checkpoints of a run, each sealed with a manifest of SHA-256 checksums.

A checkpoint is the whole :class:`~functional_gan.train.GANState` plus the run's config, written
by orbax (atomically: into a temporary folder, renamed when complete). Once orbax has finished,
``manifest.sha256.json`` is written into the step's folder (also atomically: a temporary file,
then ``os.replace``) with the size and SHA-256 of every file, and read back. Only a checkpoint
whose manifest verifies counts as good:

* restoring verifies it first; a checkpoint that fails (a truncated, changed or missing file,
  garbage metadata, no manifest because the write was interrupted) or that orbax cannot read is
  reported with its step and the file, and the newest good one is used instead;
* old checkpoints are deleted only after the new one is sealed and verified, and the newest
  ``keep`` good ones always stay;
* a failed write (disk full, ...) stops with :class:`CheckpointWriteError` and touches nothing
  already saved;
* in a multi-process run, :func:`save` is the one place that says what every process does at a
  checkpoint, so that all of them reach orbax's collectives in the same order.
"""

from __future__ import annotations

import dataclasses
import hashlib
import json
import os
import shutil
import time
from pathlib import Path

import jax
import orbax.checkpoint as ocp
from jax.sharding import SingleDeviceSharding

from functional_gan.config import TrainConfig
from functional_gan.distributed import primary_decides, to_host
from functional_gan.errors import UserError
from functional_gan.run_folder import CHECKPOINTS
from functional_gan.train import GANState, init_state

MANIFEST_NAME = "manifest.sha256.json"
KEEP = 3  # good checkpoints kept; older ones are deleted once a newer one is sealed
DAMAGED_FOLDER = "checkpoints-damaged"  # beside checkpoints/: where `train` moves damaged ones aside


class CheckpointError(UserError):
    """A checkpoint folder that is missing, empty, or holds no good checkpoint."""


class CheckpointWriteError(CheckpointError):
    """A checkpoint could not be written (no space left, permissions, ...); nothing saved before is touched."""


class DamagedCheckpoint(Exception):
    """One checkpoint failed verification or could not be read; ``reason`` names the file."""

    def __init__(self, step: int, reason: str):
        super().__init__(f"checkpoint at iteration {step}: {reason}")
        self.step, self.reason = step, reason


@dataclasses.dataclass
class Restored:
    """The newest good checkpoint of a folder, and the newer ones that were skipped as damaged."""

    config: TrainConfig
    state: GANState
    step: int
    damaged: list[DamagedCheckpoint]


def checkpoint_manager(directory: str | os.PathLike, read_only: bool = False) -> ocp.CheckpointManager:
    """An orbax manager over ``directory``; it never deletes on its own (see :func:`save`)."""
    options = ocp.CheckpointManagerOptions(
        max_to_keep=None, create=not read_only, read_only=read_only, cleanup_tmp_directories=not read_only
    )
    return ocp.CheckpointManager(Path(directory).absolute(), options=options)


def step_folder(manager: ocp.CheckpointManager, step: int) -> Path:
    return Path(manager.directory) / str(step)


def _sha256(path: Path) -> str:
    with path.open("rb") as f:
        return hashlib.file_digest(f, "sha256").hexdigest()


def _files(folder: Path) -> list[Path]:
    return sorted(p for p in folder.rglob("*") if p.is_file() and not p.name.startswith(MANIFEST_NAME))


def write_manifest(folder: Path, step: int) -> Path:
    """Seal a finished checkpoint: the size and SHA-256 of each of its files, written atomically."""
    manifest = {
        "step": step,
        "files": {str(p.relative_to(folder)): {"bytes": p.stat().st_size, "sha256": _sha256(p)} for p in _files(folder)},
    }
    path = folder / MANIFEST_NAME
    temporary = folder / (MANIFEST_NAME + ".tmp")
    with temporary.open("w") as f:
        json.dump(manifest, f, indent=1)
        f.flush()
        os.fsync(f.fileno())
    os.replace(temporary, path)
    return path


def verify(folder: Path, step: int) -> None:
    """Raise :class:`DamagedCheckpoint` naming the first file that does not match the manifest."""
    path = folder / MANIFEST_NAME
    if not path.is_file():
        raise DamagedCheckpoint(step, f"no {MANIFEST_NAME} (the write was interrupted before the checkpoint was sealed)")
    try:
        listed = json.loads(path.read_text())["files"]
        items = [(name, int(entry["bytes"]), str(entry["sha256"])) for name, entry in listed.items()]
    except (ValueError, KeyError, TypeError, AttributeError) as error:
        raise DamagedCheckpoint(step, f"{MANIFEST_NAME} is unreadable ({type(error).__name__}: {error})") from error
    if not items:
        raise DamagedCheckpoint(step, f"{MANIFEST_NAME} lists no files")
    for name, size, digest in items:
        file = folder / name
        if not file.is_file():
            raise DamagedCheckpoint(step, f"file {name} is missing")
        actual = file.stat().st_size
        if actual != size:
            raise DamagedCheckpoint(step, f"file {name} has {actual} bytes, the manifest says {size} (truncated or overwritten)")
        if _sha256(file) != digest:
            raise DamagedCheckpoint(step, f"file {name} does not match its SHA-256 (its contents changed)")


def _is_disk_error(error: BaseException) -> OSError | None:
    """The OSError behind ``error`` (orbax wraps what its writer threads raise), if any."""
    seen = set()
    while error is not None and id(error) not in seen:
        if isinstance(error, OSError):
            return error
        seen.add(id(error))
        error = error.__cause__ or error.__context__
    return None


def save(manager: ocp.CheckpointManager, state: GANState, config: TrainConfig, keep: int = KEEP) -> int:
    """What every process does at a checkpoint: save ``state``, seal it, then drop checkpoints beyond ``keep``.

    Every process of a multi-process run calls this at the same iteration, and each step below is
    reached by all of them in the same order (orbax's save and delete are collectives):

    1. orbax writes the checkpoint (each process its own shards) and every process waits for it;
    2. the first process seals it (manifest, read back) and picks the checkpoints to delete; every
       process learns the outcome, so a failure stops all of them with the same message;
    3. every process calls orbax's delete for each of those steps (the first one removes the folders).

    Raises:
      CheckpointWriteError: the write failed (e.g. no space left); earlier checkpoints are intact.
    """
    step = int(to_host(state.step))
    try:
        manager.save(
            step,
            args=ocp.args.Composite(state=ocp.args.StandardSave(state), config=ocp.args.JsonSave(config.to_dict())),
            force=True,
        )
        manager.wait_until_finished()
    except Exception as error:
        disk_error = _is_disk_error(error)
        if disk_error is None:
            raise
        raise _write_error(manager, step, disk_error) from error
    doomed = primary_decides(f"seal checkpoint {step}", lambda: _seal(manager, step, keep), CheckpointWriteError)
    for old in doomed:
        manager.delete(old)
    return step


def _write_error(manager: ocp.CheckpointManager, step: int, disk_error: OSError) -> CheckpointWriteError:
    good = [s for s in manager.all_steps() if s != step and (step_folder(manager, s) / MANIFEST_NAME).is_file()]
    kept = f"the checkpoint of iteration {max(good)} is kept" if good else "no earlier checkpoint exists"
    return CheckpointWriteError(
        f"could not write the checkpoint of iteration {step} to {manager.directory}: {disk_error}; "
        f"training stopped, {kept}, and metrics.jsonl is intact. Free space (or fix the folder) and run "
        "the same command again to resume"
    )


def _seal(manager: ocp.CheckpointManager, step: int, keep: int) -> list[int]:
    """Write and read back the manifest of ``step``; the older steps to delete now that it is sealed."""
    folder = step_folder(manager, step)
    try:
        write_manifest(folder, step)
        verify(folder, step)  # read back what was just written
    except DamagedCheckpoint as error:
        raise CheckpointWriteError(f"the checkpoint written to {folder} does not read back: {error.reason}") from error
    except OSError as error:
        raise _write_error(manager, step, error) from error
    return _beyond(manager, keep)


def _beyond(manager: ocp.CheckpointManager, keep: int) -> list[int]:
    """Checkpoints older than the ``keep`` newest sealed ones (never one of those)."""
    steps = sorted(manager.all_steps())
    sealed = [s for s in steps if (step_folder(manager, s) / MANIFEST_NAME).is_file()]
    if len(sealed) <= keep:
        return []
    oldest_kept = sealed[-keep]
    return [s for s in steps if s < oldest_kept]


def saved_config(manager: ocp.CheckpointManager, step: int) -> TrainConfig:
    restored = manager.restore(step, args=ocp.args.Composite(config=ocp.args.JsonRestore()))
    return TrainConfig.from_dict(restored["config"])


def restore(manager: ocp.CheckpointManager, config: TrainConfig, step: int, sharding=None) -> GANState:
    """The state saved at ``step``, restored into the structure ``config`` implies, onto ``sharding`` (default: one local device).

    Raises :class:`DamagedCheckpoint` if orbax cannot read it. Does not verify the manifest:
    :func:`restore_newest_good` does both.
    """
    # An explicit target sharding: the saved one may name devices this process does not have
    # (a run saved on 4 devices, resumed or sampled on 1).
    sharding = sharding or SingleDeviceSharding(jax.local_devices()[0])
    abstract_state = jax.tree_util.tree_map(
        lambda leaf: jax.ShapeDtypeStruct(leaf.shape, leaf.dtype, sharding=sharding),
        jax.eval_shape(lambda: init_state(config)),
    )
    try:
        restored = manager.restore(step, args=ocp.args.Composite(state=ocp.args.StandardRestore(abstract_state)))
    except Exception as error:  # orbax raises many types (ValueError, FileNotFoundError, tensorstore errors)
        raise DamagedCheckpoint(
            step, f"orbax cannot read it (corrupt, or from another model): {type(error).__name__}: {str(error)[:300]}"
        ) from error
    return restored["state"]


def restore_newest_good(manager: ocp.CheckpointManager, sharding=None) -> Restored | None:
    """The newest checkpoint that verifies and restores, with the newer damaged ones; None if the folder is empty.

    Raises:
      CheckpointError: there are checkpoints, and none is good (each one's problem is listed).
    """
    damaged = []
    for step in sorted(manager.all_steps(), reverse=True):
        try:
            verify(step_folder(manager, step), step)
            try:
                config = saved_config(manager, step)
            except Exception as error:
                raise DamagedCheckpoint(step, f"its config cannot be read: {type(error).__name__}: {error}") from error
            return Restored(config, restore(manager, config, step, sharding), step, damaged)
        except DamagedCheckpoint as error:
            damaged.append(error)
    if damaged:
        raise CheckpointError(
            f"no good checkpoint in {manager.directory}:\n  " + "\n  ".join(str(d) for d in damaged)
        )
    return None


def move_aside(manager: ocp.CheckpointManager, damaged: list[DamagedCheckpoint]) -> list[Path]:
    """Move damaged checkpoints out of the way (into ``checkpoints-damaged/`` beside the folder), never delete them.

    A resumed run will write those steps again; the damaged files stay for inspection.
    """
    root = Path(manager.directory)
    moved = []
    for item in damaged:
        source = step_folder(manager, item.step)
        if not source.exists():
            continue
        target = root.parent / DAMAGED_FOLDER / f"{item.step}-{time.strftime('%Y%m%d-%H%M%S')}"
        suffix = 0
        while target.exists():
            suffix += 1
            target = target.with_name(f"{target.name}-{suffix}")
        target.parent.mkdir(parents=True, exist_ok=True)
        shutil.move(str(source), str(target))
        moved.append(target)
    manager.reload()
    return moved


def load_newest_good(directory: str | os.PathLike) -> Restored:
    """The newest good checkpoint of a checkpoint folder or a run folder (read only: nothing is moved)."""
    directory = Path(directory)
    if not directory.exists():
        raise CheckpointError(f"checkpoint folder {str(directory)!r} does not exist")
    if (directory / CHECKPOINTS).is_dir():  # a run folder
        directory = directory / CHECKPOINTS
    restored = restore_newest_good(checkpoint_manager(directory, read_only=True))
    if restored is None:
        raise CheckpointError(f"no checkpoint found in {str(directory)!r}")
    return restored
