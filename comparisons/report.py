"""``functional-gan compare``: run the comparison suite and write a Markdown report with plots."""

from __future__ import annotations

import time
from pathlib import Path

import importlib.util

import jax
import numpy as np

from functional_gan import plots

from . import GROUPS, fixtures, quality
from .common import NOISE_FLOOR, SMALL_WIDTHS, TEACHER_FORCING, TUTORIAL_WIDTHS, CheckResult, loss_small

NEEDS_NO_TORCH = ("fixtures",)  # the recorded runs are checked by the JAX side alone


def set_parity_precision() -> str:
    """Full float32 precision on both sides: no TF32 or bf16 passes on GPUs/TPUs (no effect on CPU).

    Returns the PyTorch version in use, or "not installed".
    """
    jax.config.update("jax_default_matmul_precision", "highest")
    if importlib.util.find_spec("torch") is None:
        return "not installed"
    import torch

    from functional_gan.pytorch.precision import full_float32_precision

    full_float32_precision()
    return torch.__version__


def _plot_curves(path: Path, title: str, series: dict[str, np.ndarray], ylabel: str, log: bool = False) -> Path:
    return plots.save_line_plot(series, path, title, ylabel, log=log, figsize=(9, 4.5))


def _plot_losses(path: Path, title: str, torch_metrics: dict, jax_metrics: dict) -> Path:
    return _plot_curves(path, title, {
        "PyTorch Loss_D": torch_metrics["loss_d"], "JAX Loss_D": jax_metrics["loss_d"],
        "PyTorch Loss_G": torch_metrics["loss_g"], "JAX Loss_G": jax_metrics["loss_g"],
    }, "loss")


