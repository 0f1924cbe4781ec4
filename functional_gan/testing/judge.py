"""The one judge of "does the port agree with PyTorch": a quantity against its float64 reference.

Used by ``check-port`` (:mod:`functional_gan.testing`), the divergence finder
(:mod:`functional_gan.comparisons.diverge`) and the comparison suite's trajectories
(:func:`functional_gan.comparisons.common.compare_trajectory`, also on the recorded fixtures, without PyTorch), which
import it from here. Free of PyTorch imports (importing it imports nothing else of :mod:`functional_gan.testing`).

A quantity's error is ``max |port − reference| / max |reference|`` (its scale). The verdict rule, the same in both
dtypes (:data:`VERDICT_RULE`, which check-port's report prints as its footer):

* **agreement**: within k × the larger of PyTorch's own error (its results in the same dtype against the float64
  reference: the batch in other orders, other memory layouts, one-ulp moves; in float64 also its matrix products'
  long sums taken in blocks, its float32 error times eps₆₄/eps₃₂ = 2⁻²⁹, and, where it computes in float32 inside a
  float64 model, the run without those casts) and, in float64, the port's own (its program's float32 error times 2⁻²⁹:
  rounding scales with the unit roundoff, and the variants above share a long sum's roundings; and its own float32
  islands' error, the program without its casts), never less than a floor of
  4 float32 or 8 float64 ulps of the scale. The port's own counts up to √eps of the scale only: beyond that it is
  not rounding, and buys no allowance;
* **divergence** (exit 1): beyond it, and the mathematics differs: in float32 the same JAX program in float64
  (its *twin*) does not agree with PyTorch64, or the port's float32 error is not its own rounding; in float64 no
  verified cause explains it;
* **precision finding** (exit 3, float32 only): beyond it, the mathematics right (the twin agrees and the error is
  the port's own rounding), and large enough to matter: more than √eps of the scale (3.5e-4: the port keeps fewer
  than half the digits its dtype carries);
* **note**: the same, within √eps of the scale: rounding worth knowing that changes no training run; in float64,
  a row beyond the allowance whose cause a counterfactual run verifies and whose error is within 1e-10 of the scale
  (a float64 row beyond 1e-10 is a divergence: no float64 error that large is rounding);
* **not compared**: a layer's output whose shape could not be mapped to PyTorch's (the port's own layout of an
  intermediate): listed, never a divergence; the rows after it are compared as always.

Where no noise was measured (the comparison suite's fixtures), float64 is judged within a fixed tolerance (1e-10 of
the scale) and float32 within k × PyTorch's recorded error.
"""

from __future__ import annotations

import dataclasses
import enum
import math
from collections.abc import Sequence

import numpy as np
from numpy.typing import ArrayLike

DEFAULT_K = 3.0
FLOAT64_TOLERANCE = 1e-10  # of a tensor's scale
ULPS = 4  # the smallest noise allowed for in float32, in units of float32's epsilon times a tensor's scale
# ... and in float64 (check-port's grounded criterion): PyTorch's own float64 variants (the batch in other orders,
# other memory layouts, inputs and weights moved by one ulp) share its kernels' long sums, so they see less of its
# rounding than another library's kernels do: on the example ports a correct port's shallow rows reached 3.5× their
# spread with 4 ulps as the floor (pytorch/examples' MNIST Net: conv1's bias gradient, 16 ulps against 4.7).
ULPS64 = 8
EPS = {"float32": float(np.finfo(np.float32).eps), "float64": float(np.finfo(np.float64).eps)}
# A precision difference matters where the port keeps fewer than half the significant digits of its dtype: an error of
# more than √eps of the scale (3.5e-4 in float32, 1.5e-8 in float64). Below it, the port's step differs from PyTorch's
# by less than a part in 3,000 (float32): far below the minibatch's own sampling noise in a gradient, and a change of
# the step size that no training run sees (optax's Adam in float32: 6e-6 of each update). The ResNet-50 gradient that
# Flax's E[x²] − E[x]² makes 35% of its scale from the exact value (PyTorch's own: 1.4%) stays a finding.
SIGNIFICANT = {dtype: math.sqrt(eps) for dtype, eps in EPS.items()}

