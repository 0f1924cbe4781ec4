"""Precision findings: where a port's float32 error is beyond PyTorch's own although its mathematics is right, why.

A row is a precision finding when it is further from PyTorch64 than k × PyTorch's own float32 error while the same
JAX program in float64 agrees with PyTorch64 (:attr:`functional_gan.testing.judge.Row.precision`). The check
then names where it starts (the first forward row, before the gradients that inherit it) and the causes that fit,
each read off the port or measured, never assumed:

* Flax's ``BatchNorm``/``LayerNorm``/``GroupNorm`` with ``use_fast_variance=True`` (their default), read off the
  port's modules: the variance as E[x²] − E[x]² cancels where the mean is large against the spread, while PyTorch
  subtracts the mean first;
* optax's Adam-family bias corrections ``1 − βᵗ``, computed in float32 (PyTorch computes them in Python's float64),
  where the first finding is an update and the optimizer state holds Adam's moments;
* XLA:CPU's float32 reductions (less accurate still under the jaxlib 0.10.2 workaround), measured on the port's own
  layer outputs (a sum over every axis but the channels, as a normalisation takes it) against PyTorch's float32 sum
  of the same values;
* on a GPU or TPU, a matrix product or convolution of the port's whose ``precision`` or dtype the port fixes below
  full float32 (check-port asks for ``'highest'`` by default; an explicit setting in the port wins), read off the
  step's jaxpr.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np

from functional_gan import xla_guard
from .judge import Row


def start_of(findings: list[Row]) -> Row | None:
    """Where the imprecision starts: the first forward (or output) row among the findings, else the first one.

    Args:
        findings: the precision findings (or notes), in the report's order.

    Returns:
        That row, or None where ``findings`` is empty.
    """
    for row in findings:
        if row.stage in ("forward", "output"):
            return row
    return findings[0] if findings else None


# optax's states whose transforms divide their moments by the bias corrections 1 − βᵗ (optax.tree.bias_correction):
# ScaleByAdamState (adam, adamw, nadam, radam, adamax, lamb, yogi), AMSGrad's and AdaBelief's. Lion's keeps a moment
# ``mu`` and has no bias correction; Adan's has them but keeps no ``mu``, and is not recognised.
BIAS_CORRECTED_STATES = ("Adam", "Amsgrad", "Belief")


def uses_adam(opt_state) -> bool:
    """Whether an optax state holds an Adam-family state, one whose transform applies optax's bias corrections: a named
    tuple with ``mu`` whose class's name has one of :data:`BIAS_CORRECTED_STATES` in it (not Lion's, which has none).

    Args:
        opt_state: the optimizer's state, or its shapes (``jax.eval_shape`` of its ``init``), or None.

    Returns:
        True where it holds one.
    """
    names = {type(node).__name__ for node in jax.tree_util.tree_leaves(
        opt_state, is_leaf=lambda n: hasattr(n, "_fields") and hasattr(n, "mu"))}
    return any(part in name for name in names for part in BIAS_CORRECTED_STATES)


def xla_reduction_ratio(layers: dict[str, np.ndarray], channels_last: bool) -> tuple[float, str] | None:
    """The worst ratio, over the port's recorded layer outputs (PyTorch's float64 values, PyTorch's layout), of XLA's
    float32 error to PyTorch's in a sum over every axis but the channels; and the layer where it is worst.

    Args:
        layers: layer outputs by PyTorch name, float64 in PyTorch's layout (check-port passes PyTorch64's); those of
            fewer than 2 dimensions or 64 elements are left out.
        channels_last: the port's layout: the channels moved to the last axis before XLA sums.

    Returns:
        ``(ratio, layer name)`` at the worst layer (``"(model)"`` for the model's own output), or None where no layer
        was measured.
    """
    import torch

    worst: tuple[float, str] | None = None
    summed = jax.jit(lambda x, axes: jnp.sum(x, axis=axes), static_argnums=1)
    for name, value in layers.items():
        value = np.asarray(value)
        if value.ndim < 2 or value.size < 64:
            continue
        torch_axes = tuple(a for a in range(value.ndim) if a != 1)
        exact = value.sum(axis=torch_axes)
        scale = max(float(np.max(np.abs(exact))), 1e-300)
        torch_error = float(np.max(np.abs(torch.from_numpy(value.astype(np.float32)).sum(dim=torch_axes).double().numpy()
                                          - exact))) / scale
        port_value = np.moveaxis(value, 1, -1) if channels_last else value
        port_axes = tuple(range(value.ndim - 1)) if channels_last else torch_axes
        xla_error = float(np.max(np.abs(np.asarray(summed(jnp.asarray(port_value, jnp.float32), port_axes), np.float64)
                                        - exact))) / scale
        ratio = xla_error / max(torch_error, float(np.finfo(np.float32).eps))
        if worst is None or ratio > worst[0]:
            worst = (ratio, name or "(model)")
    return worst


def _sub_jaxprs(params: dict):
    for value in params.values():
        for item in value if isinstance(value, (tuple, list)) else (value,):
            if hasattr(item, "eqns"):
                yield item
            elif hasattr(getattr(item, "jaxpr", None), "eqns"):  # a ClosedJaxpr (scan, cond, pjit, custom rules)
                yield item.jaxpr


def low_precision_products(jaxpr) -> int:
    """How many matrix products and convolutions of a jaxpr (and the jaxprs inside it) the port itself runs below full
    float32: an explicit ``precision`` other than HIGHEST (a config default is applied later and is not seen here), an
    algorithm with bf16 or tf32 in its name, or bfloat16/float16 operands.

    Args:
        jaxpr: a jaxpr (the ``.jaxpr`` of :func:`jax.make_jaxpr`'s result).

    Returns:
        The count, the jaxprs inside included.
    """
    count = 0
    for eqn in jaxpr.eqns:
        if eqn.primitive.name in ("dot_general", "conv_general_dilated"):
            precision = eqn.params.get("precision")
            values = [p for p in (precision if isinstance(precision, tuple) else (precision,)) if p is not None]
            low_type = any(np.dtype(v.aval.dtype) in (np.dtype(jnp.bfloat16), np.dtype(jnp.float16))
                           for v in eqn.invars if hasattr(v, "aval"))
            low_precision = any(p != jax.lax.Precision.HIGHEST and
                                (p in (jax.lax.Precision.DEFAULT, jax.lax.Precision.HIGH)
                                 or any(t in str(p).upper() for t in ("BF16", "TF32"))) for p in values)
            count += bool(low_type or low_precision)
        count += sum(low_precision_products(sub) for sub in _sub_jaxprs(eqn.params))
    return count


def _verification(verified: dict | None, findings: list[Row]) -> str | None:
    """What switching Flax's fast variance off did to ``findings``: None where it was not tried, "" where no finding
    fell within its allowance, else the sentence that says how far they fell."""
    tried = (verified or {}).get("use_fast_variance=True")
    if tried is None:
        return None
    keys = {row.key for row in findings}
    fell = {key: ratios for key, ratios in tried["fell"].items() if key in keys}
    if not fell:
        return ""
    worst = max(fell.items(), key=lambda item: item[1][0] or 0.0)
    (stage, name), (before, after) = worst
    return (f"verified: rerun with use_fast_variance=False, {len(fell)} of the {len(keys)} quantities lose at least nine "
            f"tenths of their excess over the allowance ({stage}, {name}: {before:.1f}× → {after:.2f}×)")


def likely_causes(findings: list[Row], fast_variance: list[str], opt_state, layers: dict[str, np.ndarray],
                  channels_last: bool, step_jaxpr=None, dtype: str = "float32", verified: dict | None = None) -> list[str]:
    """The causes that fit ``findings``, each in one sentence with what was read or measured. Flax's fast variance is
    named only where switching it off (``verified``, check-port's counterfactual run) brings findings within their
    allowance; where it was tried and brought none, the report says it is not the cause.

    Args:
        findings: the judged program's precision findings (or notes).
        fast_variance: the port's normalisations with ``use_fast_variance=True``, by module path.
        opt_state: the port's optimizer state or its shapes, or None without an optimizer.
        layers: PyTorch64's layer outputs, by PyTorch name (for :func:`xla_reduction_ratio`).
        channels_last: the port lays images out channels-last.
        step_jaxpr: the port's step as a jaxpr, read on a GPU or TPU only; None: not read.
        dtype: the check's dtype; the bias corrections and XLA:CPU's sums are causes in float32 only.
        verified: :func:`.causes.verified_causes`'s findings, or None where no counterfactual ran.

    Returns:
        One sentence per cause that fits and per cause tried and ruled out; one saying that no known cause fits where
        none does; empty where ``findings`` is.
    """
    if not findings:
        return []
    causes = []
    # Where the findings are: an optimizer's arithmetic shows in the updates alone; a normalisation's or a sum's in the
    # forward pass first, and in the gradients and running statistics that inherit it.
    stages = {row.stage for row in findings}
    computed = bool(stages - {"update"})
    verification = _verification(verified, findings) if fast_variance and computed else None
    if fast_variance and computed and verification != "":
        more = f" and {len(fast_variance) - 1} more" if len(fast_variance) > 1 else ""
        causes.append(
            f"Flax's normalisation at {fast_variance[0]}{more} computes the variance as E[x²] − E[x]² "
            "(use_fast_variance=True, Flax's default), which cancels where the mean is large against the spread; PyTorch "
            "subtracts the mean first" + (f"; {verification}" if verification else "") +
            ". Build the port's BatchNorm/LayerNorm/GroupNorm with use_fast_variance=False.")
    elif fast_variance and computed:
        causes.append(f"not Flax's fast variance (use_fast_variance=True at {fast_variance[0]}): rerun with "
                      "use_fast_variance=False, no quantity loses nine tenths of its excess over the allowance.")
    bias = (verified or {}).get("optax's float32 bias corrections")
    update_rows = {row.key for row in findings if row.key[0] == "update"}
    fell = {key: ratios for key, ratios in (bias or {}).get("fell", {}).items() if key in update_rows}
    if dtype == "float32" and "update" in stages and uses_adam(opt_state) and (bias is None or fell):
        worst = max(fell.items(), key=lambda item: item[1][0] or 0.0) if fell else None
        check = (f"; verified: rerun with 1 − βᵗ exact, {len(fell)} of the {len(update_rows)} update rows lose at least "
                 f"nine tenths of their excess ({worst[0][0]}, {worst[0][1]}: {worst[1][0]:.1f}× → {worst[1][1]:.2f}×)"
                 if worst else "")
        causes.append(
            "optax computes Adam's bias corrections 1 − βᵗ in float32 (β₂ = 0.999 is 0.99900001 there, and 1 − β₂ loses "
            "1.3e-5 of its value), PyTorch in Python's float64: every float32 update differs by about 6e-6 of its size"
            f"{check}. An optimizer that computes 1 − βᵗ as −expm1(t·log β) has no such rows "
            "(examples/port/nanogpt_block.py).")
    elif dtype == "float32" and "update" in stages and uses_adam(opt_state):
        causes.append("not optax's float32 bias corrections: rerun with 1 − βᵗ exact, no update row loses nine tenths "
                      "of its excess over the allowance.")
    if dtype == "float32" and computed and jax.default_backend() == "cpu":
        measured = xla_reduction_ratio(layers, channels_last)
        if measured is not None and measured[0] > 1.5:
            under = ""
            if xla_guard.needs_workaround() and xla_guard.flag_in_effect():
                under = (f" under the workaround for jaxlib {xla_guard.installed_jaxlib()}'s miscompile "
                         "(--xla_cpu_experimental_ynn_fusion_type=-reduce)")
            causes.append(
                f"XLA:CPU's float32 reductions{under}: on this port's layer outputs, a sum over every axis but the "
                f"channels errs {measured[0]:.1f}× PyTorch's float32 sum of the same values (worst at {measured[1]}); "
                "PyTorch's CPU kernels sum in a cascade.")
    if jax.default_backend() != "cpu" and step_jaxpr is not None:
        low = low_precision_products(step_jaxpr)
        if low:
            causes.append(f"{low} matrix products or convolutions of the port run below full float32 on "
                          f"{jax.default_backend()} (a precision= or a bfloat16/float16 dtype set in the port; check-port "
                          "asks for 'highest' where the port sets nothing).")
    if not causes or all(c.startswith("not ") for c in causes):
        causes.append("no known cause fits: the port's float32 arithmetic differs from PyTorch's from the first row named "
                      "(an algorithm of its own: a sum in another order, a cancellation, a reciprocal where PyTorch divides).")
    return causes
