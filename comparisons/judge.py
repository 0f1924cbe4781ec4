"""The one judge of "does the port agree with PyTorch": a quantity against its float64 reference.

Used by ``check-port`` (:mod:`.port`), the divergence finder (:mod:`.diverge`) and the comparison
suite's trajectories (:func:`.common.compare_trajectory`, also on the recorded fixtures, without PyTorch).
Free of PyTorch imports.

A quantity's error is ``max |port − reference| / max |reference|`` (its scale). In float64 it must be
within a tolerance (1e-10 of the scale by default). In float32 it must be within k × PyTorch's own
error (the largest of PyTorch's float32 results against the same float64 reference, at least 4 ulps
of the scale): the port may be as far from the exact answer as PyTorch itself is, k times over.
"""

from __future__ import annotations

import dataclasses
import math

import numpy as np

DEFAULT_K = 3.0
FLOAT64_TOLERANCE = 1e-10  # of a tensor's scale
ULPS = 4  # the smallest noise allowed for, in units of float32's epsilon times a tensor's scale


@dataclasses.dataclass
class Row:
    stage: str
    name: str  # layer path or tensor
    port_error: float  # max |JAX − PyTorch₆₄| / scale
    noise: float | None  # max |PyTorch₃₂ − PyTorch₆₄| / scale (float32 runs)
    allowed: float
    scale: float
    jax_value: float
    torch_value: float
    shapes: tuple | None = None  # (the port's shape, PyTorch's) when they differ: no number can be compared
    jax_noise: float | None = None  # max |JAX₃₂ − JAX₆₄| / scale, the same JAX program: JAX's own float32 rounding

    @property
    def passed(self) -> bool:
        return self.shapes is None and self.port_error <= self.allowed

    @property
    def beyond_pytorch(self) -> bool:
        """Passed, but only by JAX's own float32 error: further from PyTorch64 than k × PyTorch's own."""
        return self.passed and self.noise is not None and self.jax_noise is not None and \
            self.port_error > self.allowed * _noise_at_least_ulps(self.noise) / _noise_at_least_ulps(max(self.noise, self.jax_noise))

    @property
    def ratio(self) -> float | None:
        """The port's error over the noise it is judged against (PyTorch's own, or JAX's where that is larger)."""
        if self.noise is None:
            return None
        return self.port_error / _noise_at_least_ulps(max(self.noise, self.jax_noise or 0.0))


def _noise_at_least_ulps(noise: float) -> float:
    return max(noise, ULPS * float(np.finfo(np.float32).eps))


def float32_allowed(noise: float, k: float = DEFAULT_K) -> float:
    """The largest error (relative to a tensor's scale) a float32 port may have: k × PyTorch's own, at least 4 ulps."""
    return k * _noise_at_least_ulps(noise)


def compare(stage: str, name: str, port, reference, noisy, dtype: str, k: float = DEFAULT_K,
            tolerance: float | None = None, port_shape: tuple | None = None, jax_noisy=()) -> Row:
    """One quantity judged: the port's error against the float64 reference, relative to the reference's scale.

    float64: within ``tolerance`` (default 1e-10). float32: within k × PyTorch's own error, the largest of
    ``noisy`` (PyTorch's float32 results) against the reference, at least 4 ulps; a ``tolerance`` given
    replaces that criterion with a fixed one. Arrays of different shapes give a row that records both shapes
    (``port_shape``: the port's own, before any change of layout) and fails. ``jax_noisy``: (float32, float64)
    pairs of the port's own results from one JAX program: its own float32 error ``|JAX₃₂ − JAX₆₄|``, in which any
    mistake of the port cancels (both runs have it) and rounding does not. Where that is larger than PyTorch's
    (XLA:CPU without YNNPACK sums float32 reductions less accurately than PyTorch's cascade), the port is allowed
    k times JAX's own error instead.
    """
    port = np.asarray(port, np.float64)
    reference = np.asarray(reference, np.float64)
    if port.shape != reference.shape:
        return Row(stage, name, math.inf, None, 0.0, 0.0, math.nan, math.nan,
                   shapes=(tuple(port_shape) if port_shape is not None else port.shape, reference.shape))
    scale = float(np.max(np.abs(reference))) if reference.size else 0.0
    scale = scale if scale > 0 else 1.0
    difference = np.abs(port - reference)
    where = np.unravel_index(int(np.argmax(difference)), difference.shape) if difference.size else ()
    error = float(difference[where]) / scale if difference.size else 0.0
    if not np.all(np.isfinite(port)):
        error = math.inf
    if dtype == "float64" or (tolerance is not None and not noisy):
        noise, jax_noise, allowed = None, None, FLOAT64_TOLERANCE if tolerance is None else tolerance
    else:  # ``noisy``: PyTorch's float32 results; the largest of their errors is PyTorch's own noise
        noise = max((float(np.max(np.abs(np.asarray(n, np.float64) - reference))) / scale if reference.size else 0.0)
                    for n in noisy)
        own = [float(np.max(np.abs(np.asarray(a, np.float64) - np.asarray(b, np.float64)))) / scale if port.size else 0.0
               for a, b in jax_noisy if np.shape(a) == np.shape(b) == port.shape]
        jax_noise = max(own) if own else None
        allowed = float32_allowed(max(noise, jax_noise or 0.0), k) if tolerance is None else tolerance
    return Row(stage, name, error, noise, allowed, scale, float(port[where]) if port.size else math.nan,
               float(reference[where]) if reference.size else math.nan, jax_noise=jax_noise)


