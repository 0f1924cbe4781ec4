"""The commands that hold JAX against PyTorch: ``replay``, ``diverge``, ``check-port`` and ``compare``."""

from __future__ import annotations

import json
from pathlib import Path

from functional_gan.cli.flags import LOSS_FIELDS, OPTIMIZER_FIELDS, command, config_flags, loss_config
from functional_gan.config import TrainConfig
from functional_gan.errors import UserError, torch_side


def _pytorch_run(p, batches: str, dtype: str, precision: str, when: str = "", formats: str = "") -> None:
    """The flags naming a PyTorch run: its two state_dicts, its batches, and the precision."""
    p.add_argument("--generator", required=True, help=f"netG state_dict file{when}{formats}")
    p.add_argument("--discriminator", required=True, help=f"netD state_dict file{when}")
    p.add_argument("--batches", required=True, help=f".npz with {batches}")
    p.add_argument("--dtype", choices=("float32", "float64"), default=dtype, help=f"precision {precision}")


def add_replay(subparsers) -> None:
    p = command(subparsers, run_replay)
    _pytorch_run(p, "'real' and 'noise' (and 'mix' for wgan-gp), NCHW as in PyTorch", "float32", "of the replay")
    config_flags(p, LOSS_FIELDS)
    p.add_argument("--out", required=True, help=".npz file for the per-step metrics")
    p.add_argument("--out-generator", help="write the final netG state_dict here (.pt or .safetensors)")
    p.add_argument("--out-discriminator", help="write the final netD state_dict here (.pt or .safetensors)")


def run_replay(args) -> int:
    """Replay a PyTorch DCGAN (or WGAN-GP) run step by step in JAX (state_dicts + the run's batches).

    Reads the tutorial models' state_dicts (.pt/.pth via torch.load(weights_only=True), or .safetensors) and an .npz
    with 'real' (steps, batch, nc, H, W) and 'noise' (steps, batch, nz, 1, 1), and for --loss wgan-gp 'mix' (steps,
    batch), the penalty's interpolation weights; runs the iterations in JAX and writes per-step metrics (loss_d,
    loss_g, d_x, d_g_z1, d_g_z2).
    """
    from functional_gan.replay import replay_files

    settings = loss_config(args)
    result = replay_files(args.generator, args.discriminator, args.batches, args.out, args.dtype, settings,
                          args.out_generator, args.out_discriminator)
    m, c = result.metrics, result.config
    print(f"Replayed {len(m['loss_d'])} steps in {args.dtype} (image {c.image_size}, nz {c.nz}, ngf {c.ngf}, ndf {c.ndf}); "
          f"last step: Loss_D {m['loss_d'][-1]:.4f}  Loss_G {m['loss_g'][-1]:.4f}  D(x) {m['d_x'][-1]:.4f}  "
          f"D(G(z)) {m['d_g_z1'][-1]:.4f} / {m['d_g_z2'][-1]:.4f}")
    print(f"Wrote {args.out}" + "".join(f", {p}" for p in (args.out_generator, args.out_discriminator) if p))
    return 0


def add_diverge(subparsers) -> None:
    p = command(subparsers, run_diverge)
    _pytorch_run(p, "'real' (steps, batch, nc, H, W) and 'noise' (steps, batch, nz, 1, 1)", "float64", "of both sides",
                 when=" at the start of the run", formats=" (.pt/.pth or .safetensors)")
    p.add_argument("--tolerance", type=float, default=None,
                   help="a fixed largest max|JAX − PyTorch| / max|PyTorch| per tensor instead of the default criterion "
                   "(float64: 1e-10; float32: --k times PyTorch float32's own error on the same iteration)")
    p.add_argument("--k", type=float, default=3.0,
                   help="float32: how many times PyTorch's own float32 error (against PyTorch float64) the port may be off")
    config_flags(p, OPTIMIZER_FIELDS, loss_dependent=False)


def run_diverge(args) -> int:
    """Find the first layer and stage where JAX and PyTorch differ in a DCGAN run.

    Runs the tutorial's iterations in PyTorch and in JAX, each iteration from PyTorch's state (Adam included) on the
    same batch and noise, and compares every intermediate in debugging order: forward (each layer of G, of D on
    real, of D on fake) → losses → D's gradients → D's update and running statistics → the G step from PyTorch's
    updated D (errG, G's gradients, update, running statistics). The JAX side is the training step's own parts. The
    reference is PyTorch in float64; in float32 each quantity may be off by --k times PyTorch float32's own error on
    the same iteration (updates judged from the same gradients). Prints the first quantity out of tolerance, with
    both sides' values. Exit status 1 if one is. Needs the torch extra.
    """
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


