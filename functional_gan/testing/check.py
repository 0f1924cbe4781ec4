"""Check a JAX port of any PyTorch model against PyTorch, judged against PyTorch's own rounding noise.

The port may be written with Flax Linen, Flax NNX, Equinox, or as plain functions of a parameter pytree
(:mod:`.apis` turns each into one form). ``check_port(spec)`` moves the PyTorch model's weights
into the port (:func:`transfer`: by definition order and shape, knowing each standard layer's layout in
each API), runs both on the same inputs and compares, in debugging order, every quantity a port can get
wrong:

1. each paired layer's output (PyTorch forward hooks ↔ the port's per-layer outputs), the model's
   output, the loss;
2. every parameter's gradient;
3. every parameter after one optimizer step from the same gradients (PyTorch's optimizer fed JAX's
   gradients), every buffer (BatchNorm's running statistics);
4. steps 2..N: the same, each step starting from PyTorch's parameters (teacher forcing) and from the
   port's own state after its previous step, as training carries it (each framework keeps its own
   optimizer state).

The JAX side runs twice: compiled with ``jax.jit``, as training runs it, and op by op. The compiled
program is the one judged; where only one of the two programs departs from PyTorch, the report says
that the compiled program and the same code run op by op disagree (a JAX/XLA matter, not the port).

The reference is PyTorch in float64, and each quantity is judged against PyTorch's own rounding error (and in
float64 the port's own too) by the one rule of :mod:`.judge` (:class:`.judge.Verdict`): agreement, a divergence (the
first is named: stage, layer, tensor, both sides' values or shapes), a precision finding, a note, or not compared.

A spec is a Python file (or module) naming both models, example inputs, and optionally a loss and an optimizer
pair: its entries are :class:`.spec.Spec`'s fields, each documented there (the docs' table of them is generated from
those fields: :mod:`.reference`).

The check's phases, in the order :func:`check_port` reads: both sides built and the weights paired
(:func:`.prepare.prepare`); per step, PyTorch's runs (:func:`.torch_side.pytorch_step`), then each program of the port
(:func:`.jax_side.run_program`), the port's own error (:func:`.jax_side.port_variant`, :func:`.jax_side.float64_twin`),
its rows judged (:func:`.quantities.judged_rows`, by :func:`.judge.compare`) up to the gradients and then the updates
(PyTorch's optimizers fed its gradients: :func:`.torch_side.fed_updates`); then the report, with the causes of what
departs (:mod:`.causes`, :mod:`.precision`). What is held in memory is :class:`.memory.MemoryPolicy`'s to decide.

See ``examples/port/`` for models from public code; :func:`assert_port` is the same check for pytest.
"""

from __future__ import annotations

import contextlib
import dataclasses
import functools
import os
from typing import Any, Callable

import jax
import jax.numpy as jnp
import numpy as np

from . import taps, widen
from .causes import known_causes, lopsided_gradients, name_port_islands, verified_causes
from .jax_side import (CompiledStep, check_dtypes, collected, fast_variance_off, first_narrow, float64_twin,
                       float64_update, jax_step_function, noise_program, port_islands_run, port_variant, run_program,
                       start_of_step, update_with_exact_bias_corrections)
from .judge import DEFAULT_K, Row
from .memory import MemoryPolicy, Phases, old_objects_frozen
from .pairing import variables_from_torch
from .precision import likely_causes, uses_adam
from .quantities import BEFORE_UPDATE, FROM_UPDATE, island_measures, judged_rows, port_variation, twin_measures
from .report import PROGRAMS, Report, jax_build
from .prepare import prepare
from .run import PERMUTED_RUNS, Run
from .spec import Spec, SpecError, as_spec
from .torch_side import fed_updates, pytorch_step, recomputed_gradients, reference_parked

__all__ = ["check_port", "PERMUTED_RUNS"]


