"""The checks of the comparison suite: each compares JAX numbers with a PyTorch reference run.

Every check returns a :class:`CheckResult` (the tolerance, the measured maximum difference, and
curves for the report). The tests in this folder assert them; ``functional-gan compare`` prints
them as a table with plots.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
import torch

from functional_gan import layers, linreg
from functional_gan.config import TrainConfig
from functional_gan.metrics import METRIC_NAMES
from functional_gan.pytorch import linreg as torch_linreg
from functional_gan.replay import config_from_state_dicts, replay
from functional_gan.train import make_gan_step

from . import reference_runs
from .common import CheckResult, TeacherForced, compare_trajectory, teacher_forced_step, teacher_forcing_verdict

# --- float64 trajectories ----------------------------------------------------------------------


def check_float64_trajectory(spec: TrainConfig, name: str, torch_run=None, tolerance: float = 1e-10) -> CheckResult:
    """Every metric of every step, and every final parameter and running statistic, within ``tolerance``."""
    run = torch_run or reference_runs.run_tutorial(spec, "float64")
    return compare_trajectory(
        name, spec, run.initial_generator, run.initial_discriminator, run.metrics, run.final_generator, run.final_discriminator, tolerance
    )


def check_linreg(dtype_name: str = "float64") -> CheckResult:
    """The four PyTorch linear regressions against the JAX trainers."""
    data = linreg.make_data()
    x64 = dtype_name == "float64"
    tolerance = 1e-12 if x64 else 1e-5
    with jax.enable_x64(x64):
        jax_results = [t(data, dtype=jnp.float64 if x64 else jnp.float32) for t in linreg.JAX_TRAINERS]
    torch_results = [t(data, dtype=torch.float64 if x64 else torch.float32) for t in torch_linreg.TORCH_TRAINERS]
    measured = max(max(abs(j.b - t.b), abs(j.w - t.w)) for j in jax_results for t in torch_results)
    return CheckResult(
        f"linear regression, {dtype_name}: 3 JAX trainers × 4 PyTorch variants",
        f"max |Δb|, |Δw| ≤ {tolerance:g}", measured, measured <= tolerance,
        f"JAX b = {jax_results[0].b:.8f}, w = {jax_results[0].w:.8f}; PyTorch b = {torch_results[0].b:.8f}, w = {torch_results[0].w:.8f}",
    )


# --- float32: teacher forcing and free-running drift ----------------------------------------------


def check_teacher_forced_float32(spec: TrainConfig, torch_run=None, steps: list[int] | None = None) -> CheckResult:
    """From PyTorch's state at each step t, one JAX step must reproduce PyTorch's step t.

    The tolerances and their reasons are :data:`~.common.TEACHER_FORCING_TOLERANCE`'s (metrics 1e-5
    relative, parameters 2·lr for Adam's sign flips, running statistics).
    """
    run = torch_run or reference_runs.run_tutorial(spec, "float32", record_snapshots=True)
    real, noise = reference_runs.make_batches(spec)
    config = config_from_state_dicts(run.initial_generator, run.initial_discriminator, spec.batch_size, spec)
    step = make_gan_step(config)
    indices = steps if steps is not None else range(spec.steps)
    rows = [
        teacher_forced_step(
            config, step, run.snapshots[t], run.snapshots[t + 1], real[t], noise[t], [run.metrics[k][t] for k in METRIC_NAMES]
        )
        for t in indices
    ]
    passed, tolerance, detail = teacher_forcing_verdict(rows, spec.lr)
    columns = {name: np.array(values) for name, values in zip(TeacherForced._fields, zip(*rows))}
    return CheckResult(
        f"float32 teacher forcing, {len(rows)} steps of a {spec.steps}-step PyTorch run",
        tolerance, max(r.metric_rel for r in rows), passed, detail, columns,
    )


def report_free_running_float32(spec: TrainConfig, torch_run=None) -> CheckResult:
    """float32 trajectories of both frameworks from the same start: the drift, reported as a curve (not asserted)."""
    run = torch_run or reference_runs.run_tutorial(spec, "float32")
    real, noise = reference_runs.make_batches(spec)
    ours = replay(run.initial_generator, run.initial_discriminator, real, noise, "float32", spec)
    per_step = np.max([np.abs(ours.metrics[k] - run.metrics[k]) for k in METRIC_NAMES], axis=0)
    return CheckResult(
        f"float32 free-running drift over {spec.steps} steps", "reported, not asserted (rounding is amplified: chaos)",
        float(per_step.max()), None,
        f"max |Δ metric| at step 1: {per_step[0]:.1e}, step 10: {per_step[min(9, len(per_step) - 1)]:.1e}, "
        f"last: {per_step[-1]:.1e}",
        {"per_step_max_abs": per_step, "torch": run.metrics, "jax": ours.metrics},
    )


# --- layers and gradient stopping --------------------------------------------------------------------


def check_layers() -> CheckResult:
    """Forward and gradients of every layer kind against torch.nn.functional, float64."""
    rng = np.random.default_rng(0)
    worst = {}
    with jax.enable_x64(True):
        x = rng.normal(size=(2, 6, 8, 8))
        cases = {
            "conv2d k4 s2 p1": (lambda a, w: layers.conv2d(a, w, 2, 1), lambda a, w: torch.nn.functional.conv2d(a, w, stride=2, padding=1), (5, 6, 4, 4)),
            "conv_transpose2d k4 s2 p1": (lambda a, w: layers.conv_transpose2d(a, w, 2, 1), lambda a, w: torch.nn.functional.conv_transpose2d(a, w, stride=2, padding=1), (6, 5, 4, 4)),
            "conv_transpose2d k4 s1 p0": (lambda a, w: layers.conv_transpose2d(a, w, 1, 0), lambda a, w: torch.nn.functional.conv_transpose2d(a, w, stride=1, padding=0), (6, 5, 4, 4)),
        }
        for label, (ours_fn, torch_fn, w_shape) in cases.items():
            w = rng.normal(size=w_shape)
            tx, tw = torch.tensor(x, requires_grad=True), torch.tensor(w, requires_grad=True)
            ty = torch_fn(tx, tw)
            cot = rng.normal(size=ty.shape)
            ty.backward(torch.tensor(cot))
            y, vjp = jax.vjp(ours_fn, jnp.asarray(x.transpose(0, 2, 3, 1)), jnp.asarray(w))
            dx, dw = vjp(jnp.asarray(cot.transpose(0, 2, 3, 1)))
            worst[label] = max(
                np.max(np.abs(np.asarray(y).transpose(0, 3, 1, 2) - ty.detach().numpy())),
                np.max(np.abs(np.asarray(dx).transpose(0, 3, 1, 2) - tx.grad.numpy())),
                np.max(np.abs(np.asarray(dw) - tw.grad.numpy())),
            )
        p = np.array([0.3, 1e-3, 0.0, 1.0, 0.999])
        y = np.array([1.0, 0.0, 1.0, 0.0, 1.0])
        tp = torch.tensor(p, requires_grad=True)
        loss = torch.nn.BCELoss()(tp, torch.tensor(y))
        loss.backward()
        value, grad = jax.value_and_grad(layers.bce_loss)(jnp.asarray(p), jnp.asarray(y))
        worst["BCELoss (saturated inputs included)"] = max(abs(float(value) - loss.item()), float(np.max(np.abs(np.asarray(grad) - tp.grad.numpy()) / np.maximum(np.abs(tp.grad.numpy()), 1))))
    measured = max(worst.values())
    return CheckResult(
        "per-layer forward and gradients (float64)", "max |Δ| ≤ 1e-12", measured, measured <= 1e-12,
        "; ".join(f"{k} {v:.1e}" for k, v in worst.items()),
    )


def check_gradient_stopping() -> CheckResult:
    """detach() → netG's .grad None; stop_gradient → G's gradient exactly zero; both filled without the cut."""
    from functional_gan.lessons import gan

    torch_side, jax_side = gan.torch_gan_step(), gan.jax_gan_step()
    torch_pattern = (
        torch_side[gan.TORCH_G_GRADS_NONE.format(cut="with detach()")] == torch_side["netG parameters"],
        torch_side[gan.TORCH_G_GRAD_SUM.format(cut="without detach()")] > 0.0,
    )
    jax_pattern = (
        jax_side[gan.JAX_G_GRAD_SUM.format(cut="with stop_gradient")] == 0.0,
        jax_side[gan.JAX_G_GRAD_SUM.format(cut="without stop_gradient")] > 0.0,
    )
    return CheckResult(
        "gradient stopping: detach() None ↔ stop_gradient zeros", "same pattern (exact)",
        float(jax_side[gan.JAX_G_GRAD_SUM.format(cut="with stop_gradient")]),
        torch_pattern == jax_pattern == (True, True),
        f"PyTorch (cut → None, uncut → filled): {torch_pattern}; JAX (cut → 0, uncut → ≠0): {jax_pattern}",
    )

