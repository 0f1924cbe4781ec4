"""The ``functional-gan`` command line: the only place that parses flags."""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

from functional_gan.config import TrainConfig

DEFAULTS = TrainConfig()


def _add_train_parser(subparsers) -> None:
    p = subparsers.add_parser(
        "train",
        help="train the DCGAN (the PyTorch tutorial's defaults); resumes from the run folder's checkpoints",
        description="Train the DCGAN tutorial's GAN with a pure, jitted JAX step. Defaults are the tutorial's. "
        "Running again on the same --out resumes from its newest checkpoint.",
        formatter_class=argparse.ArgumentDefaultsHelpFormatter,
    )
    p.add_argument("--data", default=DEFAULTS.data, help="'digits' (built in, offline), 'fake' (random), or a folder of images")
    p.add_argument("--out", default="runs/dcgan", help="run folder: samples, plots, metrics, checkpoints")
    p.add_argument("--epochs", type=int, default=DEFAULTS.epochs)
    p.add_argument("--steps", type=int, default=None, help="train this many iterations in total (overrides --epochs)")
    p.add_argument("--batch-size", type=int, default=DEFAULTS.batch_size)
    p.add_argument("--image-size", type=int, default=DEFAULTS.image_size, help="32, 64 (the tutorial's) or 128")
    p.add_argument("--nc", type=int, default=DEFAULTS.nc, help="image channels (1 or 3)")
    p.add_argument("--nz", type=int, default=DEFAULTS.nz, help="size of the latent vector")
    p.add_argument("--ngf", type=int, default=DEFAULTS.ngf, help="generator width")
    p.add_argument("--ndf", type=int, default=DEFAULTS.ndf, help="discriminator width")
    p.add_argument("--lr", type=float, default=DEFAULTS.lr)
    p.add_argument("--beta1", type=float, default=DEFAULTS.beta1)
    p.add_argument("--seed", type=int, default=DEFAULTS.seed)
    p.add_argument("--log-every", type=int, default=DEFAULTS.log_every, help="print the tutorial's stats line every N iterations")
    p.add_argument("--sample-every", type=int, default=DEFAULTS.sample_every, help="save a fixed-noise grid every N iterations")
    p.add_argument("--checkpoint-every", type=int, default=DEFAULTS.checkpoint_every)
    p.add_argument("--no-progress", action="store_true", help="no progress bar")
    p.set_defaults(handler=_run_train)


def _run_train(args) -> int:
    from functional_gan.loop import train

    config = TrainConfig(
        data=args.data, batch_size=args.batch_size, image_size=args.image_size, nc=args.nc, nz=args.nz,
        ngf=args.ngf, ndf=args.ndf, lr=args.lr, beta1=args.beta1, epochs=args.epochs, steps=args.steps,
        seed=args.seed, log_every=args.log_every, sample_every=args.sample_every, checkpoint_every=args.checkpoint_every,
    ).validate()
    result = train(config, args.out, progress=not args.no_progress)
    print(f"Done: iteration {result.last_step}. Results in {result.out_dir}/ "
          "(loss.png, progress.gif, real_vs_fake.png, samples/, metrics.jsonl, checkpoints/)")
    return 0


def _add_sample_parser(subparsers) -> None:
    p = subparsers.add_parser(
        "sample", help="write a grid of generated images from a checkpoint",
        formatter_class=argparse.ArgumentDefaultsHelpFormatter,
    )
    p.add_argument("--checkpoint", required=True, help="a run folder or its checkpoints/ folder (the newest step is used)")
    p.add_argument("--out", required=True, help="PNG file to write")
    p.add_argument("--num", type=int, default=64, help="number of images")
    p.add_argument("--seed", type=int, default=None, help="noise seed (default: the run's fixed noise)")
    p.add_argument("--eval-bn", action="store_true",
                   help="use BatchNorm's running statistics (PyTorch's .eval()); default is train mode, as the tutorial")
    p.set_defaults(handler=_run_sample)


def _run_sample(args) -> int:
    import jax
    import numpy as np

    from functional_gan import checkpoints, plots
    from functional_gan.train import fixed_noise, make_sampler

    if args.num <= 0:
        raise ValueError(f"--num must be positive, got {args.num}")
    out = Path(args.out)
    if out.suffix.lower() != ".png":
        raise ValueError(f"--out must name a .png file, got {str(out)!r}")
    config, state, step = checkpoints.load_latest(args.checkpoint)
    if args.seed is None and args.num <= 64:
        noise = fixed_noise(config)[: args.num]
    else:
        noise = jax.random.normal(jax.random.key(args.seed or 0), (args.num, config.nz))
    images = np.asarray(make_sampler(config, use_running_average=args.eval_bn)(state, noise))
    plots.save_grid(images, out)
    print(f"Wrote {args.num} samples from the checkpoint at iteration {step} to {out}")
    return 0


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="functional-gan",
        description="PyTorch's autograd examples in JAX's functional autodiff, checked against PyTorch.",
    )
    subparsers = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")
    _add_train_parser(subparsers)
    _add_sample_parser(subparsers)
    return parser


def main(argv: list[str] | None = None) -> int:
    from functional_gan.checkpoints import CheckpointError
    from functional_gan.config import ConfigError
    from functional_gan.convert import CheckpointFormatError
    from functional_gan.data import DataError
    from functional_gan.loop import NonFiniteLossError

    args = build_parser().parse_args(argv)
    try:
        return args.handler(args)
    except (ConfigError, DataError, CheckpointError, CheckpointFormatError, NonFiniteLossError, ValueError) as error:
        print(f"functional-gan {args.command}: error: {error}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        print("interrupted; checkpoints already written are kept", file=sys.stderr)
        return 130


if __name__ == "__main__":
    sys.exit(main())