def check_port(spec: Spec | str | os.PathLike, dtype: str = "float32", steps: int = 1, k: float = DEFAULT_K, seed: int = 0,
               programs: tuple[str, ...] = PROGRAMS, torch_state: dict | None = None, export: bool = False,
               memory_limit: float | None = None, progress: bool = False, allow_precision: bool = False,
               memory: MemoryPolicy | None = None) -> Report:
    """Compare the spec's JAX port with its PyTorch model, quantity by quantity (see the module's docstring).

    Args:
        spec: what to compare: a :class:`.spec.Spec` (from :func:`.spec.load_spec` or :func:`.spec.spec_from_module`),
            or a spec file's path, loaded by :func:`.spec.load_spec`.
        dtype: ``"float32"`` or ``"float64"``.
        steps: optimizer steps compared, each from PyTorch's parameters (teacher forcing) and the port's own state
            after its previous step.
        k: the allowance, in multiples of PyTorch's own error in ``dtype`` (at least a few ulps of each scale).
        seed: PyTorch's seed for ``torch_model()`` and the check's random draws.
        programs: which JAX programs run, the first judged: ``("jit", "eager")`` (default), ``("jit",)`` or
            ``("eager",)``.
        torch_state: a ``state_dict`` loaded into ``torch_model()`` (trained weights) instead of its seeded
            initialisation.
        export: the report's ``converted`` is the port, as its API keeps it, holding PyTorch's weights as they were
            before the first step (float32), moved with the check's pairing.
        memory_limit: bytes; a check whose peak, estimated from the PyTorch model's parameters
            (:func:`.memory.estimate`), exceeds it is not started (``check-port`` passes the memory available).
        progress: each phase's end written to standard error once the check has run a few seconds.
        allow_precision: precision findings alone exit 0 (the report's ``exit_status()``; ``--allow-precision``).
        memory: how the check holds its memory (:class:`.memory.MemoryPolicy`: what is parked on disk or computed
            again, and above what sizes); ``memory_limit`` is its ``limit``.

    Returns:
        A :class:`.report.Report`: every row, the verdict (``exit_status()``: 0 agreement, 1 divergence, 3 precision
        findings), the pairing, the notes and the memory phase by phase.

    Raises:
        SpecError: the spec cannot be used (a missing piece, weights that do not pair, a port computing in another
            dtype than asked, a check estimated beyond ``memory_limit``), or the spec's or the port's own code raised;
            the message says which, in one line.
    """
    spec = as_spec(spec)
    _check_arguments(dtype, steps, programs)
    memory = memory or MemoryPolicy(limit=memory_limit)
    with _numerics(dtype), old_objects_frozen(), taps.installed(taps.validate(spec.taps)):
        phases = Phases("check-port: " if progress else None)
        run = prepare(spec, dtype, k, seed, programs, torch_state, memory)  # both sides built, the weights paired
        run.memory.let_go_of_programs("eager", run.parameter_bytes)  # the port's construction ran op by op (NNX, Equinox)
        phases.mark("PyTorch models built, port paired")
        converted = _exported(run) if export else None  # the weights as they start, before any step changes them
        port = _PortSteps.of(run, programs, steps)  # the port's step as each program runs it, and its variants
        for number in range(1, steps + 1):
            step = _pytorch_phase(run, port, number, steps)  # PyTorch: the float64 reference and its own error
            phases.mark(f"step {number}: PyTorch's runs")
            for program in port.order:  # one program at a time, compared and let go
                outcome = _port_phase(run, port, step, program)  # the port's step
                phases.mark(f"step {number}: the port, {program}")
                if run.dtype == "float64" and program == port.order[0]:  # the port's own float64 error
                    _port_noise_phase(run, port, step, phases, port.programs[:1])
                if program == port.twin_program:  # JAX's own float32 error: the same program in float64
                    _twin_phase(run, port, step, program, outcome)
                    phases.mark(f"step {number}: the port in float64 ({program})")
                own = _own_errors(run, port, step, outcome, phases)  # float64: the port's own, beside PyTorch's
                port.rows[program] += _judged_to_gradients(run, port, step, program, outcome, own, phases)
                port.rows[program] += _judged_updates(run, port, step, program, outcome, own, phases)
                del outcome, own
                phases.mark(f"step {number}: rows of {program}")
        return _report(run, port, step, phases, converted, allow_precision)


