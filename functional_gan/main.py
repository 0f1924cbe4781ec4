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


def _add_linreg_parser(subparsers) -> None:
    p = subparsers.add_parser(
        "linreg", help="the book's linear regression: NumPy, jax.grad, optax.sgd, Flax nn.Dense (and PyTorch with --torch)",
        formatter_class=argparse.ArgumentDefaultsHelpFormatter,
    )
    p.add_argument("--float64", action="store_true", help="run the JAX trainers in float64 (jax_enable_x64)")
    p.add_argument("--torch", action="store_true", help="also run the PyTorch variants (needs the torch extra)")
    p.set_defaults(handler=_run_linreg)


def _run_linreg(args) -> int:
    import jax
    import jax.numpy as jnp

    from functional_gan import linreg

    data = linreg.make_data()
    b0, w0 = linreg.initial_parameters()
    b_grad, w_grad = linreg.numpy_gradients(b0, w0, data.x_train, data.y_train)
    print(f"Book's data: {len(data.x_train)} training / {len(data.x_val)} validation points; start b = {b0:.8f}, "
          f"w = {w0:.8f}; first gradients {b_grad:.4f}, {w_grad:.4f}; lr {linreg.LEARNING_RATE}, {linreg.EPOCHS} epochs")
    with jax.enable_x64(args.float64):
        results = linreg.run_all(jnp.float64 if args.float64 else jnp.float32)
    if args.torch:
        import torch

        from comparisons import torch_linreg

        dtype = torch.float64 if args.float64 else torch.float32
        results += [trainer(data, dtype=dtype) for trainer in torch_linreg.TORCH_TRAINERS]
    print(linreg.format_results(results))
    print("The book: NumPy b = 1.02354094, w = 1.96896411; PyTorch b = 1.0235, w = 1.9690")
    return 0


def _add_lessons_parser(subparsers) -> None:
    from functional_gan.lessons import LESSONS

    p = subparsers.add_parser(
        "lessons", help="the autograd lessons, PyTorch and JAX side by side",
        description="Runs each lesson's PyTorch half and JAX half and prints both. Lessons: " + ", ".join(LESSONS),
    )
    p.add_argument("names", nargs="*", metavar="NAME", help=f"lessons to run (default: all): {', '.join(LESSONS)}")
    p.add_argument("--markdown", metavar="FILE", help="also write the lessons' documentation page (code, output, why)")
    p.add_argument("--full-size", action="store_true",
                   help="for 'compiled': the tutorial's 64x64 nets at batch 128 instead of tiny ones")
    p.set_defaults(handler=_run_lessons)


def _run_lessons(args) -> int:
    from functional_gan import lessons

    names = args.names or list(lessons.LESSONS)
    unknown = [n for n in names if n not in lessons.LESSONS]
    if unknown:
        raise ValueError(f"unknown lesson(s) {', '.join(unknown)}; choose from {', '.join(lessons.LESSONS)}")
    results = []
    for name in names:
        result = lessons.run_lesson(name)
        if name == "compiled" and args.full_size:
            table = lessons.compiled_cost_table(lessons.FULL_SIZE_GAN_CONFIG)
            result.pytorch, result.jax = table["pytorch"], table["jax"]
        results.append(result)
        print(lessons.format_result(result), end="\n\n", flush=True)
    if args.markdown:
        path = Path(args.markdown)
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(lessons.to_markdown(results))
        print(f"Wrote {path}")
    return 0


def _add_graph_parser(subparsers) -> None:
    from functional_gan.graph import GRAPH_SETS

    p = subparsers.add_parser(
        "graph", help="draw computations as graphs: the jaxpr with its stop_gradient cut, and PyTorch's autograd graph",
        description="Writes DOT files (and SVG/PNG when Graphviz's dot is installed). "
        "'dstep' is the DCGAN's D loss, with G's side visibly cut.",
        formatter_class=argparse.ArgumentDefaultsHelpFormatter,
    )
    p.add_argument("which", nargs="*", default=list(GRAPH_SETS), metavar="WHICH", help=f"any of {', '.join(GRAPH_SETS)}")
    p.add_argument("--out", default="runs/graphs", help="folder for the files")
    p.set_defaults(handler=_run_graph)


def _run_graph(args) -> int:
    import shutil

    from functional_gan.graph import GRAPH_SETS, write_dot

    unknown = [w for w in args.which if w not in GRAPH_SETS]
    if unknown:
        raise ValueError(f"unknown graph(s) {', '.join(unknown)}; choose from {', '.join(GRAPH_SETS)}")
    for which in args.which:
        for name, source in GRAPH_SETS[which]().items():
            written = write_dot(source, Path(args.out) / f"{name}.dot")
            print("wrote " + ", ".join(str(p) for p in written))
    if not shutil.which("dot"):
        print("Graphviz's dot is not installed: only DOT files were written (apt-get install graphviz to render them)")
    return 0


