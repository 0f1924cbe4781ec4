"""What a check compares, in debugging order (each layer's output, the model's output, the loss, every gradient,
every update, every buffer), each quantity judged by :func:`.judge.compare` against PyTorch's float64 value with the
noise measured beside it (PyTorch's own error, and JAX's: its float64 twin, its float32 variant, its islands)."""

from __future__ import annotations

import itertools
from typing import TYPE_CHECKING

import numpy as np

from .judge import FLOAT32_TO_64, Row, TwinMeasured, compare, relative_error
from .pairing import leaf_at

if TYPE_CHECKING:
    from .run import Run


def layout_of(jax_output, torch_shape: tuple, from_jax, notes: set | None = None, where: str = "") -> np.ndarray:
    """A layer's output of the port in PyTorch's layout: what ``from_jax`` makes of it (as for the model's output);
    if that does not give PyTorch's shape, the output as it is, with its channels moved to axis 1, or with its axes in
    the one order that gives PyTorch's shape (a port that lays an intermediate out transposed: its business; ``notes``
    says so). Else the output as it is: a row not compared.

    Args:
        jax_output: the port's output of the layer.
        torch_shape: PyTorch's shape of it.
        from_jax: the spec's ``from_jax`` (or the API's default), tried first.
        notes: a set the note of a transposed layout is added to; None: no note.
        where: the row, as the note names it (``"forward, layer1.0"``).

    Returns:
        A NumPy array, in PyTorch's shape where one of those ways gives it.
    """
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



def quantities(run: Run, seen: dict, jax_seen: dict, fed: dict | None, stages=BEFORE_UPDATE + FROM_UPDATE):
    """Every quantity of one step of the ``stages`` asked for, in debugging order: (stage, name, pick from a JAX
    outcome, PyTorch64's value, PyTorch's own error (a :class:`Measured`), the port's shape where it may differ). Only
    the stages asked for are read (PyTorch's gradients are let go once compared).

    Args:
        run: the check's :class:`.run.Run`.
        seen: PyTorch's step (:func:`.torch_side.pytorch_step`): ``"ref"``, its float64 values, and ``"noise"``, its own
            errors.
        jax_seen: the port's outcome: which layers it has, and the shapes of its layer outputs, output and input
            gradients.
        fed: PyTorch's optimizers fed the port's gradients (:func:`.torch_side.fed_updates`), or None: no update rows.
        stages: the stages read.

    Yields:
        ``(stage, name, pick, reference, noise, port_shape)`` per quantity: ``pick(outcome)`` its value in a JAX
        outcome, in the reference's layout (PyTorch's for the layers' outputs, the output and the input gradients; the
        port's for the parameters' gradients, their updates and the buffers); ``port_shape`` the port's own shape where
        its layout is found from the shapes, else None.
    """
    ref = seen["ref"]
    noise = seen["noise"]
    for torch_name in ref["layers"] if "forward" in stages else ():  # in the order PyTorch ran them
        path = run.layer_paths[torch_name]
        if path in jax_seen["layers"]:
            expected = ref["layers"][torch_name]
            yield ("forward", torch_name or "(model)",
                   lambda s, p=path, e=expected, n=torch_name or "(model)": layout_of(
                       s["layers"][p], e.shape, run.from_jax, run.notes, f"forward, {n}"),
                   expected, noise["layers"][torch_name], np.shape(jax_seen["layers"][path]))
    if "output" in stages:
        yield ("output", "output", lambda s: layout_of(s["output"], ref["output"].shape, run.from_jax),
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
               lambda s, i=index, e=expected: layout_of(s["input_grads"][i], e.shape, run.from_jax), expected,
               noise["input_grads"][index], np.shape(jax_seen["input_grads"][index]))
    if fed is not None and "update" in stages:  # judged from the same gradients: PyTorch's optimizer fed the port's
        for p in params:
            yield ("update", p.torch_key, lambda s, p=p: p.leaf(s["params"]), fed["ref"][p.torch_key],
                   fed["noise"][p.torch_key], None)
    for p in run.pairings if "buffer" in stages else ():
        if p.collection == "batch_stats" and has_leaf(jax_seen.get("batch_stats", {}), p.jax_path):
            yield ("buffer", p.torch_key, lambda s, p=p: p.leaf(s["batch_stats"]), ref["after"][p.torch_key],
                   noise["after"][p.torch_key], None)