def _check_arguments(dtype: str, steps: int, programs: tuple[str, ...]) -> None:
    if dtype not in ("float32", "float64"):
        raise SpecError(f"dtype must be float32 or float64, got {dtype!r}")
    if steps < 1:
        raise SpecError(f"steps must be at least 1, got {steps}")
    if not programs or any(p not in PROGRAMS for p in programs):
        raise SpecError(f"programs must be taken from {PROGRAMS}, got {programs!r}")


@contextlib.contextmanager
def _numerics(dtype: str):
    """JAX's numerics for the check: 64-bit types in a float64 check, and full float32 matrix products on GPUs and
    TPUs (no TF32 or bf16 passes, no effect on CPUs): PyTorch's side runs on the CPU, and its float32 noise is the
    yardstick."""
    with jax.enable_x64(True) if dtype == "float64" else contextlib.nullcontext(), \
            jax.default_matmul_precision("highest"):
        yield


def _exported(run: Run):
    """The port, as its API keeps it, holding PyTorch's weights as they start (float32)."""
    start = variables_from_torch(run.sides["ref"][0], run.pairings, run.adapter.variables, jnp.float32)
    return run.adapter.export({**start, "carry": run.adapter.carry})


@dataclasses.dataclass
class _PortSteps:
    """The port's step as the check runs it, and what it carries from one step to the next. The optimizer's state, a
    step's input and output, is not held twice (Adam's over 124M parameters: 2 GB in float64): op by op, the last
    step does not return it (nothing reads it); compiled, a state made for the step (its first) is donated to it, and
    so are the parameters (:class:`.jax_side.CompiledStep`)."""

    programs: tuple[str, ...]
    steps: int
    order: list[str]  # op by op first: a bad dtype shows there
    optimizer: Any
    step_fn: Callable
    last_step_fn: Callable  # the same without the optimizer's state returned
    compiled_step: CompiledStep
    # the step without the optimizer: the float64 twin (JAX's own float32 error up to the gradients) and the float32
    # variant of a float64 check (the port's own float64 error)
    twin_step: Callable
    twin_function: Callable
    variant_functions: dict  # float64: per program, the port's step without its optimizer as that program runs it
    update64: Callable | None  # float32: the update stage's own error, the optimizer in float64 fed the same gradients
    twin_program: str | None  # float32: the program whose float64 twin measures JAX's own error
    width: Any  # the port's floating-point dtype
    opt_states: dict = dataclasses.field(default_factory=dict)
    # per program, the port's own state after its previous step (running statistics and whatever else it keeps): the
    # next step starts from it, as training does; the parameters start from PyTorch's (teacher forcing)
    own_state: dict = dataclasses.field(default_factory=dict)
    rows: dict = dataclasses.field(default_factory=dict)
    port_islands: dict = dataclasses.field(default_factory=dict)  # float64: where the port computes narrower
    uncaptured: list = dataclasses.field(default_factory=list)  # PyTorch's layers without the port's output

    @classmethod
    def of(cls, run: Run, programs: tuple[str, ...], steps: int) -> _PortSteps:
        """The port's step functions for a check, built once before its first step.

        Args:
            run: the check's :class:`.run.Run` (its adapter, spec, dtype and memory policy).
            programs: the JAX programs run, the first judged (``"jit"``, ``"eager"``).
            steps: how many optimizer steps the check compares.

        Returns:
            A :class:`_PortSteps` before any step: no optimizer state, each program's own state None, no rows.
        """
        optimizer = run.spec.jax_optimizer() if run.spec.jax_optimizer else None
        step_fn = jax_step_function(run.adapter, run.spec, optimizer)
        twin_step = jax_step_function(run.adapter, run.spec, None)
        compiled_twin = jax.jit(twin_step)  # the float32 check's float64 twin, or the float64 check's float32 run
        return cls(
            programs=programs, steps=steps, order=sorted(programs, key=lambda p: p != "eager"), optimizer=optimizer,
            step_fn=step_fn, last_step_fn=jax_step_function(run.adapter, run.spec, optimizer, keep_state=False),
            compiled_step=CompiledStep(step_fn, optimizer, run.memory.donates_fresh_state(run.parameter_bytes)),
            twin_step=twin_step,
            twin_function=compiled_twin if noise_program(programs) == "jit" else twin_step,
            variant_functions={p: compiled_twin if p == "jit" else twin_step for p in programs},
            update64=float64_update(optimizer) if optimizer is not None and run.dtype == "float32" else None,
            twin_program=noise_program(programs) if run.dtype == "float32" else None,
            width=jnp.float64 if run.dtype == "float64" else jnp.float32,
            own_state={program: None for program in programs}, rows={program: [] for program in programs})