def _users_frame(error: BaseException, spec_path: str) -> str | None:
    """Where ``error`` was raised in code of the user's: the spec's function (``torch_loss`` in SPEC.py), else the
    innermost frame outside check-port and the array libraries (the port's model code, a library the port uses, such
    as transformers); None where every frame is check-port's or those libraries'."""
    import os
    import traceback

    import sysconfig

    frames = traceback.extract_tb(error.__traceback__)
    spec = os.path.realpath(spec_path)
    # Python's own modules are nobody's port: the frozen ones ("<frozen _collections_abc>", a `name in mapping` inside
    # check-port) and the standard library's files.
    standard = tuple(os.path.realpath(sysconfig.get_paths()[key]) + os.sep for key in ("stdlib", "platstdlib"))
    installed = tuple(os.path.realpath(sysconfig.get_paths()[key]) + os.sep for key in ("purelib", "platlib"))
    for frame in reversed(frames):
        if os.path.realpath(frame.filename) == spec:
            return f"the spec's {frame.name}() ({Path(spec_path).name}:{frame.lineno})"
    ours = os.path.dirname(os.path.dirname(os.path.realpath(__file__)))
    libraries = ("/jax/", "/jaxlib/", "/flax/", "/optax/", "/torch/", "/numpy/", "/equinox/", "/contextlib.py",
                 "/functools.py")
    for frame in reversed(frames):
        if frame.filename.startswith("<"):
            continue
        path = os.path.realpath(frame.filename)
        python_own = path.startswith(standard) and not path.startswith(installed) and "-packages" + os.sep not in path
        if not path.startswith(ours) and not python_own and not any(part in path for part in libraries):
            return f"{frame.name}() ({path}:{frame.lineno})"
    return None


def add_check_port(subparsers) -> None:
    p = command(subparsers, run_check_port)
    p.add_argument("spec", metavar="SPEC.py", help="the spec file (its folder is importable from it)")
    p.add_argument("--dtype", choices=("float32", "float64"), default="float32", help="precision of the port under test")
    p.add_argument("--steps", type=int, default=1,
                   help="optimizer steps compared, each from PyTorch's parameters and the port's own state after its "
                        "previous step")
    p.add_argument("--k", type=float, default=3.0, help="the port may be this many times PyTorch's own error in the dtype")
    p.add_argument("--allow-precision", action="store_true",
                   help="exit 0 when the only findings are of precision (float32 beyond k times PyTorch's own error, the "
                        "same program in float64 right); they are still reported")
    p.add_argument("--program", choices=("both", "jit", "eager"), default="both",
                   help="the JAX program checked: compiled with jax.jit and op by op (judged: the compiled one), or one")
    p.add_argument("--json", metavar="FILE", help="also write the report as JSON")
    p.add_argument("--markdown", metavar="FILE", help="also write the report as Markdown")
    p.add_argument("--memory", action="store_true",
                   help="after the report, the process's resident memory at the end of each phase of the check and its "
                        "peak (Linux: /proc/self/status)")
    p.add_argument("--weights", metavar="FILE",
                   help="a state_dict for torch_model() (.pt/.pth, read with torch.load(weights_only=True), or "
                        ".safetensors) instead of its seeded initialisation")
    p.add_argument("--save", metavar="DIR",
                   help="when the port agrees (exit status 0), write PyTorch's weights as the port holds them into DIR, "
                        "in the port's API's own format, with converted.json (see the convert command; that command "
                        "checks in eval mode, the compiled program, before it writes)")
    p.add_argument("--overwrite", action="store_true", help="with --save: replace a DIR that is not empty")
    p.add_argument("--by-block", action="store_true",
                   help="one block at a time, for a model whose whole check does not fit in memory: PyTorch's model "
                        "runs once in float64 to record each block's inputs and the loss's gradient at its output, then "
                        "each block is checked alone (the spec's blocks(), or PyTorch's largest ModuleList paired with "
                        "the port's list of as many modules), then the model with its blocks replaced by stand-ins (the "
                        "parts outside the blocks, and each block's arguments as the model gives them)")
    p.add_argument("--memory-limit", type=float, metavar="GIB",
                   help="the memory the check may take, in GiB, where less than the memory available: a check estimated "
                        "above it is not started; --by-block leaves out the check of the rest of the model where that "
                        "alone is estimated above it, and says so")
    p.add_argument("--no-memory-estimate", action="store_true",
                   help="run the check even where its peak memory, estimated from the PyTorch model's parameters once "
                        "it is built, exceeds the memory available (by default it stops there with exit status 2, "
                        "the estimate and --by-block's)")


