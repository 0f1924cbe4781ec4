"""One run over several devices and processes (hosts): the data-parallel mesh and its shardings,
``jax.distributed`` and the host-side helpers a multi-process run needs.

JAX is multi-controller: every process runs the same program on its own devices, and a
``Mesh`` over ``jax.devices()`` (all processes' devices) makes one jitted step span them. Each
process feeds its slice of the global batch; replicated values (parameters, metrics, samples)
are read from a process's own copy.
"""

from __future__ import annotations

import dataclasses
import itertools
import json
import os
import re
from typing import Any, Callable

import jax
import numpy as np
from jax.sharding import Mesh, NamedSharding, PartitionSpec

from functional_gan.config import DEFAULT_JOIN_TIMEOUT, DEFAULT_PEER_TIMEOUT, ConfigError, TrainConfig
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




@dataclasses.dataclass(frozen=True)
class ProcessSettings:
    """Where a multi-process run meets and which process this is."""

    coordinator: str
    num_processes: int
    process_id: int


def process_settings(coordinator: str | None, num_processes: int | None, process_id: int | None) -> ProcessSettings | None:
    """The multi-process settings, checked (None when none is given: a one-process run).

    Raises DistributedError for an incomplete or impossible combination, before anything starts.
    """
    given = {"--coordinator": coordinator, "--num-processes": num_processes, "--process-id": process_id}
    if all(value is None for value in given.values()):
        return None
    missing = [flag for flag, value in given.items() if value is None]
    if missing:
        raise DistributedError(f"a multi-process run needs --coordinator, --num-processes and --process-id; missing {', '.join(missing)}")
    if not re.fullmatch(r"[^\s:]+:\d{1,5}", coordinator):
        raise DistributedError(f"--coordinator must be HOST:PORT, got {coordinator!r}")
    if num_processes < 1:
        raise DistributedError(f"--num-processes must be positive, got {num_processes}")
    if not 0 <= process_id < num_processes:
        raise DistributedError(f"--process-id must lie in [0, {num_processes}), got {process_id}")
    return ProcessSettings(coordinator, num_processes, process_id)


def initialize(settings: ProcessSettings, join_timeout: int = DEFAULT_JOIN_TIMEOUT,
               peer_timeout: int = DEFAULT_PEER_TIMEOUT) -> None:
    """Join a multi-process run (``jax.distributed.initialize``). Must run before anything touches a device.

    ``join_timeout``: how long to wait for the coordinator and for every process to join.
    ``peer_timeout``: a process that sends no heartbeat for this long counts as dead, and JAX's
    coordination service then stops every other process (see :mod:`functional_gan.launch`, which
    turns that into one clear line). On CPU, collectives go through gloo.
    PyTorch: ``torch.distributed.init_process_group(init_method="tcp://HOST:PORT", world_size, rank)``.
    """
    jax.config.update("jax_cpu_collectives_implementation", "gloo")  # CPU devices of several processes
    # JAX's preemption service catches SIGTERM and keeps running; a user's Ctrl-C or a scheduler's
    # SIGTERM must stop the process (a resume starts from the last sealed checkpoint).
    jax.config.update("jax_enable_preemption_service", False)
    try:
        jax.distributed.initialize(
            coordinator_address=settings.coordinator, num_processes=settings.num_processes,
            process_id=settings.process_id, initialization_timeout=join_timeout,
            heartbeat_timeout_seconds=peer_timeout, shutdown_timeout_seconds=peer_timeout,
        )
    except Exception as error:  # the coordination service raises RuntimeError/XlaRuntimeError with its own text
        raise DistributedError(
            f"could not join the run through {settings.coordinator} as process {settings.process_id} of "
            f"{settings.num_processes}: {type(error).__name__}: {str(error)[:300]}"
        ) from error


def _client():
    """The coordination service's client of this process (its key-value store is shared by every process)."""
    from jax._src.distributed import global_state

    if global_state.client is None:
        raise RuntimeError("jax.distributed is not initialized")
    return global_state.client


