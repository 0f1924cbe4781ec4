"""``assert_port``: check-port for a test suite, whole or block by block."""

from __future__ import annotations

import dataclasses
from pathlib import Path
from types import ModuleType

from .judge import DEFAULT_K

from .blocks import check_by_block
from .check import check_port
from .report import PROGRAMS, Report
from .spec import Spec, load_spec, spec_from_module


def assert_port(spec: Spec | ModuleType | str | Path | None = None, /, *, dtype: str = "float32", steps: int = 1,
                k: float = DEFAULT_K, seed: int = 0, programs: tuple[str, ...] = PROGRAMS, allow_precision: bool = False,
                by_block: bool = False, **pieces) -> Report:
    """``check_port`` for a test suite: the report when the port agrees with PyTorch, else ``AssertionError``.

    Args:
        spec: a :class:`Spec`, a spec module, a spec file's path, or nothing, with the spec's pieces as keywords
            (``torch_model=``, ``jax_model=``, ``example_inputs=``, ``train=False``, ...); keywords given with a module
            or a file replace its names.
        dtype: ``"float32"`` (the port as it trains) or ``"float64"`` (its mathematics, to about 1e-15).
        steps: optimizer steps compared, each from PyTorch's parameters and the port's own state after the last.
        k: the port may be this many times PyTorch's own error in ``dtype``.
        seed: PyTorch's seed for ``torch_model()``'s initial weights and the check's random draws.
        programs: the JAX programs run, the first judged: ``("jit", "eager")``, ``("jit",)`` or ``("eager",)``.
        allow_precision: pass where the only findings are of precision (float32 further from PyTorch64 than k ×
            PyTorch's own error while the same program in float64 agrees).
        by_block: one block at a time (see :mod:`.blocks`), for a model whose whole check does not fit in memory.

    Returns:
        The :class:`Report` (a :class:`~.blocks.BlockReport` with ``by_block``), whose exit status is 0.

    Raises:
        AssertionError: the port diverges, or has precision findings without ``allow_precision``; the message is
            the first divergence (or the findings), then the whole report.
        SpecError: a spec the checker cannot use (a missing piece, weights it cannot pair, an exception raised in
            the spec's or the port's code).
    """
    if isinstance(spec, (str, Path)):
        spec = load_spec(spec)
        if pieces:
            spec = dataclasses.replace(spec, **pieces)
    elif isinstance(spec, ModuleType):
        spec = spec_from_module({**vars(spec), **pieces})
    elif spec is None:
        spec = spec_from_module(pieces)
    elif pieces:
        spec = dataclasses.replace(spec, **pieces)
    check = check_by_block if by_block else check_port
    report = check(spec, dtype, steps, k, seed, programs, allow_precision=allow_precision)
    if report.exit_status() != 0:
        raise AssertionError(f"{report.verdict()}\n\n{report.format()}")
    return report
