"""Resident memory of the checking process, phase by phase: what ``check-port --memory`` and the benchmark's
check-port rows report. Linux reads ``/proc/self/status`` (the resident set now, VmRSS, and its peak so far, VmHWM);
elsewhere the peak comes from ``resource.getrusage`` and the current size is not known. And a bound on what JAX holds
of a program run op by op (:func:`op_programs_bounded`)."""

from __future__ import annotations

import contextlib
import ctypes
import ctypes.util
import dataclasses
import gc
import resource
import sys
import time


def _status() -> tuple[float | None, float]:
    """(resident now, peak so far), in bytes."""
    try:
        with open("/proc/self/status") as status:
            fields = dict(line.split(":", 1) for line in status if ":" in line)
        return int(fields["VmRSS"].split()[0]) * 1024, int(fields["VmHWM"].split()[0]) * 1024
    except (OSError, KeyError, ValueError):
        peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
        return None, peak * (1 if sys.platform == "darwin" else 1024)  # bytes on macOS, KiB on Linux


def _libc():
    try:
        return ctypes.CDLL(ctypes.util.find_library("c") or "libc.so.6")
    except OSError:
        return None


_LIBC = _libc()


def release() -> None:
    """Python's garbage collected, and the C heap's free memory handed back to the system where glibc can
    (:func:`trim`)."""
    gc.collect()
    trim()


def trim() -> None:
    """The C heap's free memory handed back to the system where glibc can (``malloc_trim``): arrays freed by one phase
    otherwise stay resident in malloc's arenas (XLA's threads have their own), while the next phase's large
    allocations (XLA's buffers, a big tensor) are mapped afresh beside them."""
    function = getattr(_LIBC, "malloc_trim", None)
    if function is not None:
        function(0)


_FREEZING = []


@contextlib.contextmanager
def old_objects_frozen():
    """The Python objects alive as a check starts (the imported libraries' modules, classes and functions: hundreds of
    thousands under torch, JAX and Flax) left out of the garbage collector's passes while it runs (``gc.freeze``), and
    handed back to it after (``gc.unfreeze``): each phase's collection (:func:`release`) then walks what the check made,
    not the whole interpreter (0.2 s a pass otherwise: a fifth of a block-by-block check's time, and of many a small
    check's). Inside a check that froze them already (a block's, within a block-by-block check) nothing changes.

    ``gc.unfreeze`` hands back every frozen object: objects the program froze itself before the check (CPython 3.12.1
    starts with a few hundred frozen) are collected as usual after it; the collector has no way to unfreeze only some.
    """
    if _FREEZING:
        yield
        return
    _FREEZING.append(True)
    gc.freeze()
    try:
        yield
    finally:
        gc.unfreeze()
        _FREEZING.pop()


@dataclasses.dataclass
class Phase:
    name: str
    resident: float | None  # bytes, at the phase's end
    peak: float  # bytes, the process's peak so far
    seconds: float  # since the check began


class Phases:
    """Marks taken as a check goes: each phase's end, with the resident memory then and the peak so far."""

    def __init__(self) -> None:
        self.start = time.perf_counter()
        self.marks: list[Phase] = []
        self.mark("start")

    def mark(self, name: str) -> None:
        release()
        resident, peak = _status()
        self.marks.append(Phase(name, resident, peak, time.perf_counter() - self.start))

    @property
    def peak(self) -> float:
        return max(m.peak for m in self.marks)

    def format(self) -> str:
        gib = 1024 ** 3
        width = max([44] + [len(m.name) for m in self.marks])
        lines = [f"Memory (resident, GiB; the process's peak {self.peak / gib:.2f} GiB):",
                 f"  {'phase':{width}} {'now':>6} {'peak':>6} {'at s':>7}"]
        for m in self.marks:
            now = f"{m.resident / gib:6.2f}" if m.resident is not None else "     ?"
            lines.append(f"  {m.name:{width}} {now} {m.peak / gib:6.2f} {m.seconds:7.1f}")
        return "\n".join(lines)


# Op by op, JAX compiles a program for each operation at each shape it meets and keeps every one until the process
# ends: about 1 MB apiece on XLA:CPU (each executable with its lowering), some 800 for a ResNet-50's training step,
# 1.3 GB held for the whole of a run whose arrays are a tenth of that. A bound on how many are held costs their
# compilation again (the same programs: the same numbers) for a peak that no longer grows with the model's depth.
OP_PROGRAMS_HELD = 100
_COMPILE_EVENT = "/jax/core/compile/backend_compile_duration"  # jax.monitoring's event for each XLA compilation


@contextlib.contextmanager
def op_programs_bounded(held: int = OP_PROGRAMS_HELD):
    """Within the block, JAX's caches are cleared (``jax.clear_caches``) before an operation dispatched op by op
    whenever ``held`` programs have been compiled since the last clearing. The compilations are counted with
    ``jax.monitoring``; the operations are met where JAX dispatches one (``jax._src.dispatch.xla_primitive_callable``,
    JAX's own and not public: where a JAX version has it elsewhere, nothing is bounded and the run is as before)."""
    import jax
    from jax import monitoring

    try:
        from jax._src import dispatch
        original = dispatch.xla_primitive_callable
    except (ImportError, AttributeError):
        yield
        return
    compiled = [0]

    def count(event: str, duration: float, **_) -> None:
        if event == _COMPILE_EVENT:
            compiled[0] += 1

    def bounded(*args, **kwargs):
        if compiled[0] >= held:
            compiled[0] = 0
            jax.clear_caches()
        return original(*args, **kwargs)

    monitoring.register_event_duration_secs_listener(count)
    dispatch.xla_primitive_callable = bounded
    try:
        yield
    finally:
        dispatch.xla_primitive_callable = original
        monitoring.unregister_event_duration_listener(count)
