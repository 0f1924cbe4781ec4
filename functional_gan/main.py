"""The ``functional-gan`` command line: the only place that parses flags.

Each command turns its flags into a config and calls one library function. Errors the user
caused (:class:`functional_gan.errors.UserError`) print one line and exit with status 2; any
other exception is a bug and keeps its traceback.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
from pathlib import Path

from functional_gan.config import DEFAULT_JOIN_TIMEOUT, DEFAULT_PEER_TIMEOUT, TUTORIAL, TrainConfig, config_for_loss
from functional_gan.errors import UserError, torch_side

class _FORMATTER(argparse.ArgumentDefaultsHelpFormatter):
    """Every flag's help shows its default; flags whose default is "not given" say what that means instead."""

    def _get_help_string(self, action):
        if action.default is None or action.default is False:
            return action.help
        return super()._get_help_string(action)



OPTIMIZER_FIELDS = ("lr", "beta1", "beta2")
LOSS_FIELDS = (*OPTIMIZER_FIELDS, "loss", "n_critic", "gp_weight")
MODEL_FIELDS = ("data", "epochs", "steps", "batch_size", "image_size", "nc", "nz", "ngf", "ndf")
RUN_FIELDS = ("seed", "devices", "log_every", "sample_every", "checkpoint_every")


def _config_flags(p, fields, loss_dependent: bool = True) -> None:
    """One flag per TrainConfig field, from :data:`functional_gan.config.FLAGS` (help) and the field (type, default).

    A field whose default is decided later (by the loss's entry, or by the data for --nc) defaults to None, and its
    help lists the defaults; with ``loss_dependent=False`` (no --loss flag) the tutorial's own values are the defaults.
    """
    import typing

    from functional_gan.config import FLAGS
    from functional_gan.losses import LOSSES

    hints = typing.get_type_hints(TrainConfig)
    for name in fields:
        help_text, decided = FLAGS[name]
        kind = next(t for t in (int, float, str) if t in (hints[name], *typing.get_args(hints[name])))
        default = getattr(TUTORIAL, name)
        if name == "loss":
            p.add_argument("--loss", default=default, choices=tuple(LOSSES),
                           help=f"{help_text}: " + "; ".join(f"'{e.name}': {e.summary}" for e in LOSSES.values())
                           + ". A loss may have its own defaults for the optimizer flags and --n-critic")
            continue
        if decided == "later" and (loss_dependent or name == "nc"):
            owners = [e for e in LOSSES.values() if name in e.own_settings]
            others = "; ".join(f"{e.name}: {e.defaults[name]:g}" for e in LOSSES.values() if name in e.defaults)
            if name != "nc":
                base = "" if owners else f"{default:g}"
                listed = "; ".join(x for x in (base, others) if x)
                help_text += f" (default: {listed})"
            default = None
        p.add_argument("--" + name.replace("_", "-"), type=kind, default=default, help=help_text)


def _loss_config(args, **settings) -> TrainConfig:
    """The config the --loss flags describe (and ``settings``), validated."""
    return config_for_loss(args.loss, **{name: getattr(args, name) for name in LOSS_FIELDS if name != "loss"},
                           **settings).validate()


def _add_train_parser(subparsers) -> None:
    p = subparsers.add_parser(
        "train",
        help="train the DCGAN (the PyTorch tutorial's defaults); resumes from the run folder's checkpoints",
        description="Train the DCGAN tutorial's GAN with a pure, jitted JAX step. Defaults are the tutorial's. "
        "Running again on the same --out resumes from its newest checkpoint.",
        formatter_class=_FORMATTER,
    )
    _config_flags(p, MODEL_FIELDS[:1])
    p.add_argument("--workers", type=int, default=None,
                   help="Grain worker processes that decode the images ahead of the step (default: half the CPU "
                   "cores, 1 to 8; 0: read in the training process)")
    p.add_argument("--out", default="runs/dcgan", help="run folder: samples, plots, metrics, checkpoints")
    _config_flags(p, MODEL_FIELDS[1:] + LOSS_FIELDS + RUN_FIELDS[:2])
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
    _config_flags(p, RUN_FIELDS[2:])
    p.add_argument("--init-generator", default=None, metavar="FILE",
                   help="start a new run from a PyTorch generator state_dict (.pth read weights-only, or .safetensors), "
                   "e.g. the tutorial's; Adam starts fresh")
    p.add_argument("--init-discriminator", default=None, metavar="FILE", help="the same for the discriminator")
    p.add_argument("--no-progress", action="store_true", help="no progress bar")
    p.set_defaults(handler=_run_train)