@dataclasses.dataclass
class _Step:
    """One step of the check: PyTorch's runs, and what the port's programs measure of their own error."""

    number: int
    numbered: int | None  # on each row: the step's number in a check over several steps, else None
    last: bool
    seen: dict  # PyTorch's: the reference's values ("ref") and its own error ("noise")
    params_state: dict  # PyTorch64's state_dict as the step started
    opt_before: dict  # each program's optimizer state as the step started
    recompute: bool  # PyTorch64's gradients computed again when compared, not held while the port runs
    variant_start: dict | None  # the judged program's own state as the step started
    own_before: dict = dataclasses.field(default_factory=dict)  # per program, its own state as the step started
    measures: dict = dataclasses.field(default_factory=dict)  # float32: JAX's own error, from the float64 twin
    variants: dict = dataclasses.field(default_factory=dict)  # float64: per program, the port's step in float32
    wide: dict | None = None  # float64: the port's program with its float32 islands in float64

    def reference_gradients(self, run: Run) -> None:
        """PyTorch64's gradients, computed again where they were let go.

        Args:
            run: the check's :class:`.run.Run`, whose reference model computes them again
                (:func:`.torch_side.recomputed_gradients`) into this step's ``seen``.
        """
        if self.seen["ref"]["grads"] is None:
            self.seen["ref"]["grads"] = recomputed_gradients(run)

    def start(self, run: Run, port: _PortSteps, own: dict | None, width=None) -> dict:
        """A start of the port's step: PyTorch64's parameters as the step started, the port's ``own`` state.

        Args:
            run: the check's :class:`.run.Run`.
            port: the port's steps; its ``width`` is the default dtype.
            own: the program's own state after its previous step (``batch_stats``, ``carry``), or None at the first
                step.
            width: the floating-point dtype of the start (default: ``port.width``, the check's).

        Returns:
            The port's variables the step starts from, as :func:`.jax_side.start_of_step` makes them.
        """
        return start_of_step(run, port.width if width is None else width, own, self.params_state)


def _pytorch_phase(run: Run, port: _PortSteps, number: int, steps: int) -> _Step:
    """Every PyTorch run of one step (:func:`.torch_side.pytorch_step`); PyTorch's working models let go after the
    last (the update stage builds its own when it comes to it), and its gradients too where they are large."""
    last = number == steps
    opt_before = dict(port.opt_states)
    try:
        seen, params_state = pytorch_step(run, last=last)
    except SpecError:
        raise
    except Exception as error:
        if number > 1:
            raise
        message = str(error).strip().splitlines()[0] if str(error).strip() else ""
        raise SpecError(f"{run.spec.words()['torch_step']} failed: {type(error).__name__}: {message}") from error
    run.layer_shapes.update({name: np.shape(value) for name, value in seen["ref"]["layers"].items()})
    if last:  # PyTorch's runs for its own error are done (float64's other memory layout: a model let go), and the
        # working models with them, but where an optimizer fed the port's gradients holds one from an earlier step
        run.sides = {"ref": run.sides["ref"]}
        run.working.clear()
    recompute = last and run.memory.recomputes(seen["ref"]["grads"])
    if recompute:  # a large model's gradients (GPT-2's: 1 GB in float64), not held while the port runs
        seen["ref"]["grads"] = None
    return _Step(number, number if steps > 1 else None, last, seen, params_state, opt_before, recompute,
                 port.own_state[port.programs[0]])


