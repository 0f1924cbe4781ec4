"""The report of a check: its rows, its verdict, and the text, Markdown and JSON forms.

A check's outcome (:attr:`Report.outcome`) is the worst of its rows' verdicts, each a
:class:`~functional_gan.testing.judge.Verdict`, which says what it means and its exit status (the rule, stated there
once, is the report's footer). The text starts with its summary (per stage the count and the worst ratio to
PyTorch's own error, every divergence and precision finding), then the weight transfer and the table.
"""

from __future__ import annotations

import dataclasses
import math
from typing import Any

import jax

from functional_gan import xla_guard
from .judge import FLOAT64_TOLERANCE, SIGNIFICANT, ULPS, ULPS64, VERDICT_RULE, Row, Verdict

from .pairing import Pairing

PROGRAMS = ("jit", "eager")  # the compiled program (judged) and the same code op by op


def jax_build() -> str:
    """The JAX build that ran the port, as the report names it."""
    return f"jax {jax.__version__}, {xla_guard.describe()}"


STAGES = ("forward", "output", "loss", "gradient", "update", "buffer")
EXIT_AGREEMENT, EXIT_DIVERGENCE, EXIT_PRECISION = (Verdict.AGREEMENT.exit_status, Verdict.DIVERGENCE.exit_status,
                                                  Verdict.PRECISION_FINDING.exit_status)
LISTED = 20  # divergences and precision findings listed by name in the summary (the table has every row)
NEAR_ZERO = 0.01  # PyTorch's own error above this fraction of a quantity's scale: the quantity is rounding itself