def _run_train(args) -> int:
    from functional_gan import distributed, launch
    from functional_gan.data import default_channels

    environment = distributed.settings_from_environment()
    processes = distributed.process_settings(
        args.coordinator or environment[0],
        args.num_processes if args.num_processes is not None else environment[1],
        args.process_id if args.process_id is not None else environment[2],
    )
    for flag in ("join_timeout", "peer_timeout"):
        if getattr(args, flag) <= 0:
            raise UserError(f"--{flag.replace('_', '-')} must be a positive number of seconds, got {getattr(args, flag)}")
    settings = {name: getattr(args, name) for name in MODEL_FIELDS + RUN_FIELDS}
    if settings["nc"] is None:
        settings["nc"] = default_channels(args.data)
    config = _loss_config(args, **settings)
    if processes is not None and not launch.supervised():
        # Each process of a multi-process run trains in a child that this process watches (functional_gan.launch).
        return launch.supervise(launch.child_command(args.argv), processes.process_id, processes.coordinator,
                                args.out, args.join_timeout, args.peer_timeout)
    if processes is not None:
        distributed.initialize(processes, args.join_timeout, args.peer_timeout)  # before anything touches a device
        launch.report(joined=True)
        distributed.check_same_settings(processes, {"config": config.to_dict(), "--out": str(Path(args.out).absolute())},
                                        args.join_timeout)
    import signal

    import jax

    from functional_gan.loop import request_stop, stop_requested, train

    def stop(_signum, _frame):
        # SIGTERM (a scheduler, `kill`) and Ctrl-C: the loop stops at the next iteration (workers closed,
        # checkpoints kept); a second signal stops at once.
        if stop_requested():
            raise KeyboardInterrupt
        request_stop()

    previous = {s: signal.signal(s, stop) for s in (signal.SIGTERM, signal.SIGINT)}
    try:
        result = train(config, args.out, progress=not args.no_progress, init_generator=args.init_generator,
                       init_discriminator=args.init_discriminator, workers=args.workers)
    except jax.errors.JaxRuntimeError as error:
        if processes is not None:
            distributed.await_lost_peer(error, args.peer_timeout)
        raise
    finally:
        for s, handler in previous.items():
            signal.signal(s, handler)
    if not distributed.is_primary():
        return 0
    print(f"Done: iteration {result.last_step}. Results in {result.out_dir}/ "
          "(loss.png, progress.gif, real_vs_fake.png, samples/, metrics.jsonl, checkpoints/)")
    return 0


def _add_sample_parser(subparsers) -> None:
    p = subparsers.add_parser(
        "sample", help="write a grid of generated images from a run's checkpoint or a PyTorch generator state_dict",
        description="Samples the newest good checkpoint of a run (--checkpoint), or a PyTorch generator state_dict such "
        "as the tutorial's netG.pth (--generator; its widths are read off the weights).",
        formatter_class=_FORMATTER,
    )
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
    p.set_defaults(handler=_run_sample)


def _run_sample(args) -> int:
    from functional_gan.loop import sample_from_checkpoint, sample_from_state_dict

    if args.generator is not None:
        config = sample_from_state_dict(args.generator, args.out, args.num, args.seed, args.eval_bn)
        print(f"Wrote {args.num} samples of {args.generator} (nz {config.nz}, ngf {config.ngf}, nc {config.nc}, "
              f"{config.image_size}×{config.image_size}) to {args.out}")
        return 0
    restored = sample_from_checkpoint(args.checkpoint, args.out, args.num, args.seed, args.eval_bn)
    _warn_damaged(restored)
    print(f"Wrote {args.num} samples from the checkpoint at iteration {restored.step} to {args.out}")
    return 0


def _warn_damaged(restored) -> None:
    """Name each newer checkpoint that was skipped as damaged (and the file), on stderr."""
    for damaged in restored.damaged:
        print(f"Warning: {damaged}; skipped", file=sys.stderr)