def run_check_port(args) -> int:
    """Check a JAX port (Flax Linen or NNX, Equinox, plain functions) of any PyTorch model: where it first leaves PyTorch.

    Loads SPEC.py: torch_model(), example_inputs(), and the port: jax_model() returning a Flax Linen module, a Flax
    NNX module or an Equinox module (PER_SAMPLE = True for one that acts on one sample), or jax_params() with
    jax_apply(params, *inputs); optionally example_targets(), to_jax/from_jax, param_map, torch_loss/jax_loss,
    torch_optimizer/jax_optimizer (each loss called as loss(output, *inputs, *targets)), TRAIN, and OUTPUT (the field
    compared, on both sides, of a model that returns an object: OUTPUT = "logits"). Moves the PyTorch weights into the port and compares, in debugging order,
    each layer's output, the output, the loss, every gradient, every parameter after one optimizer step and every
    buffer, for --steps steps (each from PyTorch's parameters and the port's own state after its previous step). The
    port runs compiled with jax.jit (as training runs it; judged) and op by op; a difference in one of them alone is
    named as a JAX/XLA matter. PyTorch in float64 is the reference; a quantity passes when the port is within k times
    PyTorch's own error in that dtype (the batch in other orders). Exit status 0: agreement; 1: a divergence (named:
    a value out of tolerance, or a shape that differs); 2: a spec it cannot use (a missing function, a weight that
    cannot be paired, a param_map that is not a dict, a port that computes in another dtype than --dtype, an
    exception raised in the spec's or the port's code; a fault of check-port's own, its traceback printed); 3: precision findings only (beyond k times PyTorch's own
    error, the mathematics right, and more than √eps of the scale: named with where it starts and its verified
    cause; 0 with --allow-precision). Smaller precision differences are notes (exit 0); float64 counts the port's
    own error too (its program's float32 error times 2⁻²⁹). Needs the torch extra (and equinox
    for Equinox ports). Examples: examples/port/.
    """
    port = torch_side("functional_gan.testing", "check-port")
    if not args.k > 0:
        raise UserError(f"--k must be positive, got {args.k}")
    programs = port.PROGRAMS if args.program == "both" else (args.program,)
    for target in (args.json, args.markdown):  # an unusable folder fails now, before the port is checked
        if target:
            Path(target).parent.mkdir(parents=True, exist_ok=True)
    spec = port.load_spec(args.spec)
    converting = port_convert() if (args.weights or args.save) else None
    if args.save:  # refused now, before the check, rather than after it
        converting.refuse_existing(args.save, args.overwrite)
    state = converting.read_weights(args.weights, spec.torch_model()) if args.weights else None
    if args.by_block and args.save:
        raise UserError("--save writes what the whole-model check agreed on: it cannot be used with --by-block")
    from functional_gan.testing.memory import available

    if args.memory_limit is not None and not args.memory_limit > 0:
        raise UserError(f"--memory-limit must be a positive number of GiB, got {args.memory_limit}")
    limit = None if args.no_memory_estimate else available()
    if args.memory_limit is not None and not args.no_memory_estimate:
        limit = min(x for x in (limit, args.memory_limit * 2 ** 30) if x is not None)
    try:
        if args.by_block:
            from functional_gan.testing.blocks import check_by_block

            report = check_by_block(spec, args.dtype, args.steps, args.k, programs=programs, torch_state=state,
                                    memory_limit=limit, progress=True, allow_precision=args.allow_precision)
        else:
            report = port.check_port(spec, args.dtype, args.steps, args.k, programs=programs, torch_state=state,
                                     export=bool(args.save), memory_limit=limit, progress=True,
                                     allow_precision=args.allow_precision)
    except (UserError, MemoryError, KeyboardInterrupt):
        raise
    except Exception as error:  # raised in the spec's or the port's code: exit 2 with one line, never 1 (a divergence)
        where = _users_frame(error, args.spec)
        message = str(error).strip().splitlines()[0] if str(error).strip() else ""
        if where is None:  # nothing of the spec's or the port's on the way: a fault of check-port's, with its traceback
            import traceback

            traceback.print_exc()
            raise UserError(f"check-port itself failed: {type(error).__name__}: {message} (its traceback is above; not "
                            "a verdict on the port: please report it with the spec)") from error
        raise UserError(f"the check stopped on an exception raised in {where}: {type(error).__name__}: {message} "
                        "(not a verdict on the port: fix the spec or the port there and run the check again)") from error
    print(report.format())
    if args.memory:
        print("\n" + report.memory.format())
    if args.save:
        if report.exit_status() == 0:
            written = converting.write_converted(args.save, report.api, report.converted,
                                                 converting.record_of(report, spec, args.weights), args.overwrite)
            print(f"\nWrote the port's weights to {written} ({report.api}; read them with "
                  "functional_gan.testing.load_converted)")
        else:
            print(f"\nNothing written to {args.save}: the port does not agree with PyTorch.")
    for flag, text in ((args.json, lambda: json.dumps(report.to_json(), indent=1, default=float) + "\n"),
                       (args.markdown, lambda: report.format(markdown=True))):
        if flag:
            Path(flag).write_text(text())
    return report.exit_status()


