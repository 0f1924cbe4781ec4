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
from functional_gan.pytorch import dcgan
from functional_gan.pytorch import linreg as torch_linreg
from functional_gan.replay import config_from_state_dicts, replay
from functional_gan.train import make_gan_step

from . import reference_runs
from .common import CheckResult, TeacherForced, compare_trajectory, teacher_forced_step, teacher_forcing_verdict

# --- float64 trajectories ----------------------------------------------------------------------


def check_float64_trajectory(spec: TrainConfig, name: str, torch_run=None, tolerance: float = 1e-10) -> CheckResult:
    """Every metric of every step, and every final parameter and running statistic, within ``tolerance``."""
    run = torch_run or reference_runs.run_tutorial(spec, "float64")
    result = compare_trajectory(
        name, spec, run.initial_generator, run.initial_discriminator, run.metrics, run.final_generator, run.final_discriminator, tolerance
    )
    result.noise_floor = f"{torch_self_gap(spec, run):.2e} (PyTorch−PyTorch, median of 3 batch permutations)"
    return result


def check_nnx_float64_trajectory(spec: TrainConfig, torch_run, tolerance: float = 1e-12) -> CheckResult:
    """The Flax NNX port of the step (``train --api nnx``) replaying the PyTorch run of the Linen row: the same
    check (every metric, every final parameter and running statistic) on the same PyTorch run, within 1e-12
    (measured over 100 steps: 3.1e-15; the Linen row's bound, 1e-10, leaves room for longer runs)."""
    import dataclasses

    result = compare_trajectory(
        f"Flax NNX step float64 trajectory, small widths, {spec.steps} steps", dataclasses.replace(spec, api="nnx"),
        torch_run.initial_generator, torch_run.initial_discriminator, torch_run.metrics, torch_run.final_generator,
        torch_run.final_discriminator, tolerance,
    )
    result.noise_floor = "the Linen row's (the same PyTorch run)"
    return result


def check_loss_trajectory(spec: TrainConfig, tolerance: float = 1e-10) -> CheckResult:
    """A loss's own PyTorch reference loop (its entry's ``torch_reference``) against the JAX step, float64.

    Every metric of every iteration, every final parameter of G and D (or the critic), within ``tolerance``.
    For WGAN-GP the critic's update differentiates the gradient penalty, so this proves the second-order path.
    """
    run = reference_runs.run_loss(spec, "float64")
    result = compare_trajectory(
        f"{spec.loss} float64 trajectory, small widths, {spec.steps} steps (n_critic {spec.n_critic}, lr {spec.lr:g}, "
        f"betas ({spec.beta1:g}, {spec.beta2:g}))",
        spec, run.initial_generator, run.initial_discriminator, run.metrics, run.final_generator, run.final_discriminator,
        tolerance,
    )
    real, noise = reference_runs.make_batches(spec)
    mix = reference_runs.make_mix(spec)
    gaps = []
    for k in range(3):  # PyTorch against itself: the rows of each batch (images, noise, ε together) in another order
        order = permutation_orders(spec.steps, spec.batch_size, 1000 + k)
        permuted = (*permuted_batches(real, noise, 1000 + k), None if mix is None else np.take_along_axis(mix, order, axis=1))
        gaps.append(_run_gap(reference_runs.run_loss(spec, "float64", batches=permuted), run))
    result.noise_floor = f"{np.median(gaps):.2e} (PyTorch−PyTorch, median of 3 batch permutations)"
    return result


def torch_self_gap(spec: TrainConfig, run, permutations: int = 3) -> float:
    """Median over permuted-batch PyTorch runs of max |Δ| (metrics and final state) against ``run``: PyTorch's own noise."""
    real, noise = reference_runs.make_batches(spec)
    gaps = []
    for k in range(permutations):
        gaps.append(_run_gap(reference_runs.run_tutorial(spec, "float64", batches=permuted_batches(real, noise, 1000 + k)), run))
    return float(np.median(gaps))


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