def _add_export_parser(subparsers) -> None:
    p = subparsers.add_parser(
        "export", help="write a run's networks as PyTorch state_dicts (for the tutorial's and pytorch/examples' models)",
        description="Writes the newest good checkpoint's generator and/or discriminator as state_dicts (.pt/.pth or "
        ".safetensors, by the suffix) that load_state_dict(strict=True) accepts in the tutorial's Generator and "
        "Discriminator, running statistics and num_batches_tracked included.",
        formatter_class=_FORMATTER,
    )
    p.add_argument("--checkpoint", required=True, help="a run folder or its checkpoints/ folder")
    p.add_argument("--generator", metavar="FILE", help="write netG's state_dict here")
    p.add_argument("--discriminator", metavar="FILE",
                   help="write netD's state_dict here (a --loss wgan-gp run's critic: for functional_gan.pytorch.wgan_gp.Critic)")
    p.set_defaults(handler=_run_export)


def _run_export(args) -> int:
    from functional_gan.loop import export_checkpoint

    restored = export_checkpoint(args.checkpoint, args.generator, args.discriminator)
    _warn_damaged(restored)
    written = ", ".join(p for p in (args.generator, args.discriminator) if p)
    print(f"Wrote {written} from the checkpoint at iteration {restored.step}")
    return 0


def _add_linreg_parser(subparsers) -> None:
    p = subparsers.add_parser(
        "linreg", help="the book's linear regression: NumPy, jax.grad, optax.sgd, Flax nn.Dense (and PyTorch with --torch)",
        formatter_class=_FORMATTER,
    )
    p.add_argument("--float64", action="store_true", help="run in float64 (jax_enable_x64; torch.float64)")
    p.add_argument("--torch", action="store_true", help="also run the PyTorch variants (needs the torch extra)")
    p.set_defaults(handler=_run_linreg)


def _run_linreg(args) -> int:
    import jax
    import jax.numpy as jnp

    from functional_gan import linreg

    print(linreg.describe_setup())
    with jax.enable_x64(args.float64):
        results = linreg.run_all(jnp.float64 if args.float64 else jnp.float32)
    if args.torch:
        import torch

        from functional_gan.pytorch import linreg as torch_linreg

        results += torch_linreg.run_all(torch.float64 if args.float64 else torch.float32)
    print(linreg.format_results(results))
    return 0


def _add_lessons_parser(subparsers) -> None:
    p = subparsers.add_parser(
        "lessons", help="the autograd lessons, PyTorch and JAX side by side", formatter_class=_FORMATTER,
    )
    from functional_gan.lessons import LESSONS

    p.description = "Runs every side of each lesson and prints what each computed. Lessons: " + ", ".join(LESSONS)
    p.add_argument("names", nargs="*", metavar="NAME", help=f"lessons to run (default: all): {', '.join(LESSONS)}")
    p.add_argument("--markdown", metavar="FILE", help="also write the lessons' documentation page (code, output, why)")
    p.add_argument("--full-size", action="store_true",
                   help="for 'compiled': the tutorial's 64x64 nets at batch 128 instead of tiny ones")
    p.set_defaults(handler=_run_lessons)


def _run_lessons(args) -> int:
    from functional_gan import lessons

    unknown = [n for n in args.names if n not in lessons.LESSONS]
    if unknown:
        raise UserError(f"unknown lesson(s) {', '.join(unknown)}; choose from {', '.join(lessons.LESSONS)}")
    results = []
    for name in args.names or list(lessons.LESSONS):
        result = lessons.run_lesson(name, "full" if args.full_size else "small")
        results.append(result)
        print(lessons.format_result(result), end="\n\n", flush=True)
    if args.markdown:
        path = Path(args.markdown)
        path.parent.mkdir(parents=True, exist_ok=True)
        command = "functional-gan lessons" + (" --full-size" if args.full_size else "") + f" --markdown {args.markdown}"
        path.write_text(lessons.to_markdown(results, command))
        print(f"Wrote {path}")
    return 0


