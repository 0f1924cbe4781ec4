"""The training loop around the pure step: data, progress, logs, pictures, checkpoints, resume.

All I/O lives here; :mod:`functional_gan.train` stays pure. :func:`train` runs in named phases:
``_prepare`` (every check before anything is written), ``_start`` (resume or fresh weights, the
settings written), ``_compile`` (the step, ahead of time, timed), ``_iterate`` (the loop: steps,
records, grids, checkpoints) and ``_finish`` (logs and figures). The run folder's file names live in
:mod:`functional_gan.run_folder`.
"""

from __future__ import annotations

import contextlib
import dataclasses
import fcntl
import json
import math
import os
import threading
import time
from pathlib import Path
from typing import Callable

import jax
import numpy as np
from jax.sharding import SingleDeviceSharding
from tqdm.auto import tqdm

from functional_gan import checkpoints, plots, state_dicts
from functional_gan.config import TUTORIAL, ConfigError, TrainConfig
from functional_gan.data import DataError, Dataset, load_dataset
from functional_gan.distributed import (
    barrier,
    batch_sharding,
    data_parallel_mesh,
    is_primary,
    primary_decides,
    replicated,
    to_host,
)
from functional_gan.launch import report
from functional_gan.pipeline import Batches, default_workers, known_problems, record_problems
from functional_gan.errors import UserError
from functional_gan.losses import LossSpec, loss_entry
from functional_gan.metrics import METRIC_NAMES, StepMetrics, stats_line
from functional_gan.models import count_params
from functional_gan.progress import progress_bar
from functional_gan.replay import state_from_state_dicts
from functional_gan.run_folder import RunFolder
from functional_gan.train import (
    GANState,
    fixed_noise,
    init_state,
    make_sampler,
    make_train_step,
)


class NonFiniteLossError(UserError):
    """A loss or metric became NaN or infinite; training stopped and nothing after it was saved."""

    def __init__(self, step: int, metrics: dict, last_checkpoint: int | None, directory: Path):
        self.step, self.metrics, self.last_checkpoint = step, metrics, last_checkpoint
        kept = (
            f"the last good checkpoint (iteration {last_checkpoint}) in {directory} is kept"
            if last_checkpoint is not None
            else "no checkpoint had been saved yet"
        )
        values = ", ".join(f"{k}={v:.4g}" for k, v in metrics.items())
        super().__init__(f"non-finite loss at iteration {step} ({values}); training stopped; {kept}")


@dataclasses.dataclass
class RunResult:
    state: GANState
    first_step: int  # the step this invocation started from (0, or the resumed checkpoint's)
    last_step: int
    out_dir: Path
    compile_seconds: float | None


def describe_backend() -> str:
    devices = jax.devices()
    return f"JAX {jax.__version__} backend: {jax.default_backend()}; devices: {', '.join(str(d) for d in devices)}"


def _read_metrics(path: Path) -> list[dict]:
    if not path.exists():
        return []
    with path.open() as f:
        return [json.loads(line) for line in f if line.strip()]


class RunLockedError(UserError):
    """Another ``train`` process is writing to the same run folder."""


_stop = threading.Event()  # set by request_stop (a signal handler); the loop stops at the next iteration


def request_stop() -> None:
    """Ask a running ``train`` to stop at the next iteration (it raises KeyboardInterrupt there: workers
    closed, checkpoints kept). Safe in a signal handler, unlike raising there: an exception raised
    while the interpreter runs a ``__del__`` is printed and ignored, and training would go on."""
    _stop.set()


def stop_requested() -> bool:
    return _stop.is_set()



