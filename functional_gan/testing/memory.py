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

import numpy as np


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


LIBC = _libc()


def release() -> None:
    """Python's garbage collected, and the C heap's free memory handed back to the system where glibc can
    (:func:`trim`)."""
    gc.collect()
    trim()


def trim() -> None:
    """The C heap's free memory handed back to the system where glibc can (``malloc_trim``): arrays freed by one phase
    otherwise stay resident in malloc's arenas (XLA's threads have their own), while the next phase's large
    allocations (XLA's buffers, a big tensor) are mapped afresh beside them."""
    function = getattr(LIBC, "malloc_trim", None)
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


ANNOUNCE_AFTER = 5.0  # seconds: a check's phases are written as they end from then on (a short check writes none)


class Phases:
    """Marks taken as a check goes: each phase's end, with the resident memory then and the peak so far."""

    def __init__(self, announce: str | None = None) -> None:
        self.start = time.perf_counter()
        self.marks: list[Phase] = []
        self.announce = announce  # a prefix: each phase's end written to standard error as it comes (progress)
        self.mark("start")

    def mark(self, name: str) -> None:
        """The end of the phase ``name``: the garbage collected first (:func:`release`), then the resident memory and
        the peak so far recorded, and written to standard error where the phases are announced and the check has run
        :data:`ANNOUNCE_AFTER` seconds.

        Args:
            name: the phase, as the memory table names it.
        """
        release()
        resident, peak = _status()
        self.marks.append(Phase(name, resident, peak, time.perf_counter() - self.start))
        if self.announce and name != "start" and self.marks[-1].seconds >= ANNOUNCE_AFTER:
            now = f"{resident / GIB:.2f} GiB resident, " if resident is not None else ""
            print(f"{self.announce}{name} ({self.marks[-1].seconds:.0f} s, {now}peak {peak / GIB:.2f} GiB)",
                  file=sys.stderr, flush=True)

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
    JAX's own and not public: where a JAX version has it elsewhere, nothing is bounded and the run is as before).

    Args:
        held: how many programs may be compiled between two clearings of JAX's caches.
    """
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


# --- the check's size, known before it runs ---------------------------------------------------------------------

GIB = 1024 ** 3
# What the process holds before the check makes anything (torch, JAX and Flax imported, XLA's CPU client): measured
# at a small check's start on the project's 2-core machine, 0.6–0.8 GiB.
BASELINE = 0.8 * GIB
# A whole-model check's peak less BASELINE, over the model's parameters in float32 bytes, measured: GPT-2 small
# (124M parameters, AdamW) 6.39 GiB in float32 and 6.35 GiB in float64 with --program jit (12.1×), 7.4–7.65 GiB in
# float64 with both programs (14.6×); torchvision's ResNet-50 (25.6M, SGD with momentum, 64² images) 1.97 GiB (12.3×).
# The check holds, per parameter, the reference's and the port's values, their gradients, the optimizers' states and
# the updates, some of them twice over (float64 twins): a dozen copies at its peak.
WHOLE = {"float32": 12.5, "float64": 15.0}
# The same for --by-block's check of the rest of the model (its blocks replaced), measured where one tensor is most of
# it: Llama-3.2-1B's tied embedding of 128,256 × 2048 (263M parameters) peaked at 21.7 GiB (21.3×), float32, jit.
OUTSIDE = 21.5


@dataclasses.dataclass
class SizeEstimate:
    """A check's peak resident memory, estimated from the PyTorch model's parameter counts (bytes)."""

    parameters: int
    whole: float
    by_block: float | None  # the recording and the blocks' checks; None: no list of blocks found
    dtype: str
    outside: float | None = None  # --by-block's check of the rest of the model (left out where it does not fit)

    def message(self, available: float) -> str:
        """Why the check was not started, in one line.

        Args:
            available: the memory available, in bytes.

        Returns:
            The whole check's estimated peak against ``available``; where the model has a list of blocks, what
            ``--by-block`` would need; and ``--no-memory-estimate``.
        """
        bytes32 = self.parameters * 4
        line = (f"the whole-model check of this model ({_count(self.parameters)} parameters, {self.dtype}) needs about "
                f"{self.whole / GIB:.0f} GiB at its peak (estimated: {WHOLE[self.dtype]:g} × its "
                f"{bytes32 / GIB:.2f} GiB of float32 parameters + {BASELINE / GIB:.1f} GiB), and "
                f"{available / GIB:.1f} GiB are available: it was not started. ")
        if self.by_block is not None:
            line += (f"--by-block checks it a block at a time in about {self.by_block / GIB:.1f} GiB (estimated; the "
                     f"rest of the model, checked after the blocks where it fits, {self.outside / GIB:.1f} GiB); ")
        return line + "--no-memory-estimate runs it anyway."


def _count(n: int) -> str:
    return f"{n / 1e9:.2f}B" if n >= 1e9 else f"{n / 1e6:.1f}M"


def block_lists(model) -> list[tuple[str, list[int]]]:
    """The model's lists of blocks, the one rule ``--by-block`` and the memory estimate share: its ModuleLists and
    Sequentials below the model itself of two or more modules of one class, holding parameters, largest first.

    Args:
        model: the PyTorch model (built, or on the meta device).

    Returns:
        ``(module name, each child's parameter count)`` per list; ``--by-block``'s default blocks are the first's
        children.
    """
    import torch

    found = []
    for name, module in model.named_modules():
        if isinstance(module, (torch.nn.ModuleList, torch.nn.Sequential)) and name:
            children = list(module.children())
            if len(children) >= 2 and len({type(c) for c in children}) == 1 and any(True for _ in module.parameters()):
                found.append((name, [sum(p.numel() for p in c.parameters()) for c in children]))
    return sorted(found, key=lambda f: -sum(f[1]))


def estimate(model, dtype: str) -> SizeEstimate:
    """The whole check's peak and, where the model has a list of blocks (:func:`block_lists`' first, the blocks
    ``--by-block`` checks unless the spec names its own), the block-by-block check's: the PyTorch model held while each
    block's inputs are recorded, then one block's check (PyTorch's other blocks parked on disk), then the check of the
    parts outside the blocks.

    Args:
        model: the PyTorch model, built (or on the meta device: its shapes are enough).
        dtype: the check's dtype, ``"float32"`` or ``"float64"``.

    Returns:
        A :class:`SizeEstimate`, in bytes; its ``by_block`` and ``outside`` None where the model has no list of blocks.
    """
    total = parameter_count(model)
    factor = WHOLE[dtype]
    whole = BASELINE + factor * 4 * total
    lists = [(sum(sizes), max(sizes)) for _, sizes in block_lists(model)[:1]]
    by_block = outside = None
    if lists:
        blocks, largest = max(lists)
        by_block = BASELINE + max(4 * total * 1.2,  # the recording run
                                  factor * 4 * largest)  # one block's check (the others parked on disk)
        outside = outside_estimate(total - blocks)
    return SizeEstimate(total, whole, by_block, dtype, outside)


def parameter_count(model) -> int:
    """The model's parameters, a tensor shared between modules (a tied embedding) counted once.

    Args:
        model: a PyTorch module.

    Returns:
        The number of its parameters' elements.
    """
    return sum({id(p): p.numel() for p in model.parameters()}.values())


def outside_estimate(parameters: int) -> float:
    """The peak of --by-block's check of the rest of the model, ``parameters`` outside the blocks (bytes).

    Args:
        parameters: the number of parameters outside the blocks.

    Returns:
        The estimated peak, in bytes.
    """
    return BASELINE + OUTSIDE * 4 * parameters


def available() -> float | None:
    """The memory the system can give this process now without swapping (``MemAvailable``), in bytes; None where
    it cannot be read (not Linux)."""
    try:
        with open("/proc/meminfo") as meminfo:
            for line in meminfo:
                if line.startswith("MemAvailable:"):
                    return int(line.split()[1]) * 1024
    except (OSError, ValueError, IndexError):
        pass
    return None


def estimate_before_building(torch_model, dtype: str) -> SizeEstimate | None:
    """:func:`estimate` of ``torch_model()`` built on PyTorch's meta device (shapes, no values: a 1B-parameter model in
    a fraction of a second and no memory), or None where it cannot be built there (a model that loads weights).

    Args:
        torch_model: the spec's ``torch_model``, which builds the model with no arguments.
        dtype: the check's dtype, ``"float32"`` or ``"float64"``.

    Returns:
        A :class:`SizeEstimate`, or None where building the model on the meta device (or estimating it) raised.
    """
    import torch

    try:
        with torch.device("meta"):
            model = torch_model()
        return estimate(model, dtype)
    except Exception:
        return None


@dataclasses.dataclass(frozen=True)
class MemoryPolicy:
    """How a check holds its memory, decided in one place (the check's phases ask it, they do not decide): the size
    beyond which a check is not started, the sizes beyond which PyTorch64's reference is parked on disk while the port
    runs and its gradients computed again rather than held, and the model's size beyond which JAX's per-operation
    programs are bounded and let go after a program runs op by op. ``check_by_block`` checks each block with the
    default policy."""

    limit: float | None = None  # bytes: a check estimated beyond it (:func:`estimate`) is not started
    # bytes of PyTorch64's reference model (and its optimizer's state) beyond which it is parked on disk while the port
    # runs (:func:`.torch_side.reference_parked`)
    parked_above: int = 256 << 20
    recomputed_above: int = 256 << 20  # bytes of PyTorch64's gradients computed again at the last step, not held
    # bytes of the model's parameters (in float32) from which JAX's per-operation programs are bounded and let go: a
    # smaller model's are kept for the whole check (some hundreds, about 1 MB each, less than the model's own copies
    # once it is this large), so that its steps and its twins do not compile the same operations again
    programs_let_go_above: int = 64 << 20
    # bytes of the model's parameters (in float32) from which the optimizer's state made for the first compiled step is
    # donated to it (its buffers take the new state: one copy of Adam's moments less at the peak); a smaller model's
    # first step keeps it, and its later steps run the same compiled program rather than one compiled for each
    state_donated_above: int = 64 << 20

    def donates_fresh_state(self, parameter_bytes: int) -> bool:
        """Whether the compiled step's first call is given the optimizer's new state to write over
        (:class:`.jax_side.CompiledStep`).

        Args:
            parameter_bytes: the PyTorch model's parameters, in float32 bytes.

        Returns:
            True above ``state_donated_above``.
        """
        return parameter_bytes > self.state_donated_above

    def recomputes(self, gradients: dict) -> bool:
        """Whether PyTorch64's ``gradients`` are let go while the port runs, and computed again when compared.

        Args:
            gradients: PyTorch64's gradients by parameter name (arrays).

        Returns:
            True where their bytes together exceed ``recomputed_above``.
        """
        return sum(np.asarray(g).nbytes for g in gradients.values()) > self.recomputed_above

    def programs_held(self, program: str, parameter_bytes: int) -> contextlib.AbstractContextManager:
        """While ``program`` runs: op by op, on a model of more than ``programs_let_go_above`` bytes of parameters, at
        most a bounded number of JAX's per-operation programs held (:func:`op_programs_bounded`); a smaller model's, or
        a compiled program, nothing to bound.

        Args:
            program: ``"jit"`` or ``"eager"``.
            parameter_bytes: the PyTorch model's parameters, in float32 bytes.

        Returns:
            A context manager: :func:`op_programs_bounded`, or one that does nothing.
        """
        if program == "eager" and parameter_bytes > self.programs_let_go_above:
            return op_programs_bounded()
        return contextlib.nullcontext()

    def let_go_of_programs(self, program: str, parameter_bytes: int) -> None:
        """After a program run op by op on a model of more than ``programs_let_go_above`` bytes of parameters, JAX's
        caches of the programs it compiled for each operation (about 0.75 GB for a ResNet-50's step, kept until the
        process ends) are let go: the next program compiles its own. The compiled step then compiles again at the next
        step, a few seconds, for a peak a gigabyte lower on such a model. A smaller model's are kept (a check of a
        0.1M-parameter port on 2 cores: 28 s → 25 s).

        Args:
            program: the program that has run, ``"jit"`` or ``"eager"`` (only ``"eager"`` lets go).
            parameter_bytes: the PyTorch model's parameters, in float32 bytes.
        """
        if program == "eager" and parameter_bytes > self.programs_let_go_above:
            import jax

            jax.clear_caches()