def _add_graph_parser(subparsers) -> None:
    p = subparsers.add_parser(
        "graph", help="draw computations as graphs: the jaxpr with its stop_gradient cut, and PyTorch's autograd graph",
        description="Writes DOT files (and SVG/PNG when Graphviz's dot is installed). "
        "'dstep' is the DCGAN's D loss, with G's side visibly cut.",
        formatter_class=_FORMATTER,
    )
    from functional_gan.lessons.pictures import GRAPH_SETS

    p.add_argument("which", nargs="*", default=list(GRAPH_SETS), metavar="WHICH", help=f"any of {', '.join(GRAPH_SETS)}")
    p.add_argument("--out", default="runs/graphs", help="folder for the files")
    p.set_defaults(handler=_run_graph)


def _run_graph(args) -> int:
    import shutil

    from functional_gan.graph import write_dot
    from functional_gan.lessons.pictures import GRAPH_SETS

    unknown = [w for w in args.which if w not in GRAPH_SETS]
    if unknown:
        raise UserError(f"unknown graph(s) {', '.join(unknown)}; choose from {', '.join(GRAPH_SETS)}")
    for which in args.which:
        for name, source in GRAPH_SETS[which]().items():
            written = write_dot(source, Path(args.out) / f"{name}.dot")
            print("wrote " + ", ".join(str(p) for p in written))
    if not shutil.which("dot"):
        print("Graphviz's dot is not installed: only DOT files were written (apt-get install graphviz to render them)")
    return 0


def _add_notebooks_parser(subparsers) -> None:
    p = subparsers.add_parser(
        "notebooks", help="write the lessons as notebooks (jupytext percent .py and .ipynb), one per family",
        description="Generates one notebook per lesson family from the lessons' registry: each side's own source, "
        "run and shown as a table, then the family's graph pictures. Writes FAMILY.py (jupytext's percent format) and "
        "FAMILY.ipynb built from it (needs the docs extra: pip install -e '.[docs]'). --execute also runs each .ipynb "
        "top to bottom in a fresh kernel and keeps its outputs.",
        formatter_class=_FORMATTER,
    )
    from functional_gan.lessons.registry import FAMILIES

    p.add_argument("families", nargs="*", metavar="FAMILY", help=f"families to write (default: all): {', '.join(FAMILIES)}")
    p.add_argument("--out", default="docs/notebooks", help="folder for the notebooks")
    p.add_argument("--execute", action="store_true", help="run each notebook and keep its outputs in the .ipynb")
    p.add_argument("--no-ipynb", action="store_true", help="write the percent-format .py files only (no jupytext needed)")
    p.set_defaults(handler=_run_notebooks)


def _run_notebooks(args) -> int:
    from functional_gan.lessons import notebooks
    from functional_gan.lessons.registry import FAMILIES

    unknown = [f for f in args.families if f not in FAMILIES]
    if unknown:
        raise UserError(f"unknown lesson famil{'y' if len(unknown) == 1 else 'ies'} {', '.join(unknown)}; choose from {', '.join(FAMILIES)}")
    if args.execute and args.no_ipynb:
        raise UserError("--execute runs the .ipynb files, which --no-ipynb leaves out")
    try:
        written = notebooks.write_notebooks(Path(args.out), args.families or None, ipynb=not args.no_ipynb)
    except ImportError as error:
        raise UserError(str(error)) from None
    for path in written:
        print(f"wrote {path}", flush=True)
    if args.execute:
        try:
            notebooks.execute_notebooks(written, progress=lambda line: print(line, flush=True))
        except ImportError as error:
            raise UserError(str(error)) from None
    return 0


def _add_docs_parser(subparsers) -> None:
    p = subparsers.add_parser(
        "docs", help="build the documentation site: executed lesson notebooks, the pages, the API reference",
        description="From the repository's root: stages docs/ with the benchmark results and an API page, writes the lesson "
        "notebooks and executes each in a fresh kernel, builds the site with MkDocs (strict: a broken link or anchor is "
        "an error) and checks every internal link and picture of the built pages. Needs the docs extra "
        "(pip install -e '.[torch,docs]'); Graphviz's dot draws the lessons' graphs where it is installed.",
        formatter_class=_FORMATTER,
    )
    p.add_argument("--out", default="site", help="folder for the built site")
    p.add_argument("--work", default="build/docs", help="staging folder (docs/ plus generated pages), replaced on each build")
    p.add_argument("--no-execute", action="store_true", help="show the notebooks without running them (faster; no outputs)")
    p.set_defaults(handler=_run_docs)