@contextlib.contextmanager
def run_lock(out: Path):
    """Hold an exclusive lock on the run folder for as long as training writes to it.

    ``fcntl.flock`` on ``out/.train.lock``: the kernel releases it when the process ends, however
    it ends (a SIGKILL leaves no stale lock behind). In a multi-process run the first process
    takes it and every process learns whether it could.
    """
    with contextlib.ExitStack() as stack:

        def acquire() -> None:
            handle = stack.enter_context(RunFolder(out).lock.open("a+"))
            try:
                fcntl.flock(handle, fcntl.LOCK_EX | fcntl.LOCK_NB)
            except BlockingIOError:
                handle.seek(0)
                holder = handle.read().strip() or "unknown"
                raise RunLockedError(
                    f"another `functional-gan train` (pid {holder}) is writing to {out}; wait for it to finish "
                    "or use another --out"
                ) from None
            stack.callback(fcntl.flock, handle, fcntl.LOCK_UN)
            handle.seek(0)
            handle.truncate()
            handle.write(f"{os.getpid()}\n")
            handle.flush()

        primary_decides("run lock", acquire, RunLockedError)
        yield


def train(
    config: TrainConfig,
    out_dir: str | Path,
    dataset: Dataset | None = None,
    progress: bool = True,
    print_fn: Callable[[str], None] = print,
    init_generator: str | Path | None = None,
    init_discriminator: str | Path | None = None,
    workers: int | None = None,
) -> RunResult:
    """Train (or resume) a DCGAN run in ``out_dir``.

    The folder receives ``config.json``, ``metrics.jsonl`` (one line per iteration),
    ``training_images.png``, ``samples/iter_NNNNNN.png`` (fixed-noise grids), ``progress.gif``,
    ``loss.png``, ``real_vs_fake.png`` and orbax checkpoints in ``checkpoints/``. A later call on the
    same folder resumes from the newest good checkpoint and reproduces the uninterrupted run exactly;
    newer damaged checkpoints are moved to ``checkpoints-damaged/``. One ``train`` at a time may
    write to a folder. In a multi-process run every process calls this; the first one writes the files.

    ``init_generator`` / ``init_discriminator``: PyTorch ``state_dict`` files (``.pt``/``.pth`` read
    weights-only, or ``.safetensors``) a new run starts from, e.g. the tutorial's ``netG.pth``, with
    fresh Adam states (PyTorch's optimizer state is not read). Ignored when the run resumes.

    ``workers``: Grain worker processes that read and decode the data ahead of the step (default:
    :func:`functional_gan.pipeline.default_workers`; 0 reads in this process). Unreadable image
    files met on the way are printed once and listed in ``unreadable_files.txt``.

    Raises:
      ConfigError, DataError: before any work is done.
      RunLockedError: another process is training in ``out_dir``.
      CheckpointError: checkpoints exist and none is good; CheckpointWriteError: a write failed.
      NonFiniteLossError: a loss became NaN/inf; the last good checkpoint is kept.
    """
    run = _prepare(config, Path(out_dir), dataset, progress, print_fn, workers)
    initial, initial_note = _initial_weights(config, init_generator, init_discriminator)
    run.folder.root.mkdir(parents=True, exist_ok=True)
    with run_lock(run.folder.root):
        _announce(run)
        manager = checkpoints.checkpoint_manager(run.folder.checkpoints)
        state, first_step, last_checkpoint = _start(run, manager, initial, initial_note)
        problems_path = run.folder.unreadable(jax.process_index(), jax.process_count())
        # Started before the compilation, so that the workers read the first batches while XLA compiles.
        batches = Batches(run.dataset, config.seed, config.batch_size, first_step, run.total_steps, run.mesh,
                          run.workers, known_problems(problems_path))
        if batches.workers:
            run.print_fn(f"Input: {batches.workers} Grain worker process(es) read the batches ahead (--workers)")
        try:
            train_step, compile_seconds = _compile(run, state, first_step)
            state = _iterate(run, state, train_step, batches, problems_path, manager, first_step, last_checkpoint)
        finally:
            batches.close()
            manager.wait_until_finished()
        _finish(run, state, batches, problems_path, first_step)
    return RunResult(state, first_step, int(to_host(state.step)), run.folder.root, compile_seconds)


