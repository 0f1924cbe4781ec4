"""``functional-gan train`` with a SIGKILL injected at a chosen moment (used by test_faults.py).

    python tests/fault_runner.py MOMENT N TRAIN-ARGS...

The process kills itself (SIGKILL: no cleanup, no ``finally``) on the N-th call of:

* ``grid``: saving a picture (the first is training_images.png), i.e. between checkpoints;
* ``orbax-write``: waiting for orbax's asynchronous checkpoint write, i.e. while it is being written;
* ``seal``: writing the checksum manifest, i.e. after orbax finished and before the checkpoint is sealed;
* ``sealed``: returning from a checkpoint, i.e. right after it was sealed (and old ones deleted).

In a multi-process run the supervisor starts its training process through this script too, with the
same fault.
"""

import os
import signal
import sys

import orbax.checkpoint as ocp

from functional_gan import checkpoints, launch, plots
from functional_gan.main import main


def kill_on_call(function, n, after=False):
    calls = 0

    def wrapper(*args, **kwargs):
        nonlocal calls
        calls += 1
        if calls == n and not after:
            os.kill(os.getpid(), signal.SIGKILL)
        result = function(*args, **kwargs)
        if calls == n:
            os.kill(os.getpid(), signal.SIGKILL)
        return result

    return wrapper


if __name__ == "__main__":
    moment, n, train_args = sys.argv[1], int(sys.argv[2]), sys.argv[3:]
    if moment == "grid":
        plots.save_grid = kill_on_call(plots.save_grid, n)
    elif moment == "orbax-write":
        ocp.CheckpointManager.wait_until_finished = kill_on_call(ocp.CheckpointManager.wait_until_finished, n)
    elif moment == "seal":
        checkpoints.write_manifest = kill_on_call(checkpoints.write_manifest, n)
    elif moment == "sealed":
        checkpoints.save = kill_on_call(checkpoints.save, n, after=True)
    else:
        raise SystemExit(f"unknown moment {moment!r}")
    launch.child_command = lambda argv: [sys.executable, __file__, moment, str(n), *argv[1:]]
    sys.exit(main(["train", *train_args]))
