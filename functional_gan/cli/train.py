"""``functional-gan train``: the DCGAN trained with the tutorial's defaults, alone or over several processes."""

from __future__ import annotations

from functional_gan.cli.flags import LOSS_FIELDS, MODEL_FIELDS, RUN_FIELDS, command, config_flags, loss_config
from functional_gan.config import DEFAULT_JOIN_TIMEOUT, DEFAULT_PEER_TIMEOUT


def add_train(subparsers) -> None:
    p = command(subparsers, run_train)
    config_flags(p, MODEL_FIELDS[:1])
    p.add_argument("--workers", type=int, default=None,
                   help="Grain worker processes that decode the images ahead of the step (default: half the CPU "
                   "cores, 1 to 8; 0: read in the training process)")
    p.add_argument("--out", default="runs/dcgan", help="run folder: samples, plots, metrics, checkpoints")
    config_flags(p, MODEL_FIELDS[1:] + LOSS_FIELDS + RUN_FIELDS[:3])
    p.add_argument("--coordinator", default=None, metavar="HOST:PORT",
                   help="multi-process run: the address of process 0 (default: $JAX_COORDINATOR_ADDRESS)")
    p.add_argument("--num-processes", type=int, default=None,
                   help="multi-process run: how many processes (default: $JAX_NUM_PROCESSES)")
    p.add_argument("--process-id", type=int, default=None,
                   help="multi-process run: this process's index, 0 .. num-processes − 1 (default: $JAX_PROCESS_ID)")
    p.add_argument("--join-timeout", type=int, default=DEFAULT_JOIN_TIMEOUT, metavar="SECONDS",
                   help="multi-process run: how long to wait for the coordinator and for every process to join")
    p.add_argument("--peer-timeout", type=int, default=DEFAULT_PEER_TIMEOUT, metavar="SECONDS",
                   help="multi-process run: a process silent this long counts as dead and the others stop "
                   "(with the iteration and the checkpoint kept)")
    config_flags(p, RUN_FIELDS[3:])
    p.add_argument("--init-generator", default=None, metavar="FILE",
                   help="start a new run from a PyTorch generator state_dict (.pth read weights-only, or .safetensors), "
                   "e.g. the tutorial's; Adam starts fresh")
    p.add_argument("--init-discriminator", default=None, metavar="FILE", help="the same for the discriminator")
    p.add_argument("--no-progress", action="store_true", help="no progress bar")


def run_train(args) -> int:
    """Train the DCGAN (the PyTorch tutorial's defaults); resumes from the run folder's checkpoints.

    Train the DCGAN tutorial's GAN with a pure, jitted JAX step. Defaults are the tutorial's. Running again on the
    same --out resumes from its newest checkpoint.
    """
    import jax

    from functional_gan import distributed, launch
    from functional_gan.cli.startup import join, process_settings, stop_on_signals, supervise
    from functional_gan.data import default_channels
    from functional_gan.loop import train

    processes = process_settings(args)
    settings = {name: getattr(args, name) for name in MODEL_FIELDS + RUN_FIELDS}
    if settings["nc"] is None:
        settings["nc"] = default_channels(args.data)
    config = loss_config(args, **settings)
    if processes is not None and not launch.supervised():
        return supervise(args, processes)
    if processes is not None:
        join(args, processes, config)
    try:
        with stop_on_signals():
            result = train(config, args.out, progress=not args.no_progress, init_generator=args.init_generator,
                           init_discriminator=args.init_discriminator, workers=args.workers)
    except jax.errors.JaxRuntimeError as error:
        if processes is not None:
            distributed.await_lost_peer(error, args.peer_timeout)
        raise
    if not distributed.is_primary():
        return 0
    print(f"Done: iteration {result.last_step}. Results in {result.out_dir}/ "
          "(loss.png, progress.gif, real_vs_fake.png, samples/, metrics.jsonl, checkpoints/)")
    return 0