def _run_docs(args) -> int:
    from functional_gan import site

    result = site.build(Path(args.out), Path("."), Path(args.work), execute=not args.no_execute,
                        progress=lambda line: print(line, flush=True))
    executed = ", ".join(f"{name} {seconds:.0f} s" for name, seconds in result.notebooks.items()) or "none"
    print(f"built {result.pages} pages into {result.site} in {result.seconds:.0f} s "
          f"(notebooks executed: {executed}; {result.links_checked} internal links and pictures checked, none broken)")
    print(f"open {result.site / 'index.html'}, or serve it: python -m http.server -d {args.out}")
    return 0


def _add_replay_parser(subparsers) -> None:
    p = subparsers.add_parser(
        "replay", help="replay a PyTorch DCGAN (or WGAN-GP) run step by step in JAX (state_dicts + the run's batches)",
        description="Reads the tutorial models' state_dicts (.pt/.pth via torch.load(weights_only=True), or "
        ".safetensors) and an .npz with 'real' (steps, batch, nc, H, W) and 'noise' (steps, batch, nz, 1, 1), "
        "and for --loss wgan-gp 'mix' (steps, batch), the penalty's interpolation weights; "
        "runs the iterations in JAX and writes per-step metrics (loss_d, loss_g, d_x, d_g_z1, d_g_z2).",
        formatter_class=_FORMATTER,
    )
    p.add_argument("--generator", required=True, help="netG state_dict file")
    p.add_argument("--discriminator", required=True, help="netD state_dict file")
    p.add_argument("--batches", required=True, help=".npz with 'real' and 'noise' (and 'mix' for wgan-gp), NCHW as in PyTorch")
    p.add_argument("--dtype", choices=("float32", "float64"), default="float32", help="precision of the replay")
    _config_flags(p, LOSS_FIELDS)
    p.add_argument("--out", required=True, help=".npz file for the per-step metrics")
    p.add_argument("--out-generator", help="write the final netG state_dict here (.pt or .safetensors)")
    p.add_argument("--out-discriminator", help="write the final netD state_dict here (.pt or .safetensors)")
    p.set_defaults(handler=_run_replay)


def _run_replay(args) -> int:
    from functional_gan.replay import replay_files

    settings = _loss_config(args)
    result = replay_files(args.generator, args.discriminator, args.batches, args.out, args.dtype, settings,
                          args.out_generator, args.out_discriminator)
    m, c = result.metrics, result.config
    print(f"Replayed {len(m['loss_d'])} steps in {args.dtype} (image {c.image_size}, nz {c.nz}, ngf {c.ngf}, ndf {c.ndf}); "
          f"last step: Loss_D {m['loss_d'][-1]:.4f}  Loss_G {m['loss_g'][-1]:.4f}  D(x) {m['d_x'][-1]:.4f}  "
          f"D(G(z)) {m['d_g_z1'][-1]:.4f} / {m['d_g_z2'][-1]:.4f}")
    print(f"Wrote {args.out}" + "".join(f", {p}" for p in (args.out_generator, args.out_discriminator) if p))
    return 0