def input_name(index: int, floats: int) -> str:
    """The name of the row of the gradient with respect to the model's input ``index`` (of ``floats`` compared).

    Args:
        index: the input's position among the model's inputs.
        floats: how many inputs' gradients are compared.

    Returns:
        ``"(input)"`` where one is compared, else ``"(input i)"``.
    """
    return "(input)" if floats == 1 else f"(input {index})"



def paired(run: Run, seen: dict, jax_seen: dict, other: dict, stages=BEFORE_UPDATE + FROM_UPDATE):
    """Each quantity of the ``stages`` asked for but the updates, as (stage, name, this outcome's value, ``other``'s,
    PyTorch64's) where the three have one shape: one program's outcome beside another run of the same port.

    Args:
        run: the check's :class:`.run.Run`.
        seen: PyTorch's step, as for :func:`quantities`.
        jax_seen: this program's outcome.
        other: another outcome of the same port from the same start (its float64 twin, its float32 variant, its run
            without islands).
        stages: the stages read (the updates never: no PyTorch optimizer is fed here).

    Yields:
        ``(stage, name, this outcome's value, other's, PyTorch64's)``, each in the reference's layout.
    """
    for stage, name, pick, reference, _, _ in quantities(run, seen, jax_seen, None, stages):
        if stage == "forward" and run.layer_paths[name if name != "(model)" else ""] not in other["layers"]:
            continue
        a, b = pick(jax_seen), pick(other)
        if np.shape(a) == np.shape(b) == np.shape(reference):
            yield stage, name, a, b, reference



def twin_measures(run: Run, seen: dict, jax_seen: dict, twin: dict) -> dict:
    """JAX's own float32 error, quantity by quantity up to the gradients and the buffers, from one program's float32
    outcome (``jax_seen``) and its float64 twin, taken once and kept as numbers (each program's rows use them):
    ``|JAX₃₂ − JAX₆₄|``, and the twin's error against PyTorch64.

    Args:
        run: the check's :class:`.run.Run`.
        seen: PyTorch's step, as for :func:`quantities`.
        jax_seen: the program's float32 outcome.
        twin: its float64 twin's outcome (:func:`.jax_side.float64_twin`).

    Returns:
        {(stage, name): (``max |JAX₃₂ − JAX₆₄|`` as a :class:`.judge.TwinMeasured`, not yet divided by the scale, the
        twin's :class:`.judge.Measured` error against PyTorch64)}.
    """
    return {(stage, name): (TwinMeasured(relative_error(a, b, scale=1.0), np.shape(a)), relative_error(b, reference))
            for stage, name, a, b, reference in paired(run, seen, jax_seen, twin)}



def port_variation(run: Run, seen: dict, jax_seen: dict, variants: list[dict]) -> dict:
    """float64: the port's own rounding error, quantity by quantity up to the gradients and the buffers, estimated
    from its programs in float32 (:func:`port_variant`): ``max |JAX₃₂ − JAX₆₄|`` of this program's outcome
    (``jax_seen``), times eps₆₄/eps₃₂ (2⁻²⁹), kept as numbers not yet divided by each quantity's scale. With float32
    runs of both programs (compiled and op by op), the larger estimate: one run's rounding is one sample of it, and
    two programs round differently (a factor of 3 between them measured on a correct NNX MobileNet block).

    Args:
        run: the check's :class:`.run.Run`.
        seen: PyTorch's step, as for :func:`quantities`.
        jax_seen: the program's float64 outcome.
        variants: the port's programs run in float32 from their own starts (:func:`.jax_side.port_variant`); may be
            empty.

    Returns:
        {(stage, name): a :class:`.judge.TwinMeasured`}; empty where ``variants`` is.
    """
    measured: dict = {}
    for variant in variants:
        for stage, name, a, b, _ in paired(run, seen, jax_seen, variant, BEFORE_UPDATE + ("buffer",)):
            value = TwinMeasured(relative_error(b, a, scale=1.0) * FLOAT32_TO_64, np.shape(a))
            if (stage, name) not in measured or value > measured[(stage, name)]:
                measured[(stage, name)] = value
    return measured