@dataclasses.dataclass(frozen=True, kw_only=True)
class Report:
    """A check's outcome, built once when the check ends (:func:`.check.check_port`); its verdict is
    :attr:`outcome` (a :class:`~.judge.Verdict`), its exit status :meth:`exit_status`."""

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
    carried: str = ""  # the port's own state handed from each step to the next, in words ("" for one step)
    steps: int = 1
    causes: list[str] = dataclasses.field(default_factory=list)  # the likely causes of the precision findings
    allow_precision: bool = False  # precision findings alone exit 0 (the CLI's --allow-precision)
    hints: dict = dataclasses.field(default_factory=dict)  # (stage, name) of a divergence → a known cause, in words
    memory: Any = None  # the check's resident memory phase by phase (a .memory.Phases)
    notes: list[str] = dataclasses.field(default_factory=list)  # what the check could not do as it does, in words
    tied: dict = dataclasses.field(default_factory=dict)  # PyTorch's tied tensors: a later name → the name paired
    converted: Any = None  # check_port(..., export=True): the port as its API keeps it, holding PyTorch's weights
    train: bool = True  # the spec's TRAIN: the mode both models ran in

    @property
    def first_divergence(self) -> Row | None:
        """The first row that diverges, or a layer's output of another size than PyTorch's (no layout makes 15×15
        values of 16×16: a max pool with other padding starts a divergence there). A layer's output of PyTorch's size
        that the checker could not lay out as PyTorch's is never it (an unmapped layout is no evidence of a
        difference: a head-split attention tap named there hid the real divergence further down); those before the
        first divergence are named beside it (:meth:`verdict`)."""
        for rows in (self.rows, self.other_rows):
            for row in rows:
                if row.diverged or (row.not_compared and _sizes_differ(row)):
                    return row
        return None

    def not_compared_before(self, first: Row) -> list[Row]:
        """The layer outputs not compared that come before ``first`` among its program's rows (where a divergence may
        start unseen, a pooling with other padding say)."""
        rows = self.rows if any(r is first for r in self.rows) else self.other_rows
        before = []
        for row in rows:
            if row is first:
                return before
            if row.not_compared:
                before.append(row)
        return before

    @property
    def precision_findings(self) -> list[Row]:
        """The judged program's precision findings that fail the check: beyond the allowance, the mathematics right,
        and more than √eps of the scale (:attr:`Row.finding`)."""
        return [r for r in self.rows if r.finding]

    @property
    def precision_notes(self) -> list[Row]:
        """The judged program's precision differences within √eps of the scale: reported, never a failure."""
        return [r for r in self.rows if r.note]

    @property
    def not_compared(self) -> list[Row]:
        """Layer outputs the checker could not lay out as PyTorch's: listed, never a divergence."""
        return [r for r in self.rows if r.not_compared]

    @property
    def precision_start(self) -> Row | None:
        """Where the imprecision starts: the first forward (or output) finding, before the gradients inheriting it."""
        from .precision import start_of

        return start_of(self.precision_findings or self.precision_notes)

    @property
    def passed(self) -> bool:
        """Agreement: every quantity within tolerance, no divergence and no precision finding."""
        return self.first_divergence is None and not self.precision_findings

    @property
    def outcome(self) -> Verdict:
        """The check's verdict: a divergence in either program, else a precision finding of the judged one, else
        agreement (notes and rows not compared included)."""
        if self.first_divergence is not None:
            return Verdict.DIVERGENCE
        return Verdict.PRECISION_FINDING if self.precision_findings else Verdict.AGREEMENT

    def exit_status(self, allow_precision: bool | None = None) -> int:
        """The outcome's exit status: 0 agreement, 1 a divergence, 3 precision findings only (0 with
        ``allow_precision``, by default the report's own).

        Args:
            allow_precision: precision findings alone exit 0; None (the default) takes the report's own
                ``allow_precision``.

        Returns:
            0, 1 or 3.
        """
        allow = self.allow_precision if allow_precision is None else allow_precision
        outcome = self.outcome
        return EXIT_AGREEMENT if outcome is Verdict.PRECISION_FINDING and allow else outcome.exit_status

    @property
    def only_in(self) -> str | None:
        """"jit" or "eager" when the first divergence shows in that program alone (a JAX/XLA matter), else None."""
        first = self.first_divergence
        if first is None or len(self.programs) < 2:
            return None
        twins = {(r.step, r.stage, r.name): r for r in (self.other_rows if first in self.rows else self.rows)}
        twin = twins.get((first.step, first.stage, first.name))
        if twin is None or twin.diverged:
            return None
        return self.programs[0] if first in self.rows else self.programs[1]

    def _precision_text(self) -> str:
        findings = self.precision_findings
        if not findings:
            return self._notes_text()
        ratios = [r.ratio for r in findings if r.ratio is not None] or [float("nan")]
        start = self.precision_start
        count = f"{len(findings)} quantit{'y is' if len(findings) == 1 else 'ies are'}"
        why = ("although the same JAX program in float64 agrees with PyTorch: the mathematics is right, the port's "
               "float32 arithmetic is less accurate than PyTorch's" if self.dtype == "float32" else
               "within 1e-10 of each scale, in a port that computes with an algorithm known to lose precision: the "
               "mathematics is right, the port's float64 arithmetic is less accurate than PyTorch's")
        text = (f"Precision: {count} {min(ratios):.1f}–{max(ratios):.1f}× PyTorch's own {self.dtype} error "
                f"(allowed {self.k:g}×) {why}. It starts at {start.label}, {start.name} ({start.ratio:.1f}×).")
        for cause in self.causes:
            text += f"\nLikely cause: {cause}"
        return text + ("\n" + self._notes_text() if self._notes_text() else "")

    def _notes_text(self) -> str:
        notes = self.precision_notes
        if not notes:
            return ""
        worst = max(notes, key=lambda r: r.port_error)
        text = (f"Note: {len(notes)} quantit{'y is' if len(notes) == 1 else 'ies are'} beyond k × PyTorch's own "
                f"{self.dtype} error by the port's own rounding (the mathematics right), each within √eps "
                f"({SIGNIFICANT[self.dtype]:.2g}) of its scale, the largest {worst.port_error:.2g} ({worst.label}, "
                f"{worst.name}): a difference that changes no training run; not a failure.")
        if not self.precision_findings:
            for cause in self.causes:
                text += f"\nLikely cause: {cause}"
        return text

    def verdict(self) -> str:
        """The report's last line(s): agreement, precision findings, or the first divergence and what it means."""
        first = self.first_divergence
        precision = self._precision_text()
        if first is None:
            if self.precision_findings:
                status = ("exit status 0 (precision findings allowed)" if self.allow_precision else
                          "exit status 3; 0 with --allow-precision, or assert_port(..., allow_precision=True)")
                return (precision + f"\nNo divergence: every other quantity within tolerance ({program_words(self.programs)}); "
                        f"{status}.")
            skipped = len(self.not_compared)
            compared = len(self.rows) - skipped - len(self.precision_notes)
            text = (f"Agreement: {'all ' if compared == len(self.rows) else ''}{compared} quantities within tolerance "
                    f"({program_words(self.programs)})")
            if self.precision_notes:
                text += f", {len(self.precision_notes)} within √eps (notes)"
            if skipped:
                text += (f"; {skipped} layer output{'s' if skipped > 1 else ''} not compared (a layout the checker "
                         "could not map), every row after {'them' if skipped > 1 else 'it'} compared")
            return text + "." + ("\n" + precision if precision else "")
        if first.shapes is not None:
            port_shape, torch_shape = first.shapes
            text = (f"First divergence: {first.label}, {first.name}: the shapes differ: the port gives {port_shape}, "
                    f"PyTorch {torch_shape} (a layout the checker could not map; to_jax/from_jax say how to convert).")
        else:
            text = (f"First divergence: {first.label}, {first.name}: relative error {first.port_error:.3g} (the largest "
                    f"difference ÷ the tensor's scale, {first.scale:.3g}; allowed {first.allowed:.3g}); at the largest "
                    f"difference JAX has {first.jax_value:.8g}, PyTorch (float64) {first.torch_value:.8g}.")
            if first.twin_error is not None:
                text += (f" The same JAX program in float64 is {first.twin_error:.3g} of the scale from PyTorch64: "
                         "the mathematics differs.")
        unmapped = self.not_compared_before(first)
        if unmapped:
            names = ", ".join(f"{r.label}, {r.name}" for r in unmapped[:3]) + (" ..." if len(unmapped) > 3 else "")
            text += (f"\nBefore it, {len(unmapped)} layer output{'s' if len(unmapped) > 1 else ''} not compared (a "
                     f"layout the checker could not map): {names}; a divergence may start there unseen.")
        hint = self.hints.get((first.stage, first.name))
        if hint:
            text += f"\nKnown cause that fits: {hint}"
        only = self.only_in
        if only == "jit":
            text += ("\nOnly the compiled program (jax.jit) departs: the same code run op by op agrees with PyTorch. "
                     f"The compiled program differs from the op-by-op one: a JAX/XLA matter, not the port ({self.build}).")
        elif only == "eager":
            text += ("\nOnly the op-by-op program departs: the compiled one (jax.jit) agrees with PyTorch. The two "
                     f"programs differ: a JAX/XLA matter, not the port ({self.build}).")
        return text + ("\n" + precision if precision else "")

    def _coverage(self) -> str:
        if not self.uncaptured:
            which = {1: "the paired layer", 2: "both paired layers"}.get(self.layers, f"all {self.layers} paired layers")
            return f"Per-layer outputs: {which}."
        why = {"plain function": "mark each with functional_gan.testing.tap('layer path', x)"}.get(
            self.api, "a layer is seen when the port calls it as a module")
        return (f"Per-layer outputs: {self.layers - len(self.uncaptured)} of {self.layers} paired layers; none for "
                f"{', '.join(self.uncaptured)} ({why}): a divergence there shows at the next layer that has one.")

    def _state_line(self) -> str:
        if self.steps < 2:
            return ""
        own = f"the port's own state ({self.carried}) from its previous step, as training carries it" if self.carried \
            else "no state of the port's own (it keeps none)"
        return f"Steps: {self.steps}; each starts from PyTorch's parameters (teacher forcing) and {own}."

    def summary(self) -> list[str]:
        """Per stage: the count and the worst ratio to PyTorch's own error (or to the allowance) with its row; then
        every divergence and precision finding (the first ``LISTED`` by name)."""
        status = self.exit_status()
        outcome = outcome_words(self.outcome, self.allow_precision)
        lines = [f"Summary: {outcome} (exit status {status}); {len(self.rows)} quantities, {self.dtype}, "
                 f"k = {self.k:g}", f"  {'stage':<9} {'rows':>5}  {'worst':>9}  at"]
        for stage in STAGES:
            rows = [r for r in self.rows if r.stage == stage and not r.not_compared]
            if not rows:
                continue
            worst = max(rows, key=badness)
            lines.append(f"  {stage:<9} {len(rows):>5}  {ratio_text(worst):>9}  {worst.label}, {worst.name}"
                         f"{'' if worst.passed else (' ≈ precision' if worst.finding else ' ~ note' if worst.note else ' ✗')}")
        lines.append(f"  (worst, \"×\": the port's error ÷ max(PyTorch's own error in this dtype, {ULPS if self.dtype == 'float32' else ULPS64} "
                     f"ulps of the scale); allowed: {self.k:g}×. \"of\": ÷ the allowance, where PyTorch's own was not measured)")
        judged = {(r.step, r.stage, r.name) for r in self.rows if r.diverged}
        other = self.programs[1] if len(self.programs) > 1 else ""
        diverged = [(r, "") for r in self.rows if r.diverged]
        diverged += [(r, f" ({program_words((other,))} only)") for r in self.other_rows
                     if r.diverged and (r.step, r.stage, r.name) not in judged]
        for title, found in (("Divergences", diverged), ("Precision findings", [(r, "") for r in self.precision_findings]),
                             ("Notes (within √eps of the scale)", [(r, "") for r in self.precision_notes]),
                             ("Not compared (the port's layout of a layer's output not mapped)",
                              [(r, "") for r in self.not_compared])):
            if found:
                lines.append(f"{title} ({len(found)}):")
                lines += [f"  {r.label}, {r.name}: {ratio_text(r)}{where}" for r, where in found[:LISTED]]
                if len(found) > LISTED:
                    lines.append(f"  ... and {len(found) - LISTED} more (marked in the table)")
        return lines

    def to_json(self) -> dict:
        """The report as JSON-ready data (``check-port --json``).

        Returns:
            A dict: the spec, dtype, k, the outcome (``passed``, ``exit_status``, ``only_in``), the build, the
                pairing (``transfer``), every row of both programs with its verdict's flags and its ratio to
                PyTorch's noise, the first divergence, the rows not compared, the precision findings' count and
                causes, the notes.
        """
        def rows(which):
            return [{**dataclasses.asdict(r), "passed": r.passed, "precision": r.precision, "finding": r.finding,
                     "note": r.note, "not_compared": r.not_compared, "diverged": r.diverged,
                     "ratio_to_pytorch_noise": r.ratio} for r in which]

        start = self.precision_start
        return {"spec": self.spec, "dtype": self.dtype, "k": self.k, "passed": self.passed,
                "allow_precision": self.allow_precision,
                "exit_status": self.exit_status(), "api": self.api,
                "programs": list(self.programs), "build": self.build, "only_in": self.only_in,
                "layers": self.layers, "uncaptured_layers": self.uncaptured, "steps": self.steps,
                "carried_state": self.carried, "notes": self.notes, "tied": self.tied,
                "transfer": [dataclasses.asdict(p) for p in self.pairings], "rows": rows(self.rows),
                "other_program_rows": rows(self.other_rows),
                "first_divergence": None if self.first_divergence is None else dataclasses.asdict(self.first_divergence),
                "not_compared": [{"step": r.step, "stage": r.stage, "name": r.name, "shapes": r.shapes} for r in self.not_compared],
                "precision": {"findings": len(self.precision_findings), "notes": len(self.precision_notes),
                              "causes": self.causes,
                              "starts_at": None if start is None else {"step": start.step, "stage": start.stage, "name": start.name,
                                                                       "ratio": start.ratio}}}

    def criterion(self) -> str:
        """The criterion the rows were judged by, in this check's dtype, as one line of the report."""
        if self.dtype == "float32":
            return (f"|JAX − PyTorch64| ≤ {self.k:g} × max(|PyTorch32 − PyTorch64|, {ULPS} ulps), relative to each "
                    "tensor's scale (PyTorch32: also with the batch in two other orders). Beyond it, a precision finding "
                    "(≈) where the same JAX program in float64 agrees with PyTorch64 within that allowance and JAX's own "
                    "float32 error |JAX32 − JAX64| accounts for it; else a divergence (✗).")
        measured = any(r.noise is not None for r in self.rows)
        if measured:
            return (f"|JAX − PyTorch64| ≤ {self.k:g} × max(|PyTorch64' − PyTorch64|, {ULPS64} ulps of float64), relative "
                    "to each tensor's scale (PyTorch64': PyTorch in float64 with the batch in two other orders, with its "
                    "weights and images in other memory layouts, with every input and weight moved by one ulp, with its "
                    "matrix products' long sums in blocks, and its float32 error × 2⁻²⁹; where it computes in float32 "
                    "inside, without those casts; for the update, its optimizer fed moved gradients; the port's own "
                    f"error beside it; {FLOAT64_TOLERANCE:g} where nothing was measured)")
        return f"|JAX − PyTorch64| ≤ {FLOAT64_TOLERANCE:g} of each tensor's scale"

    def format(self, markdown: bool = False) -> str:
        """The whole report as text: the summary, the port and its coverage, the notes, the weight transfer, the
        criterion, every row, the verdict and the verdicts' rule.

        Args:
            markdown: a Markdown page (a heading, the text in a code block) instead of plain text.

        Returns:
            The report, as ``check-port`` prints it.
        """
        lines = [f"# check-port: {self.spec} ({self.dtype})", ""] if markdown else []
        lines += self.summary()
        lines += ["", f"Port: {self.api}; JAX program checked: {program_words(self.programs)}; {self.build}",
                  self._coverage()]
        if self._state_line():
            lines.append(self._state_line())
        lines += [f"Note: {note}" for note in self.notes]
        lines += ["", "Weight transfer (PyTorch → port):"]
        width_torch = max([len(p.torch_key) for p in self.pairings] + [8])
        width_jax = max([len(p.jax_name) for p in self.pairings] + [8])
        for p in self.pairings:
            lines.append(f"  {p.torch_key:<{width_torch}}  →  {p.jax_name:<{width_jax}}  {p.transform}")
        paired = {p.torch_key for p in self.pairings}
        for later, first in self.tied.items():
            lines.append(f"  {later:<{width_torch}}  =  {first:<{width_jax}}  " + (
                "(tied in PyTorch: one tensor; the port holds a copy of its own, paired above)" if later in paired else
                "(tied: one tensor, paired once; its gradient is the sum over its uses)"))
        lines += ["", f"Criterion: {self.criterion()}", ""]
        width_stage = max([len(r.label) for r in self.rows] + [5])
        width_name = max([len(r.name) for r in self.rows] + [8])
        header = (f"{'stage':<{width_stage}}  {'quantity':<{width_name}}  {'port error':>11} {'PyTorch noise':>13} "
                  f"{'JAX noise':>10} {'ratio':>7}  ok")
        lines += [header, "-" * len(header)]
        near_zero = False
        for r in self.rows:
            noise = f"{r.noise:.2e}" if r.noise is not None else "—"
            owns = [n for n in (r.port_noise, r.island_noise) if n is not None]
            own = r.jax_noise if r.jax_noise is not None else max(owns) if owns else None
            jax_noise = f"{own:.2e}" if own is not None else "—"
            ratio = _ratio(r.ratio) if r.ratio is not None else "—"
            error = "shape" if r.shapes is not None else f"{r.port_error:.2e}"
            mark = r.verdict.mark
            if r.passed and r.noise is not None and r.noise > NEAR_ZERO:
                mark = "✓°"
                near_zero = True
            lines.append(f"{r.label:<{width_stage}}  {r.name:<{width_name}}  {error:>11} {noise:>13} {jax_noise:>10} "
                         f"{ratio:>7}  {mark}")
        if near_zero:
            lines.append(f"° PyTorch's own error there is above {NEAR_ZERO:.0%} of the quantity's scale: rounding "
                         "dominates its values (a quantity mathematically zero or nearly, a bias before a BatchNorm, say; "
                         "or one whose computation amplifies rounding, as gradients through BatchNorms over a few values "
                         "each do), and the port's rounding is compared with PyTorch's.")
        lines += ["", self.verdict(), "", f"Verdicts: {VERDICT_RULE}"]
        text = "\n".join(lines)
        return f"```text\n{text}\n```\n" if markdown else text