@dataclasses.dataclass
class _Run:
    """What the phases of a run share: its settings, its folder, its data and schedule, and how it reports."""

    config: TrainConfig
    folder: RunFolder
    dataset: Dataset
    mesh: object  # a jax.sharding.Mesh, or None on one device
    state_sharding: object
    loss: LossSpec
    workers: int
    progress: bool
    print_fn: Callable[[str], None]
    primary: bool
    per_epoch: int
    total_steps: int
    sampler: Callable  # the fixed-noise grids' program, made once (it compiles on its first call)
    noise: jax.Array  # the fixed noise, on the state's devices

    @property
    def num_epochs(self) -> int:
        return math.ceil(self.total_steps / self.per_epoch)

    @property
    def grid_every(self) -> int:
        return self.config.grid_interval(self.total_steps)


def _prepare(config: TrainConfig, out: Path, dataset: Dataset | None, progress: bool, print_fn, workers: int | None) -> _Run:
    """Check everything that can be checked before anything is written; the run's settings and schedule."""
    config.validate()
    loss = loss_entry(config.loss)  # its entry: the stats line's labels and derived metrics, the critic or not
    _stop.clear()
    if out.exists() and not out.is_dir():
        raise ConfigError(f"--out {str(out)!r} exists and is not a folder")
    if workers is not None and workers < 0:
        raise ConfigError(f"--workers must be 0 or more, got {workers}")
    if dataset is None:
        dataset = load_dataset(config.data, config.image_size, config.nc)
    if tuple(dataset.image_shape) != (config.image_size, config.image_size, config.nc):
        raise DataError(f"dataset images have shape {tuple(dataset.image_shape)}, the model expects "
                        f"{(config.image_size, config.image_size, config.nc)}")
    per_epoch = dataset.steps_per_epoch(config.batch_size)
    if per_epoch == 0:
        raise DataError(f"the dataset has {len(dataset)} images, fewer than one batch of {config.batch_size}; "
                        "lower --batch-size or add images")
    mesh = data_parallel_mesh(config)
    primary = is_primary()
    state_sharding = replicated(mesh) if mesh is not None else SingleDeviceSharding(jax.local_devices()[0])
    return _Run(config, RunFolder(out), dataset, mesh, state_sharding, loss,
                default_workers() if workers is None else workers, progress and primary,
                print_fn if primary else _quiet, primary, per_epoch,
                config.steps if config.steps is not None else config.epochs * per_epoch,
                make_sampler(config), jax.device_put(fixed_noise(config), state_sharding))


def _initial_weights(config: TrainConfig, init_generator, init_discriminator) -> tuple[GANState | None, str]:
    """A new run's starting state from PyTorch state_dict files (read and checked before anything is written)."""
    if init_generator is None and init_discriminator is None:
        return None, ""
    initial = state_from_state_dicts(
        config,
        None if init_generator is None else state_dicts.load_state_dict_file(init_generator),
        None if init_discriminator is None else state_dicts.load_state_dict_file(init_discriminator),
    )
    sources = [f"{name} from {path}" for name, path in (("generator", init_generator), ("discriminator", init_discriminator)) if path]
    return initial, f"Initial weights: {', '.join(sources)} (PyTorch state_dicts); Adam states start fresh"


def _quiet(_message: str) -> None:
    pass


def _announce(run: _Run) -> None:
    run.print_fn(f"Random Seed: {run.config.seed}")
    run.print_fn(describe_backend())
    if run.config.api == "nnx":
        run.print_fn("Training step: the Flax NNX port (functional_gan.nnx_dcgan), split/merge around jax.jit")
    if run.mesh is not None:
        processes = f" in {jax.process_count()} processes" if jax.process_count() > 1 else ""
        run.print_fn(f"Data parallel over {run.mesh.devices.size} devices{processes}: batch split along its first axis, "
                     "state replicated")


