"""``functional-gan train`` with a SIGKILL injected at a chosen moment (used by test_faults.py).

    python tests/fault_runner.py MOMENT N TRAIN-ARGS...

The process kills itself (SIGKILL: no cleanup, no ``finally``) on the N-th call of:

* ``grid``: saving a picture (the first is training_images.png), i.e. between checkpoints;
* ``orbax-write``: waiting for orbax's asynchronous checkpoint write, i.e. while it is being written;
* ``seal``: writing the checksum manifest, i.e. after orbax finished and before the checkpoint is sealed.
"""

import os
import signal
import sys

import orbax.checkpoint as ocp

from functional_gan import checkpoints, plots
from functional_gan.main import main


def kill_on_call(function, n):
    calls = 0

    def wrapper(*args, **kwargs):
        nonlocal calls
        calls += 1
        if calls == n:
            os.kill(os.getpid(), signal.SIGKILL)
        return function(*args, **kwargs)

    return wrapper


if __name__ == "__main__":
    moment, n, train_args = sys.argv[1], int(sys.argv[2]), sys.argv[3:]
    if moment == "grid":
        plots.save_grid = kill_on_call(plots.save_grid, n)
    elif moment == "orbax-write":
        ocp.CheckpointManager.wait_until_finished = kill_on_call(ocp.CheckpointManager.wait_until_finished, n)
    elif moment == "seal":
        checkpoints.write_manifest = kill_on_call(checkpoints.write_manifest, n)
    else:
        raise SystemExit(f"unknown moment {moment!r}")
    sys.exit(main(["train", *train_args]))