class Verdict(enum.Enum):
    """What a compared quantity's row means, and what it does to the check's exit status: the verdict rule, stated
    once (:data:`VERDICT_RULE` is its words; :attr:`Row.verdict` a row's; ``Report.outcome`` a check's)."""

    AGREEMENT = ("agreement", "✓", 0,
                 "within k × the larger of PyTorch's own error and (float64) the port's own (each framework's float32 "
                 "error × 2⁻²⁹ beside PyTorch64's variants; a float32 island's error where either computes in float32 "
                 "inside), at least the ulp floor")
    DIVERGENCE = ("divergence", "✗", 1,
                  "beyond it and the mathematics differs (float32: the same JAX program in float64 does not agree "
                  "with PyTorch64; float64: no verified cause explains it)")
    PRECISION_FINDING = ("precision finding", "≈", 3,
                         "float32: beyond it, the mathematics right (the float64 twin agrees) and more than √eps of "
                         "the scale (3.5e-4), exit 0 where precision findings are allowed")
    NOTE = ("note", "~", 0, "the same within √eps, rounding that changes no training run (float64: beyond it, a "
            "cause verified by rerunning without it, within 1e-10 of the scale)")
    NOT_COMPARED = ("not compared", "–", 0, "a layer's output the checker could not lay out as PyTorch's")

    def __init__(self, words: str, mark: str, exit_status: int, meaning: str):
        self.words = words  # as the report's summary names it
        self.mark = mark  # the table's column "ok"
        self.exit_status = exit_status  # of a check whose worst row this is
        self.meaning = meaning

    def __str__(self) -> str:
        return f"{self.words} ({self.mark}, exit {self.exit_status}): {self.meaning}"


VERDICT_RULE = "; ".join(str(v) for v in Verdict) + "."
# A check's exit status: its worst row's verdict's (above), or this one where the spec cannot be used (SpecError: a
# missing piece, weights that do not pair, a check estimated beyond the memory available, an unreadable file)
EXIT_SPEC = 2


class Measured(float):
    """An error already measured against a quantity's reference (``max |values − reference| / scale``, the scale being
    the reference's): what a caller passes in ``noisy`` or ``jax_noisy`` instead of the array, having compared it and let
    it go (check-port holds one PyTorch run at a time, not all of them)."""


class TwinMeasured(float):
    """``max |JAX₃₂ − JAX₆₄|`` of one quantity, not yet divided by its scale (which :func:`compare` knows), with the
    shape of the values: one ``jax_noisy`` pair, measured and let go."""

    def __new__(cls, difference: float, shape: tuple):
        value = super().__new__(cls, difference)
        value.shape = tuple(shape)
        return value


def relative_error(values, reference, scale: float | None = None) -> Measured:
    """``max |values − reference| / scale`` (by default the reference's largest magnitude, 1 where it is 0): a
    quantity's error as :func:`compare` measures it, to be passed there as a :class:`Measured`.

    Args:
        values: the values measured (anything NumPy reads), widened to float64.
        reference: the float64 reference, of the same shape.
        scale: the divisor; None: the reference's largest magnitude (1 where it is 0).

    Returns:
        The error as a :class:`Measured`; 0 where the reference is empty.
    """
    reference = np.asarray(reference, np.float64)
    if not reference.size:
        return Measured(0.0)
    if scale is None:
        scale = _largest_magnitude(reference)
        scale = scale if scale > 0 else 1.0
    difference = _magnitude_in_place(np.asarray(values, np.float64) - reference)
    return Measured(float(np.max(difference)) / scale)


def _magnitude_in_place(difference):
    """``|difference|``, in the array itself (a gigabyte's tensor makes no more); a NumPy scalar as it comes."""
    if isinstance(difference, np.ndarray):
        return np.abs(difference, out=difference)
    return np.abs(difference)


