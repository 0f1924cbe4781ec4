"""The benchmark's report: the tables (each time against PyTorch eager's), the header, the scaling plot, Markdown
and JSON."""

from __future__ import annotations

import dataclasses
import json
from pathlib import Path

import numpy as np

from functional_gan.benchmarks.timing import Context, Record


def _ms(value) -> str:
    return "—" if value is None else f"{value * 1e3:.1f}"


def ratio_to(records: list[Record], reference: str = "torch_eager") -> dict[tuple[str, int, str], float]:
    """time(framework) / time(reference) for each workload × batch (below 1: faster than the reference)."""
    base = {(r.workload, r.batch): r.median_s for r in records if r.framework == reference and r.median_s}
    return {(r.workload, r.batch, r.framework): r.median_s / base[(r.workload, r.batch)]
            for r in records if r.median_s and (r.workload, r.batch) in base}


def format_table(records: list[Record], markdown: bool = False) -> str:
    ratios = ratio_to(records)
    header = ["workload", "batch", "framework", "median ms", "min–max ms", "compile s", "GFLOP/s", "% of peak",
              "peak MB", "time / torch eager"]
    rows = []
    for r in records:
        rows.append([
            r.workload, str(r.batch), r.framework, _ms(r.median_s),
            "—" if r.min_s is None else f"{r.min_s * 1e3:.1f}–{r.max_s * 1e3:.1f}",
            "—" if r.compile_s is None else f"{r.compile_s:.2f}",
            "—" if r.flops_per_s is None else f"{r.flops_per_s / 1e9:.0f}",
            "—" if r.fraction_of_peak is None else f"{100 * r.fraction_of_peak:.0f}%",
            "—" if r.peak_memory_bytes is None else f"{r.peak_memory_bytes / 2**20:.0f}",
            f"{ratios[(r.workload, r.batch, r.framework)]:.2f}" if (r.workload, r.batch, r.framework) in ratios else "—",
        ])
    if markdown:
        lines = ["| " + " | ".join(header) + " |", "|" + "---|" * len(header)]
        lines += ["| " + " | ".join(row) + " |" for row in rows]
        notes = [f"- {r.workload} {r.framework}: {r.note}" for r in records if r.note and section(r) == "main"]
        return "\n".join(lines + ([""] + sorted(set(notes)) if notes else []))
    widths = [max(len(h), *(len(row[i]) for row in rows)) for i, h in enumerate(header)]
    fmt = "  ".join("{:<%d}" % w if i < 3 else "{:>%d}" % w for i, w in enumerate(widths))
    return "\n".join([fmt.format(*header)] + [fmt.format(*row) for row in rows])


def header_lines(ctx: Context) -> list[str]:
    v = ctx.versions
    return [
        f"JAX {v['jax']} on {ctx.backend} ({ctx.jax_device}); PyTorch {v['torch']} on {ctx.torch_device}, "
        f"{v['threads']} threads; CPU: {v['cpu']}",
        f"XLA_FLAGS: {v['xla_flags'] or '(none)'}; transposed convolutions: {v['transposed_conv_form']} form; "
        f"BatchNorm: {v.get('batchnorm_form', 'reductions')} form; convolutions: {v.get('convolutions', 'XLA')} "
        "(rows jax_jit: XLA's, jax_jit_onednn: oneDNN's)",
        f"float32, {'TF32 allowed on both sides (GPUs; no effect on CPUs)' if ctx.tf32 else 'TF32 off on both sides'}; "
        f"medians of {ctx.repeats} interleaved repeats after warm-up; compile time apart",
    ]