def _port_phase(run: Run, port: _PortSteps, step: _Step, program: str) -> dict:
    """One program of the port runs the step from PyTorch's parameters and its own state; on the first, its dtypes are
    checked, its layers without an output listed, and (float64) its float32 islands found in its program."""
    own_before = step.own_before[program] = port.own_state[program]
    start = step.start(run, port, own_before)
    if program == "jit":  # the optimizer's state made for its first step once the step is compiled
        fresh = program not in port.opt_states and port.optimizer is not None
        function = port.compiled_step.with_state(
            (lambda params=start["params"]: port.optimizer.init(params)) if fresh else None)
        port.opt_states.setdefault(program, None)
    else:
        if program not in port.opt_states:
            port.opt_states[program] = port.optimizer.init(start["params"]) if port.optimizer is not None else None
        function = port.last_step_fn if step.last else port.step_fn
    first = step.number == 1 and program == port.order[0]
    # the start's shapes, for the islands' jaxpr once the program has run (a jitted step donates its start)
    shapes = jax.tree_util.tree_map(lambda a: jax.ShapeDtypeStruct(np.shape(a), a.dtype)
                                    if hasattr(a, "dtype") else a, start) if first and run.dtype == "float64" else None
    with run.memory.programs_held(program, run.parameter_bytes), reference_parked(run):
        outcome = run_program(run, function, program, start, port.opt_states[program], first=first)
    if first:
        check_dtypes(outcome, run.dtype, run)
        port.uncaptured = [n or "(model)" for n in step.seen["ref"]["layers"]
                           if run.layer_paths[n] not in outcome["layers"]]
        run.notes.update(taps.silent(run.spec.taps or {}, step.seen["ref"]["layers"], outcome["layers"]))
        if run.dtype == "float64":
            port.port_islands = widen.islands(port.twin_step, shapes, run.jax_inputs, run.jax_targets, None)
    del shapes
    state = outcome.pop("opt_state", None)  # to the next step; after the last, nothing reads it
    port.opt_states[program] = None if step.last else state
    port.own_state[program] = {"batch_stats": outcome.get("batch_stats") or start["batch_stats"],
                               "carry": outcome.get("carry")}
    del start, state
    run.memory.let_go_of_programs(program, run.parameter_bytes)
    return outcome


def _port_noise_phase(run: Run, port: _PortSteps, step: _Step, phases: Phases, programs) -> None:
    """float64: the port's own rounding error, the ``programs`` run in float32, each from its own start; first after
    the first program (its faults named first), the judged program's, and where it has float32 islands, its program
    with them computed in float64."""
    for program in programs:
        own = step.own_before.get(program, port.own_state[program])  # the program's own state as the step started
        variant_from = step.start(run, port, own)  # before PyTorch's is parked
        with run.memory.programs_held(program, run.parameter_bytes), reference_parked(run):
            step.variants[program] = port_variant(run, port.variant_functions[program], variant_from)
        del variant_from
        run.memory.let_go_of_programs(program, run.parameter_bytes)
        phases.mark(f"step {step.number}: the port in float32 ({program}), for its own float64 error")
    if port.port_islands and step.wide is None:  # the port's own islands' error: its step with its casts removed
        wide_from = step.start(run, port, step.variant_start)
        with reference_parked(run):
            step.wide = port_islands_run(run, port.twin_step, wide_from)
        del wide_from
        phases.mark(f"step {step.number}: the port with its float32 islands in float64")


def _twin_phase(run: Run, port: _PortSteps, step: _Step, program: str, outcome: dict) -> None:
    """float32: the program's float64 twin, JAX's own float32 error kept as numbers (the twin let go before the update
    stage's runs); a port that fixes its own dtype has none, and nothing can be called precision."""
    own_before = step.own_before[program]
    with jax.enable_x64(True), run.memory.programs_held(program, run.parameter_bytes):
        twin = float64_twin(run, port.twin_function, lambda: step.start(run, port, own_before, jnp.float64),
                            compile_first=program == "jit")
    narrow = first_narrow(twin, run)
    if narrow:
        run.notes.add(f"the port run in float64 computes in {narrow[1]} ({narrow[0]} gives {narrow[1]} from "
                      "float64 inputs and parameters: a dtype fixed inside the port, such as a Flax "
                      "module's dtype=jnp.float32, or a cast), so JAX's own float32 error cannot be measured "
                      "and nothing beyond tolerance can be called precision; make the port compute in the "
                      "dtype of its inputs to have it measured (a Flax Linen module, Hugging Face's Flax classes among "
                      "them: dtype=None; an NNX layer built with "
                      "param_dtype=jnp.zeros(()).dtype, which is the check's dtype while it builds: "
                      "nnx.Embed takes its param_dtype, float32 by default, as its dtype when dtype=None, "
                      "so set its .dtype = None after building)")
    else:
        step.reference_gradients(run)
        step.measures = twin_measures(run, step.seen, outcome, twin)
    del twin
    run.memory.let_go_of_programs(program, run.parameter_bytes)