def _largest_magnitude(values: np.ndarray) -> float:
    """``max |values|``, without an array of the magnitudes (NaN if any is NaN, as ``np.max(np.abs(values))``)."""
    return float(max(np.max(values), -np.min(values)))


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
    twin_error: float | None = None  # max |JAX₆₄ − PyTorch₆₄| / scale: the same JAX program in float64 (its mathematics)
    dtype: str = "float32"
    # float64: a cause of imprecision in the port (Flax's fast variance) verified for this row: rerun without it, the
    # row is within its allowance; set by check-port
    explained_by: str | None = None
    port_noise: float | None = None  # float64: the port's own error (its program's float32 error × 2⁻²⁹) / scale
    # float64: the error of the port's own lower-precision islands (a cast to float32 inside), |JAX − JAX with its
    # casts removed| / scale: the row is judged against that precision's noise too
    island_noise: float | None = None
    step: int | None = None  # the step of a check over several steps (1, 2, …); None for one step

    @property
    def key(self) -> tuple[str, str]:
        """(stage, name): the same quantity at every step."""
        return self.stage, self.name

    @property
    def label(self) -> str:
        """The stage as a report shows it: ``"step 2: update"`` in a check over several steps, else ``"update"``."""
        return self.stage if self.step is None else f"step {self.step}: {self.stage}"

    @property
    def passed(self) -> bool:
        """Within the allowance: agreement, nothing else counts."""
        return self.shapes is None and self.port_error <= self.allowed

    @property
    def not_compared(self) -> bool:
        """A layer's output whose shape the checker could not lay out as PyTorch's: no number to compare, never a
        divergence (the port lays out its intermediates as it likes; the next rows say whether it agrees)."""
        return self.shapes is not None and self.key[0] == "forward"

    @property
    def precision(self) -> bool:
        """A precision finding: out of tolerance, but the same JAX program in float64 agrees with PyTorch64 (within
        this row's float32 allowance) and the port's float32 error is within k × that program's own float32 rounding:
        the mathematics is right, the float32 arithmetic less accurate than PyTorch's. In float64: out of k ×
        PyTorch64's own error but within 1e-10 of the scale, in a port with a known imprecise algorithm."""
        if self.dtype == "float64":  # no wider twin: a known cause read off the port, and within the fixed 1e-10
            return (not self.passed and self.shapes is None and self.explained_by is not None
                    and self.port_error <= FLOAT64_TOLERANCE)
        return (not self.passed and self.shapes is None and self.twin_error is not None and self.jax_noise is not None
                and math.isfinite(self.port_error) and self.twin_error <= self.allowed
                and self.port_error <= self.allowed / _at_least_ulps(self.noise or 0.0, self.dtype)
                * _at_least_ulps(self.jax_noise, self.dtype))

    @property
    def significant(self) -> bool:
        """Beyond √eps of the scale: the port keeps fewer than half the digits of its dtype (:data:`SIGNIFICANT`)."""
        return self.port_error > SIGNIFICANT[self.dtype]

    @property
    def finding(self) -> bool:
        """A precision finding that fails the check (exit 3): :attr:`precision` and :attr:`significant`."""
        return self.precision and self.significant

    @property
    def note(self) -> bool:
        """A precision difference within √eps of the scale: reported, never a failure."""
        return self.precision and not self.significant

    @property
    def diverged(self) -> bool:
        return not self.passed and not self.precision and not self.not_compared

    @property
    def verdict(self) -> Verdict:
        """This row's :class:`Verdict` (the properties above, in the rule's order)."""
        if self.passed:
            return Verdict.AGREEMENT
        if self.not_compared:
            return Verdict.NOT_COMPARED
        if self.finding:
            return Verdict.PRECISION_FINDING
        if self.note:
            return Verdict.NOTE
        return Verdict.DIVERGENCE

    @property
    def ratio(self) -> float | None:
        """The port's error over the larger of PyTorch's own and the port's own (at least the ulp floor), or None where
        PyTorch's own was not measured."""
        if self.noise is None:
            return None
        return self.port_error / _at_least_ulps(max(self.noise, self.port_noise or 0.0, self.island_noise or 0.0),
                                                self.dtype)