def run_suite(out_dir: str | Path, groups=GROUPS, quality_spec: quality.QualitySpec | None = None,
              progress=print) -> tuple[list[CheckResult], Path]:
    """Run the checks of ``groups``, write ``report.md`` and its plots in ``out_dir``; return the results and the report path."""
    unknown = sorted(set(groups) - set(GROUPS))
    if unknown:
        raise ValueError(f"unknown check groups {unknown}; choose from {GROUPS}")
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    torch_version = set_parity_precision()
    if torch_version == "not installed" and set(groups) - set(NEEDS_NO_TORCH):
        raise ImportError(f"the checks {sorted(set(groups) - set(NEEDS_NO_TORCH))} need torch; only {NEEDS_NO_TORCH} run without it")
    if set(groups) - set(NEEDS_NO_TORCH):
        from . import checks
    results: list[CheckResult] = []
    figures: list[tuple[str, Path]] = []
    started = time.perf_counter()

    def add(result: CheckResult) -> CheckResult:
        verdict = "reported" if result.passed is None else ("PASS" if result.passed else "FAIL")
        progress(f"[{verdict}] {result.name}: {result.measured:.3g} ({result.tolerance})")
        results.append(result)
        return result

    progress(f"Comparison suite on JAX {jax.__version__} ({jax.default_backend()}) vs PyTorch {torch_version}")
    if "layers" in groups:
        add(checks.check_layers())
    if "gradient-stopping" in groups:
        add(checks.check_gradient_stopping())
    if "linreg" in groups:
        add(checks.check_linreg("float64"))
        add(checks.check_linreg("float32"))
    curves = {}
    if "trajectories" in groups:
        from . import reference_runs

        small_run = reference_runs.run_tutorial(SMALL_WIDTHS, "float64")
        small = add(checks.check_float64_trajectory(SMALL_WIDTHS, f"DCGAN float64 trajectory, small widths, {SMALL_WIDTHS.steps} steps",
                                                    small_run))
        add(checks.check_nnx_float64_trajectory(SMALL_WIDTHS, small_run))
        add(checks.check_float64_trajectory(TUTORIAL_WIDTHS, "DCGAN float64 trajectory, the tutorial's widths (64×64, ngf = ndf = 64)"))
        from functional_gan.config import TUTORIAL
        from functional_gan.losses import LOSSES

        for loss in LOSSES:  # every other loss against its own PyTorch reference loop (the tutorial's: above)
            if loss != TUTORIAL.loss:
                add(checks.check_loss_trajectory(loss_small(loss)))
        curves["float64 trajectory"] = small.curves["per_step_max_abs"]
        figures.append(("Loss curves, float64, both frameworks (they coincide)", _plot_losses(
            out / "losses_float64.png", "float64: PyTorch and JAX loss curves", small.curves["torch"], small.curves["jax"])))
    if "teacher-forcing" in groups:
        teacher = add(checks.check_teacher_forced_float32(TEACHER_FORCING))
        add(checks.check_intermediates_float32(TUTORIAL_WIDTHS))
        drift = add(checks.report_free_running_float32(TEACHER_FORCING))
        curves["float32 free-running (drift)"] = drift.curves["per_step_max_abs"]
        curves["float32 teacher-forced (relative)"] = teacher.curves["metric_rel"]
        figures.append(("Loss curves, float32 free-running (the drift)", _plot_losses(
            out / "losses_float32.png", "float32: PyTorch and JAX loss curves", drift.curves["torch"], drift.curves["jax"])))
    if "noise-floor" in groups:
        progress(f"Noise floor at the tutorial's widths: PyTorch on {NOISE_FLOOR.steps} float64 steps, 4 batch orders, "
                 "channels_last, BatchNorm as plain sums, and the JAX replay (a few minutes on 2 CPU cores) ...")
        full = add(checks.check_noise_floor(NOISE_FLOOR, "float64"))
        drift = add(checks.check_noise_floor(TEACHER_FORCING, "float32"))
        figures.append(("The noise floor: JAX − PyTorch next to PyTorch − PyTorch (the batches in another order, channels_last, or "
                        "BatchNorm's statistics as plain sums), "
                        "per step, max over the five metrics (log scale)", _plot_curves(
            out / "noise_floor.png", "JAX−PyTorch and PyTorch−PyTorch (same mathematics, another summation order)", {
                "float64 full widths: JAX − PyTorch": np.maximum(full.curves["jax_per_step"], 1e-18),
                "float64 full widths: PyTorch − PyTorch (batch permuted)": np.maximum(full.curves["torch_per_step"], 1e-18),
                "float64 full widths: PyTorch − PyTorch (channels_last)": np.maximum(full.curves["channels_last_per_step"], 1e-18),
                "float64 full widths: PyTorch − PyTorch (BatchNorm as plain sums)":
                    np.maximum(full.curves["summed_batchnorm_per_step"], 1e-18),
                "float32 free-running: JAX − PyTorch": np.maximum(drift.curves["jax_per_step"], 1e-18),
                "float32 free-running: PyTorch − PyTorch (batch permuted)": np.maximum(drift.curves["torch_per_step"], 1e-18),
            }, "difference", log=True)))
    if "fixtures" in groups:
        for check in (fixtures.check_trajectory_fixture, fixtures.check_teacher_forcing_fixture, fixtures.check_linreg_fixture):
            add(check())
    if curves:
        figures.append(("Per-step max |JAX − PyTorch| over the five metrics (log scale)", _plot_curves(
            out / "differences.png", "Per-step max |JAX − PyTorch| of the metrics",
            {label: np.maximum(values, 1e-18) for label, values in curves.items()}, "difference", log=True)))

    quality_section = ""
    if "quality" in groups:
        spec = quality_spec or quality.QualitySpec()
        progress(f"Sample quality: {len(spec.seeds)} seeds × 2 frameworks × {spec.run.steps} iterations on the built-in digits ...")
        q = quality.compare_quality(spec, progress, confidence=quality.family_confidence(len(spec.seeds)))
        for metric, label in (("fd", "Fréchet distance (lower is better)"), ("score", "classifier score (higher is better)")):
            add(quality_result(metric, label, q))
        seed = spec.seeds[0]
        figures.append((f"Sample quality run, seed {seed}: loss curves",
                        _plot_losses(out / "losses_quality_run.png", f"digits, seed {seed}, float32", q["curves"][seed]["pytorch"], q["curves"][seed]["jax"])))
        figures.append(("Samples: real digits, trained in PyTorch, trained in JAX (same initial weights, data and noise)",
                        plots.save_grids_side_by_side({"real": q["real_samples"], "PyTorch": q["samples"]["pytorch"], "JAX": q["samples"]["jax"]}, out / "samples.png")))
        quality_section = (
            f"\nThe quality classifier (an MLP trained in JAX on 80% of the digits) scores {q['classifier_accuracy']:.1%} on the other 20%. "
            f"An untrained generator's Fréchet distance is {q['untrained_fd']:.0f}.\n"
        )

    report = out / "report.md"
    lines = [
        "# functional_gan comparison report\n",
        f"JAX {jax.__version__} on {jax.default_backend()}, PyTorch {torch_version}; float32 matmul/conv precision 'highest' "
        f"on both sides (no TF32/bf16). {len(results)} checks in {time.perf_counter() - started:.0f} s.\n",
        "| check | measured | noise floor | tolerance | result | detail |", "|---|---|---|---|---|---|",
    ]
    for r in results:
        lines.append(f"| {r.name} | {r.measured:.3g} | {r.noise_floor} | {r.tolerance} | {_verdict(r, '**FAIL**')} | {r.detail} |")
    lines.append(quality_section)
    for caption, path in figures:
        lines.append(f"## {caption}\n\n![{caption}]({path.name})\n")
    report.write_text("\n".join(lines))
    write_html(report.with_suffix(".html"), lines[1], results, quality_section, figures)
    return results, report