def _own_errors(run: Run, port: _PortSteps, step: _Step, outcome: dict, phases: Phases) -> tuple[dict, dict]:
    """float64: the port's own error up to the gradients and the buffers, quantity by quantity (its program in float32
    × 2⁻²⁹, and its islands' error), of this program's outcome; empty in float32.

    One float32 run's rounding is one sample of the port's: where a row is beyond the allowance by the judged
    program's run alone, the other program runs in float32 too and each quantity takes the larger estimate (on an NNX
    MobileNet block over 2 steps the compiled program's run erred a third of the op-by-op one's, and judged by it
    three op-by-op gradients read as a divergence). A port that agrees pays for one float32 run a step."""
    step.reference_gradients(run)
    own = (port_variation(run, step.seen, outcome, list(step.variants.values())),
           island_measures(run, step.seen, outcome, step.wide))
    others = [p for p in port.programs if p not in step.variants]
    if run.dtype != "float64" or not others:
        return own
    rows = judged_rows(run, step.numbered, step.seen, outcome, None, step.measures, None, BEFORE_UPDATE + ("buffer",),
                       *own)
    if all(r.passed or r.not_compared for r in rows):
        return own
    _port_noise_phase(run, port, step, phases, others)
    return port_variation(run, step.seen, outcome, list(step.variants.values())), own[1]


def _judged_to_gradients(run: Run, port: _PortSteps, step: _Step, program: str, outcome: dict, own: tuple,
                         phases: Phases) -> list[Row]:
    """The program's rows up to the gradients, judged; at the last step of the judged program, a cause of its excess
    verified by rerunning without it (Flax's fast variance)."""
    variation, island = own
    rows = judged_rows(run, step.numbered, step.seen, outcome, None, step.measures, None, BEFORE_UPDATE, variation,
                       island)
    if port.port_islands and step.number == 1 and program == port.programs[0]:
        name_port_islands(run, port.port_islands, rows)
    if step.last and program == port.programs[0] and run.adapter.fast_variance \
            and any(not r.passed and not r.not_compared for r in rows):
        _verify_fast_variance(run, port, step, program, variation)
        phases.mark(f"step {step.number}: the port with use_fast_variance=False (a cause verified)")
    if program == port.order[-1]:
        step.variants, step.wide = {}, None
    if step.recompute:
        step.seen["ref"]["grads"] = None
    if step.last and program == port.order[-1]:
        step.seen["ref"].pop("grads", None)
        step.seen["ref"].pop("input_grads", None)
    return rows


def _verify_fast_variance(run: Run, port: _PortSteps, step: _Step, program: str, variation: dict) -> None:
    """The same step with Flax's normalisations subtracting the mean first: a cause is named only where the excess
    goes away without it."""
    counter_start = step.start(run, port, step.own_before[program])
    counter_step = jax_step_function(run.adapter, run.spec, None)  # a function of its own: traced afresh,
    counter_step = jax.jit(counter_step) if program == "jit" else counter_step  # the patch in effect
    with fast_variance_off(), run.memory.programs_held(program, run.parameter_bytes), reference_parked(run):
        counter = collected(run, functools.partial(counter_step, counter_start, run.jax_inputs, run.jax_targets, None))
    del counter_start
    run.counterfactuals["use_fast_variance=False"] = {
        r.key: r for r in judged_rows(run, step.numbered, step.seen, counter, None, {}, None,
                                      BEFORE_UPDATE + ("buffer",), variation)}
    del counter
    run.memory.let_go_of_programs(program, run.parameter_bytes)