def _add_diverge_parser(subparsers) -> None:
    p = subparsers.add_parser(
        "diverge", help="find the first layer and stage where JAX and PyTorch differ in a DCGAN run",
        description="Runs the tutorial's iterations in PyTorch and in JAX, each iteration from PyTorch's state (Adam "
        "included) on the same batch and noise, and compares every intermediate in debugging order: forward "
        "(each layer of G, of D on real, of D on fake) → losses → D's gradients → D's update and running statistics → "
        "the G step from PyTorch's updated D (errG, G's gradients, update, running statistics). The JAX side is the "
        "training step's own parts. The reference is PyTorch in float64; in float32 each quantity may be off by --k "
        "times PyTorch float32's own error on the same iteration (updates judged from the same gradients). Prints the "
        "first quantity out of tolerance, with both sides' values. Exit status 1 if one is. Needs the torch extra.",
        formatter_class=_FORMATTER,
    )
    p.add_argument("--generator", required=True, help="netG state_dict file at the start of the run (.pt/.pth or .safetensors)")
    p.add_argument("--discriminator", required=True, help="netD state_dict file at the start of the run")
    p.add_argument("--batches", required=True, help=".npz with 'real' (steps, batch, nc, H, W) and 'noise' (steps, batch, nz, 1, 1)")
    p.add_argument("--dtype", choices=("float32", "float64"), default="float64", help="precision of both sides")
    p.add_argument("--tolerance", type=float, default=None,
                   help="a fixed largest max|JAX − PyTorch| / max|PyTorch| per tensor instead of the default criterion "
                   "(float64: 1e-10; float32: --k times PyTorch float32's own error on the same iteration)")
    p.add_argument("--k", type=float, default=3.0,
                   help="float32: how many times PyTorch's own float32 error (against PyTorch float64) the port may be off")
    _config_flags(p, OPTIMIZER_FIELDS, loss_dependent=False)
    p.set_defaults(handler=_run_diverge)


def _run_diverge(args) -> int:
    diverge = torch_side("functional_gan.comparisons.diverge", "the divergence finder")
    if args.tolerance is not None and not args.tolerance > 0:
        raise UserError(f"--tolerance must be positive, got {args.tolerance}")
    if not args.k > 0:
        raise UserError(f"--k must be positive, got {args.k}")
    settings = TrainConfig(lr=args.lr, beta1=args.beta1, beta2=args.beta2).validate()
    divergence, history = diverge.diverge_files(args.generator, args.discriminator, args.batches, args.dtype,
                                                args.tolerance, settings, args.k)
    print(diverge.format_divergence(divergence, history, args.dtype, args.tolerance, args.k))
    return 0 if divergence is None else 1


def _add_check_port_parser(subparsers) -> None:
    p = subparsers.add_parser(
        "check-port", help="check a JAX port (Flax Linen or NNX, Equinox, plain functions) of any PyTorch model: "
        "where it first leaves PyTorch",
        description="Loads SPEC.py: torch_model(), example_inputs(), and the port: jax_model() returning a Flax Linen "
        "module, a Flax NNX module or an Equinox module (PER_SAMPLE = True for one that acts on one sample), or "
        "jax_params() with jax_apply(params, *inputs); optionally example_targets(), to_jax/from_jax, param_map, "
        "torch_loss/jax_loss, torch_optimizer/jax_optimizer, TRAIN. Moves the PyTorch weights into the port and "
        "compares, in debugging order, each layer's output, the output, the loss, every gradient, every parameter "
        "after one optimizer step and every buffer, for --steps steps (each from PyTorch's state). The port runs "
        "compiled with jax.jit (as training runs it; judged) and op by op; a difference in one of them alone is "
        "named as a JAX/XLA matter. PyTorch in float64 is the reference; in float32 a quantity passes when the port "
        "is within k times PyTorch float32's own error. Exit status 0: agreement; 1: a divergence (named: a value "
        "out of tolerance, or a shape that differs); 2: a spec it cannot use (a missing function, a weight that "
        "cannot be paired, a param_map that is not a dict, a port that computes in another dtype than --dtype). "
        "Needs the torch extra (and equinox for Equinox ports). Examples: examples/port/.",
        formatter_class=_FORMATTER,
    )
    p.add_argument("spec", metavar="SPEC.py", help="the spec file (its folder is importable from it)")
    p.add_argument("--dtype", choices=("float32", "float64"), default="float32", help="precision of the port under test")
    p.add_argument("--steps", type=int, default=1, help="optimizer steps compared, each from PyTorch's state")
    p.add_argument("--k", type=float, default=3.0, help="float32: the port may be this many times PyTorch's own error")
    p.add_argument("--program", choices=("both", "jit", "eager"), default="both",
                   help="the JAX program checked: compiled with jax.jit and op by op (judged: the compiled one), or one")
    p.add_argument("--json", metavar="FILE", help="also write the report as JSON")
    p.add_argument("--markdown", metavar="FILE", help="also write the report as Markdown")
    p.set_defaults(handler=_run_check_port)


