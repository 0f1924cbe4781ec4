"""One run over several processes (hosts): ``jax.distributed`` and the host-side helpers it needs.

JAX is multi-controller: every process runs the same program on its own devices, and a
``Mesh`` over ``jax.devices()`` (all processes' devices) makes one jitted step span them. Each
process feeds its slice of the global batch; replicated values (parameters, metrics, samples)
are read from a process's own copy.
"""

from __future__ import annotations

import os
import re

import jax
import numpy as np

from functional_gan.errors import UserError


class DistributedError(UserError):
    """Multi-process settings that cannot work, or a coordinator that cannot be reached."""


def settings_from_environment() -> tuple[str | None, int | None, int | None]:
    """(coordinator, number of processes, process id) from JAX_COORDINATOR_ADDRESS, JAX_NUM_PROCESSES, JAX_PROCESS_ID."""

    def integer(name):
        value = os.environ.get(name)
        if value is None or value == "":
            return None
        try:
            return int(value)
        except ValueError:
            raise DistributedError(f"{name}={value!r} is not an integer") from None

    return os.environ.get("JAX_COORDINATOR_ADDRESS") or None, integer("JAX_NUM_PROCESSES"), integer("JAX_PROCESS_ID")


def initialize(coordinator: str | None, num_processes: int | None, process_id: int | None) -> bool:
    """Join a multi-process run (``jax.distributed.initialize``); False (and nothing done) when no setting is given.

    Must run before anything touches a device. On CPU, collectives go through gloo.
    PyTorch: ``torch.distributed.init_process_group(init_method="tcp://HOST:PORT", world_size, rank)``.
    """
    given = {"--coordinator": coordinator, "--num-processes": num_processes, "--process-id": process_id}
    if all(value is None for value in given.values()):
        return False
    missing = [flag for flag, value in given.items() if value is None]
    if missing:
        raise DistributedError(f"a multi-process run needs --coordinator, --num-processes and --process-id; missing {', '.join(missing)}")
    if not re.fullmatch(r"[^\s:]+:\d{1,5}", coordinator):
        raise DistributedError(f"--coordinator must be HOST:PORT, got {coordinator!r}")
    if num_processes < 1:
        raise DistributedError(f"--num-processes must be positive, got {num_processes}")
    if not 0 <= process_id < num_processes:
        raise DistributedError(f"--process-id must lie in [0, {num_processes}), got {process_id}")
    jax.config.update("jax_cpu_collectives_implementation", "gloo")  # CPU devices of several processes
    try:
        jax.distributed.initialize(coordinator_address=coordinator, num_processes=num_processes, process_id=process_id)
    except Exception as error:  # the coordination service raises RuntimeError/XlaRuntimeError with its own text
        raise DistributedError(
            f"could not join the run through {coordinator} as process {process_id} of {num_processes}: "
            f"{type(error).__name__}: {str(error)[:300]}"
        ) from error
    return True


def is_primary() -> bool:
    """The process that prints and writes the run's files (logs, pictures, manifests)."""
    return jax.process_index() == 0


def barrier(name: str) -> None:
    """Wait until every process reaches the same point (nothing to wait for in a one-process run)."""
    if jax.process_count() > 1:
        from jax.experimental import multihost_utils

        multihost_utils.sync_global_devices(name)


def to_host(x) -> np.ndarray:
    """The value of a replicated (or single-device) array as NumPy, from this process's own copy.

    ``jax.device_get`` refuses arrays that span other processes' devices; a replicated one has
    its whole value in each of this process's shards.
    """
    if isinstance(x, jax.Array) and not x.is_fully_addressable:
        return np.asarray(x.addressable_data(0))
    return np.asarray(jax.device_get(x))


def process_rows(sharding, global_shape: tuple[int, ...]) -> slice:
    """The rows of a global batch that this process's devices hold under ``sharding`` (a contiguous slice).

    Each process feeds only these rows; ``jax.make_array_from_process_local_data`` assembles the
    global batch from the processes' slices.
    """
    rows = [index[0] for index in sharding.addressable_devices_indices_map(global_shape).values()]
    start = min(r.start or 0 for r in rows)
    stop = max(global_shape[0] if r.stop is None else r.stop for r in rows)
    return slice(start, stop)