def _start(run: _Run, manager, initial: GANState | None, initial_note: str) -> tuple[GANState, int, int | None]:
    """The state the run starts from (its newest good checkpoint, the given weights, or fresh ones), the settings
    written, the folder made consistent with it; the state, its iteration and the last checkpoint's iteration."""
    config, print_fn = run.config, run.print_fn
    restored = _resume(config, run.folder, manager, run.state_sharding, print_fn)
    if restored is not None:
        state = restored.state
        if initial is not None:
            print_fn("The run resumes from its checkpoint; --init-generator / --init-discriminator are not used")
    else:
        state = jax.device_put(initial if initial is not None else init_state(config), run.state_sharding)
        if initial is not None:
            print_fn(initial_note)
    first_step = int(to_host(state.step))
    if run.primary:
        run.folder.config.write_text(json.dumps(config.to_dict(), indent=2) + "\n")
        _forget_after(run.folder, first_step)
        if first_step == 0:
            plots.save_grid(run.dataset.batch(config.seed, 0, min(64, config.batch_size)), run.folder.training_images)
    print_fn(
        f"Generator: {count_params(state.generator_params):,} parameters; "
        f"{f'Critic ({run.loss.name})' if run.loss.critic else 'Discriminator'}: "
        f"{count_params(state.discriminator_params):,} parameters"
    )
    print_fn(f"Data: {run.dataset.name}, {len(run.dataset)} images, {run.per_epoch} iterations per epoch (batch "
             f"{config.batch_size}); {run.total_steps} iterations, a fixed-noise grid every {run.grid_every}")
    return state, first_step, restored.step if restored is not None else None


def _resume(config: TrainConfig, folder: RunFolder, manager, sharding, print_fn) -> checkpoints.Restored | None:
    """The newest good checkpoint (damaged newer ones reported and moved aside), checked against ``config``."""
    restored = checkpoints.restore_newest_good(manager, sharding)
    if restored is None:
        return None
    problems = config.incompatibilities(restored.config)
    if problems:
        raise ConfigError(
            f"{folder.root} holds a run with other settings; use another --out or the same settings:\n  " + "\n  ".join(problems)
        )
    if restored.damaged:
        for damaged in restored.damaged:
            print_fn(f"Warning: {damaged}; skipped")
        barrier("functional_gan damaged checkpoints found")  # every process has read them before they move
        moved = primary_decides("move damaged checkpoints",
                                lambda: [str(p) for p in checkpoints.move_aside(manager, restored.damaged)])
        print_fn(f"Moved the damaged checkpoint(s) to {', '.join(moved)} (nothing deleted)")
        manager.reload()
    print_fn(f"Resuming from the checkpoint at iteration {restored.step} in {folder.checkpoints}")
    return restored


def _forget_after(folder: RunFolder, step: int) -> None:
    """On resume, drop logged iterations and grids beyond the checkpoint: they are recomputed identically."""
    metrics_path = folder.metrics
    records = [r for r in _read_metrics(metrics_path) if r["step"] <= step]
    temporary = metrics_path.with_suffix(".jsonl.tmp")
    with temporary.open("w") as f:
        for record in records:
            f.write(json.dumps(record) + "\n")
    os.replace(temporary, metrics_path)
    for grid in folder.grids():
        if RunFolder.grid_step(grid) > step:
            grid.unlink()



def _compile(run: _Run, state: GANState, first_step: int):
    """The training step, compiled ahead of the loop (timed); (step, seconds), or (the jitted step, None) when
    nothing is left to train."""
    if run.config.api == "nnx":
        from functional_gan import nnx_dcgan

        train_step = nnx_dcgan.make_train_step(run.config, run.mesh)
    else:
        train_step = make_train_step(run.config, run.mesh)
    if first_step >= run.total_steps:
        return train_step, None
    run.print_fn("Starting Training Loop...")
    start = time.perf_counter()
    config = run.config
    abstract_batch = jax.ShapeDtypeStruct((config.batch_size, config.image_size, config.image_size, config.nc),
                                          np.float32, sharding=batch_sharding(run.mesh) if run.mesh is not None else None)
    compiled = train_step.lower(state, abstract_batch).compile()
    seconds = time.perf_counter() - start
    run.print_fn(f"Compiled the training step in {seconds:.1f} s")
    return compiled, seconds