def port_convert():
    """functional_gan.testing.convert, with the torch extra's check."""
    torch_side("functional_gan.testing", "convert")
    from functional_gan.testing import convert

    return convert


def add_convert(subparsers) -> None:
    p = command(subparsers, run_convert)
    p.add_argument("spec", metavar="SPEC.py", help="the check-port spec of the model and its port")
    p.add_argument("--weights", required=True, metavar="FILE",
                   help="the PyTorch state_dict: .pt/.pth (torch.load(weights_only=True): a pickle carrying code is "
                        "refused) or .safetensors")
    p.add_argument("--out", required=True, metavar="DIR", help="the folder to write (refused if it exists and is not "
                                                                  "empty, unless --overwrite)")
    p.add_argument("--overwrite", action="store_true", help="replace DIR if it is not empty (only by a complete folder)")
    p.add_argument("--k", type=float, default=3.0, help="the port may be this many times PyTorch's own float32 error")
    p.add_argument("--allow-precision", action="store_true",
                   help="write also when the only findings are of precision (see check-port)")


def run_convert(args) -> int:
    """Convert a PyTorch state_dict into a JAX port's weights, written only if the port is checked to agree.

    Reads --weights into the spec's torch_model() (every missing or unexpected key and every shape that differs
    named), moves them into the port with check-port's pairing, checks the port on the spec's example inputs in eval
    mode (TRAIN = False), float32, compiled with jax.jit: every paired layer's output and the output within k times
    PyTorch's own float32 error. Only if it agrees, writes into --out the port's weights in its API's own format (an
    orbax checkpoint of the Linen variables or of the NNX state, eqx.tree_serialise_leaves of the Equinox (model,
    state), safetensors for a plain parameter tree) and converted.json (the pairing, the verdict and its worst ratio,
    the versions, every file's SHA-256), into a temporary folder renamed into place when complete. Read them back with
    functional_gan.testing.load_converted(DIR, template). Exit status 0: written; 1: the port diverges, nothing written
    (the first divergence named); 2: weights or a spec it cannot use; 3: precision findings only, nothing written
    (written with --allow-precision).
    """
    convert = port_convert()
    from functional_gan.testing import load_spec

    if not args.k > 0:
        raise UserError(f"--k must be positive, got {args.k}")
    report, written = convert.convert(load_spec(args.spec), args.weights, args.out, args.overwrite, args.k,
                                      args.allow_precision)
    print("\n".join(report.summary()))
    print("\n" + report.verdict())
    if written is None:
        print(f"\nNothing written to {args.out}.")
        return report.exit_status()
    print(f"\nWrote {written}: the port's weights ({report.api}) and {convert.MANIFEST}; read them with "
          f"functional_gan.testing.load_converted({str(written)!r}, template).")
    return 0


def add_compare(subparsers) -> None:
    p = command(subparsers, run_compare)
    from functional_gan.comparisons import GROUPS

    p.add_argument("--out", default="runs/compare", help="folder for report.md and its plots")
    p.add_argument("--only", nargs="+", choices=GROUPS, metavar="GROUP",
                   help=f"run only these groups of checks: {', '.join(GROUPS)}")
    p.add_argument("--skip-quality", action="store_true", help="skip the long float32 runs (the slowest part)")
    p.add_argument("--skip-noise-floor", action="store_true",
                   help="skip the noise floor at the tutorial's widths (float64, ~5 min on 2 cores)")
    p.add_argument("--quality-steps", type=int, default=300, help="iterations of each long float32 run")
    p.add_argument("--quality-seeds", type=int, default=8,
                   help="paired seeds of the long runs (each trains once per framework; ~50 s per seed on 2 cores); "
                        "from 8 on the two quality rows are judged (5%% false alarms for the pair), with fewer they are "
                        "estimates with their intervals, reported")


def run_compare(args) -> int:
    """Run the comparison suite against PyTorch and write a report with plots.

    Runs the checks of the comparison suite (per-layer values, gradient stopping, linear regression, float64
    trajectories, float32 teacher forcing, recorded fixtures, and long float32 runs on the digits compared by sample
    quality) and writes report.md with its plots. Needs the torch extra, except '--only fixtures'.
    """
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