def _run_check_port(args) -> int:
    port = torch_side("functional_gan.comparisons.port", "check-port")
    if not args.k > 0:
        raise UserError(f"--k must be positive, got {args.k}")
    programs = port.PROGRAMS if args.program == "both" else (args.program,)
    report = port.check_port(port.load_spec(args.spec), args.dtype, args.steps, args.k, programs=programs)
    print(report.format())
    for flag, text in ((args.json, lambda: json.dumps(report.to_json(), indent=1, default=float) + "\n"),
                       (args.markdown, lambda: report.format(markdown=True))):
        if flag:
            Path(flag).parent.mkdir(parents=True, exist_ok=True)
            Path(flag).write_text(text())
    return 0 if report.passed else 1


def _add_compare_parser(subparsers) -> None:
    p = subparsers.add_parser(
        "compare", help="run the comparison suite against PyTorch and write a report with plots",
        description="Runs the checks of the comparison suite (per-layer values, gradient stopping, linear regression, "
        "float64 trajectories, float32 teacher forcing, recorded fixtures, and long float32 runs on the digits "
        "compared by sample quality) and writes report.md with its plots. Needs the torch extra, except "
        "'--only fixtures'.",
        formatter_class=_FORMATTER,
    )
    from functional_gan.comparisons import GROUPS

    p.add_argument("--out", default="runs/compare", help="folder for report.md and its plots")
    p.add_argument("--only", nargs="+", choices=GROUPS, metavar="GROUP",
                   help=f"run only these groups of checks: {', '.join(GROUPS)}")
    p.add_argument("--skip-quality", action="store_true", help="skip the long float32 runs (the slowest part)")
    p.add_argument("--skip-noise-floor", action="store_true",
                   help="skip the noise floor at the tutorial's widths (float64, ~5 min on 2 cores)")
    p.add_argument("--quality-steps", type=int, default=300, help="iterations of each long float32 run")
    p.add_argument("--quality-seeds", type=int, default=8,
                   help="paired seeds of the long runs (each trains once per framework; ~50 s per seed on 2 cores)")
    p.set_defaults(handler=_run_compare)


def _run_compare(args) -> int:
    import dataclasses

    from functional_gan.comparisons import GROUPS

    skipped = {"quality"} if args.skip_quality else set()
    skipped |= {"noise-floor"} if args.skip_noise_floor else set()
    groups = [g for g in (args.only or GROUPS) if g not in skipped]
    if args.quality_steps <= 0:
        raise UserError(f"--quality-steps must be positive, got {args.quality_steps}")
    if args.quality_seeds < 2:
        raise UserError(f"--quality-seeds must be at least 2 (a paired comparison), got {args.quality_seeds}")
    from functional_gan.comparisons import quality, report

    if set(groups) - set(report.NEEDS_NO_TORCH):
        torch_side("torch", "the comparison suite (except --only " + " ".join(report.NEEDS_NO_TORCH) + ")")
    spec = quality.QualitySpec(run=dataclasses.replace(quality.QUALITY_RUN, steps=args.quality_steps),
                               seeds=tuple(range(1, args.quality_seeds + 1)))
    results, path = report.run_suite(args.out, groups=groups, quality_spec=spec)
    failed = [r.name for r in results if r.passed is False]
    print(f"Wrote {path}: {sum(r.passed is True for r in results)} passed, {len(failed)} failed, "
          f"{sum(r.passed is None for r in results)} reported")
    return 1 if failed else 0


def _add_bench_parser(subparsers) -> None:
    p = subparsers.add_parser(
        "bench", help="benchmark JAX against PyTorch on the same work (DCGAN step, sampling, linear regression)",
        formatter_class=_FORMATTER,
    )
    from functional_gan.benchmarks import bench

    p.description = bench.DESCRIPTION
    bench.add_arguments(p)