def peak_lines(ctx: Context, records: list[Record]) -> list[str]:
    """The machine's measured peak (the best GEMM of the run, either framework), the CPU's theoretical one beside it,
    and each framework's DCGAN step as a fraction of the measured peak."""
    from functional_gan.benchmarks.timing import theoretical_peak

    if not ctx.peak:
        return []
    best = max(ctx.peak, key=ctx.peak.get)
    theoretical, how = theoretical_peak() if ctx.backend == "cpu" else (None, "not reckoned off a CPU")
    lines = [f"Best GEMM: {ctx.peak[best] / 1e9:.0f} GFLOP/s ({best}, {ctx.peak_at[best]}; the best of "
             f"{len([r for r in records if r.workload.startswith('matmul')]) // 2} GEMM timings per framework); "
             f"the other framework's best {min(ctx.peak.values()) / 1e9:.0f} GFLOP/s"]
    if ctx.fma_peak:
        rate, measured_how = ctx.fma_peak
        used = "the peak the fractions divide by" if rate >= ctx.peak[best] else "below the best GEMM, which stays the peak"
        lines.append(f"Measured FMA throughput of the CPU: {rate / 1e9:.0f} GFLOP/s ({measured_how}); {used}")
    if theoretical:
        lines.append(f"Theoretical float32 peak of the CPU: {how}; measured/theoretical "
                     f"{ctx.peak[best] / theoretical:.0%}")
    for batch in sorted({r.batch for r in records if r.workload == "dcgan_step"}):
        steps = [r for r in records if r.workload == "dcgan_step" and r.batch == batch and r.fraction_of_peak]
        if steps:
            lines.append(f"DCGAN step, batch {batch}, fraction of the measured peak: " + ", ".join(
                f"{r.framework} {r.fraction_of_peak:.0%}" for r in steps))
    lines.append(f"Measured peak (the fractions of peak divide by it): {ctx.machine_peak() / 1e9:.0f} GFLOP/s")
    over = [r for r in records if r.fraction_of_peak and r.fraction_of_peak > 1.0]
    if over:
        lines.append(f"Above the measured peak ({len(over)} rows): " + "; ".join(
            f"{r.workload} {r.framework} {r.fraction_of_peak:.0%}" for r in over[:5]))
    return lines


def save_scaling_plot(records: list[Record], path: Path) -> Path:
    """Step time against batch, log-log, per framework, with the linear-cost line through JAX's batch-64 point."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(7, 5))
    steps = [r for r in records if r.workload == "dcgan_step" and r.median_s]
    for framework in sorted({r.framework for r in steps}):
        points = sorted((r.batch, r.median_s) for r in steps if r.framework == framework)
        ax.plot([b for b, _ in points], [t for _, t in points], "o-", label=framework)
    anchor = [r for r in steps if r.framework == "jax_jit" and r.batch == 64]
    if anchor:
        batches = np.array(sorted({r.batch for r in steps}))
        ax.plot(batches, anchor[0].median_s * batches / 64, "k--", linewidth=1, label="linear cost (through JAX at 64)")
    ax.set_xscale("log", base=2)
    ax.set_yscale("log")
    ax.set_xlabel("batch size")
    ax.set_ylabel("seconds per training iteration")
    ax.set_title("DCGAN step (tutorial nets, 64×64): time against batch")
    ax.legend()
    fig.tight_layout()
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, dpi=100)
    plt.close(fig)
    return path


# The tables after the main one: the prefix of their workloads' names, and their headings.
SECTIONS = {
    "layer": "Per layer: forward + backward (input and kernel gradients)",
    "pass": "Per pass: each convolution's forward, input gradient and kernel gradient alone",
    "glue": "BatchNorm + activation between the convolutions: forward + backward",
    "startup": "Start-up of the command line: whole processes, wall time",
}


def section(record: Record) -> str:
    prefix = record.workload.split(":", 1)[0]
    return prefix if prefix in SECTIONS else "main"


def to_markdown(ctx: Context, records: list[Record], plot: Path | None, command: str, method: str = "") -> str:
    """The run as a Markdown page: the command, the machine, the main table, the sections, the plot, ``method``."""
    main = [r for r in records if section(r) == "main"]
    parts = [
        "# functional_gan benchmark\n",
        f"`{command}`\n",
        "\n".join(f"- {line}" for line in header_lines(ctx)) + "\n",
        "## Results\n",
        format_table(main, markdown=True) + "\n",
        "\n".join(f"- {line}" for line in peak_lines(ctx, records)) + "\n",
    ]
    for name, heading in SECTIONS.items():
        rows = [r for r in records if section(r) == name]
        if rows:
            batch = f" (batch {rows[0].batch})" if name != "startup" else ""
            notes = sorted({f"- {r.workload}: {r.note}" for r in rows if r.note and name == "startup"})
            parts += [f"## {heading}{batch}\n", format_table(rows, markdown=True) + "\n" + "".join(n + "\n" for n in notes)]
    if plot:
        parts.append(f"## Scaling\n\n![step time against batch]({plot.name})\n")
    parts.append("## Method\n\n" + method + "\n")
    return "\n".join(parts)


def write_json(records: list[Record], path: Path) -> Path:
    """One JSON object per record (workload × framework × batch), as a list; :func:`read_json` reads it back."""
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps([dataclasses.asdict(r) for r in records], indent=1) + "\n")
    return path


def read_json(path: Path) -> list[Record]:
    return [Record(**fields) for fields in json.loads(Path(path).read_text())]