class _Log:
    """The per-iteration records: fetched one iteration late (so the host never waits for the step it just
    launched), checked finite, written to metrics.jsonl (line-buffered: on disk as soon as fetched), and the
    tutorial's stats line every ``log_every`` iterations."""

    def __init__(self, run: _Run, file, last_checkpoint: int | None):
        self.run, self.file, self.last_checkpoint = run, file, last_checkpoint
        self.pending = None  # (step_done, metrics) not yet fetched

    def push(self, step_done: int, metrics: StepMetrics) -> None:
        self.flush()
        self.pending = (step_done, metrics)

    def flush(self) -> dict | None:
        """Fetch and record the pending iteration; its values (None when none was pending)."""
        if self.pending is None:
            return None
        (step_done, metrics), self.pending = self.pending, None
        run = self.run
        values = {name: float(to_host(v)) for name, v in zip(METRIC_NAMES, metrics)}
        if not all(math.isfinite(v) for v in values.values()):
            raise NonFiniteLossError(step_done, values, self.last_checkpoint, run.folder.checkpoints)
        epoch, index = divmod(step_done - 1, run.per_epoch)
        if self.file is not None:
            self.file.write(json.dumps({"step": step_done, "epoch": epoch, **values}) + "\n")
        if run.primary and (step_done % run.config.log_every == 0 or step_done == run.total_steps):
            tqdm.write(stats_line(epoch, run.num_epochs, index, run.per_epoch, values, run.loss.labels, run.loss.derived))
        return values


def _iterate(run: _Run, state: GANState, train_step, batches: Batches, problems_path: Path, manager,
             first_step: int, last_checkpoint: int | None) -> GANState:
    """The training loop from ``first_step``: a step per iteration, the fixed-noise grids and the checkpoints."""
    config, folder = run.config, run.folder
    with (folder.metrics.open("a", buffering=1) if run.primary else contextlib.nullcontext()) as file, progress_bar(
        run.total_steps, "training", "it", initial=min(first_step, run.total_steps), disable=not run.progress
    ) as bar:
        log = _Log(run, file, last_checkpoint)
        for step in range(first_step, run.total_steps):
            if _stop.is_set():
                raise KeyboardInterrupt
            state, metrics = train_step(state, next(batches))
            step_done = step + 1
            _note_problems(run, batches, problems_path)
            log.push(step_done, metrics)
            bar.update(1)
            report(iteration=step_done)
            at_sample = step_done % run.grid_every == 0 or step_done == run.total_steps
            at_checkpoint = step_done % config.checkpoint_every == 0 or step_done == run.total_steps
            if not (at_sample or at_checkpoint):
                continue
            values = log.flush()  # checked finite before anything is saved
            bar.set_postfix(loss_d=f"{values['loss_d']:.3f}", loss_g=f"{values['loss_g']:.3f}")
            if at_sample:
                grid = run.sampler(state, run.noise)  # every process runs the program; only the first fetches it
                if run.primary:
                    plots.save_grid(to_host(grid), folder.grid(step_done))
            if at_checkpoint:
                if file is not None:
                    file.flush()
                log.last_checkpoint = checkpoints.save(manager, state, config)
        log.flush()
    return state


def _note_problems(run: _Run, batches: Batches, problems_path: Path) -> None:
    problems = batches.take_problems()
    for problem in problems:
        run.print_fn(f"Skipped an unreadable image file (the next readable one takes its place): {problem}")
    record_problems(problems_path, problems)


def _finish(run: _Run, state: GANState, batches: Batches, problems_path: Path, first_step: int) -> None:
    """What a finished run leaves besides its checkpoints: the input logs, the skipped files, the figures."""
    if jax.process_count() > 1:  # what this process read: its rows of each global batch, nothing else
        log_path = run.folder.input_log(jax.process_index())
        log_path.parent.mkdir(exist_ok=True)
        log_path.write_text(json.dumps(
            {"process": jax.process_index(), "rows": batches.local_rows, "iterations": run.total_steps - first_step,
             "files_read": batches.files_read}) + "\n")
    skipped = known_problems(problems_path)
    if skipped:
        run.print_fn(f"{len(skipped)} unreadable image file(s) were skipped; listed in {problems_path}")
    final_samples = run.sampler(state, run.noise)
    if run.primary:
        _write_figures(run, to_host(final_samples))


