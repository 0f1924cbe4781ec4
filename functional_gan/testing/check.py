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

The reference is PyTorch in float64. In float32 a quantity passes when
``|JAX₃₂ − PyTorch₆₄| ≤ k · max(|PyTorch₃₂ − PyTorch₆₄|, 4 ulps of its scale)``: the port may be as far
from the exact answer as PyTorch itself is, k times over (``k`` = 3 by default). PyTorch's own
error is the largest of three float32 runs: as it is, and with the batch's samples in two other
orders (put back in order after), which makes every reduction over the batch sum in another order. Beyond it, a
quantity is a precision finding where the same JAX program in float64 agrees with PyTorch (see :mod:`.precision`),
else a divergence. Adam turns float32 rounding in near-zero gradients into lr-sized steps; PyTorch does that to
itself too, and the update stage is judged from the same gradients. In float64 the port must agree within k ×
PyTorch's own float64 error (other batch orders, other memory layouts, one-ulp moves, its matrix products' long sums in
blocks, its float32 error × 2⁻²⁹, and where it computes in float32 inside, the run without those casts) and the port's
(its program in float32 × 2⁻²⁹, and without its own casts to float32; at least 8 ulps). The first
divergence is named: stage, layer, tensor, both sides' values (or both shapes).

A spec is a Python file (or module) defining

* ``torch_model()``: the PyTorch module (a class will do: the checker builds it once under
  ``torch.manual_seed(seed)``, 0 by default, and loads those weights into every later build);
  ``example_inputs()``: NumPy arrays as the PyTorch model takes them;
* the port, one of: ``jax_model()`` returning a Flax Linen module, a Flax NNX module, or an Equinox
  module (or ``(module, state)`` from ``eqx.nn.make_with_state``; ``PER_SAMPLE = True`` when it acts on
  one sample, and the checker vmaps it over the batch with the axis name ``BATCH_AXIS``, default
  ``"batch"``); or ``jax_params()`` (a pytree) with ``jax_apply(params, *inputs)`` (and, for running
  statistics, ``jax_state()`` with ``jax_apply(params, state, *inputs) -> (output, state)``), where
  ``tap("layer", x)`` marks a layer's output;