def outcome_words(outcome: Verdict, allow_precision: bool = False) -> str:
    """A check's outcome as its summary line names it.

    Args:
        outcome: the check's verdict.
        allow_precision: precision findings alone are allowed (the words say so).

    Returns:
        ``"DIVERGENCE"``, ``"precision findings"`` (or ``"precision findings, allowed"``), or the verdict's words.
    """
    if outcome is Verdict.PRECISION_FINDING:
        return "precision findings, allowed" if allow_precision else "precision findings"
    return "DIVERGENCE" if outcome is Verdict.DIVERGENCE else outcome.words


def badness(row: Row) -> float:
    """How far a row is from agreement, to pick the worst row of a stage or a block.

    Args:
        row: a judged row.

    Returns:
        The row's ratio to PyTorch's own error (:attr:`.judge.Row.ratio`); where that was not measured, its error over
        its allowance; infinity where the shapes differ or nothing is allowed.
    """
    if row.shapes is not None:
        return float("inf")
    return row.ratio if row.ratio is not None else row.port_error / row.allowed if row.allowed else float("inf")


def _ratio(ratio: float) -> str:
    """A ratio to the allowance in at most 7 characters: two decimals, or an exponent from 10,000 on (2.1e+06)."""
    return f"{ratio:.2f}" if ratio < 10000 else f"{ratio:.1e}"


def ratio_text(row: Row) -> str:
    """A row's entry in the worst column of a report's summary.

    Args:
        row: a judged row.

    Returns:
        ``"shape"`` where the shapes differ; the ratio to PyTorch's own error (``"1.23×"``); where that was not
        measured, the error over the allowance followed by ``of`` (``"0.5 of"``), or ``"inf"`` where nothing is allowed.
    """
    if row.shapes is not None:
        return "shape"
    if row.ratio is not None:
        return f"{_ratio(row.ratio)}×"
    return f"{row.port_error / row.allowed:.2g} of" if row.allowed else "inf"


def program_words(programs: tuple[str, ...]) -> str:
    """The JAX programs as the report and the messages name them.

    Args:
        programs: ``"jit"`` and/or ``"eager"``.

    Returns:
        Each program in words, joined by "and".
    """
    words = {"jit": "compiled with jax.jit, as training runs it", "eager": "op by op, without jax.jit"}
    return " and ".join(words[p] for p in programs)


def _sizes_differ(row: Row) -> bool:
    """Whether a row's two shapes hold different numbers of values (no layout maps one onto the other)."""
    port_shape, torch_shape = row.shapes
    return math.prod(port_shape) != math.prod(torch_shape)

