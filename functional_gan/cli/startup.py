"""How ``train`` starts: alone, or as one process of a multi-process run (supervised, joined, checked).

A multi-process run is ``--coordinator/--num-processes/--process-id`` (or JAX's environment variables).
Each such process first starts a supervised child that does the training and watches it
(:mod:`functional_gan.launch`); the child joins ``jax.distributed`` before anything touches a device
and checks that every process was given the same settings.
"""

from __future__ import annotations

import contextlib
import signal
from pathlib import Path

from functional_gan import distributed, launch
from functional_gan.config import TrainConfig
from functional_gan.errors import UserError


def process_settings(args) -> distributed.ProcessSettings | None:
    """This process's part in a multi-process run (the flags first, then JAX's environment), or None alone."""
    for flag in ("join_timeout", "peer_timeout"):
        if getattr(args, flag) <= 0:
            raise UserError(f"--{flag.replace('_', '-')} must be a positive number of seconds, got {getattr(args, flag)}")
    environment = distributed.settings_from_environment()
    return distributed.process_settings(
        args.coordinator or environment[0],
        args.num_processes if args.num_processes is not None else environment[1],
        args.process_id if args.process_id is not None else environment[2],
    )


def supervise(args, processes: distributed.ProcessSettings) -> int:
    """Run this process's part in a child and watch it (one clear line when a peer dies); the child's status."""
    return launch.supervise(launch.child_command(args.argv), processes.process_id, processes.coordinator,
                            args.out, args.join_timeout, args.peer_timeout)


def join(args, processes: distributed.ProcessSettings, config: TrainConfig) -> None:
    """Join the run (before anything touches a device) and check every process has the same settings."""
    distributed.initialize(processes, args.join_timeout, args.peer_timeout)
    launch.report(joined=True)
    distributed.check_same_settings(processes, {"config": config.to_dict(), "--out": str(Path(args.out).absolute())},
                                    args.join_timeout)


@contextlib.contextmanager
def stop_on_signals():
    """SIGTERM (a scheduler, ``kill``) and Ctrl-C stop the loop at its next iteration (workers closed, checkpoints
    kept); a second signal stops at once. The previous handlers come back afterwards."""
    from functional_gan.loop import request_stop, stop_requested

    def stop(_signum, _frame):
        if stop_requested():
            raise KeyboardInterrupt
        request_stop()

    previous = {s: signal.signal(s, stop) for s in (signal.SIGTERM, signal.SIGINT)}
    try:
        yield
    finally:
        for s, handler in previous.items():
            signal.signal(s, handler)