def _judged_updates(run: Run, port: _PortSteps, step: _Step, program: str, outcome: dict, own: tuple,
                    phases: Phases) -> list[Row]:
    """The update stage, from the same gradients: PyTorch's optimizers fed the program's gradients (their float64
    reference and their own error), beside the port's optimizer in float64 (the update's own float32 error); and the
    buffers. With optax's Adam, its float32 bias corrections are verified as a cause by the same update with them
    exact."""
    fed = update64 = counter_update = None
    if port.optimizer is not None and run.spec.torch_loss is not None:
        own_before = step.own_before[program]
        if port.update64 is not None:  # the update stage's own float32 error, from the same gradients
            params = step.start(run, port, own_before)["params"]
            opt_state = step.opt_before.get(program)
            update64 = port.update64(params, outcome["grads"], opt_state)
            if step.last and program == port.programs[0] and uses_adam(jax.eval_shape(port.optimizer.init, params)):
                # the counterfactual of optax's float32 bias corrections: the same update with 1 − βᵗ as PyTorch has
                # it (rounded once to float32), judged after the update rows are
                counter_update = update_with_exact_bias_corrections(port.optimizer)(params, outcome["grads"], opt_state)
            del params
            phases.mark(f"step {step.number}: {program}'s update in float64")
        in_place = step.last and program == port.order[-1] and run.shadows[program].get("ref") is None
        fed = fed_updates(run, program, step.params_state, outcome["grads"], last=step.last, in_place=in_place)
        phases.mark(f"step {step.number}: PyTorch's optimizers fed {program}'s gradients")
    variation, island = own
    rows = judged_rows(run, step.numbered, step.seen, outcome, fed, step.measures, update64, FROM_UPDATE, variation,
                       island)
    if counter_update is not None and any(not r.passed for r in rows if r.stage == "update"):
        run.counterfactuals["exact bias corrections"] = {
            r.key: r for r in judged_rows(run, step.numbered, step.seen, counter_update, fed, {}, None, ("update",))}
    del fed, update64, counter_update
    if step.last:  # this program's update-stage optimizers are done, and their working models with them (the next
        # program's builds its own: a gigabyte for 124M parameters, not held in between)
        run.shadows[program] = {}
        run.working.clear()
    return rows


def _report(run: Run, port: _PortSteps, last: _Step, phases: Phases, converted, allow_precision: bool) -> Report:
    """The report, built once: the judged program's rows and the other's, the causes of what departs (known causes
    read off the port, causes verified by counterfactual runs, likely causes of precision findings), the notes."""
    programs = port.programs
    rows, other_rows = port.rows[programs[0]], port.rows[programs[1]] if len(programs) > 1 else []
    verified = verified_causes(run, rows)
    if run.dtype == "float64":  # E[x²] − E[x]² cancels in float64 too, 2²⁹ times less: where switching it off verified it
        for row in rows + other_rows:
            if row.key in verified.get("use_fast_variance=True", {}).get("fell", {}):
                row.explained_by = "use_fast_variance=True"
    findings = [r for r in rows if r.finding] or [r for r in rows if r.note]
    causes = []
    if findings:
        jaxpr = None
        if jax.default_backend() != "cpu":  # the port's own precision settings matter on accelerators only
            with contextlib.suppress(Exception), jax.default_matmul_precision("highest"):
                start = start_of_step(run, port.width, port.own_state[programs[0]])  # its shapes and dtypes only
                jaxpr = jax.make_jaxpr(port.step_fn)(start, run.jax_inputs, run.jax_targets,
                                                     last.opt_before.get(programs[0])).jaxpr
        structure = jax.eval_shape(port.optimizer.init, run.adapter.variables["params"]) \
            if port.optimizer is not None else None
        causes = likely_causes(findings, run.adapter.fast_variance, structure, last.seen["ref"]["layers"],
                               run.adapter.channels_last, jaxpr, run.dtype, verified=verified)
    spec = run.spec
    return Report(
        spec=spec.name, dtype=run.dtype, k=run.k, pairings=run.pairings, rows=rows, api=run.adapter.api,
        programs=tuple(programs), other_rows=other_rows, build=jax_build(), layers=len(last.seen["ref"]["layers"]),
        uncaptured=port.uncaptured, carried=run.adapter.carried if port.steps > 1 else "", steps=port.steps,
        causes=causes, allow_precision=allow_precision, hints=known_causes(run, rows, other_rows), memory=phases,
        notes=sorted(run.notes) + lopsided_gradients(rows), tied=run.tied, converted=converted, train=spec.train)