* optionally ``example_targets()``: arrays the losses take after the model's output and inputs;
  ``to_jax(*arrays)`` / ``from_jax(output)`` (default: the API's layout: Linen and NNX channels-last,
  arrays of 3 or more dimensions NC… ↔ N…C; Equinox and functions as PyTorch has them);
  ``param_map`` ({PyTorch module name: the port's module path "a/b"}); ``torch_loss(output, *inputs,
  *targets)`` with ``jax_loss(output, *inputs, *targets)`` (the output as compared; the inputs as each framework's
  model takes them, on the JAX side what ``to_jax`` made of them); ``OUTPUT``: the field compared (an attribute, a
  key, or an index) of both models' outputs where they return objects (``"logits"``); ``torch_optimizer(parameters)`` with ``jax_optimizer()`` (an optax
  transformation); for Linen, ``jax_apply(model, variables, *inputs, capture_intermediates)`` returning
  ``(output, {"batch_stats": ..., "intermediates": ...})`` for a model whose ``__call__`` needs more
  than the inputs; ``TRAIN = False`` to compare in eval mode (dropout off, running statistics used; for Linen, given
  to the module's ``deterministic``/``use_running_average``/``train`` argument or field where it has one).

See ``examples/port/`` for models from public code; :func:`assert_port` is the same check for pytest.
"""

from __future__ import annotations

import contextlib
import dataclasses
import itertools
import math
import sys
import warnings
from typing import Any, Callable

import jax
import jax.numpy as jnp
import numpy as np
import torch

from functional_gan.errors import UserError

from . import apis, taps, widen
from .judge import DEFAULT_K, Measured, Row, TwinMeasured, compare, relative_error
from .jax_side import check_dtypes, jax_step_function
from .pairing import (Pairing, leaf_at, default_from_jax, default_to_jax, shapes_of_paired, tied_tensors,
                      torch_in_flax_layout, transfer, variables_from_torch)
from .memory import Phases, estimate, estimate_before_building, old_objects_frozen, op_programs_bounded, trim
from .precision import uses_adam, likely_causes
from .report import PROGRAMS, Report, program_words, jax_build
from .spec import Spec, SpecError
from .torch_side import BlockedSums, Islands, Parked, make_torch_side, run_torch_step, fed_update, island_pattern, load_into, other_layout

PERMUTED_RUNS = 2  # float32 PyTorch runs with the batch in another order, besides the plain one


@dataclasses.dataclass
class _Run:
    """Everything one check keeps: the spec's pieces on both sides, the pairing, and PyTorch's runs."""

    spec: Spec
    dtype: str
    k: float
    inputs: tuple
    targets: tuple
    jax_inputs: tuple
    jax_targets: tuple
    from_jax: Callable
    adapter: apis.Adapter
    pairings: list[Pairing]
    layer_paths: dict[str, tuple[str, ...]]
    layer_shapes: dict  # PyTorch's layer outputs' shapes, by PyTorch name (known after its first step)
    sides: dict  # PyTorch's runs: "ref" (float64), "t32" and permuted float32 runs
    permutations: dict
    shadows: dict  # per program: PyTorch's optimizers fed that program's gradients, (model, optimizer) once built
    notes: set = dataclasses.field(default_factory=set)  # for the report: what was compared otherwise than usual
    tied: dict = dataclasses.field(default_factory=dict)  # tied tensors: later name → the name paired
    working: dict = dataclasses.field(default_factory=dict)  # a working PyTorch model per dtype (see _prepare)
    reference_rng: Any = None  # PyTorch's random state as the reference's step of this step began
    # a cause switched off → the last step's rows up to the gradients, by (stage, name), of the port without it
    counterfactuals: dict = dataclasses.field(default_factory=dict)
    make_working: Callable | None = None  # a working PyTorch model of a dtype, built on first use
    torch_islands: dict | None = None  # PyTorch64's lower-precision islands {module: dtype}, found at its first step


def _layout_of(jax_output, torch_shape: tuple, from_jax, notes: set | None = None, where: str = "") -> np.ndarray:
    """A layer's output of the port in PyTorch's layout: what ``from_jax`` makes of it (as for the model's output);
    if that does not give PyTorch's shape, the output as it is, with its channels moved to axis 1, or with its axes in
    the one order that gives PyTorch's shape (a port that lays an intermediate out transposed: its business; ``notes``
    says so). Else the output as it is: a row not compared."""
    for candidate in (lambda y: np.asarray(from_jax(y)), np.asarray, lambda y: np.moveaxis(np.asarray(y), -1, 1)):
        try:
            converted = candidate(jax_output)
        except Exception:  # a from_jax written for the model's output only
            continue
        if converted.shape == tuple(torch_shape):
            return converted
    value = np.asarray(jax_output)
    orders = {order for order in itertools.permutations(range(value.ndim))
              if tuple(value.shape[a] for a in order) == tuple(torch_shape)} if value.ndim <= 5 else set()
    if len(orders) == 1:
        order = orders.pop()
        if notes is not None:
            notes.add(f"{where}: the port lays it out as {value.shape}, PyTorch as {tuple(torch_shape)}; compared with "
                      f"the port's axes in the order {order}")
        return np.transpose(value, order)
    return value


BEFORE_UPDATE = ("forward", "output", "loss", "gradient")
FROM_UPDATE = ("update", "buffer")


def _quantities(run: _Run, seen: dict, jax_seen: dict, fed: dict | None, stages=BEFORE_UPDATE + FROM_UPDATE):
    """Every quantity of one step of the ``stages`` asked for, in debugging order: (stage, name, pick from a JAX
    outcome, PyTorch64's value, PyTorch's own error (a :class:`Measured`), the port's shape where it may differ). Only
    the stages asked for are read (PyTorch's gradients are let go once compared)."""
    ref = seen["ref"]
    noise = seen["noise"]
    for torch_name in ref["layers"] if "forward" in stages else ():  # in the order PyTorch ran them
        path = run.layer_paths[torch_name]
        if path in jax_seen["layers"]:
            expected = ref["layers"][torch_name]
            yield ("forward", torch_name or "(model)",
                   lambda s, p=path, e=expected, n=torch_name or "(model)": _layout_of(
                       s["layers"][p], e.shape, run.from_jax, run.notes, f"forward, {n}"),
                   expected, noise["layers"][torch_name], np.shape(jax_seen["layers"][path]))
    if "output" in stages:
        yield ("output", "output", lambda s: _layout_of(s["output"], ref["output"].shape, run.from_jax),
               ref["output"], noise["output"], np.shape(jax_seen["output"]))
    if run.spec.torch_loss is None:
        return
    if "loss" in stages:
        yield "loss", "loss", lambda s: s["loss"], ref["loss"], noise["loss"], None
    params = [p for p in run.pairings if p.collection == "params"]
    for p in params if "gradient" in stages else ():
        yield ("gradient", p.torch_key, lambda s, p=p: p.leaf(s["grads"]), ref["grads"][p.torch_key],
               noise["grads"][p.torch_key], None)
    floats = ref.get("input_grads", {}) if "gradient" in stages else {}
    for index, expected in floats.items():  # INPUT_GRADIENTS: after the parameters', as backpropagation reaches them
        yield ("gradient", input_name(index, len(floats)),
               lambda s, i=index, e=expected: _layout_of(s["input_grads"][i], e.shape, run.from_jax), expected,
               noise["input_grads"][index], np.shape(jax_seen["input_grads"][index]))
    if fed is not None and "update" in stages:  # judged from the same gradients: PyTorch's optimizer fed the port's
        for p in params:
            yield ("update", p.torch_key, lambda s, p=p: p.leaf(s["params"]), fed["ref"][p.torch_key],
                   fed["noise"][p.torch_key], None)
    for p in run.pairings if "buffer" in stages else ():
        if p.collection == "batch_stats" and _has(jax_seen.get("batch_stats", {}), p.jax_path):
            yield ("buffer", p.torch_key, lambda s, p=p: p.leaf(s["batch_stats"]), ref["after"][p.torch_key],
                   noise["after"][p.torch_key], None)


def differentiated_inputs(spec: Spec, inputs) -> list[int]:
    """INPUT_GRADIENTS: the positions of the inputs differentiated: the floating-point ones (under --by-block, among
    the block's positional arguments only; its keyword arguments' arrays follow them, not differentiated)."""
    limit = len(inputs) if spec.positional is None else spec.positional
    return [i for i, x in enumerate(inputs[:limit]) if np.asarray(x).dtype.kind == "f"]


def input_name(index: int, floats: int) -> str:
    """The name of the row of the gradient with respect to the model's input ``index`` (of ``floats`` compared)."""
    return "(input)" if floats == 1 else f"(input {index})"


def _paired(run: _Run, seen: dict, jax_seen: dict, other: dict, stages=BEFORE_UPDATE + FROM_UPDATE):
    """Each quantity of the ``stages`` asked for but the updates, as (stage, name, this outcome's value, ``other``'s,
    PyTorch64's) where the three have one shape: one program's outcome beside another run of the same port."""
    for stage, name, pick, reference, _, _ in _quantities(run, seen, jax_seen, None, stages):
        if stage == "forward" and run.layer_paths[name if name != "(model)" else ""] not in other["layers"]:
            continue
        a, b = pick(jax_seen), pick(other)
        if np.shape(a) == np.shape(b) == np.shape(reference):
            yield stage, name, a, b, reference


def _twin_measures(run: _Run, seen: dict, jax_seen: dict, twin: dict) -> dict:
    """JAX's own float32 error, quantity by quantity up to the gradients and the buffers, from one program's float32
    outcome (``jax_seen``) and its float64 twin, taken once and kept as numbers (each program's rows use them):
    ``|JAX₃₂ − JAX₆₄|``, and the twin's error against PyTorch64."""
    return {(stage, name): (TwinMeasured(relative_error(a, b, scale=1.0), np.shape(a)), relative_error(b, reference))
            for stage, name, a, b, reference in _paired(run, seen, jax_seen, twin)}


FLOAT32_TO_64 = float(np.finfo(np.float64).eps / np.finfo(np.float32).eps)  # 2⁻²⁹: rounding scales with the unit roundoff


def _port_variation(run: _Run, seen: dict, jax_seen: dict, variant: dict | None) -> dict:
    """float64: the port's own rounding error, quantity by quantity up to the gradients and the buffers, estimated
    from its program in float32 (:func:`_port_variant`): ``max |JAX₃₂ − JAX₆₄|`` of this program's outcome
    (``jax_seen``), times eps₆₄/eps₃₂ (2⁻²⁹), kept as numbers not yet divided by each quantity's scale."""
    if variant is None:
        return {}
    return {(stage, name): TwinMeasured(relative_error(b, a, scale=1.0) * FLOAT32_TO_64, np.shape(a))
            for stage, name, a, b, _ in _paired(run, seen, jax_seen, variant, BEFORE_UPDATE + ("buffer",))}


def _island_measures(run: _Run, seen: dict, jax_seen: dict, wide: dict | None) -> dict:
    """float64: the error of the port's own lower-precision islands, quantity by quantity up to the gradients:
    ``|JAX − JAX with its casts removed|`` (:mod:`.widen`) of this program's outcome, not yet divided by the scale."""
    if wide is None:
        return {}
    return {(stage, name): TwinMeasured(relative_error(a, b, scale=1.0), np.shape(a))
            for stage, name, a, b, _ in _paired(run, seen, jax_seen, wide, BEFORE_UPDATE + ("buffer",))}


def _port_islands_run(run: _Run, step_function, start: dict) -> dict:
    """The port's step without its optimizer, compiled, with its lower-precision islands computed in float64."""
    wide = jax.jit(widen.widened(step_function))
    return _collected(run, lambda: wide(start, run.jax_inputs, run.jax_targets, None))


def _name_port_islands(run: _Run, islands: dict, rows: list[Row]) -> None:
    """One note per island of the port: where its step narrows (the module, where the name stack says it), and the
    first layer whose output its error reaches (more than a thousand float64 ulps of the scale)."""
    shown = next((r.name for r in rows if r.key[0] == "forward" and (r.island_noise or 0.0) > 1e3 * EPS64), None)
    seen_at = f"; its error first shows at forward {shown}" if shown else ""
    for where, narrow in island_pattern(islands).items():
        named = where != "(the model itself)"  # Flax Linen names its modules in JAX's name stack; NNX and Equinox not
        run.notes.add(f"the port computes {f'its module {where}' if named else 'part of its step'} in {narrow} inside "
                      f"its float64 program (a cast or a dtype fixed there{'' if named else seen_at}): those rows and "
                      "what follows are judged against that island's own error (the same program with its casts "
                      "removed, beside it)")


EPS64 = float(np.finfo(np.float64).eps)
ISLAND_FLOOR = float(np.finfo(np.float32).eps)  # the least PyTorch noise of a row a float32 island reaches (2⁻²³)


def _narrowed(tree):
    """``tree`` as a float32 program takes it: floating-point leaves in float32, integers in int32."""
    def narrow(a):
        if jax.dtypes.issubdtype(getattr(a, "dtype", np.float64), jax.dtypes.prng_key):  # a key (NNX's Rngs)
            return a
        a = np.asarray(a)
        if a.dtype.kind == "f":  # beyond float32's range at its ends (an attention mask of float64's lowest value)
            limit = np.finfo(np.float32)
            return np.clip(a, limit.min, limit.max).astype(np.float32)
        return a.astype(np.int32) if a.dtype.kind in "iu" and a.dtype.itemsize > 4 else a
    return jax.tree_util.tree_map(narrow, tree)


def _port_variant(run: _Run, function, start: dict) -> dict:
    """float64: the port's program without its optimizer, run in float32 from the same start (64-bit types off, so
    that a dtype the port fixes to its inputs' computes in float32 too). Rounding error scales with the unit roundoff:
    the same summation orders and cancellations in float64 err 2⁻²⁹ times as much, so ``|JAX₃₂ − JAX₆₄| · 2⁻²⁹``
    estimates the port's own float64 error, XLA's sums included, as PyTorch's float32 run estimates PyTorch's."""
    start, inputs, targets = _narrowed((start, run.jax_inputs, run.jax_targets))
    with jax.enable_x64(False), warnings.catch_warnings():
        warnings.filterwarnings("ignore", message="Explicitly requested dtype float64")  # a dtype the port fixes
        warnings.filterwarnings("ignore", message="overflow encountered in cast")  # float64's finfo.min as a mask
        return _collected(run, lambda: function(start, inputs, targets, None))


def _rows(run: _Run, step: int | None, seen: dict, jax_seen: dict, fed: dict | None, measures: dict,
          update64: dict | None, stages=BEFORE_UPDATE + FROM_UPDATE, variation: dict | None = None,
          island: dict | None = None) -> list[Row]:
    """Every quantity of one step of the ``stages`` asked for compared, in debugging order. ``measures``: JAX's own
    float32 error up to the gradients (see :func:`_twin_measures`); ``update64``: the port's optimizer in float64 fed
    this program's gradients, its own float32 error at the update stage; ``variation``: float64, the port's own
    variation up to the gradients (:func:`_port_variation`); ``step``: the step's number on each row, in a check over
    several steps (None for one)."""
    rows = []
    variation, island = variation or {}, island or {}
    for stage, name, pick, reference, noise, port_shape in _quantities(run, seen, jax_seen, fed, stages):
        if stage == "update":  # the gradients are compared: let go before the updates are
            jax_seen.pop("grads", None)
            jax_seen.pop("input_grads", None)
        port = pick(jax_seen)
        jax_noisy = [measures[stage, name]] if (stage, name) in measures else []
        if stage == "update" and update64 is not None:
            jax_noisy = [(port, pick(update64))]
        if stage in ("forward", "output"):
            port, reference = _broadcast_equal(run, f"{stage}, {name}", port, reference)
        port_noisy = [variation[stage, name]] if (stage, name) in variation else []
        island_noisy = [island[stage, name]] if (stage, name) in island else []
        row = compare(stage, name, port, reference, [noise], run.dtype, run.k, port_shape=port_shape,
                      jax_noisy=jax_noisy, float64_noise=True, port_noisy=port_noisy, island_noisy=island_noisy)
        row.step = step
        rows.append(row)
    return rows


def _broadcast_equal(run: _Run, where: str, port, reference):
    """``port`` and ``reference`` as compared: where their shapes differ only by axes of length 1 that broadcast
    (position ids of shape (1, T) in PyTorch, (B, T) in the port), each broadcast to the larger, with a note: the
    values are compared as they would act."""
    port, reference = np.asarray(port), np.asarray(reference)
    if port.shape == reference.shape or port.ndim != reference.ndim:
        return port, reference
    try:
        common = np.broadcast_shapes(port.shape, reference.shape)
    except ValueError:
        return port, reference
    run.notes.add(f"{where}: the port's {port.shape} and PyTorch's {reference.shape} differ by axes of length 1; "
                  f"compared broadcast to {common}")
    return np.broadcast_to(port, common), np.broadcast_to(reference, common)


def _has(tree, path) -> bool:
    try:
        leaf_at(tree, path)
        return True
    except (KeyError, TypeError, IndexError):
        return False


def _prepare(spec: Spec, dtype: str, k: float, seed: int, programs: tuple[str, ...], torch_state: dict | None = None,
             memory_limit: float | None = None) -> _Run:
    """The spec's pieces built, the port adapted and paired with the PyTorch model, PyTorch's runs set up."""
    if spec.example_inputs is None or (spec.jax_model is None and (spec.jax_params is None or spec.jax_apply is None)):
        raise SpecError("a spec needs torch_model, example_inputs, and jax_model or jax_params with jax_apply")
    # the size known before anything is built, where the model builds on the meta device (else once it is built)
    size = estimate_before_building(spec.torch_model, dtype) if memory_limit is not None else None
    if size is not None and size.whole > memory_limit:
        raise SpecError(size.message(memory_limit))
    torch.manual_seed(seed)
    try:
        inputs = tuple(np.asarray(x) for x in spec.example_inputs())
        targets = tuple(np.asarray(x) for x in spec.example_targets()) if spec.example_targets else ()
        reference_model = spec.torch_model()
    except Exception as error:
        raise SpecError(f"the spec's torch_model()/example_inputs() failed: {type(error).__name__}: {error}") from error
    if memory_limit is not None and size is None:  # a model the meta device cannot build: measured built
        size = estimate(reference_model, dtype)
        if size.whole > memory_limit:
            raise SpecError(size.message(memory_limit))
    if torch_state is not None:
        reference_model.load_state_dict(torch_state)
    state = reference_model.state_dict()  # each model built loads it; the first build is let go after pairing
    jax_dtype = jnp.float64 if dtype == "float64" else jnp.float32

    def on_jax(arrays):  # None (an argument the port takes empty: cache=None) passes as it is
        return tuple(x if x is None else jnp.asarray(x, jax_dtype) if np.asarray(x).dtype.kind == "f"
                     else jnp.asarray(x) for x in arrays)

    def jax_inputs(channels_last: bool) -> tuple:
        to_jax = spec.to_jax or (default_to_jax if channels_last else lambda *a: tuple(np.asarray(x) for x in a))
        try:
            moved = to_jax(*inputs)
        except Exception as error:
            words = spec.words()
            raise SpecError(f"the spec's {words['to_jax']} failed on {words['to_jax_on']}: {type(error).__name__}: "
                            f"{error}") from error
        try:
            return on_jax(moved)
        except (TypeError, ValueError) as error:
            raise SpecError(f"the spec's {spec.words()['to_jax']} gave something that is not an array nor None "
                            f"({error}): it must return a tuple of arrays, one per argument of the port") from error

    if spec.input_gradients:
        words = spec.words()
        floats = [i for i in differentiated_inputs(spec, inputs)]
        moved = spec.to_jax(*inputs) if spec.to_jax is not None else None
        if not floats or spec.torch_loss is None:
            raise SpecError(f"{words['input_gradients']} needs a floating-point input and a loss (torch_loss, "
                            "jax_loss): the gradient compared is the loss's")
        if moved is not None and ((len(moved) != len(inputs) and spec.positional is None)
                                  or any(i >= len(moved) or np.asarray(moved[i]).dtype.kind != "f" for i in floats)):
            raise SpecError(f"{words['input_gradients']} pairs the inputs by position: {words['to_jax']} must give "
                            "one array per input, the floating-point ones in the same places")
    try:
        adapter = apis.adapter_for(spec, jax_inputs, seed)
    except UserError as error:
        raise SpecError(str(error)) from error
    from_jax = spec.from_jax or (default_from_jax if adapter.channels_last else np.asarray)
    pairings = transfer(reference_model, adapter.variables, spec.param_map, adapter.kinds)
    adapter.variables = shapes_of_paired(adapter.variables, pairings)
    tied = tied_tensors(reference_model)
    layer_paths = {p.torch_key.rsplit(".", 1)[0] if "." in p.torch_key else "": p.layer for p in pairings}
    # PyTorch's own error in the dtype checked: in float32 the float32 run, and the same twice with the batch's
    # samples in other orders (the reductions over the batch sum in other orders; outputs are put back in order);
    # in float64 the two float64 runs in other orders, and one with its weights and images in other memory layouts
    # (other_layout): a computation without a reduction over the batch (a Linear in eval mode) sums in the same order
    # however the batch is ordered, and in another order in another layout. The largest of their errors counts.
    # One model per role, not per run (a model of 124M parameters is 1 GB in float64): the reference, whose parameters
    # and buffers every run starts each step from; a working model per dtype that each other run and each optimizer
    # fed the port's gradients loads its start into before it computes; float64's other memory layout.
    ref = make_torch_side(spec, torch.float64, state)
    working = {torch.float64: None, torch.float32: None}

    def work(torch_dtype):
        if working[torch_dtype] is None:
            working[torch_dtype] = make_torch_side(spec, torch_dtype, state)[0]
        return working[torch_dtype]

    sides = {"ref": ref}
    batch = {np.shape(x)[0] for x in (*inputs, *targets) if np.ndim(x) > 0}
    permutations = {}
    short = "t32" if dtype == "float32" else "t64"
    if dtype == "float32":
        sides["t32"] = (work(torch.float32), None)
    if len(batch) == 1 and (size := batch.pop()) > 1:
        for variant in range(PERMUTED_RUNS):
            permutations[f"{short}-permuted-{variant}"] = np.random.default_rng([seed, variant]).permutation(size)
            sides[f"{short}-permuted-{variant}"] = (work(_torch_dtype(short)), None)
    if dtype == "float64":
        sides["t64-layout"] = (other_layout(make_torch_side(spec, torch.float64, state)[0]), None)
        sides["t64-moved"] = (work(torch.float64), None)
        sides["t64-blocked"] = (work(torch.float64), None)  # its matrix products' long sums in blocks (BlockedSums)
        # PyTorch's float32 error times eps₆₄/eps₃₂: its float64 error where the variants above share its roundings
        # (a long sum's partial sums round alike however its inputs are ordered or moved by an ulp)
        sides["t32-scaled"] = (work(torch.float32), None)
    # The update stage is judged from the same gradients: PyTorch's optimizer (float64, and float32 for its
    # own noise) fed JAX's gradients, its state evolving with them as optax's does. Judged from each
    # framework's own gradients instead, Adam's lr-sized steps on near-zero gradients make the
    # comparison a matter of chance.
    # Each is an optimizer of its own (its state) over the working model of its dtype, built when it is first fed
    # (_shadow): float32's float64 working model then exists only for the update stage, and is let go after the last.
    shadows = {program: ({"ref": None, short: None} if spec.jax_optimizer is not None else {}) for program in programs}
    run = _Run(spec, dtype, k, inputs, targets, jax_inputs(adapter.channels_last), on_jax(targets), from_jax, adapter,
               pairings, layer_paths, {}, sides, permutations, shadows, tied=tied, working=working, make_working=work)
    paths = {p.torch_key: "/".join(p.jax_path) for p in pairings}
    for later, first in tied.items():
        if later in paths:  # the port keeps a copy of its own where PyTorch uses one tensor twice
            run.notes.add(f"PyTorch's {later} is {first}: one tensor, whose gradient is the sum over both its uses and "
                          f"which one update moves; the port keeps two arrays ({paths[first]} and {paths[later]}), each "
                          "given PyTorch's values, each with the gradient of its own use alone: trained so, they part "
                          "(an untied model; the copy's update differs for that reason, not the optimizer's). A port of "
                          "the tie uses one array in both places (Flax: nn.Embed.attend).")
    return run


def _torch_dtype(side: str) -> torch.dtype:
    """A PyTorch side's dtype by its name: "ref" and "t64…" float64, "t32…" float32."""
    return torch.float32 if side.startswith("t32") else torch.float64


def noise_program(programs: tuple[str, ...]) -> str:
    """The program whose float64 twin measures JAX's own float32 error: op by op where it runs (a fault of the
    compiler alone then never reads as rounding), else the compiled one."""
    return "eager" if "eager" in programs else programs[0]


def _one_ulp(tensor: torch.Tensor, rng: np.random.Generator) -> torch.Tensor:
    """``tensor`` in float64 with each element moved by one ulp (relative eps), up or down at random."""
    wide = tensor.to(torch.float64)
    return wide * (1 + torch.from_numpy(rng.choice([-1.0, 1.0], size=tuple(wide.shape))) * float(np.finfo(np.float64).eps))


def _ulp_signs(shape: tuple, rng: np.random.Generator) -> np.ndarray:
    """The directions :func:`_one_ulp` draws for an array of ``shape`` (the same draws from the same ``rng``), kept as
    int8: an eighth of the memory of the moved array, which :class:`_Moved` makes when it is read."""
    return rng.choice(np.array([-1, 1], np.int8), size=tuple(shape))


def _moved_by(value, signs: np.ndarray) -> torch.Tensor:
    """``value`` in float64 moved by one ulp in the directions ``signs``: :func:`_one_ulp`'s arithmetic, number for
    number (the factor 1 ± eps made in place, then one product)."""
    factor = signs.astype(np.float64)
    factor *= float(np.finfo(np.float64).eps)
    factor += 1
    if torch.is_tensor(value):
        return value.to(torch.float64) * torch.from_numpy(factor)
    return torch.from_numpy(np.asarray(value, np.float64) * factor)  # IEEE products: the same numbers as torch's


class _Moved:
    """An array moved by one ulp when it is read (``np.asarray``), from its directions drawn beforehand: an optimizer
    fed moved gradients holds one moved array at a time, not a moved copy of every gradient (1 GB for 124M parameters
    in float64)."""

    def __init__(self, value, signs: np.ndarray):
        self.value, self.signs = value, signs
        self.shape = np.shape(value)

    def __getitem__(self, index):  # a stacked leaf's slice: the slice moved (an elementwise product)
        return _Moved(np.asarray(self.value)[index], self.signs[index])

    def __array__(self, dtype=None, copy=None):
        moved = _moved_by(self.value, self.signs).numpy()
        return moved if dtype is None else moved.astype(dtype)


class _MovedState(dict):
    """A state_dict whose floating-point tensors are moved by one ulp as :func:`.torch_side.load_into` reads each."""

    def __init__(self, state: dict, signs: dict):
        super().__init__(state)
        self.signs = signs

    def __getitem__(self, key):
        value = super().__getitem__(key)
        return _moved_by(value, self.signs[key]) if key in self.signs else value


RECOMPUTED_ABOVE = 256 << 20  # bytes of PyTorch64's gradients beyond which the last step computes them again


def _recomputed_gradients(run: _Run) -> dict:
    """PyTorch64's gradients of the last step computed again, as the reference computed them (the same start, inputs
    and random state: the same bits), in the port's layout: held while they are compared, not while the port runs."""
    model = run.sides["ref"][0]
    with torch.random.fork_rng(devices=[]):
        torch.random.set_rng_state(run.reference_rng)
        run_torch_step(run.spec, model, None, run.inputs, run.targets, torch.float64, {})
    return torch_in_flax_layout(model, run.pairings, "grad", release=True)


def _torch_steps(run: _Run, last: bool) -> tuple[dict, dict]:
    """Every PyTorch side runs one step from PyTorch64's state; returns what the reference saw (``"ref"``), the other
    runs' largest errors against it (``"noise"``: PyTorch's own error in the dtype, quantity by quantity, each run
    compared as soon as it is done and let go), and that starting state. The reference's optimizer steps (its
    parameters start the next step) unless this is the ``last`` step."""
    start = run.sides["ref"][0]  # teacher forcing: every side starts the step from PyTorch64's parameters and buffers
    # a copy of what the reference's step changes: its buffers (running statistics), and its parameters where its
    # optimizer steps; at the last step the parameters are read as they are (a model of 124M parameters: 1 GB in float64)
    fixed = {name for name, _ in start.named_parameters(remove_duplicate=False)} if last else set()
    params_state = {k: v.detach() if k in fixed else v.detach().clone() for k, v in start.state_dict().items()}
    moves = np.random.default_rng(len(run.pairings))
    stats = [p for p in run.pairings if p.collection == "batch_stats"]

    def inputs_of(name):
        if name != "t64-moved":
            return run.inputs
        return tuple(_one_ulp(torch.from_numpy(np.array(x)), moves).numpy() if np.asarray(x).dtype.kind == "f" else x
                     for x in run.inputs)

    noise = {"layers": {}, "grads": {}, "after": {}, "input_grads": {}, "output": Measured(0.0), "loss": Measured(0.0)}

    def error_of(name, value, reference) -> Measured:  # a float32 run in a float64 check: scaled to float64's roundoff
        error = relative_error(value, reference)
        if name == "t64-wide" and float(error) > 1e3 * EPS64:
            # A row a float32 island reaches carries float32 rounding: of the island's results, which the run without
            # its casts measures, and of constants the model made in float32 before the check widened it (transformers'
            # rotary frequencies, a float32 buffer at init), which that run cannot widen back. Such a row's PyTorch
            # noise is at least one float32 ulp of its scale (the rotary tables of a float64 Llama: 1.35e-7 of their
            # scale from a port that computes them in float64, against 4.3e-8 measured without the casts).
            error = max(error, Measured(ISLAND_FLOOR))
        return Measured(error * FLOAT32_TO_64) if name == "t32-scaled" else error

    def step_of(name, model, opt):
        islands = mode = None
        if name == "ref" and run.torch_islands is None:  # PyTorch64's own islands, found at its first step
            islands = mode = Islands(model, torch.float64)
        elif name == "t64-wide":
            mode = Islands(model, torch.float64, widen=True)
        elif name == "t64-blocked":
            mode = BlockedSums()
        sink = None
        if name != "ref":  # each layer's output measured against the reference's as it comes, not kept
            def sink(layer, value):
                noise["layers"][layer] = max(noise["layers"].get(layer, Measured(0.0)),
                                             error_of(name, value, ref["layers"][layer]))
        seen = run_torch_step(run.spec, model, opt, inputs_of(name), run.targets, _torch_dtype(name), run.layer_paths,
                           run.permutations.get(name), layout=name == "t64-layout", sink=sink, mode=mode)
        if name == "ref":  # a tapped function's rows (TAPS), paired with the port's values in order
            run.layer_paths.update(seen.pop("tap_paths", {}))
        if name == "ref" and run.torch_islands is None:
            run.torch_islands = islands.found
            if islands.found and run.make_working is not None:
                # the island's own error: PyTorch64 with its casts removed beside it, in every row's PyTorch noise
                run.sides["t64-wide"] = (run.make_working(torch.float64), None)
                for where, narrow in island_pattern(islands.found).items():
                    run.notes.add(f"PyTorch computes {where} in {narrow} inside its float64 model (a cast there): those "
                                  f"rows and what follows are judged against that island's own error (PyTorch64 with "
                                  f"its casts removed, beside it)")
        seen["grads"] = torch_in_flax_layout(model, run.pairings, "grad", release=True)
        seen["after"] = torch_in_flax_layout(model, stats)  # the buffers (the parameters' updates are judged fed)
        return seen

    ref_model, ref_optimizer = run.sides["ref"]
    run.reference_rng = torch.random.get_rng_state()  # for _recomputed_gradients
    ref = step_of("ref", ref_model, None if last else ref_optimizer)
    for name, (model, _) in run.sides.items():
        if name == "ref":
            continue
        # copied into the parameters as they are laid out, each converted to the run's dtype as it is copied
        state = params_state
        if name == "t64-moved":
            state = {k: _one_ulp(v, moves) if v.is_floating_point() else v for k, v in params_state.items()}
        load_into(model, state)
        del state
        seen = step_of(name, model, None)  # no optimizer step: its parameters after it are not compared
        model.zero_grad(set_to_none=True)
        for quantity in ("output", "loss"):
            if quantity in seen:
                noise[quantity] = max(noise[quantity], error_of(name, seen[quantity], ref[quantity]))
        for quantity in ("grads", "after", "input_grads"):
            for key, value in seen.get(quantity, {}).items():
                noise[quantity][key] = max(noise[quantity].get(key, Measured(0.0)),
                                           error_of(name, value, ref[quantity][key]))
        del seen
    return {"ref": ref, "noise": noise}, params_state


def _run_program(run: _Run, function, program: str, before: dict, opt_state, first: bool) -> dict:
    """One step of the port by ``function``; on the first call, a port that raises is a spec the checker cannot use."""
    trim()  # what the step's start and the previous program freed, handed back before this one allocates
    try:
        return _collected(run, lambda: function(before, run.jax_inputs, run.jax_targets, opt_state))
    except SpecError as error:  # raised while JAX traced the step, which appends a note on its traceback filtering
        raise type(error)(str(error).split("\n-----")[0]) from error
    except Exception as error:
        if not first:
            raise
        hints = []
        if run.adapter.api == "Equinox" and not run.spec.per_sample:
            hints.append("an Equinox model that acts on one sample needs PER_SAMPLE = True")
        if run.adapter.channels_last and run.spec.to_jax is None and any(np.ndim(x) >= 3 for x in run.inputs):
            hints.append("its inputs of 3 or more dimensions were moved channels-last; to_jax says otherwise")
        message = str(error).strip().splitlines()[0] if str(error).strip() else ""
        words = run.spec.words()
        raise SpecError(f"{words['port']} ({program_words((program,))}) failed on {words['inputs']}: "
                        f"{type(error).__name__}: {message}" + (f" ({'; '.join(hints)})" if hints else "")) from error


def _float64_twin(run: _Run, function, make_before: Callable[[], dict], compile_first: bool = False) -> dict:
    """A program's step without its optimizer, in float64 from the same start (PyTorch64's parameters and buffers, made
    by ``make_before``), for JAX's own float32 error up to the gradients. ``compile_first`` (a jitted ``function``):
    compiled before its start is made, from the shapes of a start made and let go first, so that XLA's compilation
    does not run beside the start's float64 parameters (GPT-2's: 1 GB)."""
    with jax.enable_x64(True):
        inputs, targets = _floats_in((run.jax_inputs, run.jax_targets), jnp.float64)
        if compile_first:
            before = make_before()
            shapes = jax.eval_shape(lambda: before)
            del before
            with apis.nested_outputs():  # traced as _collected runs it: layers inside the port's own scans leave
                function = function.lower(shapes, inputs, targets, None).compile()
            trim()
        before = make_before()
        return _collected(run, lambda: function(before, inputs, targets, None))


def _update_in_float64(optimizer):
    """The port's optimizer step in float64 fed the float32 program's own gradients, from the same parameters and
    optimizer state, ``(params, grads, opt_state) -> {"params": ...}``: the update stage's float64 twin. Fed the
    float64 twin's gradients instead, Adam would turn a gradient that is zero but for rounding (a key bias under
    softmax: 1e-19 in float64, 1e-9 in float32) into steps of different size, and a wrong update of 1% there would
    read as rounding. Compiled once per check; the float32 parameters, gradients and state are widened inside the
    compiled step, where XLA fuses the conversions into the update (no float64 copy of them is held: 2 GB on a model
    of 124M parameters)."""
    import optax

    @jax.jit
    def step(params, grads, opt_state):  # widened inside: no float64 copy of the parameters and gradients is kept
        params, grads, opt_state = _floats_in((params, grads, opt_state), jnp.float64)
        if opt_state is None:
            opt_state = optimizer.init(params)
        updates, _ = optimizer.update(grads, opt_state, params)
        return optax.apply_updates(params, updates)

    def update(params, grads, opt_state) -> dict:
        with jax.enable_x64(True):
            return {"params": jax.device_get(step(params, grads, opt_state))}

    return update


@contextlib.contextmanager
def _bias_corrections_exact():
    """While in effect, optax's Adam-family bias corrections 1 − βᵗ are computed as PyTorch has them, exactly and then
    rounded once to the moments' dtype (−expm1(t · log β), log β in Python's float64), not as float32's 1 − β^t."""
    import math

    import optax

    original = optax.tree.bias_correction

    def exact(moment, decay, count):
        log_decay = math.log(decay) if isinstance(decay, (int, float)) else jnp.log(decay)
        correction = -jnp.expm1(jnp.asarray(count, jnp.float32) * log_decay)
        return jax.tree_util.tree_map(lambda t: t / correction.astype(t.dtype), moment)

    optax.tree.bias_correction = exact
    try:
        yield
    finally:
        optax.tree.bias_correction = original


def _update_with_exact_bias_corrections(optimizer):
    """``(params, grads, opt_state) -> {"params": ...}``: the port's optimizer step, its bias corrections exact
    (:func:`_bias_corrections_exact`), in the check's dtype."""
    import optax

    def update(params, grads, opt_state):
        with _bias_corrections_exact():
            state = optimizer.init(params) if opt_state is None else opt_state
            updates, _ = optimizer.update(grads, state, params)
            return {"params": jax.device_get(optax.apply_updates(params, updates))}

    return update


def _floats_in(tree, width):
    """``tree`` with its floating-point leaves in ``width`` (the rest as they are)."""
    return jax.tree_util.tree_map(
        lambda a: jnp.asarray(a, width) if jnp.issubdtype(jnp.asarray(a).dtype, jnp.floating) else a, tree)


def _collected(run: _Run, call) -> dict:
    """A program's outcome fetched from the device, with the outputs of the layers the port runs inside its own
    transformations (which leave through callbacks while it runs) assembled into its per-layer outputs."""
    with apis.nested_outputs() as nested:
        outcome = jax.device_get(call())
    if nested:
        expected = {path: run.layer_shapes[name] for name, path in run.layer_paths.items() if name in run.layer_shapes}
        found = apis.assemble_nested(nested, expected)
        outcome["layers"] = {**found, **outcome["layers"]}
    return outcome


def _start_of_step(run: _Run, width, own: dict | None, state: dict | None = None) -> dict:
    """The variables a step of the port starts from: PyTorch64's parameters (in ``width``; read from the reference,
    or from ``state``, its state_dict as the step started), and the port's own state after its previous step (``own``;
    on the first step, the statistics PyTorch starts from and the port's initial state)."""
    start = variables_from_torch(run.sides["ref"][0] if state is None else state, run.pairings, run.adapter.variables,
                                 width)
    if own is None:
        return {**start, "carry": run.adapter.carry}
    return {**start, "batch_stats": _floats_in(own["batch_stats"], width), "carry": _floats_in(own["carry"], width)}


def _shadow(run: _Run, program: str, name: str):
    """``program``'s PyTorch optimizer ``name`` ("ref": float64; "t32"/"t64": PyTorch's own error) and the working
    model of its dtype it steps, built the first time it is asked for. A working model that no run has yet is built
    afresh (its values do not matter: each fed update loads its start into it), PyTorch's random state kept as it was."""
    if run.shadows[program][name] is None:
        dtype = torch.float64 if name == "ref" else _torch_dtype(name)
        if run.working.get(dtype) is None:
            with torch.random.fork_rng(devices=[]):
                run.working[dtype] = make_torch_side(run.spec, dtype, None)[0]
        model = run.working[dtype]
        run.shadows[program][name] = (model, run.spec.torch_optimizer(model.parameters()))
    return run.shadows[program][name]


def _fed_updates(run: _Run, program: str, start: dict, grads, last: bool, in_place: bool = False) -> dict:
    """PyTorch's optimizers fed ``program``'s gradients: float64, the reference (``"ref"``, its parameters read from its
    model as the rows ask for them); float32 (or float64 fed gradients and parameters moved by one ulp), PyTorch's own
    error, measured against it at once (``"noise"``). The optimizers' states are kept for the next step, let go after
    the ``last``. ``in_place``: the reference's optimizer steps PyTorch64's reference model itself, whose parameters
    are ``start`` and are read by nothing after it (the last program of a check of one step), after the other run: no
    working model holds the start a second time, and the reference's values need no copy (1 GB each for 124M
    parameters in float64)."""
    names = [name for name in run.shadows[program] if not (in_place and name == "ref")]
    shadows = {name: _shadow(run, program, name) for name in names}
    if in_place:
        model = run.sides["ref"][0]
        shadows["ref"] = (model, run.spec.torch_optimizer(model.parameters()))
    moves = np.random.default_rng(len(run.pairings) + 1)

    def own_update(name, model, opt):
        if name == "t64":
            # the start's and the gradients' one-ulp moves drawn as they always were (in this order), each applied as
            # the optimizer reads that tensor
            start_signs = {k: _ulp_signs(v.shape, moves) for k, v in start.items() if v.is_floating_point()}
            grad_signs = jax.tree_util.tree_map(lambda g: _ulp_signs(np.shape(g), moves), grads)
            moved = jax.tree_util.tree_map(_Moved, grads, grad_signs)
            return fed_update(model, opt, _MovedState(start, start_signs), run.pairings, moved, last)
        return fed_update(model, opt, start, run.pairings, grads, last)

    others = [(name, model, opt) for name, (model, opt) in shadows.items() if name in ("t64", "t32")]
    if in_place:  # the other run first: the reference's step overwrites the start
        owns = [own_update(*other) for other in others]
        ref = fed_update(*shadows["ref"], start, run.pairings, grads, last)
    else:
        ref = fed_update(*shadows["ref"], start, run.pairings, grads, last)
        if any(model is shadows["ref"][0] for _, model, _ in others):
            ref = dict(ref)  # float64: the other run steps the same working model; the reference's values copied first
        owns = (own_update(*other) for other in others)  # one at a time
    fed = {"ref": ref}
    for own in owns:
        fed["noise"] = {key: relative_error(own[key], ref[key]) for key in own}
        del own
    return fed


def _narrow(outcome: dict, run: _Run) -> tuple[str, str] | None:
    """(where, dtype) of the first floating-point value of the float64 twin's outcome that is not float64 (its layers
    in PyTorch's order, its output, its gradients), or None."""
    places = [(name or "(model)", outcome["layers"].get(path)) for name, path in run.layer_paths.items()]
    places += [("its output", outcome["output"]), ("its gradients", outcome.get("grads"))]
    for where, value in places:
        for leaf in jax.tree_util.tree_leaves(value):
            kind = np.dtype(getattr(leaf, "dtype", np.float64))
            if np.issubdtype(kind, np.floating) and kind != np.float64:
                return where, str(kind)
    return None


def _unshared(tree, beside=None):
    """``tree`` with each array that it holds twice copied at its later places (an optimizer's init may give its first
    and second moments one zeros array), and each that ``beside`` holds (the parameters an init may keep as they are):
    each leaf a buffer of its own, which a donated argument needs."""
    seen = {id(leaf) for leaf in jax.tree_util.tree_leaves(beside)}

    def own(leaf):
        if id(leaf) in seen:
            return jnp.array(leaf, copy=True)
        seen.add(id(leaf))
        return leaf

    return jax.tree_util.tree_map(own, tree)


class _CompiledStep:
    """The compiled step as check_port runs it: ``(variables, inputs, targets, opt_state) -> outcome``, with the
    variables' parameters (made for the step from PyTorch's, read by nothing after it) donated where an optimizer
    steps them: the new parameters are written into their buffers. The optimizer's state of a first step is made after
    the program is compiled (XLA's compilation of GPT-2's float64 step holds most of a gigabyte while it runs, not
    beside Adam's two moments) and donated too, the new state written into its buffers. Donation changes where outputs
    are written, not what is computed: the reports are the same number for number. The step returns its new state at
    the last step too (nothing reads it): a program without that output is fused otherwise, and its update rounds
    otherwise (Adam's steps on near-zero gradients moved by up to 1e-3 of their size in the example ports). Each
    variant is compiled once per check."""

    def __init__(self, step, optimizer):
        def apart(params, rest, inputs, targets, opt_state):
            return step({**rest, "params": params}, inputs, targets, opt_state)

        params = (0,) if optimizer is not None else ()  # without an optimizer no new parameters come out to take them
        self.jitted = {fresh: jax.jit(apart, donate_argnums=params + ((4,) if fresh else ())) for fresh in (False, True)}
        self.compiled = {}

    def with_state(self, make_state: Callable | None):
        """The step's function; ``make_state``: the optimizer's state made for this step (else the state is given)."""

        def call(variables, inputs, targets, opt_state):
            params = variables["params"]
            rest = {key: value for key, value in variables.items() if key != "params"}
            fresh = make_state is not None
            if fresh not in self.compiled:
                state_shapes = jax.eval_shape(make_state) if fresh else opt_state
                self.compiled[fresh] = self.jitted[fresh].lower(params, rest, inputs, targets, state_shapes).compile()
            if fresh:
                opt_state = _unshared(make_state(), beside=params)
            trim()  # what the start's conversion and the compilation freed, handed back before the program's buffers
            return self.compiled[fresh](params, rest, inputs, targets, opt_state)

        return call


PARKED_ABOVE = 256 << 20  # bytes of PyTorch64's reference model (and its optimizer's state) parked while the port runs


def _reference_parked(run: _Run):
    """While a program of the port runs, PyTorch64's reference model, and its optimizer's state, parked on disk
    (:class:`.torch_side.Parked`) where they are over ``PARKED_ABOVE`` bytes (GPT-2 124M's: 1 GB in float64): nothing
    reads them until the program's outcome is compared. Every start of the program is made before, from them."""
    model, optimizer = run.sides["ref"]
    tensors = [*model.parameters(), *model.buffers()]
    if optimizer is not None:
        tensors += [v for state in optimizer.state.values() for v in state.values() if isinstance(v, torch.Tensor)]
    parked = Parked(tensors)
    return parked if parked.nbytes > PARKED_ABOVE else contextlib.nullcontext()


@contextlib.contextmanager
def _fast_variance_off():
    """While in effect, Flax's BatchNorm, LayerNorm and GroupNorm (Linen and NNX) compute the variance as PyTorch does,
    the mean subtracted first (``use_fast_variance=False``), whatever the port built them with: the counterfactual
    that verifies the cause before the report names it."""
    patched = []
    for name in ("flax.linen.normalization", "flax.nnx.nn.normalization"):
        module = sys.modules.get(name)
        if module is None or not hasattr(module, "_compute_stats"):
            continue
        original = module._compute_stats

        def exact(*args, _original=original, **kwargs):
            kwargs["use_fast_variance"] = False
            return _original(*args, **kwargs)

        module._compute_stats = exact
        patched.append((module, original))
    try:
        yield
    finally:
        for module, original in patched:
            module._compute_stats = original


def _programs_held(program: str):
    """While ``program`` runs: op by op, at most a bounded number of JAX's per-operation programs held
    (:func:`.memory.op_programs_bounded`); compiled, nothing to bound."""
    return op_programs_bounded() if program == "eager" else contextlib.nullcontext()


def _let_go_of_programs(program: str) -> None:
    """After a program run op by op, JAX's caches of the programs it compiled for each operation (about 0.75 GB for a
    ResNet-50's step, kept until the process ends) are let go: the next program compiles its own. The compiled
    step then compiles again at the next step, a few seconds, for a peak a gigabyte lower on such a model."""
    if program == "eager":
        jax.clear_caches()


FLAX_BATCHNORM = ("flax.linen.normalization.BatchNorm", "flax.nnx.nn.normalization.BatchNorm")


def _known_causes(run: _Run, report: Report) -> dict:
    """A known cause for divergences at a running statistic of Flax's own BatchNorm, read off the port's module."""
    modules = {p.torch_key: p.jax_path[:-1] for p in run.pairings}
    hints = {}
    for row in report.rows + report.other_rows:
        stage = row.stage
        if row.diverged and stage == "gradient" and row.name.startswith("(input"):
            hints[(stage, row.name)] = (
                "a path that only the input's gradient takes is cut or changed (every parameter's gradient before "
                "it agrees): a stop_gradient (PyTorch's .detach()) on a residual stream or a skip connection, or a "
                "custom gradient there")
        if row.diverged and stage == "buffer" and run.adapter.classes.get(modules.get(row.name)) in FLAX_BATCHNORM:
            hints[(stage, row.name)] = (
                "the port's module there is Flax's own BatchNorm, which weighs the old running average by its momentum "
                "(0.9 means PyTorch's 0.1) and keeps the biased batch variance, where PyTorch keeps the unbiased one; "
                "a port of PyTorch's BatchNorm writes its own (examples/port/resnet_basic.py: TorchBatchNorm)")
    updates = [r for r in report.rows if r.diverged and r.key[0] == "update"]
    if updates and not any(r.diverged for r in report.rows if r.key[0] in ("forward", "output", "loss", "gradient")):
        said = _optimizer_differences(run)
        if said:
            for row in updates:
                hints[row.key] = "; ".join(said)
    return hints


def _optimizer_differences(run: _Run) -> list[str]:
    """Each side's optimizer stepped alone on the same made-up gradients, from fresh states, each probe telling one
    hyperparameter: a weight of 1 and a zero gradient (a decoupled weight decay: lr × weight_decay), a weight of 0 and
    a gradient of 1 (the step size: the learning rate), a gradient of 1e-8 beside it (Adam's ε: ``g / (|g| + ε)``),
    and the gradients 1, -2, 0.5 in turn (the momentum: SGD's or Adam's betas). What differs is said, in that order;
    nothing where either optimizer cannot be run so (one that needs more than a list of parameters)."""
    import optax

    def torch_steps(start, grads):
        weight = torch.nn.Parameter(torch.full((4,), start, dtype=torch.float64))
        optimizer = run.spec.torch_optimizer([weight])
        moves = []
        for g in grads:
            before = weight.detach().clone()
            weight.grad = torch.full_like(weight, g)
            optimizer.step()
            moves.append(float((weight.detach() - before)[0]))
        return moves

    def port_steps(start, grads):
        optimizer = run.spec.jax_optimizer()
        params = {"w": jnp.full(4, start, jnp.float32)}
        state = optimizer.init(params)
        moves = []
        for g in grads:
            updates, state = optimizer.update({"w": jnp.full(4, g, jnp.float32)}, state, params)
            params = optax.apply_updates(params, updates)
            moves.append(float(np.asarray(updates["w"])[0]))
        return moves

    try:
        probes = {name: (torch_steps(*probe), port_steps(*probe)) for name, probe in
                  {"decay": (1.0, [0.0]), "step": (0.0, [1.0]), "tiny": (0.0, [1e-8]),
                   "turns": (0.0, [1.0, -2.0, 0.5])}.items()}
    except Exception:
        return []

    def differ(a, b):
        return not math.isclose(a, b, rel_tol=1e-3, abs_tol=1e-12)

    said = []
    (t_step,), (p_step,) = probes["step"]
    steps_differ = differ(t_step, p_step)
    if steps_differ:
        said.append(f"the optimizers' learning rates differ: with a gradient of 1 the first step moves a weight by "
                    f"{t_step:.3g} in PyTorch and {p_step:.3g} in the port")
    (t_decay,), (p_decay,) = probes["decay"]
    if t_step and p_step and differ(t_decay / t_step, p_decay / p_step):  # weight_decay itself, lr divided out
        said.append(f"the optimizers' weight decays differ: with zero gradients PyTorch's shrinks each weight by "
                    f"{-t_decay:.3g} of itself a step and the port's by {-p_decay:.3g} (lr × weight_decay; "
                    "torch.optim.AdamW's default weight_decay is 0.01, optax.adamw's 1e-4: give both the same)")
    if steps_differ:
        return said  # the probes below are read relative to the step size
    (t_tiny,), (p_tiny,) = probes["tiny"]
    if t_step and differ(t_tiny / t_step, p_tiny / p_step):
        said.append(f"the optimizers' epsilons differ: a gradient of 1e-8 moves a weight {t_tiny / t_step:.3g} as far "
                    f"as a gradient of 1 in PyTorch, {p_tiny / p_step:.3g} in the port (Adam's g / (√v̂ + ε): its eps, or "
                    "eps inside the square root, optax's eps_root)")
    t_turns, p_turns = probes["turns"]
    if not said and any(differ(a, b) for a, b in zip(t_turns[1:], p_turns[1:])):
        said.append(f"the optimizers' momenta differ: with the gradients 1, -2, 0.5 the steps are "
                    f"{', '.join(f'{m:.3g}' for m in t_turns)} in PyTorch and {', '.join(f'{m:.3g}' for m in p_turns)} "
                    "in the port, the first alike (SGD's momentum or dampening, Adam's betas)")
    return said


def _lopsided_gradients(report: Report, apart: float = 10.0) -> list[str]:
    """Where a divergence reaches the weight gradients of sibling layers (one parent module) unevenly, some ``apart``
    times further off than the nearest, a line saying so: the mistake lies on the far ones' path alone (queries' and
    keys' projections far worse than values': between them and the attention scores, a rotary embedding say)."""
    groups: dict[str, list[Row]] = {}
    for row in report.rows:
        if row.diverged and row.key[0] == "gradient" and row.name.endswith(".weight") and row.name.count(".") >= 2:
            groups.setdefault(row.name.rsplit(".", 2)[0], []).append(row)
    lines = []
    for parent, rows in groups.items():
        nearest = min(rows, key=lambda r: r.port_error)
        far = [r for r in rows if nearest.port_error > 0 and r.port_error >= apart * nearest.port_error]
        if len(rows) >= 3 and far and len(far) < len(rows) - 1:
            times = [r.port_error / nearest.port_error for r in far]
            names = " and ".join(r.name[len(parent) + 1:] for r in far)
            lines.append(f"among {parent}'s weight gradients, {names} {'is' if len(far) == 1 else 'are'} "
                         f"{min(times):.0f}–{max(times):.0f}× further from PyTorch's than "
                         f"{nearest.name[len(parent) + 1:]}: the mistake lies on their path alone (queries' and keys' "
                         "projections far worse than the values': between them and the attention scores, a rotary "
                         "embedding say; TAPS can give it rows)")
    return lines


def _verified_causes(run: _Run, report: Report) -> dict:
    """Per cause switched off (:attr:`_Run.counterfactuals`): the judged rows beyond their allowance whose excess over
    it goes away without the cause, at least nine tenths of it ("fell"; the rest may have a cause of its own), and those
    whose excess stays ("stayed"), each ``(stage, name) → (ratio, ratio without)``."""
    verified = {}
    for cause, counter in run.counterfactuals.items():
        label = {"use_fast_variance=False": "use_fast_variance=True",
                 "exact bias corrections": "optax's float32 bias corrections"}[cause]
        fell, stayed = {}, {}
        for row in report.rows:
            if row.passed or row.not_compared or row.key not in counter:
                continue
            after = counter[row.key]  # the excess over the allowance gone, or nine tenths of it
            gone = max(after.port_error - after.allowed, 0.0) <= 0.1 * (row.port_error - row.allowed)
            (fell if gone else stayed)[row.key] = (row.ratio, after.ratio)
        verified[label] = {"fell": fell, "stayed": stayed}
    return verified


def check_port(spec: Spec, dtype: str = "float32", steps: int = 1, k: float = DEFAULT_K, seed: int = 0,
               programs: tuple[str, ...] = PROGRAMS, torch_state: dict | None = None, export: bool = False,
               memory_limit: float | None = None, progress: bool = False) -> Report:
    """Compare the spec's JAX port with its PyTorch model, quantity by quantity (see the module's docstring).

    Args:
        spec: what to compare (:class:`.spec.Spec`, from :func:`.spec.load_spec` or :func:`.spec.spec_from_module`).
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

    Returns:
        A :class:`.report.Report`: every row, the verdict (``exit_status()``: 0 agreement, 1 divergence, 3 precision
        findings), the pairing, the notes and the memory phase by phase.

    Raises:
        SpecError: the spec cannot be used (a missing piece, weights that do not pair, a port computing in another
            dtype than asked, a check estimated beyond ``memory_limit``), or the spec's or the port's own code raised;
            the message says which, in one line.
    """
    if dtype not in ("float32", "float64"):
        raise SpecError(f"dtype must be float32 or float64, got {dtype!r}")
    if steps < 1:
        raise SpecError(f"steps must be at least 1, got {steps}")
    if not programs or any(p not in PROGRAMS for p in programs):
        raise SpecError(f"programs must be taken from {PROGRAMS}, got {programs!r}")
    # Full float32 on GPUs/TPUs (no TF32 or bf16 passes, no effect on CPUs): PyTorch's side runs on the CPU, and its
    # float32 noise is the yardstick.
    with jax.enable_x64(True) if dtype == "float64" else contextlib.nullcontext(), \
            jax.default_matmul_precision("highest"), old_objects_frozen(), taps.installed(taps.validate(spec.taps)):
        phases = Phases("check-port: " if progress else None)
        run = _prepare(spec, dtype, k, seed, programs, torch_state, memory_limit)
        jax.clear_caches()  # the programs of the port's construction (run op by op, as NNX and Equinox build models)
        phases.mark("PyTorch models built, port paired")
        if export:  # the weights as they start, before any step changes them
            start = variables_from_torch(run.sides["ref"][0], run.pairings, run.adapter.variables, jnp.float32)
            converted = run.adapter.export({**start, "carry": run.adapter.carry})
            del start
        optimizer = spec.jax_optimizer() if spec.jax_optimizer else None
        step_fn = jax_step_function(run.adapter, spec, optimizer)
        update_in_float64 = _update_in_float64(optimizer) if optimizer is not None and dtype == "float32" else None
        # The optimizer's state, a step's input and output, is not held twice (Adam's over 124M parameters: 2 GB in
        # float64): op by op, the last step does not return it (nothing reads it); compiled, a state made for the step
        # (its first) is donated to it, the new state written into its buffers (the same program, the same numbers;
        # a program without that output would be fused otherwise and round otherwise), and so are the parameters
        # (_CompiledStep).
        last_step_fn = jax_step_function(run.adapter, spec, optimizer, keep_state=False)
        compiled_step = _CompiledStep(step_fn, optimizer)
        # The float64 twin measures JAX's own error up to the gradients (the update stage's twin is update_in_float64):
        # the same step without the optimizer, whose float64 parameters and state it would otherwise hold.
        twin_step = jax_step_function(run.adapter, spec, None)
        compiled_twin = jax.jit(twin_step)  # the float32 check's float64 twin, or the float64 check's float32 run
        twin_function = compiled_twin if noise_program(programs) == "jit" else twin_step
        variant_program = "jit" if "jit" in programs else "eager"
        variant_function = compiled_twin if variant_program == "jit" else twin_step
        order = sorted(programs, key=lambda p: p != "eager")  # op by op first: a bad dtype shows there
        # JAX's own float32 error, |JAX₃₂ − JAX₆₄| of one program, and whether that program's mathematics is right
        # (|JAX₆₄ − PyTorch₆₄|); float64 needs neither.
        twin_program = noise_program(programs) if dtype == "float32" else None
        width = jnp.float64 if dtype == "float64" else jnp.float32
        opt_states: dict[str, Any] = {}
        # Per program, the port's own state after its previous step (running statistics and whatever else it keeps):
        # the next step starts from it, as training does; the parameters start from PyTorch's (teacher forcing).
        own_state: dict[str, dict | None] = {program: None for program in programs}
        rows: dict[str, list[Row]] = {program: [] for program in programs}
        port_islands: dict = {}  # float64: where the port computes narrower, found in its step's jaxpr (widen.py)
        for step in range(1, steps + 1):
            last = step == steps
            opt_before = dict(opt_states)
            try:
                seen, params_state = _torch_steps(run, last=last)
                phases.mark(f"step {step}: PyTorch's runs")
            except SpecError:
                raise
            except Exception as error:
                if step > 1:
                    raise
                message = str(error).strip().splitlines()[0] if str(error).strip() else ""
                raise SpecError(f"{spec.words()['torch_step']} failed: {type(error).__name__}: {message}") from error
            run.layer_shapes.update({name: np.shape(value) for name, value in seen["ref"]["layers"].items()})
            if last:  # PyTorch's runs for its own error are done (float64's other memory layout: a model let go), and
                # the working models with them, but where an optimizer fed the port's gradients holds one from an
                # earlier step: the update stage builds its own when it comes to it (a gigabyte for 124M parameters in
                # float64, not held while the port runs)
                run.sides = {"ref": run.sides["ref"]}
                run.working.clear()
            # PyTorch64's gradients of a large model (GPT-2's: 1 GB in float64) are not held while the port runs: the
            # last step computes them again when each program's are compared (one more PyTorch64 backward a program)
            recompute = last and sum(np.asarray(g).nbytes for g in seen["ref"]["grads"].values()) > RECOMPUTED_ABOVE
            if recompute:
                seen["ref"]["grads"] = None

            def reference_gradients():
                if seen["ref"]["grads"] is None:
                    seen["ref"]["grads"] = _recomputed_gradients(run)

            # float64: the port's own rounding error, from its program (compiled where it runs) in float32, held while
            # each program's rows are compared
            variant = wide = None
            variant_start = own_state[programs[0]]  # the judged program's state as this step starts
            # One program at a time, compared and let go: the twin's program first, then its float64 twin (JAX's own
            # float32 error, kept as numbers), then the others.
            measures: dict = {}
            for program in order:
                # Each program's start (its float64 twin's, its update stage's) is made when it comes to it, one at a
                # time, from the state PyTorch's step started from (the reference's statistics have moved since).
                own_before = own_state[program]
                start = _start_of_step(run, width, own_before, params_state)
                if program == "jit":  # the optimizer's state made for its first step once the step is compiled
                    fresh = program not in opt_states and optimizer is not None
                    function = compiled_step.with_state(
                        (lambda params=start["params"]: optimizer.init(params)) if fresh else None)
                    opt_states.setdefault(program, None)
                else:
                    if program not in opt_states:
                        opt_states[program] = optimizer.init(start["params"]) if optimizer is not None else None
                    function = last_step_fn if last else step_fn
                first = step == 1 and program == order[0]
                # the start's shapes, for the islands' jaxpr once the program has run (a jitted step donates its start)
                shapes = jax.tree_util.tree_map(lambda a: jax.ShapeDtypeStruct(np.shape(a), a.dtype)
                                                if hasattr(a, "dtype") else a, start) \
                    if first and dtype == "float64" else None
                with _programs_held(program), _reference_parked(run):
                    outcome = _run_program(run, function, program, start, opt_states[program],
                                           first=first)
                if first:
                    check_dtypes(outcome, dtype, run)
                    uncaptured = [n or "(model)" for n in seen["ref"]["layers"]
                                  if run.layer_paths[n] not in outcome["layers"]]
                    if dtype == "float64":
                        port_islands = widen.islands(twin_step, shapes, run.jax_inputs, run.jax_targets, None)
                del shapes
                state = outcome.pop("opt_state", None)  # to the next step; after the last, nothing reads it
                opt_states[program] = None if last else state
                own_state[program] = {"batch_stats": outcome.get("batch_stats") or start["batch_stats"],
                                      "carry": outcome.get("carry")}
                del start, state
                _let_go_of_programs(program)
                phases.mark(f"step {step}: the port, {program}")
                if dtype == "float64" and program == order[0]:  # after the first program: its faults named first
                    variant_from = _start_of_step(run, width, variant_start, params_state)  # before PyTorch's is parked
                    with _programs_held(variant_program), _reference_parked(run):
                        variant = _port_variant(run, variant_function, variant_from)
                    del variant_from
                    _let_go_of_programs(variant_program)
                    phases.mark(f"step {step}: the port in float32, for its own float64 error")
                    if port_islands:  # the port's own islands' error: its step with its casts removed
                        wide_from = _start_of_step(run, width, variant_start, params_state)
                        with _reference_parked(run):
                            wide = _port_islands_run(run, twin_step, wide_from)
                        del wide_from
                        phases.mark(f"step {step}: the port with its float32 islands in float64")
                if program == twin_program:
                    with jax.enable_x64(True), _programs_held(program):
                        twin = _float64_twin(run, twin_function,
                                             lambda: _start_of_step(run, jnp.float64, own_before, params_state),
                                             compile_first=program == "jit")
                    narrow = _narrow(twin, run)
                    if narrow:  # a port that fixes its own dtype: no float64 twin, nothing can be called precision
                        run.notes.add(f"the port run in float64 computes in {narrow[1]} ({narrow[0]} gives {narrow[1]} from "
                                  "float64 inputs and parameters: a dtype fixed inside the port, such as a Flax "
                                  "module's dtype=jnp.float32, or a cast), so JAX's own float32 error cannot be measured "
                                  "and nothing beyond tolerance can be called precision; make the port compute in the "
                                  "dtype of its inputs to have it measured (dtype=None; an NNX layer built with "
                                  "param_dtype=jnp.zeros(()).dtype, which is the check's dtype while it builds: "
                                  "nnx.Embed takes its param_dtype, float32 by default, as its dtype when dtype=None, "
                                  "so set its .dtype = None after building)")
                    else:  # kept as numbers; the twin is let go before the update stage's runs
                        reference_gradients()
                        measures = _twin_measures(run, seen, outcome, twin)
                    del twin
                    _let_go_of_programs(program)
                    phases.mark(f"step {step}: the port in float64 ({twin_program})")
                # Up to the gradients compared first; at the last step, once the last program's are, PyTorch's
                # gradients are let go (a model of 124M parameters: 1 GB in float64) before its optimizers are fed.
                numbered = step if steps > 1 else None
                reference_gradients()
                variation = _port_variation(run, seen, outcome, variant)
                island = _island_measures(run, seen, outcome, wide)
                computed = _rows(run, numbered, seen, outcome, None, measures, None, BEFORE_UPDATE, variation, island)
                if port_islands and step == 1 and program == programs[0]:
                    _name_port_islands(run, port_islands, computed)
                rows[program] += computed
                if last and program == programs[0] and run.adapter.fast_variance \
                        and any(not r.passed and not r.not_compared for r in computed):
                    # a cause is named only where the excess goes away without it: the same step, Flax's
                    # normalisations subtracting the mean first
                    counter_start = _start_of_step(run, width, own_before, params_state)
                    counter_step = jax_step_function(run.adapter, spec, None)  # a function of its own: traced afresh,
                    counter_step = jax.jit(counter_step) if program == "jit" else counter_step  # the patch in effect
                    with _fast_variance_off(), _programs_held(program), _reference_parked(run):
                        counter = _collected(run, lambda: counter_step(counter_start, run.jax_inputs, run.jax_targets,
                                                                       None))
                    del counter_start
                    run.counterfactuals["use_fast_variance=False"] = {
                        r.key: r for r in _rows(run, numbered, seen, counter, None, {}, None, BEFORE_UPDATE + ("buffer",),
                                                variation)}
                    del counter
                    _let_go_of_programs(program)
                    phases.mark(f"step {step}: the port with use_fast_variance=False (a cause verified)")
                if program == order[-1]:
                    variant = wide = None
                if recompute:
                    seen["ref"]["grads"] = None
                if last and program == order[-1]:
                    seen["ref"].pop("grads", None)
                    seen["ref"].pop("input_grads", None)
                fed = update64 = counter_update = None
                if optimizer is not None and spec.torch_loss is not None:
                    if update_in_float64 is not None:  # the update stage's own float32 error, from the same gradients
                        params = _start_of_step(run, width, own_before, params_state)["params"]
                        update64 = update_in_float64(params, outcome["grads"], opt_before.get(program))
                        if last and program == programs[0] and uses_adam(jax.eval_shape(optimizer.init, params)):
                            # the counterfactual of optax's float32 bias corrections: the same update with 1 − βᵗ as
                            # PyTorch has it (rounded once to float32), judged after the update rows are
                            counter_update = _update_with_exact_bias_corrections(optimizer)(
                                params, outcome["grads"], opt_before.get(program))
                        del params
                        phases.mark(f"step {step}: {program}'s update in float64")
                    in_place = last and program == order[-1] and run.shadows[program].get("ref") is None
                    fed = _fed_updates(run, program, params_state, outcome["grads"], last=last, in_place=in_place)
                    phases.mark(f"step {step}: PyTorch's optimizers fed {program}'s gradients")
                updated = _rows(run, numbered, seen, outcome, fed, measures, update64, FROM_UPDATE, variation, island)
                del variation, island
                rows[program] += updated
                if counter_update is not None:
                    if any(not r.passed for r in updated if r.stage == "update"):
                        run.counterfactuals["exact bias corrections"] = {
                            r.key: r for r in _rows(run, numbered, seen, counter_update, fed, {}, None, ("update",))}
                del outcome, fed, update64, counter_update
                if last:  # this program's update-stage optimizers are done, and their working models with them (the
                    # next program's builds its own: a gigabyte for 124M parameters, not held in between)
                    run.shadows[program] = {}
                    run.working.clear()
                phases.mark(f"step {step}: rows of {program}")
            del measures
    report = Report(spec.name, dtype, k, run.pairings, rows[programs[0]], run.adapter.api, tuple(programs),
                    rows[programs[1]] if len(programs) > 1 else [], jax_build(), len(seen["ref"]["layers"]), uncaptured,
                    carried=run.adapter.carried if steps > 1 else "", steps=steps)
    report.hints = _known_causes(run, report)
    report.notes = sorted(run.notes) + _lopsided_gradients(report)
    report.converted = converted if export else None
    report.train = spec.train
    report.tied = run.tied
    report.memory = phases
    verified = _verified_causes(run, report)
    if dtype == "float64":  # E[x²] − E[x]² cancels in float64 too, 2²⁹ times less: where switching it off verified it
        for row in report.rows + report.other_rows:
            if row.key in verified.get("use_fast_variance=True", {}).get("fell", {}):
                row.explained_by = "use_fast_variance=True"
    if report.precision_findings or report.precision_notes:
        jaxpr = None
        if jax.default_backend() != "cpu":  # the port's own precision settings matter on accelerators only
            with contextlib.suppress(Exception), jax.default_matmul_precision("highest"):
                start = _start_of_step(run, width, own_state[programs[0]])  # its shapes and dtypes only
                jaxpr = jax.make_jaxpr(step_fn)(start, run.jax_inputs, run.jax_targets,
                                                opt_before.get(programs[0])).jaxpr
        structure = jax.eval_shape(optimizer.init, run.adapter.variables["params"]) if optimizer is not None else None
        report.causes = likely_causes(report.precision_findings or report.precision_notes, run.adapter.fast_variance,
                                      structure, seen["ref"]["layers"], run.adapter.channels_last, jaxpr, dtype,
                                      verified=verified)
    return report