def check_intermediates_float32(spec: TrainConfig, k: float = 3.0) -> CheckResult:
    """The divergence finder in float32 over ``spec.steps`` iterations: every intermediate within k × PyTorch's own error.

    Each iteration starts from PyTorch float64's state; each layer's output, the losses, every gradient,
    every update (from the same gradients) and running statistic is judged against PyTorch float64,
    allowed k times the largest error of PyTorch's own float32 runs of that iteration (see
    :mod:`.diverge`, the same core as ``check-port``).
    """
    from . import diverge

    net_g, net_d = dcgan.make_models(spec, dtype=torch.float64)
    real, noise = reference_runs.make_batches(spec)
    divergence, history = diverge.find_divergence(
        dcgan.state_dict_numpy(net_g), dcgan.state_dict_numpy(net_d), real, noise, "float32", settings=spec, k=k)
    entries = [e for step in history for e in step]
    judged = [e for e in entries if not e.kinks]
    ratios = np.array([e.row.ratio for e in judged])
    worst = max(judged, key=lambda e: e.row.ratio)
    detail = (f"{len(entries)} quantities over {len(history)} iteration(s); worst ratio to PyTorch's own float32 error "
              f"{worst.row.ratio:.2f} ({worst.stage}, {worst.network} {worst.name}); median {np.median(ratios):.2f}; "
              f"gradients behind a ReLU input float32 moved across 0 (chance): {len(entries) - len(judged)}")
    if divergence is not None:
        detail = diverge.format_divergence(divergence, history, "float32", k=k).splitlines()[0] + "; " + detail
    return CheckResult(
        f"float32 intermediates, {spec.steps} iterations at {spec.image_size}×{spec.image_size}, batch {spec.batch_size}",
        f"every intermediate |JAX − PyTorch64| ≤ {k:g} × max(PyTorch32's own error, 4 ulps), relative to its scale",
        worst.row.ratio, divergence is None, detail, {"ratio": ratios},
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



# --- the noise floor: PyTorch against itself ----------------------------------------------------


def permuted_batches(real: np.ndarray, noise: np.ndarray, seed: int) -> tuple[np.ndarray, np.ndarray]:
    """The same batches with the images (and their noise rows) of each step in another order.

    The same mathematics: BatchNorm's statistics and the losses are means over the batch, so only
    the order of summation changes; the difference it makes is PyTorch's own rounding noise.
    """
    order = permutation_orders(real.shape[0], real.shape[1], seed)
    return (np.take_along_axis(real, order[:, :, None, None, None], axis=1),
            np.take_along_axis(noise, order[:, :, None, None, None], axis=1))


def permutation_orders(steps: int, batch: int, seed: int) -> np.ndarray:
    """(steps, batch): a random order of each step's rows, from ``default_rng(seed)``."""
    rng = np.random.default_rng(seed)
    return np.stack([rng.permutation(batch) for _ in range(steps)])


def _per_step_metric_gap(a: dict, b: dict) -> np.ndarray:
    return np.max([np.abs(np.asarray(a[k], np.float64) - np.asarray(b[k], np.float64)) for k in METRIC_NAMES], axis=0)


def _run_gap(other, run) -> float:
    """Max |Δ| between two recorded runs over every metric of every step and every final tensor."""
    return max(float(_per_step_metric_gap(other.metrics, run.metrics).max()),
               max(_tensor_gaps(other.final_generator, run.final_generator).values()),
               max(_tensor_gaps(other.final_discriminator, run.final_discriminator).values()))


def _tensor_gaps(ours: dict, theirs: dict) -> dict[str, float]:
    return {k: float(np.max(np.abs(np.asarray(ours[k], np.float64) - np.asarray(theirs[k], np.float64))))
            for k in theirs if not k.endswith("num_batches_tracked")}


def check_noise_floor(spec: TrainConfig, dtype: str = "float64", permutations: int = 3, factor: float = 3.0) -> CheckResult:
    """JAX − PyTorch next to PyTorch − PyTorch, per step and per tensor.

    PyTorch is run against itself with the same mathematics in other summation orders, three ways:
    the batch permuted (``permutations`` times; the median is that floor), the channels_last memory
    format (other convolution kernels, which is what a port also brings), and BatchNorm's training
    statistics as plain sums instead of its fused kernel (:class:`.reference_runs.SummedBatchNorm2d`:
    jax 0.12 sums them with several accumulators, 5× more accurately than the fused kernel, and every
    JAX−PyTorch gap then carries the fused kernel's own error; ``benchmarks/reduction_accuracy.py``
    measures it). The noise floor of each quantity is the largest of the three. float64 passes when the
    largest metric gap over the run and every final parameter and running statistic's gap is within
    ``factor`` × its floor, with a floor of at least 8 ulps of the largest value (at small widths every
    gap is a few ulps and ratios are quantisation). The result's detail also gives the ratio against
    the permutations alone. float32: reported, not asserted (free-running float32 runs drift: chaos).
    """
    real, noise = reference_runs.make_batches(spec)
    base = reference_runs.run_tutorial(spec, dtype, real=real, noise=noise)
    ours = replay(base.initial_generator, base.initial_discriminator, real, noise, dtype, spec)

    def final(run_g, run_d):
        return {**run_g, **{"D " + k: v for k, v in run_d.items()}}

    torch_final = final(base.final_generator, base.final_discriminator)
    measured = {**_tensor_gaps(final(ours.generator_state_dict, ours.discriminator_state_dict), torch_final),
                "metrics": float(_per_step_metric_gap(ours.metrics, base.metrics).max())}
    jax_steps = _per_step_metric_gap(ours.metrics, base.metrics)

    def gaps(run) -> tuple[dict, np.ndarray]:
        steps = _per_step_metric_gap(run.metrics, base.metrics)
        return {**_tensor_gaps(final(run.final_generator, run.final_discriminator), torch_final), "metrics": float(steps.max())}, steps

    permuted = [gaps(reference_runs.run_tutorial(spec, dtype, batches=permuted_batches(real, noise, 1000 + k)))
                for k in range(permutations)]
    channels_last, channels_last_steps = gaps(reference_runs.run_tutorial(spec, dtype, real=real, noise=noise, channels_last=True))
    summed, summed_steps = gaps(reference_runs.run_tutorial(spec, dtype, real=real, noise=noise, summed_batchnorm=True))
    ulp = np.finfo(np.float64 if dtype == "float64" else np.float32).eps
    scale = {key: float(np.max(np.abs(torch_final[key]))) for key in torch_final}
    scale["metrics"] = max(float(np.max(np.abs(base.metrics[k]))) for k in METRIC_NAMES)
    permutation_floor = {key: float(np.median([p[key] for p, _ in permuted])) for key in measured}
    floor = {key: max(permutation_floor[key], channels_last[key], summed[key], 8 * ulp * scale[key] / factor)
             for key in measured}
    ratios = {key: measured[key] / floor[key] for key in measured}
    permutation_ratios = {key: measured[key] / max(permutation_floor[key], 8 * ulp * scale[key] / factor) for key in measured}
    worst = max(ratios, key=ratios.get)
    worst_permutation = max(permutation_ratios, key=permutation_ratios.get)
    passed = all(ratio <= factor for ratio in ratios.values()) if dtype == "float64" else None
    shape = f"{spec.image_size}×{spec.image_size}, nz {spec.nz}, ngf {spec.ngf}, ndf {spec.ndf}, batch {spec.batch_size}"
    permutation_steps = np.median([steps for _, steps in permuted], axis=0)
    return CheckResult(
        f"noise floor, {dtype}, {spec.steps} steps ({shape})",
        f"JAX−PyTorch ≤ {factor:g} × PyTorch−PyTorch (the largest of: median over {permutations} batch permutations, "
        "channels_last, BatchNorm statistics as plain sums), for the metrics and each tensor"
        if dtype == "float64" else "reported, not asserted (free-running float32 drifts: chaos)",
        ratios[worst], passed,
        f"worst JAX gap / floor: {ratios[worst]:.2f} ({worst}); against the permutations alone: "
        f"{permutation_ratios[worst_permutation]:.2f} ({worst_permutation}). Metrics: JAX {measured['metrics']:.2e}, "
        f"permuted {permutation_floor['metrics']:.2e}, channels_last {channels_last['metrics']:.2e}, "
        f"summed BatchNorm {summed['metrics']:.2e}",
        {"jax_per_step": jax_steps, "torch_per_step": permutation_steps, "channels_last_per_step": channels_last_steps,
         "summed_batchnorm_per_step": summed_steps, "ratios": ratios, "permutation_ratios": permutation_ratios},
        noise_floor=f"metrics: permuted {permutation_floor['metrics']:.2e}, channels_last {channels_last['metrics']:.2e}, "
        f"summed BatchNorm {summed['metrics']:.2e}",
    )
