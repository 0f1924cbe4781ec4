"""``functional-gan bench``: JAX and PyTorch timed on the same work (:mod:`functional_gan.benchmarks.bench`)."""

from __future__ import annotations

import shlex
from pathlib import Path

from functional_gan.cli.flags import command
from functional_gan.errors import UserError, torch_side

def add_bench(subparsers) -> None:
    p = command(subparsers, run_bench)  # (only when `bench` is the command: the import below loads JAX)
    from functional_gan.benchmarks.bench import FULL_BATCHES, SCALING_BATCHES, SCAN_STEPS

    p.add_argument("--quick", action="store_true", help="batch 64 only, few repeats, no scaling sweep (1-2 minutes on 2 CPU "
                   "cores); with --check-port, the MNIST example only")
    p.add_argument("--batch-sizes", type=int, nargs="+", default=None,
                   help=f"DCGAN step batches (default: {' '.join(map(str, FULL_BATCHES))}; --quick: 64)")
    p.add_argument("--scaling", type=int, nargs="*", default=None,
                   help=f"batches of the scaling sweep, plotted (default: {' '.join(map(str, SCALING_BATCHES))}; --quick: none)")
    p.add_argument("--repeats", type=int, default=None, help="timed repeats per framework (default 7; --quick 3)")
    p.add_argument("--scan-steps", type=int, default=SCAN_STEPS, help="steps per call for the lax.scan variant")
    p.add_argument("--no-torch-compile", action="store_true", help="leave torch.compile out")
    p.add_argument("--tf32", action="store_true",
                   help="GPUs: let both frameworks run float32 matmuls and convolutions with TF32 inputs (default: full "
                   "float32 on both; no effect on CPUs)")
    p.add_argument("--no-startup", action="store_true", help="leave out the command line's start-up (--help, sample cold and warm)")
    p.add_argument("--no-layers", action="store_true", help="leave the per-layer, per-pass and BatchNorm timings out")
    p.add_argument("--json", metavar="FILE", help="write one record per workload × framework × batch")
    p.add_argument("--markdown", metavar="FILE", help="write the tables, the method and the machine as Markdown")
    p.add_argument("--plot", metavar="FILE", help="scaling plot (PNG; default: beside --markdown or --json, named after it: REPORT-scaling.png)")
    p.add_argument("--check-port", nargs="?", const="all", metavar="SPEC",
                   help="instead of the frameworks' timings: check-port's wall time and peak memory on the example "
                   "ports of a clone (examples/port: ResNet-50, GPT-2 124M in float32 and float64, whole and block by "
                   "block; about 25 minutes and up to 12 GiB on 2 cores), each check a process of its own, written as "
                   "check-port-memory.json and .md beside --json/--markdown (default: benchmarks/results); SPEC: one "
                   "example's checks (gpt2.py, resnet50_nnx.py, ...); --quick: the MNIST example only")


def _plan(args):
    from functional_gan.benchmarks.bench import FULL_BATCHES, SCALING_BATCHES, Plan

    repeats = args.repeats if args.repeats is not None else (3 if args.quick else 7)
    batches = args.batch_sizes if args.batch_sizes is not None else ([64] if args.quick else list(FULL_BATCHES))
    scaling = args.scaling if args.scaling is not None else ([] if args.quick else list(SCALING_BATCHES))
    if not batches or min(batches + scaling + [repeats, args.scan_steps]) <= 0:
        raise UserError("batch sizes, repeats and --scan-steps must be positive")
    return Plan(tuple(sorted(set(batches) | set(scaling))), repeats, args.scan_steps, not args.no_torch_compile,
                args.tf32, not args.no_layers, not args.no_startup)


def run_bench(args) -> int:
    """Benchmark JAX against PyTorch on the same work (DCGAN step, sampling, linear regression).

    JAX and PyTorch timed on the same work, side by side in one run: the DCGAN training step (the tutorial's nets,
    64x64), sampling 64 images, the book's linear regression, and each convolution of the step. Frameworks: JAX jit
    (and K steps in one lax.scan), PyTorch eager and torch.compile.
    """
    torch_side("torch", "the benchmark (it compares with PyTorch)")
    if args.check_port:
        return _check_port_rows(args)
    from functional_gan.benchmarks import bench, report

    plan = _plan(args)
    for target in (args.json, args.markdown, args.plot):  # unusable output paths fail now, not after the timings
        if target:
            Path(target).parent.mkdir(parents=True, exist_ok=True)
    ctx, records = bench.run(plan)
    print(report.format_table([r for r in records if report.section(r) == "main"]))
    for line in report.peak_lines(ctx, records):
        print(line)
    for name, heading in report.SECTIONS.items():
        rows = [r for r in records if report.section(r) == name]
        if rows:
            print(f"\n{heading}:")
            print(report.format_table(rows))
    plot = None
    if len({r.batch for r in records if r.workload == "dcgan_step"}) > 1:
        # beside the report, named after it: a second run's report does not overwrite the first's plot
        report_path = Path(args.markdown or args.json) if (args.markdown or args.json) else None
        target = args.plot or (str(report_path.with_name(f"{report_path.stem}-scaling.png")) if report_path else None)
        if target:
            plot = report.save_scaling_plot(records, Path(target))
            print(f"Wrote {plot}")
    if args.json:
        print(f"Wrote {report.write_json(records, Path(args.json))}")
    if args.markdown:
        command = "functional-gan " + shlex.join(args.argv)
        Path(args.markdown).write_text(report.to_markdown(ctx, records, plot, command, bench.method()))
        print(f"Wrote {args.markdown}")
    return 0


def _check_port_rows(args) -> int:
    """``bench --check-port``: the rows of :mod:`functional_gan.benchmarks.check_port_memory`."""
    from functional_gan.benchmarks import check_port_memory

    if not check_port_memory.EXAMPLES.is_dir():
        raise UserError(f"bench --check-port checks the example ports of a clone of the repository "
                        f"(examples/port), which the installed package does not hold: {check_port_memory.EXAMPLES} is "
                        "not there; run it from a clone (pip install -e .)")
    specs = sorted({spec for spec, _, _ in check_port_memory.CHECKS})
    only = None if args.check_port == "all" else Path(args.check_port).name  # examples/port/gpt2.py: gpt2.py
    if only is not None and only not in specs:
        raise UserError(f"bench --check-port {only}: no such example; the examples measured: {', '.join(specs)}")
    if only is not None and args.quick:
        raise UserError("bench --check-port: --quick (the MNIST example alone) and an example's name exclude each other")
    target = args.json or args.markdown
    out = str(Path(target).parent) if target else "benchmarks/results"
    argv = ["--out", out] + (["--quick"] if args.quick else []) + (["--only", only] if only is not None else [])
    return check_port_memory.main(argv)