def quality_result(metric: str, label: str, q: dict) -> CheckResult:
    """One sample-quality row: judged (pass/fail) with at least ``quality.JUDGED_SEEDS`` paired seeds, each of the two
    metrics at the confidence that keeps the pair's false-alarm rate at 5% (Bonferroni); with fewer seeds an estimate
    with its interval, reported, not judged (two seeds of chaotic float32 training cannot tell a gap from chance)."""
    v = q["verdicts"][metric]
    judged = v["seeds"] >= quality.JUDGED_SEEDS
    criterion = (f"the {v['confidence']:.1%} interval of mean(JAX − PyTorch) holds 0 (the two quality rows together: 5% "
                 "false alarms)" if judged else
                 f"reported, not judged: {v['seeds']} seeds (a pass/fail needs {quality.JUDGED_SEEDS}: --quality-seeds "
                 f"{quality.JUDGED_SEEDS})")
    return CheckResult(
        f"long float32 runs on digits, {v['seeds']} paired seeds: {label}", criterion, v["mean_difference"],
        v["passed"] if judged else None,
        f"JAX − PyTorch = {v['mean_difference']:.3g}, {v['confidence']:.1%} interval [{v['interval'][0]:.3g}, "
        f"{v['interval'][1]:.3g}], paired t-test p = {v['p_value']:.2f}; a true difference of {v['detectable']:.3g} "
        f"would be detected with {v['power']:.0%} power. Means: JAX {v['jax_mean']:.3g}, PyTorch {v['pytorch_mean']:.3g}; "
        f"per seed JAX {np.round(q['scores']['jax'][metric], 2).tolist()}, PyTorch "
        f"{np.round(q['scores']['pytorch'][metric], 2).tolist()}",
    )


def _verdict(result: CheckResult, fail: str) -> str:
    return "reported" if result.passed is None else ("pass" if result.passed else fail)


def write_html(path: Path, summary: str, results: list[CheckResult], notes: str, figures: list[tuple[str, Path]]) -> Path:
    """The report as one self-contained HTML file: the same table, the plots embedded (base64 PNG)."""
    import base64
    import html

    rows = "\n".join(
        "<tr>" + "".join(f"<td>{html.escape(str(cell))}</td>" for cell in (
            r.name, f"{r.measured:.3g}", r.noise_floor, r.tolerance, _verdict(r, "FAIL"), r.detail)) + "</tr>"
        for r in results
    )
    images = "\n".join(
        f"<h2>{html.escape(caption)}</h2>\n<img alt=\"{html.escape(caption)}\" src=\"data:image/png;base64,"
        f"{base64.b64encode(image.read_bytes()).decode()}\">"
        for caption, image in figures
    )
    path.write_text(f"""<!DOCTYPE html>
<html lang="en"><head><meta charset="utf-8"><title>functional_gan comparison report</title>
<style>body{{font-family:sans-serif;max-width:1200px;margin:auto}} table{{border-collapse:collapse}}
td,th{{border:1px solid #ccc;padding:4px;vertical-align:top;font-size:90%}} img{{max-width:100%}}</style></head>
<body><h1>functional_gan comparison report</h1>
<p>{html.escape(summary)}</p>
<table><tr><th>check</th><th>measured</th><th>noise floor</th><th>tolerance</th><th>result</th><th>detail</th></tr>
{rows}
</table>
<p>{html.escape(notes.strip())}</p>
{images}
</body></html>
""")
    return path
