"""The input pipeline: for each iteration, the global batch, already sharded, read ahead by Grain worker processes.

``Batches(dataset, seed, batch_size, first_step, total_steps, mesh, workers, known_problems)`` is the
one object the training loop asks for data. Iteration ``t``'s batch is a pure function of (seed, t) (see
:class:`functional_gan.data.Dataset`), so the pipeline starts at any iteration: a resumed run
reads exactly what the uninterrupted run read, and nothing before ``first_step`` is touched.

With a mesh over several processes each process reads only its own rows of each global batch
(the rows its devices hold), and ``jax.make_array_from_process_local_data`` assembles the global
array. PyTorch: ``DataLoader(dataset, batch_size, shuffle=True, num_workers=N)`` with a
``DistributedSampler``.

Reading, decoding, resizing and cropping run in ``workers`` Grain worker processes
(``grain.IterDataset.mp_prefetch``), each reading whole batches ahead (at most
``READ_AHEAD`` per worker); ``workers=0`` reads in this process, one batch ahead, on a thread.
"""

from __future__ import annotations

import contextlib
import os
import threading
from pathlib import Path


from functional_gan.data import Dataset, ImageDataset, to_unit_range
from functional_gan.errors import UserError

READ_AHEAD = 2  # batches each worker keeps ready


def default_workers() -> int:
    """Worker processes when ``--workers`` is not given: half the CPU cores (the step needs the rest), 1 to 8."""
    return max(1, min(8, (os.cpu_count() or 2) // 2))


class InputPipelineError(UserError):
    """The input pipeline failed (a worker process died); what was saved is kept."""


class _ReadBatch:
    """Grain's map function: iteration → (uint8 images of this process's rows, problems met, files opened)."""

    def __init__(self, dataset: Dataset, seed: int, batch_size: int, rows: slice):
        self.dataset, self.seed, self.batch_size, self.rows = dataset, seed, batch_size, rows

    def __call__(self, step):
        indices = self.dataset.indices(self.seed, int(step), self.batch_size, self.rows)
        images, problems = self.dataset.read_batch(indices)
        return {"images": images, "problems": list(problems), "files": len(indices) + len(problems)}


def _leave_with_parent(_worker_index: int, _worker_count: int) -> None:
    """In each worker process: end when the training process is gone, however it ended (even by SIGKILL)."""
    parent = os.getppid()

    def watch():
        while os.getppid() == parent:
            threading.Event().wait(1.0)
        os._exit(0)

    threading.Thread(target=watch, name="functional-gan-parent-watch", daemon=True).start()


def _grain():
    import grain
    from absl import flags

    if not flags.FLAGS.is_parsed():  # Grain reads absl flags; this program has its own command line
        flags.FLAGS.mark_as_parsed()
    return grain


class Batches:
    """The global batch of every iteration from ``first_step`` to ``total_steps``, in order.

    ``next(batches)`` returns the batch of the next iteration as float32 in [−1, 1], NHWC, placed
    on the mesh's devices (or left as a host array without a mesh). ``problems`` lists the
    unreadable files not yet taken (:meth:`take_problems`); ``files_read`` counts the files this process opened.
    """

    def __init__(self, dataset: Dataset, seed: int, batch_size: int, first_step: int, total_steps: int,
                 mesh=None, workers: int = 0, known_problems: set[str] = frozenset()):
        self.dataset, self.batch_size, self.step = dataset, batch_size, first_step
        self.global_shape = (batch_size, *dataset.image_shape)
        self.sharding, self.rows = None, slice(None)
        if mesh is not None:
            import jax

            from functional_gan.distributed import batch_sharding, process_rows

            self._assemble = jax.make_array_from_process_local_data
            self.sharding = batch_sharding(mesh)
            self.rows = process_rows(self.sharding, self.global_shape)  # this process reads only these rows
        self.workers = 0 if isinstance(dataset, ImageDataset) else workers  # in memory: nothing to decode
        self.problems: list[str] = []
        self._seen: set[str] = set(known_problems)
        self.files_read = 0
        grain = _grain()
        source = grain.MapDataset.range(first_step, total_steps).map(_ReadBatch(dataset, seed, batch_size, self.rows))
        if self.workers == 0:
            stream = source.to_iter_dataset(grain.ReadOptions(num_threads=1, prefetch_buffer_size=READ_AHEAD))
        else:
            stream = source.to_iter_dataset(grain.ReadOptions(num_threads=1, prefetch_buffer_size=1)).mp_prefetch(
                grain.MultiprocessingOptions(num_workers=self.workers, per_worker_buffer_size=READ_AHEAD),
                worker_init_fn=_leave_with_parent,
            )
        self._iterator = iter(stream)

    @property
    def local_rows(self) -> tuple[int, int]:
        start, stop, _ = self.rows.indices(self.batch_size)
        return start, stop

    def __iter__(self):
        return self

    def __next__(self):
        try:
            record = next(self._iterator)
        except (StopIteration, UserError):
            raise
        except Exception as error:
            if "Worker process was terminated" in str(error) or "worker" in type(error).__name__.lower():
                raise InputPipelineError(
                    f"a data worker process died while reading the batch of iteration {self.step + 1} ({error}); "
                    "run the same command again to resume, or use --workers 0 to read in the training process"
                ) from error
            raise
        self.step += 1
        self.files_read += int(record["files"])
        for problem in record["problems"]:
            if problem not in self._seen:
                self._seen.add(problem)
                self.problems.append(problem)
        local = to_unit_range(record.pop("images"))  # a new array: the worker's shared memory is released here
        if self.sharding is None:
            return local
        return self._assemble(self.sharding, local, self.global_shape)

    def take_problems(self) -> list[str]:
        """The unreadable files met since the last call (each file once over the whole run)."""
        taken, self.problems = self.problems, []
        return taken

    def close(self) -> None:
        """Stop the worker processes (also done when the object is garbage collected)."""
        with contextlib.suppress(Exception):
            close = getattr(self._iterator, "close", None)
            if close is not None:
                close()

    def __enter__(self):
        return self

    def __exit__(self, *_exc):
        self.close()


def record_problems(path: Path, problems: list[str]) -> None:
    """Append newly met unreadable files to ``path`` (one per line)."""
    if problems:
        with path.open("a") as f:
            f.writelines(problem.replace("\n", " ") + "\n" for problem in problems)


def known_problems(path: Path) -> set[str]:
    """The unreadable files a run folder already lists (a resumed run names each file once, not again)."""
    return set(path.read_text().splitlines()) if path.exists() else set()