def _check_sample_request(out: str | Path, num: int) -> Path:
    if num <= 0:
        raise ConfigError(f"--num must be positive, got {num}")
    out = Path(out)
    if out.suffix.lower() != ".png":
        raise ConfigError(f"--out must name a .png file, got {str(out)!r}")
    out.parent.mkdir(parents=True, exist_ok=True)  # an unusable folder fails now, before anything is computed
    return out


def _write_samples(config: TrainConfig, state: GANState, out: Path, num: int, seed: int | None, eval_bn: bool) -> None:
    noise = fixed_noise(config, num) if seed is None else jax.random.normal(jax.random.key(seed), (num, config.nz))
    plots.save_grid(np.asarray(make_sampler(config, use_running_average=eval_bn)(state, noise)), out)


def sample_from_checkpoint(
    checkpoint: str | Path, out: str | Path, num: int = 64, seed: int | None = None, eval_bn: bool = False
) -> checkpoints.Restored:
    """Write a grid of ``num`` samples of the newest good checkpoint in ``checkpoint`` to the PNG ``out``.

    Without ``seed`` the noise is the run's fixed noise (its first 64 rows are the training grids'
    noise); with one, ``normal(key(seed))``. ``eval_bn`` uses BatchNorm's running statistics
    (PyTorch's ``.eval()``) instead of the tutorial's train mode. Returns the checkpoint used, with
    the newer damaged checkpoints that were skipped (nothing is moved or deleted).
    """
    out = _check_sample_request(out, num)
    restored = checkpoints.load_newest_good(checkpoint)
    _write_samples(restored.config, restored.state, out, num, seed, eval_bn)
    return restored


def sample_from_state_dict(
    generator: str | Path, out: str | Path, num: int = 64, seed: int | None = None, eval_bn: bool = False
) -> TrainConfig:
    """Write a grid of ``num`` samples of a PyTorch generator ``state_dict`` file (e.g. the tutorial's ``netG.pth``).

    The widths (nz, ngf, nc, image size) are read off the weights' shapes; noise as in
    :func:`sample_from_checkpoint` (the default seed's fixed noise, or ``normal(key(seed))``).
    Returns the config the weights imply.
    """
    out = _check_sample_request(out, num)
    state_dict = state_dicts.load_state_dict_file(generator)
    config = dataclasses.replace(TUTORIAL, **state_dicts.infer_generator_shape(state_dict)).validate()
    _write_samples(config, state_from_state_dicts(config, state_dict, None), out, num, seed, eval_bn)
    return config


def export_checkpoint(
    checkpoint: str | Path, generator: str | Path | None = None, discriminator: str | Path | None = None
) -> checkpoints.Restored:
    """Write the newest good checkpoint's networks as PyTorch ``state_dict`` files (``.pt``/``.pth`` or ``.safetensors``).

    They load with ``load_state_dict(strict=True)`` into the tutorial's ``Generator`` and
    ``Discriminator`` (and pytorch/examples' dcgan, which has the same modules), running statistics
    and ``num_batches_tracked`` included. PyTorch: ``torch.save(netG.state_dict(), path)``.
    """
    if generator is None and discriminator is None:
        raise ConfigError("name at least one file to write: --generator and/or --discriminator")
    restored = checkpoints.load_newest_good(checkpoint)
    state = restored.state
    if generator is not None:
        state_dicts.save_state_dict_file(state_dicts.variables_to_state_dict(state.generator_params, state.generator_batch_stats), generator)
    if discriminator is not None:
        state_dicts.save_state_dict_file(
            state_dicts.variables_to_state_dict(state.discriminator_params, state.discriminator_batch_stats), discriminator
        )
    return restored


def _write_figures(run: _Run, samples_NHWC: np.ndarray) -> None:
    config, folder = run.config, run.folder
    records = _read_metrics(folder.metrics)
    if records:
        derived = {label: [fn(r) for r in records] for label, fn in run.loss.derived.items()}
        plots.save_loss_plot([r["loss_g"] for r in records], [r["loss_d"] for r in records], folder.loss_plot, derived)
    plots.save_progress_gif(folder.grids(), folder.progress_gif)
    real = run.dataset.batch(config.seed, 0, min(64, config.batch_size))
    plots.save_real_vs_fake(real, samples_NHWC, folder.real_vs_fake)