def check_same_settings(settings: ProcessSettings, values: dict, timeout: int = DEFAULT_JOIN_TIMEOUT) -> None:
    """Every process must have been started with the same settings; raise DistributedError on each if not.

    ``values``: what must agree (the training config, the run folder, ...). JAX accepts a process
    whose --num-processes differs from the coordinator's; this check does not.
    """
    mine = {"--num-processes": settings.num_processes, **values}
    client = _client()
    client.key_value_set(f"functional_gan/settings/{settings.process_id}", json.dumps(mine, sort_keys=True))
    problems = []
    if jax.process_count() != settings.num_processes:
        problems.append(f"this process (--process-id {settings.process_id}) was started with --num-processes "
                        f"{settings.num_processes}, the coordinator with {jax.process_count()}")
    for other in range(jax.process_count()):
        if other == settings.process_id:
            continue
        try:
            theirs = json.loads(client.blocking_key_value_get(f"functional_gan/settings/{other}", timeout * 1000))
        except Exception as error:
            raise DistributedError(f"process {other} did not report its settings within {timeout} s: {error}") from error
        for name in sorted(set(mine) | set(theirs)):
            if mine.get(name) != theirs.get(name):
                problems.append(f"{name}: process {settings.process_id} has {mine.get(name)!r}, "
                                f"process {other} has {theirs.get(name)!r}")
    if problems:
        raise DistributedError("the processes of this run were started with different settings; start every "
                               "process with the same command (only --process-id differs):\n  " + "\n  ".join(problems))


def await_lost_peer(error: Exception, peer_timeout: int) -> None:
    """A collective failed (gloo: "Connection reset by peer"): most likely another process died.

    Wait for JAX's coordination service to notice which one (it stops this process within the
    peer timeout, and the supervisor names the process); if it does not, raise a clear error.
    """
    import time

    time.sleep(2 * peer_timeout + 5)
    raise DistributedError(
        f"a collective operation with the other processes failed and no process was reported dead within "
        f"{2 * peer_timeout + 5} s: {str(error)[:300]}"
    ) from error


_decisions = itertools.count()


def primary_decides(name: str, decide: Callable[[], Any], error: type[Exception] = UserError) -> Any:
    """Run ``decide`` on the first process only and return its (JSON) result on every process.

    Every process calls this at the same point of the program, in the same order. If ``decide``
    raises, it raises on the first process and ``error(message)`` on every other one, so no
    process goes on to a collective that the others never reach.
    """
    if jax.process_count() == 1:
        return decide()
    key = f"functional_gan/decision/{next(_decisions)}/{name}"
    if is_primary():
        try:
            value = decide()
        except Exception as failure:
            message = str(failure) if isinstance(failure, UserError) else f"process 0 failed ({name}): {type(failure).__name__}: {failure}"
            _client().key_value_set(key, json.dumps({"error": message}))
            raise
        _client().key_value_set(key, json.dumps({"value": value}))
        return value
    # A dead first process is noticed by the coordination service (the peer timeout), not here.
    answer = json.loads(_client().blocking_key_value_get(key, 24 * 3600 * 1000))
    if "error" in answer:
        raise error(answer["error"])
    return answer["value"]


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


DATA_AXIS = "data"


def data_parallel_mesh(config: TrainConfig) -> Mesh | None:
    """A one-axis Mesh over ``config.devices`` devices (all by default), or None for one device.

    In one process the devices are its local ones; in a multi-process run (``jax.distributed``)
    the mesh spans every device of every process. The batch must split evenly: ``batch_size``
    divisible by the device count.
    """
    if jax.process_count() > 1:
        available = jax.devices()
        count = config.devices or len(available)
        if count != len(available):
            raise ConfigError(f"--devices {count}: a run of {jax.process_count()} processes spans all their "
                              f"{len(available)} devices; leave --devices out or give {len(available)}")
    else:
        available = jax.local_devices()
        count = config.devices or len(available)
        if count > len(available):
            raise ConfigError(f"--devices {count}: only {len(available)} local device(s) "
                              f"({', '.join(str(d) for d in available)})")
    if config.batch_size % count:
        raise ConfigError(f"--batch-size {config.batch_size} does not split evenly over {count} devices; "
                          f"choose a multiple of {count} or other --devices")
    return None if count == 1 else Mesh(np.array(available[:count]), (DATA_AXIS,))


def batch_sharding(mesh: Mesh) -> NamedSharding:
    """Batches split along their first axis over the mesh's first axis (data parallelism)."""
    return NamedSharding(mesh, PartitionSpec(mesh.axis_names[0]))


def replicated(mesh: Mesh) -> NamedSharding:
    """Parameters, optimizer states and metrics: a full copy on every device of the mesh."""
    return NamedSharding(mesh, PartitionSpec())