def island_measures(run: Run, seen: dict, jax_seen: dict, wide: dict | None) -> dict:
    """float64: the error of the port's own lower-precision islands, quantity by quantity up to the gradients:
    ``|JAX − JAX with its casts removed|`` (:mod:`.widen`) of this program's outcome, not yet divided by the scale.

    Args:
        run: the check's :class:`.run.Run`.
        seen: PyTorch's step, as for :func:`quantities`.
        jax_seen: the program's float64 outcome.
        wide: the port's step with its islands in float64 (:func:`.jax_side.port_islands_run`), or None.

    Returns:
        {(stage, name): a :class:`.judge.TwinMeasured`}, the buffers included; empty where ``wide`` is None.
    """
    if wide is None:
        return {}
    return {(stage, name): TwinMeasured(relative_error(a, b, scale=1.0), np.shape(a))
            for stage, name, a, b, _ in paired(run, seen, jax_seen, wide, BEFORE_UPDATE + ("buffer",))}



def judged_rows(run: Run, step: int | None, seen: dict, jax_seen: dict, fed: dict | None, measures: dict,
          update64: dict | None, stages=BEFORE_UPDATE + FROM_UPDATE, variation: dict | None = None,
          island: dict | None = None) -> list[Row]:
    """Every quantity of one step of the ``stages`` asked for compared, in debugging order. ``measures``: JAX's own
    float32 error up to the gradients (see :func:`twin_measures`); ``update64``: the port's optimizer in float64 fed
    this program's gradients, its own float32 error at the update stage; ``variation``: float64, the port's own
    variation up to the gradients (:func:`port_variation`); ``step``: the step's number on each row, in a check over
    several steps (None for one).

    Args:
        run: the check's :class:`.run.Run` (its dtype and k; its notes take what was compared otherwise than usual).
        step: the step's number on each row, or None.
        seen: PyTorch's step, as for :func:`quantities`.
        jax_seen: the program's outcome; its ``grads`` and ``input_grads`` are removed from it once the update rows
            begin.
        fed: PyTorch's optimizers fed the program's gradients, or None: no update rows.
        measures: JAX's own float32 error, {(stage, name): a ``jax_noisy`` pair}.
        update64: the port's optimizer in float64 fed the program's gradients (``{"params": ...}``), or None.
        stages: the stages compared.
        variation: float64, the port's own error (``port_noisy``).
        island: float64, the port's islands' error (:func:`island_measures`; ``island_noisy``).

    Returns:
        One :class:`.judge.Row` per quantity, in debugging order.
    """
    rows = []
    variation, island = variation or {}, island or {}
    for stage, name, pick, reference, noise, port_shape in quantities(run, seen, jax_seen, fed, stages):
        if stage == "update":  # the gradients are compared: let go before the updates are
            jax_seen.pop("grads", None)
            jax_seen.pop("input_grads", None)
        port = pick(jax_seen)
        jax_noisy = [measures[stage, name]] if (stage, name) in measures else []
        if stage == "update" and update64 is not None:
            jax_noisy = [(port, pick(update64))]
        if stage in ("forward", "output"):
            port, reference = broadcast_equal(run, f"{stage}, {name}", port, reference)
        port_noisy = [variation[stage, name]] if (stage, name) in variation else []
        island_noisy = [island[stage, name]] if (stage, name) in island else []
        row = compare(stage, name, port, reference, [noise], run.dtype, run.k, port_shape=port_shape,
                      jax_noisy=jax_noisy, float64_noise=True, port_noisy=port_noisy, island_noisy=island_noisy)
        row.step = step
        rows.append(row)
    return rows



def broadcast_equal(run: Run, where: str, port, reference):
    """``port`` and ``reference`` as compared: where their shapes differ only by axes of length 1 that broadcast
    (position ids of shape (1, T) in PyTorch, (B, T) in the port), each broadcast to the larger, with a note: the
    values are compared as they would act.

    Args:
        run: the check's :class:`.run.Run`; its notes take one where the values are broadcast.
        where: the row, as the note names it.
        port: the port's values, in PyTorch's layout.
        reference: PyTorch's values.

    Returns:
        ``(port, reference)`` as NumPy arrays, broadcast to their common shape where they have as many axes and their
        shapes differ only by axes of length 1; else as they are.
    """
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



def has_leaf(tree, path) -> bool:
    """Whether ``tree`` has a leaf at ``path``.

    Args:
        tree: nested dicts (the port's ``batch_stats``).
        path: the leaf's path, a tuple of keys.

    Returns:
        True where every key of ``path`` leads somewhere.
    """
    try:
        leaf_at(tree, path)
        return True
    except (KeyError, TypeError, IndexError):
        return False