def build_parser(command: str | None = None) -> argparse.ArgumentParser:
    """The whole command line; with ``command``, that command's flags and the other commands' names only."""
    parser = argparse.ArgumentParser(
        prog="functional-gan",
        description="PyTorch's autograd examples in JAX's functional autodiff, checked against PyTorch.",
    )
    parser.add_argument("--no-compile-cache", action="store_true",
                        help="compile every JAX program afresh instead of reusing compiled programs from the persistent "
                        "cache (default: on, in $XDG_CACHE_HOME/functional-gan/jax or ~/.cache/functional-gan/jax; "
                        "environment: FUNCTIONAL_GAN_NO_COMPILE_CACHE=1, or JAX_COMPILATION_CACHE_DIR for another folder)")
    subparsers = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")
    for add in (_add_train_parser, _add_sample_parser, _add_export_parser, _add_linreg_parser, _add_lessons_parser,
                _add_notebooks_parser, _add_graph_parser, _add_replay_parser, _add_diverge_parser, _add_check_port_parser,
                _add_compare_parser, _add_bench_parser, _add_docs_parser):
        try:
            add(subparsers if command is None else _NamesOnly(subparsers, command))
        except _NamesOnly.Stop:
            pass
    return parser


class _NamesOnly:
    """Stands in for argparse's subparsers while the parser is built for one command: every other command
    gets its name and one-line help only, so that building it imports nothing (``--help`` answers without JAX)."""

    class Stop(Exception):
        pass

    def __init__(self, subparsers, command: str):
        self.subparsers, self.command = subparsers, command

    def add_parser(self, name, **kwargs):
        if name == self.command:
            return self.subparsers.add_parser(name, **kwargs)
        self.subparsers.add_parser(name, help=kwargs.get("help"))
        raise _NamesOnly.Stop


def _command_of(argv: list[str]) -> str:
    """The command argv names (its first word), or "" when it names none (then only the commands' list is built)."""
    return next((a for a in argv if not a.startswith("-")), "")


# Commands that compile JAX programs and gain from the persistent compilation cache (``bench`` measures
# compilation, so it compiles afresh).
CACHED_COMMANDS = ("train", "sample", "export", "linreg", "lessons", "notebooks", "graph", "replay", "diverge", "check-port",
                   "compare", "docs")


def compile_cache_folder() -> Path:
    """Where the CLI keeps JAX's compiled programs: ``$XDG_CACHE_HOME/functional-gan/jax`` (``~/.cache`` by default)."""
    return Path(os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache") / "functional-gan" / "jax"


def use_compile_cache() -> None:
    """Turn on JAX's persistent compilation cache for this process and the ones it starts (before JAX is imported).

    A second ``train`` or ``sample`` with the same shapes then loads its programs instead of compiling them.
    Settings already in the environment (``JAX_COMPILATION_CACHE_DIR``, the minimum compile time) are kept.
    """
    os.environ.setdefault("JAX_COMPILATION_CACHE_DIR", str(compile_cache_folder()))
    # Every program, however fast it compiled: the many small ones (eager operations, restoring a checkpoint) add
    # up. Measure: `time functional-gan sample --checkpoint RUN --out x.png`, run twice, with this and with 0.2.
    os.environ.setdefault("JAX_PERSISTENT_CACHE_MIN_COMPILE_TIME_SECS", "0")
    if "jax" in sys.modules:  # imported already (main() called from Python): the environment is read at import
        import jax

        if not jax.config.jax_compilation_cache_dir:
            jax.config.update("jax_compilation_cache_dir", os.environ["JAX_COMPILATION_CACHE_DIR"])


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else list(argv)
    parser = build_parser(_command_of(argv))
    args = parser.parse_args(argv)
    if args.command in CACHED_COMMANDS and not args.no_compile_cache and os.environ.get("FUNCTIONAL_GAN_NO_COMPILE_CACHE") != "1":
        use_compile_cache()
    args.argv = argv
    try:
        return args.handler(args)
    except UserError as error:
        print(f"functional-gan {args.command}: error: {error}", file=sys.stderr)
        return 2
    except OSError as error:
        if error.filename is None:  # not about a path: a bug or a system failure, with its traceback
            raise
        # A path from the command line that cannot be read or written (missing, a file where a folder should be,
        # no permission, disk full): one line, and what was written before stays.
        paths = " → ".join(str(p) for p in (error.filename, error.filename2) if p is not None)
        print(f"functional-gan {args.command}: error: {paths}: {error.strerror or error}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        print("interrupted; checkpoints already written are kept", file=sys.stderr)
        return 130


if __name__ == "__main__":
    sys.exit(main())