def _add_replay_parser(subparsers) -> None:
    p = subparsers.add_parser(
        "replay", help="replay a PyTorch DCGAN run step by step in JAX (state_dicts + the run's batches)",
        description="Reads the tutorial models' state_dicts (.pt/.pth via torch.load(weights_only=True), or "
        ".safetensors) and an .npz with 'real' (steps, batch, nc, H, W) and 'noise' (steps, batch, nz, 1, 1), "
        "runs the tutorial's iterations in JAX and writes per-step metrics (loss_d, loss_g, d_x, d_g_z1, d_g_z2).",
        formatter_class=argparse.ArgumentDefaultsHelpFormatter,
    )
    p.add_argument("--generator", required=True, help="netG state_dict file")
    p.add_argument("--discriminator", required=True, help="netD state_dict file")
    p.add_argument("--batches", required=True, help=".npz with 'real' and 'noise', NCHW as in PyTorch")
    p.add_argument("--dtype", choices=("float32", "float64"), default="float32")
    p.add_argument("--lr", type=float, default=DEFAULTS.lr)
    p.add_argument("--beta1", type=float, default=DEFAULTS.beta1)
    p.add_argument("--out", required=True, help=".npz file for the per-step metrics")
    p.add_argument("--out-generator", help="write the final netG state_dict here (.pt or .safetensors)")
    p.add_argument("--out-discriminator", help="write the final netD state_dict here (.pt or .safetensors)")
    p.set_defaults(handler=_run_replay)


def _run_replay(args) -> int:
    from functional_gan import convert
    from functional_gan.replay import load_batches, replay, save_metrics

    generator_sd = convert.load_state_dict_file(args.generator)
    discriminator_sd = convert.load_state_dict_file(args.discriminator)
    real, noise = load_batches(args.batches)
    result = replay(generator_sd, discriminator_sd, real, noise, args.dtype, args.lr, args.beta1)
    save_metrics(result, args.out)
    if args.out_generator:
        convert.save_state_dict_file(result.generator_state_dict, args.out_generator)
    if args.out_discriminator:
        convert.save_state_dict_file(result.discriminator_state_dict, args.out_discriminator)
    m = result.metrics
    print(f"Replayed {len(m['loss_d'])} steps in {args.dtype} (image {result.config.image_size}, nz {result.config.nz}, "
          f"ngf {result.config.ngf}, ndf {result.config.ndf}); last step: Loss_D {m['loss_d'][-1]:.4f}  "
          f"Loss_G {m['loss_g'][-1]:.4f}  D(x) {m['d_x'][-1]:.4f}  D(G(z)) {m['d_g_z1'][-1]:.4f} / {m['d_g_z2'][-1]:.4f}")
    print(f"Wrote {args.out}" + "".join(f", {p}" for p in (args.out_generator, args.out_discriminator) if p))
    return 0


def _add_compare_parser(subparsers) -> None:
    p = subparsers.add_parser(
        "compare", help="run the comparison suite against PyTorch and write a report with plots",
        description="Runs every check of comparisons/ (float64 trajectories, float32 teacher forcing, layers, gradient "
        "stopping, linear regression, recorded fixtures, and long float32 runs on the digits compared by sample "
        "quality) and writes report.md with its plots. Needs the torch extra.",
        formatter_class=argparse.ArgumentDefaultsHelpFormatter,
    )
    p.add_argument("--out", default="runs/compare", help="folder for report.md and its plots")
    p.add_argument("--skip-quality", action="store_true", help="skip the long float32 runs (the slowest part, ~2 min on 2 cores)")
    p.add_argument("--quality-steps", type=int, default=300, help="iterations of each long float32 run")
    p.set_defaults(handler=_run_compare)


def _run_compare(args) -> int:
    try:
        from comparisons import quality, report
    except ImportError as error:
        raise ValueError(f"the comparison suite needs PyTorch: pip install -e '.[torch]' ({error})") from error
    if args.quality_steps <= 0:
        raise ValueError(f"--quality-steps must be positive, got {args.quality_steps}")
    spec = quality.QualitySpec(steps=args.quality_steps, nz=100, ngf=32, ndf=32)
    results, path = report.run_suite(args.out, include_quality=not args.skip_quality, quality_spec=spec)
    failed = [r.name for r in results if r.passed is False]
    print(f"Wrote {path}: {sum(r.passed is True for r in results)} passed, {len(failed)} failed, "
          f"{sum(r.passed is None for r in results)} reported")
    return 1 if failed else 0


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="functional-gan",
        description="PyTorch's autograd examples in JAX's functional autodiff, checked against PyTorch.",
    )
    subparsers = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")
    _add_train_parser(subparsers)
    _add_sample_parser(subparsers)
    _add_linreg_parser(subparsers)
    _add_lessons_parser(subparsers)
    _add_graph_parser(subparsers)
    _add_replay_parser(subparsers)
    _add_compare_parser(subparsers)
    return parser


def main(argv: list[str] | None = None) -> int:
    from functional_gan.checkpoints import CheckpointError
    from functional_gan.config import ConfigError
    from functional_gan.convert import CheckpointFormatError
    from functional_gan.data import DataError
    from functional_gan.loop import NonFiniteLossError
    from functional_gan.replay import ReplayInputError

    args = build_parser().parse_args(argv)
    try:
        return args.handler(args)
    except (ConfigError, DataError, CheckpointError, CheckpointFormatError, NonFiniteLossError, ReplayInputError, ValueError) as error:
        print(f"functional-gan {args.command}: error: {error}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        print("interrupted; checkpoints already written are kept", file=sys.stderr)
        return 130


if __name__ == "__main__":
    sys.exit(main())