def _at_least_ulps(noise: float, dtype: str = "float32") -> float:
    return max(noise, (ULPS if dtype == "float32" else ULPS64) * EPS[dtype])


def allowance(noise: float, k: float = DEFAULT_K, dtype: str = "float32") -> float:
    """The largest error (relative to a tensor's scale) a port may have: k × PyTorch's own, at least 4 ulps.

    Args:
        noise: PyTorch's own error, relative to the tensor's scale.
        k: the multiple of the noise allowed.
        dtype: ``"float32"`` (a floor of :data:`ULPS` float32 ulps) or ``"float64"`` (:data:`ULPS64` float64 ulps).

    Returns:
        ``k × max(noise, the floor)``, relative to the tensor's scale.
    """
    return k * _at_least_ulps(noise, dtype)


def compare(stage: str, name: str, port: ArrayLike, reference: ArrayLike, noisy: Sequence, dtype: str,
            k: float = DEFAULT_K, tolerance: float | None = None, port_shape: tuple | None = None,
            jax_noisy: Sequence = (), twin_reference: ArrayLike | None = None, float64_noise: bool = False,
            port_noisy: Sequence = (), island_noisy: Sequence = ()) -> Row:
    """One quantity judged: the port's error against the float64 reference, relative to the reference's scale.

    float32: within k × PyTorch's own error, the largest of ``noisy`` (PyTorch's float32 results) against the
    reference, at least 4 ulps; a ``tolerance`` given replaces that criterion with a fixed one. float64: within
    ``tolerance`` (default 1e-10), or with ``float64_noise`` and ``noisy`` (PyTorch's float64 results in other
    summation orders) within k × their largest error, at least 8 float64 ulps (:data:`ULPS64`). Arrays of
    different shapes give a row that records both shapes (``port_shape``: the port's own, before any change of
    layout) and fails.

    ``jax_noisy``: (float32, float64) pairs of the port's own results from one JAX program (or, measured already, a
    :class:`TwinMeasured` and the float64 values or their :class:`Measured` error): ``|JAX₃₂ − JAX₆₄|`` is its
    own float32 rounding, and ``|JAX₆₄ − reference|`` (or against ``twin_reference``, where the float64 program's
    reference differs, as an update fed other gradients does) says whether its mathematics is right. They never
    widen the allowance; they tell a precision finding from a divergence (:attr:`Row.precision`).

    ``port_noisy`` (float64, with ``float64_noise``): the port's own error, as :class:`TwinMeasured` differences (its
    program's float32 error × 2⁻²⁹) or :class:`Measured` errors, or other results of the port compared with its own:
    the allowance is k × the larger of PyTorch's own error and the port's, the port's
    counted up to √eps of the scale (beyond it, a variation is the port's behaviour, not rounding).

    ``island_noisy`` (float64, with ``float64_noise``): the port's results against the same program with its
    lower-precision islands removed (:mod:`functional_gan.testing.widen`), as :class:`TwinMeasured` differences: the
    error the port's own casts to float32 make, counted in full (the port computes there in float32 by design, and
    is judged against that precision, as PyTorch's own islands are through ``noisy``).

    Args:
        stage: the row's stage (``"forward"``, ``"output"``, ``"loss"``, ``"gradient"``, ``"update"``, ``"buffer"``).
        name: the quantity's name (a layer's path, a tensor's key).
        port: the port's values, in the reference's layout.
        reference: PyTorch's float64 values.
        noisy: PyTorch's results in ``dtype`` (arrays, or their :class:`Measured` errors).
        dtype: ``"float32"`` or ``"float64"``.
        k: the allowance, in multiples of PyTorch's own error.
        tolerance: a fixed allowance relative to the scale, instead of ``k`` × the noise.
        port_shape: the port's own shape, recorded where the shapes differ.
        jax_noisy: the port's own (float32, float64) pairs, as above (float32 only).
        twin_reference: the float64 program's reference, where it differs from ``reference``.
        float64_noise: in float64, judge against ``noisy`` (with ``port_noisy`` and ``island_noisy``) rather than the
            fixed tolerance.
        port_noisy: the port's own float64 error, as above.
        island_noisy: the port's islands' error, as above.

    Returns:
        The :class:`Row`: the error, PyTorch's own, the allowance, the scale and both values where they differ most;
        where the shapes differ, both shapes and an infinite error.

    Raises:
        ValueError: a float32 quantity given neither ``noisy`` nor ``tolerance``: nothing to judge it against.
    """
    port = np.asarray(port, np.float64)
    reference = np.asarray(reference, np.float64)
    if port.shape != reference.shape:
        return Row(stage, name, math.inf, None, 0.0, 0.0, math.nan, math.nan,
                   shapes=(tuple(port_shape) if port_shape is not None else port.shape, reference.shape), dtype=dtype)
    scale = _largest_magnitude(reference) if reference.size else 0.0
    scale = scale if scale > 0 else 1.0

    def error_of(values, against=reference) -> float:
        return float(values) if isinstance(values, Measured) else float(relative_error(values, against, scale))

    difference = _magnitude_in_place(port - reference)
    where = np.unravel_index(int(np.argmax(difference)), difference.shape) if difference.size else ()
    error = float(difference[where]) / scale if difference.size else 0.0
    del difference
    if not np.all(np.isfinite(port)):
        error = math.inf
    noise = jax_noise = twin_error = port_noise = island_noise = None
    if dtype == "float64" and not (float64_noise and noisy and tolerance is None):
        allowed = FLOAT64_TOLERANCE if tolerance is None else tolerance
    elif dtype == "float32" and tolerance is not None and not noisy:
        allowed = tolerance
    else:  # ``noisy``: PyTorch's results in this dtype; the largest of their errors is PyTorch's own
        if not noisy:
            raise ValueError(f"compare({stage!r}, {name!r}): a float32 quantity is judged against PyTorch's own error "
                             "(noisy) or a fixed tolerance; neither was given")
        noise = max(error_of(n) for n in noisy)
        allowed = allowance(noise, k, dtype) if tolerance is None else tolerance
        if dtype == "float64" and port_noisy and tolerance is None:
            port_noise = max(float(n) / scale if isinstance(n, TwinMeasured) else error_of(n, port) for n in port_noisy)
            allowed = allowance(max(noise, min(port_noise, SIGNIFICANT[dtype])), k, dtype)
        if dtype == "float64" and island_noisy and tolerance is None:
            island_noise = max(float(n) / scale if isinstance(n, TwinMeasured) else error_of(n, port) for n in island_noisy)
            allowed = max(allowed, allowance(island_noise, k, dtype))
        pairs = [(a, b) for a, b in jax_noisy
                 if (a.shape if isinstance(a, TwinMeasured) else np.shape(a)) == port.shape
                 and (isinstance(a, TwinMeasured) or np.shape(a) == np.shape(b))]
        if pairs and dtype == "float32":
            jax_noise = max(float(a) / scale if isinstance(a, TwinMeasured) else error_of(a, b) for a, b in pairs)
            twin_against = reference if twin_reference is None else twin_reference
            twin_error = max(error_of(b, twin_against) for _, b in pairs)
    return Row(stage, name, error, noise, allowed, scale, float(port[where]) if port.size else math.nan,
               float(reference[where]) if reference.size else math.nan, jax_noise=jax_noise, twin_error=twin_error,
               dtype=dtype, port_noise=port_noise, island_noise=island_noise)


FLOAT32_TO_64 = float(np.finfo(np.float64).eps / np.finfo(np.float32).eps)  # 2⁻²⁹: rounding scales with the unit roundoff



EPS64 = float(np.finfo(np.float64).eps)



ISLAND_FLOOR = float(np.finfo(np.float32).eps)  # the least PyTorch noise of a row a float32 island reaches (2⁻²³)
