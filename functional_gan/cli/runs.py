"""``functional-gan sample`` and ``export``: what a run's checkpoint (or a PyTorch generator) gives back."""

from __future__ import annotations

import sys

from functional_gan.cli.flags import command


def add_sample(subparsers) -> None:
    p = command(subparsers, run_sample)
    source = p.add_mutually_exclusive_group(required=True)
    source.add_argument("--checkpoint", help="a run folder or its checkpoints/ folder (the newest good step is used)")
    source.add_argument("--generator", metavar="FILE",
                        help="a PyTorch generator state_dict (.pt/.pth read weights-only, or .safetensors)")
    p.add_argument("--out", required=True, help="PNG file to write")
    p.add_argument("--num", type=int, default=64, help="number of images")
    p.add_argument("--seed", type=int, default=None,
                   help="noise seed (default: the run's fixed noise; its first 64 rows are the training grids')")
    p.add_argument("--eval-bn", action="store_true",
                   help="use BatchNorm's running statistics (PyTorch's .eval()); default is train mode, as the tutorial")


def run_sample(args) -> int:
    """Write a grid of generated images from a run's checkpoint or a PyTorch generator state_dict.

    Samples the newest good checkpoint of a run (--checkpoint), or a PyTorch generator state_dict such as the
    tutorial's netG.pth (--generator; its widths are read off the weights).
    """
    from functional_gan.loop import sample_from_checkpoint, sample_from_state_dict

    if args.generator is not None:
        config = sample_from_state_dict(args.generator, args.out, args.num, args.seed, args.eval_bn)
        print(f"Wrote {args.num} samples of {args.generator} (nz {config.nz}, ngf {config.ngf}, nc {config.nc}, "
              f"{config.image_size}×{config.image_size}) to {args.out}")
        return 0
    restored = sample_from_checkpoint(args.checkpoint, args.out, args.num, args.seed, args.eval_bn)
    warn_damaged(restored)
    print(f"Wrote {args.num} samples from the checkpoint at iteration {restored.step} to {args.out}")
    return 0


def warn_damaged(restored) -> None:
    """Name each newer checkpoint that was skipped as damaged (and the file), on stderr."""
    for damaged in restored.damaged:
        print(f"Warning: {damaged}; skipped", file=sys.stderr)


def add_export(subparsers) -> None:
    p = command(subparsers, run_export)
    p.add_argument("--checkpoint", required=True, help="a run folder or its checkpoints/ folder")
    p.add_argument("--generator", metavar="FILE", help="write netG's state_dict here")
    p.add_argument("--discriminator", metavar="FILE",
                   help="write netD's state_dict here (a --loss wgan-gp run's critic: for functional_gan.pytorch.wgan_gp.Critic)")


def run_export(args) -> int:
    """Write a run's networks as PyTorch state_dicts (for the tutorial's and pytorch/examples' models).

    Writes the newest good checkpoint's generator and/or discriminator as state_dicts (.pt/.pth or .safetensors, by
    the suffix) that load_state_dict(strict=True) accepts in the tutorial's Generator and Discriminator, running
    statistics and num_batches_tracked included.
    """
    from functional_gan.loop import export_checkpoint

    restored = export_checkpoint(args.checkpoint, args.generator, args.discriminator)
    warn_damaged(restored)
    written = ", ".join(p for p in (args.generator, args.discriminator) if p)
    print(f"Wrote {written} from the checkpoint at iteration {restored.step}")
    return 0
