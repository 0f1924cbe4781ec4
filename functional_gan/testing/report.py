"""The report of a check: its rows, its verdict, and the text, Markdown and JSON forms."""

from __future__ import annotations

import dataclasses

import jax
import numpy as np

from functional_gan import xla_guard
from functional_gan.comparisons.judge import FLOAT64_TOLERANCE, ULPS, Row

from .pairing import Pairing

PROGRAMS = ("jit", "eager")  # the compiled program (judged) and the same code op by op


def jax_build() -> str:
    """The JAX build that ran the port, as the report names it."""
    return f"jax {jax.__version__}, {xla_guard.describe()}"


@dataclasses.dataclass
class Report:
    spec: str
    dtype: str
    k: float
    pairings: list[Pairing]
    rows: list[Row]  # the judged program's (the compiled one, unless only op by op was asked)
    api: str = "Flax Linen"
    programs: tuple[str, ...] = PROGRAMS
    other_rows: list[Row] = dataclasses.field(default_factory=list)  # the second program's, when both ran
    build: str = ""
    layers: int = 0  # paired layers PyTorch ran
    uncaptured: list[str] = dataclasses.field(default_factory=list)  # those of them without the port's output

    @property
    def first_divergence(self) -> Row | None:
        return next((r for r in self.rows if not r.passed), None) or next((r for r in self.other_rows if not r.passed), None)

    @property
    def passed(self) -> bool:
        return self.first_divergence is None

    @property
    def only_in(self) -> str | None:
        """"jit" or "eager" when the first divergence shows in that program alone (a JAX/XLA matter), else None."""
        first = self.first_divergence
        if first is None or len(self.programs) < 2:
            return None
        twins = {(r.stage, r.name): r for r in (self.other_rows if first in self.rows else self.rows)}
        twin = twins.get((first.stage, first.name))
        if twin is None or not twin.passed:
            return None
        return self.programs[0] if first in self.rows else self.programs[1]

    @property
    def beyond_pytorch(self) -> list[Row]:
        """The quantities that pass only by JAX's own float32 error (PyTorch's alone would not allow them)."""
        return [r for r in self.rows if r.beyond_pytorch]

    def verdict(self) -> str:
        """The report's last line(s): agreement, or the first divergence and what it means."""
        first = self.first_divergence
        if first is None:
            text = f"Agreement: all {len(self.rows)} quantities within tolerance ({_program_words(self.programs)})."
            rounding = self.beyond_pytorch
            if rounding:
                r = rounding[0]
                text += (f"\n{len(rounding)} of them (marked *) are further from PyTorch64 than {self.k:g}× PyTorch's own "
                         f"float32 error, but within {self.k:g}× JAX's own (the same JAX program in float64 is right): JAX's "
                         f"float32 arithmetic is less accurate than PyTorch's there, not the port's logic. First: "
                         f"{r.stage}, {r.name} ({r.port_error / _at_least_ulps(r.noise):.1f}× PyTorch's error, "
                         f"{r.port_error / _at_least_ulps(r.jax_noise):.1f}× JAX's).")
            return text
        if first.shapes is not None:
            port_shape, torch_shape = first.shapes
            text = (f"First divergence: {first.stage}, {first.name}: the shapes differ: the port gives {port_shape}, "
                    f"PyTorch {torch_shape} (a layout the checker could not map; to_jax/from_jax say how to convert).")
        else:
            text = (f"First divergence: {first.stage}, {first.name}: error {first.port_error:.3g} of the tensor's scale "
                    f"{first.scale:.3g} (allowed {first.allowed:.3g}); at the largest difference JAX has "
                    f"{first.jax_value:.8g}, PyTorch (float64) {first.torch_value:.8g}.")
        only = self.only_in
        if only == "jit":
            text += ("\nOnly the compiled program (jax.jit) departs: the same code run op by op agrees with PyTorch. "
                     f"The compiled program differs from the op-by-op one: a JAX/XLA matter, not the port ({self.build}).")
        elif only == "eager":
            text += ("\nOnly the op-by-op program departs: the compiled one (jax.jit) agrees with PyTorch. The two "
                     f"programs differ: a JAX/XLA matter, not the port ({self.build}).")
        return text

    def _coverage(self) -> str:
        if not self.uncaptured:
            return f"Per-layer outputs: all {self.layers} paired layers."
        why = {"plain function": "mark each with functional_gan.testing.tap('layer path', x)",
               "Flax Linen": "capture_intermediates sees only submodules' __call__, outside nn.scan/nn.vmap"}.get(
            self.api, "only a submodule's __call__ is seen, and not inside the port's own jax.vmap or lax.scan")
        return (f"Per-layer outputs: {self.layers - len(self.uncaptured)} of {self.layers} paired layers; none for "
                f"{', '.join(self.uncaptured)} ({why}): a divergence there shows at the next layer that has one.")

    def to_json(self) -> dict:
        def rows(which):
            return [{**dataclasses.asdict(r), "passed": r.passed, "ratio_to_pytorch_noise": r.ratio} for r in which]

        return {"spec": self.spec, "dtype": self.dtype, "k": self.k, "passed": self.passed, "api": self.api,
                "programs": list(self.programs), "build": self.build, "only_in": self.only_in,
                "layers": self.layers, "uncaptured_layers": self.uncaptured,
                "transfer": [dataclasses.asdict(p) for p in self.pairings], "rows": rows(self.rows),
                "other_program_rows": rows(self.other_rows),
                "first_divergence": None if self.passed else dataclasses.asdict(self.first_divergence)}

    def format(self, markdown: bool = False) -> str:
        lines = [f"# check-port: {self.spec} ({self.dtype})", ""] if markdown else []
        lines += [f"Port: {self.api}; JAX program checked: {_program_words(self.programs)}; {self.build}",
                  self._coverage(), "", "Weight transfer (PyTorch → port):"]
        width_torch = max([len(p.torch_key) for p in self.pairings] + [8])
        width_jax = max([len(p.jax_name) for p in self.pairings] + [8])
        for p in self.pairings:
            lines.append(f"  {p.torch_key:<{width_torch}}  →  {p.jax_name:<{width_jax}}  {p.transform}")
        criterion = (f"|JAX − PyTorch64| ≤ {self.k:g} × max(|PyTorch32 − PyTorch64|, |JAX32 − JAX64|, {ULPS} ulps), relative "
                     "to each tensor's scale (PyTorch32: also with the batch in two other orders; JAX64: the same JAX "
                     f"program in float64, {'op by op' if 'eager' in self.programs else 'compiled'})"
                     if self.dtype == "float32" else f"|JAX − PyTorch64| ≤ {FLOAT64_TOLERANCE:g} of each tensor's scale")
        lines += ["", f"Criterion: {criterion}", ""]
        width_stage = max([len(r.stage) for r in self.rows] + [5])
        width_name = max([len(r.name) for r in self.rows] + [8])
        header = (f"{'stage':<{width_stage}}  {'quantity':<{width_name}}  {'port error':>11} {'PyTorch noise':>13} "
                  f"{'JAX noise':>10} {'ratio':>7}  ok")
        lines += [header, "-" * len(header)]
        for r in self.rows:
            noise = f"{r.noise:.2e}" if r.noise is not None else "—"
            jax_noise = f"{r.jax_noise:.2e}" if r.jax_noise is not None else "—"
            ratio = f"{r.ratio:.2f}" if r.ratio is not None else "—"
            error = "shape" if r.shapes is not None else f"{r.port_error:.2e}"
            mark = ("✓*" if r.beyond_pytorch else "✓") if r.passed else "✗"
            lines.append(f"{r.stage:<{width_stage}}  {r.name:<{width_name}}  {error:>11} {noise:>13} {jax_noise:>10} "
                         f"{ratio:>7}  {mark}")
        lines += ["", self.verdict()]
        text = "\n".join(lines)
        return f"```text\n{text}\n```\n" if markdown else text


def _at_least_ulps(noise: float | None) -> float:
    return max(noise or 0.0, ULPS * float(np.finfo(np.float32).eps))


def _program_words(programs: tuple[str, ...]) -> str:
    words = {"jit": "compiled with jax.jit, as training runs it", "eager": "op by op, without jax.jit"}
    return " and ".join(words[p] for p in programs)


