"""The JAX side of ``check-port``, one adapter per API: Flax Linen, Flax NNX, Equinox and plain functions.

The check (:mod:`.check`) sees every port the same way, as Linen does: a dict of variables
``{"params": {...}, "batch_stats": {...}}`` nested by module path in definition order, and a pure
function ``apply(variables, inputs, capture) -> (output, new batch_stats, {module path: output})`` it
can differentiate, jit and run op by op. Each adapter turns its API's model into that form and back:

* **Flax Linen**: ``model.init`` / ``model.apply``; per-layer outputs from ``capture_intermediates``.
* **Flax NNX**: ``nnx.split`` into ``nnx.Param`` and ``nnx.BatchStat`` state, ``nnx.merge`` back inside
  the function; per-layer outputs from ``nnx.capture(..., method_outputs=nnx.Intermediate)``; the
  order of definition is the order the attributes were set in ``__init__``.
* **Equinox**: the model's inexact arrays (PyTorch's layouts, but a convolution's bias is ``(out, 1, 1)``
  and a transposed convolution's kernel is ``(out, in, *k)``, flipped), the running statistics of
  an ``eqx.nn.State``; a model that acts on one sample (``PER_SAMPLE = True``) is vmapped over the
  batch with the axis name ``BATCH_AXIS`` (``"batch"``), as ``eqx.nn.BatchNorm`` expects; per-layer
  outputs by recording each module's ``__call__``.
* **plain functions**: ``jax_params()`` (a pytree: dicts in insertion order, lists, tuples) and
  ``jax_apply(params, *inputs)`` (or ``jax_state()`` and ``jax_apply(params, state, *inputs) ->
  (output, state)``); per-layer outputs where the function calls :func:`tap`.

Each adapter knows its API's default layout for the inputs (Linen and NNX channels-last, Equinox and
functions channels-first like PyTorch) and how its standard layers hold PyTorch's tensors.
"""

from __future__ import annotations

import contextlib
import dataclasses
import sys
from collections.abc import Mapping
from typing import Any, Callable

import jax
import numpy as np

from functional_gan.errors import UserError

_TAPS: list[dict] = []  # the recorders of the captures under way (innermost last)
_TAP_COUNTS: list[dict] = []  # per capture under way: how many values each of a spec's TAPS has given
_NESTED: list[dict] = []  # where layer outputs from inside the port's own transformations arrive (innermost last)


def tap(name: str, value: Any) -> Any:
    """Record ``value`` as the output of the port's layer ``name`` while check-port captures per-layer outputs (a
    plain-function port's layers, which no module marks).

    Args:
        name: the layer's path in the port's parameters, ``"a/b"``.
        value: the layer's output (any array, traced or not).

    Returns:
        ``value`` unchanged, so that a plain function can say ``x = tap("fc1", x @ w + b)``; outside a check, it
            only returns it.
    """
    if _TAPS:
        _TAPS[-1].setdefault(tuple(str(name).split("/")), value)
    return value


@contextlib.contextmanager
def _taps(record: dict):
    _TAPS.append(record)
    _TAP_COUNTS.append({})  # a spec's tapped functions (TAPS, taps.py) numbered from 0 in each capture
    try:
        yield record
    finally:
        _TAPS.pop()
        _TAP_COUNTS.pop()


def next_tap_index(name: str) -> int | None:
    """The number of the next value the spec's tapped function ``name`` gives in this capture (from 0), or None where
    no capture is under way.

    Args:
        name: the tapped function's name, as the spec's ``TAPS`` gives it.

    Returns:
        The count of its values so far in the capture under way (0 for its first), or None outside a capture.
    """
    if not _TAP_COUNTS:
        return None
    counts = _TAP_COUNTS[-1]
    counts[name] = counts.get(name, -1) + 1
    return counts[name]


@contextlib.contextmanager
def nested_outputs():
    """Collects, while a program of the port runs, the outputs of layers the port calls inside a transformation of
    its own (``jax.vmap``, ``lax.scan``, ``nn.scan``, ...): {module path: [each call's output, in call order]}.

    Such an output is a value of the transformation's trace and cannot be returned from it; it leaves through a
    callback (:func:`_leave_through_callback`) called once per element of a vmap, in order, and once per iteration
    of a scan. :func:`assemble_nested` puts the pieces back together."""
    sink: dict = {}
    _NESTED.append(sink)
    try:  # the callbacks' results feed the port's outputs: fetching those waits for every callback
        yield sink
    finally:
        _NESTED.remove(sink)


def _leave_through_callback(path: tuple[str, ...], value):
    """``value``, seen by the host on its way: the layer's output is handed to a callback that records it and gives
    it back unchanged, and the port computes on with what came back. The data dependency keeps the callback where
    the output is used (a scan's iterations, one after the other; a vmap's elements in order, ``sequential``) and lets
    a trace that does not use it drop it (Flax's nn.scan traces its body once for what it broadcasts). The callback
    may run on another thread, where JAX's float64 switch (a thread's context) is off: an 8-byte value travels as its
    bits (uint32 pairs)."""
    dtype = np.dtype(value.dtype)
    wide = dtype.itemsize == 8
    carried = jax.lax.bitcast_convert_type(value, np.uint32) if wide else value

    def receive(array, path=path):
        array = np.asarray(array)
        if _NESTED:
            _NESTED[-1].setdefault(path, []).append(
                np.ascontiguousarray(array).view(dtype).reshape(array.shape[:-1]) if wide else array.copy())
        return array

    back = jax.pure_callback(receive, jax.ShapeDtypeStruct(carried.shape, carried.dtype), carried,
                             vmap_method="sequential")
    return jax.lax.bitcast_convert_type(back, dtype) if wide else back


def _first(out):
    """A module's output, or the first element of the tuple it returns (``(output, state)``)."""
    return out[0] if isinstance(out, tuple) and out else out


def _with_first(out, first):
    """``out`` with its first element (or itself) replaced by ``first``."""
    if isinstance(out, tuple) and out:
        return (first, *out[1:])
    return first


def assemble_nested(nested: dict, expected_shapes: dict[tuple[str, ...], tuple]) -> dict[tuple[str, ...], np.ndarray]:
    """Each nested layer's output as one array: per-sample outputs (a call inside a vmap over the batch gives one
    array per sample, in order) stacked back into the batch; a layer called once per batch, its first call.

    Args:
        nested: {module path: its outputs in the order they were sent out (:func:`nested_outputs`)}.
        expected_shapes: {module path: the output's shape PyTorch's layer has}; a path ending ``"#i"`` is layer i of
            a module scanned over layers.

    Returns:
        {module path: one array}, for each path the shapes name.
    """
    assembled = {}
    for path, pieces in nested.items():
        shape = expected_shapes.get(path)
        if shape is not None and pieces:
            if np.ndim(pieces[0]) == len(shape) - 1 and len(pieces) >= shape[0]:
                assembled[path] = np.stack(pieces[: shape[0]])
            else:
                assembled[path] = pieces[0]
        for index, piece in enumerate(pieces):  # a module scanned over layers: call i is layer i ("#i")
            stacked = expected_shapes.get((*path, f"#{index}"))
            if stacked is None:
                continue
            per_sample = stacked[0] if len(stacked) and np.ndim(piece) == len(stacked) - 1 else 0
            if per_sample and len(pieces) >= (index + 1) * per_sample:  # inside a vmap over the batch: one piece per
                # sample, layer after layer (the scan's iterations in order, each with the batch's samples in order)
                assembled[(*path, f"#{index}")] = np.stack(pieces[index * per_sample:(index + 1) * per_sample])
            elif not per_sample:
                assembled[(*path, f"#{index}")] = piece
    return assembled


def _is_array(value) -> bool:
    """An array (JAX's, NumPy's, a tracer), not a module that happens to have a ``shape`` (``eqx.nn.LayerNorm``)."""
    return isinstance(value, (jax.Array, np.ndarray, np.generic))


def _key_name(key) -> str:
    for attribute in ("key", "name", "idx"):
        if hasattr(key, attribute):
            return str(getattr(key, attribute))
    return str(key)


def _nested(flat: dict[tuple[str, ...], Any]) -> dict:
    """{(a, b, leaf): x} → {a: {b: {leaf: x}}}, in the order given."""
    tree: dict = {}
    for path, value in flat.items():
        node = tree
        for key in path[:-1]:
            node = node.setdefault(key, {})
        node[path[-1]] = value
    return tree


def _flat(tree, prefix: tuple[str, ...] = ()) -> dict[tuple[str, ...], Any]:
    out = {}
    for key, value in dict(tree).items():
        if isinstance(value, dict) or (hasattr(value, "items") and not hasattr(value, "shape")):
            out.update(_flat(value, (*prefix, str(key))))
        else:
            out[(*prefix, str(key))] = value
    return out


def _intermediates(tree, prefix: tuple[str, ...] = ()) -> dict[tuple[str, ...], Any]:
    """Linen's and NNX's captured intermediates ({..., "__call__": (output,)}) as {module path: output}."""
    out = {}
    for name, value in dict(tree).items():
        if name == "__call__":
            out[prefix] = value[0]
        elif isinstance(value, dict) or hasattr(value, "items"):
            out.update(_intermediates(value, (*prefix, str(name))))
    return out


def _refill(treedef, template: list, slots: dict[tuple[str, ...], tuple], values: dict[tuple[str, ...], Any]):
    """The pytree ``treedef`` with its leaves ``template``, each leaf at ``slots[path] = (position, _)`` replaced by
    ``values[path]``: a port's own structure (an Equinox module, a parameter pytree) rebuilt from canonical arrays."""
    leaves = list(template)
    for path, (position, _) in slots.items():
        leaves[position] = values[path]
    return jax.tree_util.tree_unflatten(treedef, leaves)


def _definition_order(node, prefix: tuple[str, ...] = (), seen: set | None = None) -> list[tuple[str, ...]]:
    """Every path below ``node`` in the order its attributes, fields, keys and items were defined."""
    seen = set() if seen is None else seen
    if id(node) in seen or isinstance(node, (str, bytes, int, float, bool, type(None))) or _is_array(node):
        return [prefix]
    seen.add(id(node))
    if isinstance(node, dict):
        items = list(node.items())
    elif isinstance(node, (list, tuple)):
        items = list(enumerate(node))
    elif _fields(node):  # an Equinox module: its fields' order
        items = [(f.name, getattr(node, f.name, None)) for f in _fields(node)]
    elif hasattr(node, "__dict__"):  # an NNX module (nnx.List too): the order its attributes were set in
        items = [(k, v) for k, v in vars(node).items() if not k.startswith("_")]
    else:
        return [prefix]
    paths = [prefix]
    for key, value in items:
        paths.extend(_definition_order(value, (*prefix, str(key)), seen))
    return paths


def _fields(node) -> tuple:
    """A dataclass instance's fields (an Equinox module's), or () (NNX's List is a dataclass without any)."""
    if isinstance(node, type) or not dataclasses.is_dataclass(node):
        return ()
    return dataclasses.fields(node)


def _in_definition_order(flat: dict[tuple[str, ...], Any], root, paths: list | None = None) -> dict[tuple[str, ...], Any]:
    """``flat`` in the order ``root``'s attributes were defined (or in ``paths``' order, read off the port as built)."""
    order = {path: i for i, path in enumerate(_definition_order(root) if paths is None else paths)}
    return dict(sorted(flat.items(), key=lambda item: order.get(item[0], len(order))))


def _modules_by_path(root, is_module: Callable[[Any], bool]) -> dict[tuple[str, ...], Any]:
    """{path: module} of every module below ``root`` (the root at ()), each module once, at its first path."""
    found: dict[tuple[str, ...], Any] = {}
    seen: set[int] = set()

    def walk(node, prefix):
        if id(node) in seen:
            return
        if is_module(node):
            seen.add(id(node))
            found[prefix] = node
        if isinstance(node, dict):
            items = node.items()
        elif isinstance(node, (list, tuple)):
            items = enumerate(node)
        elif _fields(node):
            items = [(f.name, getattr(node, f.name, None)) for f in _fields(node)]
        elif hasattr(node, "__dict__") and is_module(node):
            items = [(k, v) for k, v in vars(node).items() if not k.startswith("_")]
        else:
            return
        for key, value in items:
            if not _is_array(value):
                walk(value, (*prefix, str(key)))

    walk(root, ())
    return found


def _current_trace():
    """JAX's innermost transformation now (a private attribute; None where this JAX has none by that name)."""
    try:
        from jax._src import core

        return core.trace_ctx.trace
    except (ImportError, AttributeError):
        return None


@contextlib.contextmanager
def _recording_calls(modules: dict[tuple[str, ...], Any], record: dict, children: Callable | None = None):
    """While active, the first output of each module's ``__call__`` is recorded by its path (outermost call only).

    A module the port calls inside a transformation of its own (``jax.vmap(self.conv)(x)``, a ``lax.scan`` over
    layers) has an output that cannot leave that transformation as a value: it leaves through a host callback
    into :func:`nested_outputs` instead, when one is collecting. Inside a ``lax.scan`` over a stack of layers the
    layer is a module rebuilt from its slice (Equinox's ``eqx.combine``), not one of ``modules``: where its class is
    that of exactly one of them, it takes that one's path, and the modules below it (``children(module)``: {relative
    path: module}) the paths below, for the call."""
    paths = {id(m): path for path, m in modules.items()}
    by_class: dict[type, list] = {}
    for path, module in modules.items():
        if path:
            by_class.setdefault(type(module), []).append(path)
    dynamic: dict[int, tuple[str, ...]] = {}  # modules rebuilt inside a transformation, for the call of their stack
    active: set[int] = set()
    level = _current_trace()

    def wrapping(original):
        def wrapper(self, *args, __original=original, **kwargs):
            path = paths.get(id(self), dynamic.get(id(self)))
            added = []
            if path is None and children is not None and _NESTED and _current_trace() is not level \
                    and len(by_class.get(type(self), ())) == 1:
                path = by_class[type(self)][0]
                for sub, node in children(self).items():
                    if sub and id(node) not in paths and id(node) not in dynamic:
                        dynamic[id(node)] = (*path, *sub)
                        added.append(id(node))
            if path is None or id(self) in active:
                return __original(self, *args, **kwargs)
            active.add(id(self))
            try:
                out = __original(self, *args, **kwargs)
            finally:
                active.discard(id(self))
                for key in added:
                    dynamic.pop(key, None)
            first = _first(out)
            if hasattr(first, "shape"):
                if _current_trace() is level:
                    record.setdefault(path, first)
                elif _NESTED and path not in record:
                    out = _with_first(out, _leave_through_callback(path, first))
            return out
        return wrapper

    with _calls_wrapped({type(m) for m in modules.values()}, wrapping):
        yield record


@contextlib.contextmanager
def _calls_wrapped(classes, wrapping: Callable):
    """While active, each class's ``__call__`` is ``wrapping(its original)`` (classes that refuse it are left)."""
    patched = []
    for cls in classes:
        original, had_own = cls.__call__, "__call__" in cls.__dict__
        try:
            type.__setattr__(cls, "__call__", wrapping(original))
        except (TypeError, AttributeError):
            continue
        patched.append((cls, had_own, original))
    try:
        yield
    finally:
        for cls, had_own, original in patched:
            if had_own:
                type.__setattr__(cls, "__call__", original)
            else:
                type.__delattr__(cls, "__call__")


@dataclasses.dataclass
class Adapter:
    """A port seen by the core: its variables (canonical), ``apply`` and what the transfer must know."""

    api: str  # "Flax Linen", "Flax NNX", "Equinox", "plain function"
    layout: str  # "flax": Flax's kernel names and layouts; "torch": PyTorch's (Equinox, plain functions)
    channels_last: bool  # the API's usual layout for images (the default to_jax / from_jax)
    variables: dict  # {"params": {...}, "batch_stats": {...}}, nested by module path in definition order
    # (variables, inputs, capture) -> (output, new batch_stats or {}, {module path: output}, new carry); variables
    # may hold "carry", the port's own state beyond the paired statistics (see ``carry``), from its previous step
    apply: Callable
    kinds: dict[tuple[str, ...], str] = dataclasses.field(default_factory=dict)  # module path → its class, for layouts
    carry: Any = None  # the port's own state that no PyTorch tensor pairs with, as the port starts (a pytree or None)
    carried: str = ""  # what state a step hands to the next, in words, for the report
    fast_variance: list[str] = dataclasses.field(default_factory=list)  # norm layers with use_fast_variance=True
    classes: dict[tuple[str, ...], str] = dataclasses.field(default_factory=dict)  # module path → module.Class
    # variables (as ``apply`` takes them) -> the port as its API keeps it: Linen's variables dict, the NNX model, the
    # Equinox (model, state), a function's {"params": ..., "state": ...}; what ``convert`` writes
    export: Callable | None = None
    # where ``variables`` holds shapes (the port built abstractly): () -> the port's own initial variables, for the
    # leaves no PyTorch tensor fills
    materialise: Callable | None = None


def is_linen(model) -> bool:
    """Whether ``model`` is a Flax Linen module (False where ``flax.linen`` was never imported).

    Args:
        model: what the spec's ``jax_model()`` returned.
    """
    linen = sys.modules.get("flax.linen")
    return linen is not None and isinstance(model, linen.Module)


def is_nnx(model) -> bool:
    """Whether ``model`` is a Flax NNX module (False where ``flax.nnx`` was never imported).

    Args:
        model: what the spec's ``jax_model()`` returned.
    """
    nnx = sys.modules.get("flax.nnx")
    return nnx is not None and isinstance(model, nnx.Module)


def is_equinox(model) -> bool:
    """Whether ``model`` is an Equinox module, or the ``(module, state)`` pair ``eqx.nn.make_with_state`` returns (False
    where ``equinox`` was never imported).

    Args:
        model: what the spec's ``jax_model()`` returned.
    """
    eqx = sys.modules.get("equinox")
    if eqx is None:
        return False
    if isinstance(model, tuple) and len(model) == 2:
        return isinstance(model[0], eqx.Module) and isinstance(model[1], eqx.nn.State)
    return isinstance(model, eqx.Module)


def adapter_for(spec, make_inputs: Callable[[bool], tuple], seed: int, abstract: bool = True) -> Adapter:
    """The adapter for the spec's port (its ``jax_model()``'s type, or ``jax_params``/``jax_apply``).

    Args:
        spec: the check's :class:`.spec.Spec`.
        make_inputs: ``make_inputs(channels_last)``, the example inputs on the JAX side in the API's usual layout
            (Linen's ``init`` needs them).
        seed: the key the port's own initialisation (and an Equinox model's ``key`` argument) draws from.
        abstract: the port built as shapes where PyTorch's tensors can fill every array it holds (Linen:
            ``jax.eval_shape`` of ``init``; ``nnx.eval_shape``; ``eqx.filter_eval_shape``), its own values drawn by
            :attr:`Adapter.materialise` only if a leaf is left unpaired; False: built as ``jax_model()`` builds it.

    Returns:
        The :class:`Adapter`: the port's variables (arrays, or shapes where built abstractly), ``apply`` and ``export``.

    Raises:
        UserError: ``jax_model()``, ``jax_params()`` or Linen's ``init`` failed, or ``jax_model()`` returned something
            that is none of the APIs taken.
    """
    if spec.jax_model is None:
        return _function_adapter(spec)
    built = _adapter_built_abstractly(spec, seed) if abstract else None
    if built is not None:
        return built
    try:
        model = spec.jax_model()
    except Exception as error:
        raise UserError(f"the spec's jax_model() failed: {type(error).__name__}: {error}") from error
    if is_linen(model):
        return _linen_adapter(spec, model, make_inputs(True), seed, abstract)
    if is_nnx(model):
        return _nnx_adapter(spec, model)
    if is_equinox(model):
        return _equinox_adapter(spec, model, seed)
    raise UserError(f"jax_model() returned {type(model).__module__}.{type(model).__qualname__}; check-port takes a "
                    "Flax Linen module, a Flax NNX module, an Equinox module (or (module, state) from "
                    "eqx.nn.make_with_state), or no jax_model() and jax_params() with jax_apply(params, *inputs)")


def _adapter_built_abstractly(spec, seed: int) -> Adapter | None:
    """An NNX or Equinox port built as shapes (``nnx.eval_shape``, ``eqx.filter_eval_shape``: its constructor traced,
    no random value drawn), where PyTorch's tensors can fill every array it holds; its ``materialise`` builds it for real
    if some leaf is left unpaired. None for any other port, or one that holds state of its own (NNX's RNG streams, an
    Equinox State, integer arrays) or whose constructor needs concrete values: it is built as it is.

    Drawing a port's random initial values costs a compiled program per initializer and shape (about a second each
    on one core with jaxlib 0.10.2's threefry), all of it thrown away when PyTorch's weights replace them."""
    found = {}

    def probe():
        made = spec.jax_model()
        found["api"] = "nnx" if is_nnx(made) else "equinox" if is_equinox(made) else None
        found["state"] = isinstance(made, tuple)
        found["order"] = _definition_order(made)  # nnx.eval_shape's model keeps its attributes sorted by name

    try:
        jax.eval_shape(probe)
    except Exception:  # the constructor needs concrete values, or fails: said by the real build
        return None
    if found.get("api") is None or found.get("state"):
        return None
    try:
        if found["api"] == "nnx":
            from flax import nnx

            adapter = _nnx_adapter(spec, nnx.eval_shape(spec.jax_model), found["order"])
        else:
            import equinox as eqx

            model = eqx.filter_eval_shape(spec.jax_model)
            if any(isinstance(leaf, jax.ShapeDtypeStruct) and not np.issubdtype(leaf.dtype, np.inexact)
                   for leaf in jax.tree_util.tree_leaves(model)):
                return None  # an integer array of its own (positions, a table): its values are the port's
            adapter = _equinox_adapter(spec, model, seed)
    except Exception:
        return None
    if adapter.carry:  # NNX's RNG streams, counters, caches: carried with their values
        return None

    def materialise():
        return adapter_for(spec, lambda channels_last: (), seed, abstract=False).variables

    adapter.materialise = materialise
    return adapter


# --- Flax Linen ---------------------------------------------------------------------------------------


# Linen's usual names for the mode a module runs in, as call arguments or fields: TRAIN reaches each one the port has.
_LINEN_MODE = {"deterministic": False, "use_running_average": False, "train": True, "training": True,
               "is_training": True}


def _linen_mode(model, train: bool):
    """The port with ``TRAIN`` given to it: (the module, with its mode fields set; the keyword arguments for its
    ``__call__``). In training mode ``deterministic`` is left as the port has it (dropout cannot draw PyTorch's
    masks; with a rate of 0 it is the identity either way)."""
    import inspect

    def wanted(name):
        if name == "deterministic" and train:
            return None
        return train if _LINEN_MODE[name] else not train

    fields = {f.name for f in dataclasses.fields(model)} if dataclasses.is_dataclass(model) else set()
    set_fields = {n: wanted(n) for n in _LINEN_MODE if n in fields and wanted(n) is not None}
    if set_fields:
        model = model.clone(**set_fields)
    try:
        parameters = inspect.signature(type(model).__call__).parameters
    except (TypeError, ValueError):
        parameters = {}
    arguments = {n: wanted(n) for n in _LINEN_MODE if n in parameters and wanted(n) is not None
                 and parameters[n].kind in (inspect.Parameter.POSITIONAL_OR_KEYWORD, inspect.Parameter.KEYWORD_ONLY)}
    return model, arguments


# What tracing a module whose ``init`` needs concrete values raises
_NEEDS_CONCRETE_VALUES = (jax.errors.ConcretizationTypeError, jax.errors.TracerBoolConversionError,
                          jax.errors.TracerIntegerConversionError, jax.errors.TracerArrayConversionError)


def _traced_init(model, mode: dict | None):
    """(``model.init`` as a function of (key, *inputs), the dict where its last trace leaves its variables in definition
    order, which pairing reads: a transformation's outputs come back key-sorted)."""
    traced = {}

    def init(key, *inputs):
        traced["variables"] = model.init(key, *inputs, **(mode or {}))
        return traced["variables"]

    return init, traced


def _linen_shapes(model, key, inputs, mode: dict | None = None) -> dict | None:
    """``model.init``'s variables as shapes and dtypes (``jax.eval_shape``: traced, neither compiled nor drawn), in
    definition order; None where tracing it fails (a module whose ``init`` needs concrete values, or an error the real
    ``init`` then reports)."""
    init, traced = _traced_init(model, mode)
    try:
        shapes = jax.eval_shape(init, key, *inputs)  # traced first: it fills ``traced``
    except Exception:
        return None
    return _in_order_of(traced["variables"], shapes)


def _linen_init(model, key, inputs, mode: dict | None = None) -> dict:
    """``model.init`` as one compiled program (eagerly, each initializer and layer is its own small compile: 4 s of
    a 12 s check on the example MNIST CNN with jaxlib 0.10.2); eagerly for a module whose ``init`` needs concrete
    values. The values are the same programs' (the initializers draw from the same keys); the paired ones are
    replaced by PyTorch's before any step."""
    init, traced = _traced_init(model, mode)
    try:
        variables = jax.jit(init)(key, *inputs)
        return _in_order_of(traced["variables"], variables)
    except _NEEDS_CONCRETE_VALUES:
        return model.init(key, *inputs, **(mode or {}))


def _in_order_of(template, tree):
    """``tree``'s nested dicts with their keys in ``template``'s order."""
    if isinstance(template, Mapping):
        return {key: _in_order_of(value, tree[key]) for key, value in template.items()}
    return tree


def _linen_adapter(spec, model, inputs, seed, abstract: bool = True) -> Adapter:
    model, mode = _linen_mode(model, spec.train) if spec.jax_apply is None else (model, {})
    key = jax.random.key(seed)

    def initialised():
        try:
            variables = _linen_init(model, key, inputs, mode)
        except Exception as error:
            raise UserError(f"jax_model().init on the example inputs failed: {type(error).__name__}: {error}") from error
        return {c: dict(v) for c, v in variables.items()}

    # The variables' shapes first: PyTorch's tensors fill every paired leaf, and the port's own random values are drawn
    # (a compiled program per initializer and shape) only where a leaf is left unpaired or a collection of its own is
    # carried from step to step.
    variables = _linen_shapes(model, key, inputs, mode) if abstract else None
    variables = {c: dict(v) for c, v in variables.items()} if variables is not None else None
    if variables is None or any(c not in ("params", "batch_stats", "intermediates") for c in variables):
        variables = initialised()
        materialise = None
    else:
        def materialise():
            built = initialised()
            return {c: built.get(c, {}) for c in ("params", "batch_stats")}
    canonical = {c: variables.get(c, {}) for c in ("params", "batch_stats")}
    others = {c: v for c, v in variables.items() if c not in ("params", "batch_stats", "intermediates")}

    def apply(tree, inputs, capture):
        carry = tree.get("carry") if tree.get("carry") is not None else others
        full = {**carry, **{c: v for c, v in tree.items() if v and c != "carry"}}
        mutable = [c for c in full if c != "params"] + ["intermediates"]
        level = _current_trace()

        def outermost(module, method_name):  # inside nn.scan a sown value would depend on the scan's body
            return method_name == "__call__" and _current_trace() is level

        captured = outermost if capture else False
        tapped: dict = {}  # a spec's tapped functions' outputs (TAPS)
        with _linen_nested_calls() if capture else contextlib.nullcontext(), \
                _taps(tapped) if capture else contextlib.nullcontext():
            if spec.jax_apply is not None:
                output, state = spec.jax_apply(model, full, *inputs, capture_intermediates=captured)
            else:
                output, state = model.apply(full, *inputs, **mode, capture_intermediates=captured, mutable=mutable)
        layers = {**_intermediates(state.get("intermediates", {})), **tapped} if capture else {}
        new_carry = {c: state.get(c, v) for c, v in carry.items()}
        return output, dict(state.get("batch_stats", {})), layers, new_carry

    def export(tree):
        carry = tree.get("carry") if tree.get("carry") is not None else others
        return {**carry, **{c: v for c, v in tree.items() if v and c != "carry"}}

    carried = ["batch_stats"] * bool(canonical["batch_stats"]) + sorted(others)
    fast, classes = _linen_modules(model, variables, inputs, mode)
    return Adapter("Flax Linen", "flax", True, canonical, apply, carry=others,
                   carried=", ".join(f"the {c!r} collection" for c in carried), fast_variance=fast, classes=classes,
                   export=export, materialise=materialise)


@contextlib.contextmanager
def _linen_nested_calls():
    """While active, a Linen module called inside a transformation of the port's own (``nn.scan``, ``nn.vmap``,
    ``nn.remat``), whose output ``capture_intermediates`` does not see, sends it out through a callback."""
    import flax.linen as nn

    level = _current_trace()

    def interceptor(next_fun, args, kwargs, context):
        out = next_fun(*args, **kwargs)
        if context.method_name == "__call__" and _NESTED and _current_trace() is not level:
            first = _first(out)
            if hasattr(first, "shape"):
                out = _with_first(out, _leave_through_callback(tuple(map(str, context.module.path)), first))
        return out

    with nn.intercept_methods(interceptor):
        yield


def _class_name(module) -> str:
    return f"{type(module).__module__}.{type(module).__qualname__}"


def _linen_modules(model, variables, inputs, mode: dict) -> tuple[list[str], dict[tuple[str, ...], str]]:
    """Read off the Linen modules while the model is traced once (no arithmetic): the paths of the norm layers that
    compute the variance as E[x²] − E[x]² (``use_fast_variance=True``), and each module's class."""
    found: list[str] = []
    classes: dict[tuple[str, ...], str] = {}

    def spy(module, method_name):
        if method_name == "__call__":
            path = tuple(map(str, getattr(module, "path", ()) or module.scope.path))
            classes.setdefault(path, _class_name(module))
            if getattr(module, "use_fast_variance", False) is True and "/".join(path) not in found:
                found.append("/".join(path))
        return False

    try:
        jax.eval_shape(lambda v, *x: model.apply(v, *x, **mode, capture_intermediates=spy, mutable=True), variables,
                       *inputs)
    except Exception:  # a model that needs its own jax_apply: nothing read, nothing claimed
        return [], {}
    return found, classes


# --- Flax NNX -----------------------------------------------------------------------------------------


@contextlib.contextmanager
def _nnx_nested_calls(net):
    """While active, an NNX module called inside a transformation of the port's own (``nnx.scan`` over a stack of
    layers, ``nnx.vmap``), whose output ``nnx.capture`` does not see, sends it out through a callback under its path.
    Inside such a transformation NNX calls fresh module objects: a module whose class is that of exactly one module of
    ``net`` takes that module's path, and its submodules (found in its graph) the paths below it, for the call."""
    from flax import nnx

    outer = {path: module for path, module in _nnx_modules(net).items() if path}
    by_class: dict[type, list] = {}
    for path, module in outer.items():
        by_class.setdefault(type(module), []).append(path)
    known = {id(module): path for path, module in outer.items()}
    dynamic: dict[int, tuple[str, ...]] = {}
    level = _current_trace()

    def wrapping(original):
        def wrapper(self, *args, __original=original, **kwargs):
            if _current_trace() is level or not _NESTED or id(self) in known:
                return __original(self, *args, **kwargs)
            path = dynamic.get(id(self))
            added = []
            if path is None and len(by_class.get(type(self), ())) == 1:
                path = by_class[type(self)][0]
                for sub, node in nnx.iter_graph(self):
                    if isinstance(node, nnx.Module) and sub and id(node) not in dynamic:
                        dynamic[id(node)] = (*path, *map(str, sub))
                        added.append(id(node))
            try:
                out = __original(self, *args, **kwargs)
            finally:
                for key in added:
                    dynamic.pop(key, None)
            first = _first(out)
            if path is not None and hasattr(first, "shape"):
                out = _with_first(out, _leave_through_callback(path, first))
            return out
        return wrapper

    with _calls_wrapped(by_class, wrapping):
        yield


def _nnx_modules(net) -> dict[tuple[str, ...], object]:
    from flax import nnx

    return {tuple(map(str, path)): node for path, node in nnx.iter_graph(net) if isinstance(node, nnx.Module)}


def _nnx_adapter(spec, model, order: list | None = None) -> Adapter:
    from flax import nnx

    model.train() if spec.train else model.eval()
    graphdef, state = nnx.split(model)
    flat = {tuple(map(str, path)): (path, variable) for path, variable in nnx.to_flat_state(state)}
    flat = _in_definition_order(flat, model, order)
    collections = {}
    for key, (_, variable) in flat.items():
        kind = "params" if isinstance(variable, nnx.Param) else "batch_stats" if isinstance(variable, nnx.BatchStat) else None
        if kind is not None and hasattr(variable.get_value(), "shape"):
            collections.setdefault(kind, {})[key] = variable.get_value()
    canonical = {c: _nested(collections.get(c, {})) for c in ("params", "batch_stats")}
    # Each step's variables hold every one of these leaves (PyTorch's tensors, or the port's own initial values kept in
    # ``canonical``): the model rebuilt for a step keeps their shapes only, not a second copy of the port's parameters.
    for key in [key for leaves in collections.values() for key in leaves]:
        path, variable = flat[key]
        value = variable.get_value()
        flat[key] = (path, variable.replace(jax.ShapeDtypeStruct(value.shape, value.dtype)))
    modules = _modules_by_path(model, lambda m: isinstance(m, nnx.Module))
    kinds = {path: type(m).__name__ for path, m in modules.items()}
    # The port's other state (RNG counters, caches, a Variable type of its own): carried from step to step as is.
    other = {key: variable.get_value() for key, (_, variable) in flat.items()
             if not isinstance(variable, (nnx.Param, nnx.BatchStat)) and hasattr(variable.get_value(), "shape")}

    def build(tree):
        values = {**_flat(tree.get("params", {})), **_flat(tree.get("batch_stats", {})),
                  **(tree.get("carry") if tree.get("carry") is not None else {})}
        leaves = [(path, variable.replace(values[key]) if key in values else variable) for key, (path, variable) in flat.items()]
        return nnx.merge(graphdef, nnx.from_flat_state(leaves))

    def apply(tree, inputs, capture):
        net = build(tree)
        if capture:
            tapped: dict = {}  # a spec's tapped functions' outputs (TAPS)
            with _taps(tapped), _nnx_nested_calls(net):
                output, captured = nnx.capture(net, nnx.Intermediate, method_outputs=nnx.Intermediate)(*inputs)
            layers = {**_intermediates(nnx.to_pure_dict(captured)), **tapped}
            layers.pop((), None)
        else:
            output, layers = net(*inputs), {}
        after = {tuple(map(str, p)): v for p, v in nnx.to_flat_state(nnx.state(net))}
        stats = {key: v.get_value() for key, v in after.items() if isinstance(v, nnx.BatchStat)}
        carry = {key: after[key].get_value() if key in after else value for key, value in other.items()}
        return output, _nested(stats), layers, carry

    kinds_carried = sorted({type(flat[key][1]).__name__ for key in other})
    carried = ", ".join(["nnx.BatchStat"] * bool(canonical["batch_stats"]) + [f"nnx.{k}" for k in kinds_carried])
    fast = ["/".join(path) for path, m in modules.items() if getattr(m, "use_fast_variance", False) is True]
    return Adapter("Flax NNX", "flax", True, canonical, apply, kinds, carry=other, carried=carried, fast_variance=fast,
                   classes={path: _class_name(m) for path, m in modules.items()}, export=build)


# --- Equinox ------------------------------------------------------------------------------------------


def _equinox_state_leaves(modules: dict, state) -> dict[tuple[str, ...], tuple]:
    """{(module path..., name): (StateIndex, position)} of the float arrays an ``eqx.nn.State`` keeps per module.

    A StateIndex holding (mean, variance), as BatchNorm's does, is named ``running_mean``/``running_var``
    (PyTorch's names); a dict keeps its keys; a single array takes the field's name."""
    import equinox as eqx

    found = {}
    for path, module in modules.items():
        if not dataclasses.is_dataclass(module):
            continue
        for field in dataclasses.fields(module):
            index = getattr(module, field.name, None)
            if not isinstance(index, eqx.nn.StateIndex):
                continue
            value = state.get(index)
            if isinstance(value, dict):
                names = {k: k for k in value}
            elif isinstance(value, (tuple, list)):
                floats = [i for i, v in enumerate(value) if np.issubdtype(np.asarray(v).dtype, np.floating)]
                names = dict(zip(floats, ("running_mean", "running_var"))) if len(floats) == 2 else \
                    {i: f"{field.name}_{i}" for i in floats}
            else:
                names = {None: field.name} if np.issubdtype(np.asarray(value).dtype, np.floating) else {}
            for position, name in names.items():
                found[(*path, name)] = (index, position)
    return found


def _equinox_adapter(spec, made, seed: int = 0) -> Adapter:
    import equinox as eqx

    model, state = made if isinstance(made, tuple) else (made, None)
    model = eqx.nn.inference_mode(model, value=not spec.train)
    leaves, treedef = jax.tree_util.tree_flatten_with_path(model, is_leaf=lambda x: isinstance(x, eqx.nn.StateIndex))
    arrays = {tuple(_key_name(k) for k in path): (i, leaf) for i, (path, leaf) in enumerate(leaves)
              if eqx.is_inexact_array(leaf) or isinstance(leaf, jax.ShapeDtypeStruct) and np.issubdtype(leaf.dtype,
                                                                                                       np.inexact)}
    arrays = _in_definition_order(arrays, model)
    modules = _modules_by_path(model, lambda m: isinstance(m, eqx.Module))
    stateful = _equinox_state_leaves(modules, _clone(state)) if state is not None else {}
    canonical = {"params": _nested({path: leaf for path, (_, leaf) in arrays.items()}),
                 "batch_stats": _nested({path: _state_value(_clone(state), *where) for path, where in stateful.items()})}
    kinds = {path: f"eqx.{type(m).__name__}" for path, m in modules.items()}
    # Each step's variables hold every parameter (PyTorch's tensors, or the port's initial values kept in
    # ``canonical``): the structure rebuilt for a step keeps their shapes only, not a second copy of them.
    filled = {i for i, _ in arrays.values()}
    template = [jax.ShapeDtypeStruct(leaf.shape, leaf.dtype) if i in filled else leaf for i, (_, leaf) in enumerate(leaves)]
    arrays = {path: (i, None) for path, (i, _) in arrays.items()}

    key = _equinox_key(model, seed)

    def build(tree):
        values = _flat(tree.get("params", {}))
        net = _refill(treedef, template, arrays, values)
        current = tree.get("carry") if tree.get("carry") is not None else state
        if current is not None:  # the State this step starts from (the port's own after its previous step), a copy in
            dtype = next((v.dtype for v in values.values()), None)  # the parameters' precision
            current = jax.tree_util.tree_map(
                lambda a: a.astype(dtype) if dtype is not None and np.issubdtype(a.dtype, np.floating) else a, _clone(current))
        for path, value in _flat(tree.get("batch_stats", {})).items():
            current = _set_state_value(current, *stateful[path], value)
        return net, current

    def apply(tree, inputs, capture):
        net, current = build(tree)
        record: dict = {}
        nets = _modules_by_path(net, lambda m: isinstance(m, eqx.Module)) if capture else {}

        def children(module):  # a layer rebuilt inside the port's lax.scan: the modules below it
            return _modules_by_path(module, lambda m: isinstance(m, eqx.Module))

        nets.pop((), None)
        extra = {"key": key} if key is not None else {}

        def call(*xs):
            with _recording_calls(nets, record, children), _taps(record):
                result = net(*xs, current, **extra) if current is not None else net(*xs, **extra)
            out, new_state = result if current is not None else (result, None)
            return out, new_state, dict(record)

        if spec.per_sample:
            n = len(inputs)
            out, new_state, layers = jax.vmap(call, in_axes=(0,) * n, out_axes=(0, None, 0), axis_name=spec.batch_axis)(*inputs)
        else:
            out, new_state, layers = call(*inputs)
        stats = {path: _state_value(new_state, *where) for path, where in stateful.items()} if new_state is not None else {}
        return out, _nested(stats), layers, new_state

    carried = "the eqx.nn.State: every StateIndex, running statistics, counters and flags" if state is not None else ""
    return Adapter("Equinox", "torch", False, canonical, apply, kinds, carry=state, carried=carried,
                   export=lambda tree: build(tree) if state is not None else (build(tree)[0], None))


def _equinox_key(model, seed: int):
    """The ``key`` an Equinox model's ``__call__`` takes, where it takes one (``key=None`` by Equinox's convention for
    layers without randomness, required by models that draw dropout masks): a fixed key from the checker's seed. In
    inference mode (``TRAIN = False``) Equinox's dropout ignores it; in training mode the draws cannot match
    PyTorch's, as with every API."""
    import inspect

    try:
        parameters = inspect.signature(type(model).__call__).parameters
    except (TypeError, ValueError):
        return None
    return jax.random.key(seed) if "key" in parameters else None


def _clone(tree):
    leaves, treedef = jax.tree_util.tree_flatten(tree)
    return jax.tree_util.tree_unflatten(treedef, leaves)


def _state_value(state, index, position):
    value = state.get(index)
    return value if position is None else value[position]


def _set_state_value(state, index, position, new):
    if position is None:
        return state.set(index, new)
    value = state.get(index)
    if isinstance(value, dict):
        return state.set(index, {**value, position: new})
    items = list(value)
    items[position] = new
    return state.set(index, type(value)(items))


# --- plain functions ----------------------------------------------------------------------------------


def _function_adapter(spec) -> Adapter:
    try:
        params = spec.jax_params()
        state = spec.jax_state() if spec.jax_state is not None else None
    except Exception as error:
        raise UserError(f"the spec's jax_params()/jax_state() failed: {type(error).__name__}: {error}") from error
    trees = {"params": params, "batch_stats": state}
    structure = {}
    canonical = {}
    for collection, tree in trees.items():
        if tree is None:
            canonical[collection] = {}
            continue
        leaves, treedef = jax.tree_util.tree_flatten_with_path(tree)
        flat = {tuple(_key_name(k) for k in path): (i, leaf) for i, (path, leaf) in enumerate(leaves)
                if hasattr(leaf, "shape") and np.issubdtype(np.asarray(leaf).dtype, np.inexact)}
        flat = _in_definition_order(flat, tree)
        structure[collection] = (treedef, [leaf for _, leaf in leaves], flat)
        canonical[collection] = _nested({path: leaf for path, (_, leaf) in flat.items()})

    def rebuild(collection, tree, template_tree=None):
        treedef, template, flat = structure[collection]
        if template_tree is not None:  # the state the port handed on: its other leaves (counters) as it left them
            template = jax.tree_util.tree_leaves(template_tree)
        return _refill(treedef, template, flat, _flat(tree))

    def apply(tree, inputs, capture):
        record: dict = {}
        new_state = None
        with _taps(record) if capture else contextlib.nullcontext():
            if state is None:
                output, stats = spec.jax_apply(rebuild("params", tree["params"]), *inputs), {}
            else:
                output, new_state = spec.jax_apply(rebuild("params", tree["params"]),
                                                   rebuild("batch_stats", tree["batch_stats"], tree.get("carry")), *inputs)
                leaves = {tuple(_key_name(k) for k in p): v for p, v in jax.tree_util.tree_flatten_with_path(new_state)[0]}
                stats = _nested({path: leaves[path] for path in structure["batch_stats"][2]})
        return output, stats, dict(record), new_state

    def export(tree):
        return {"params": rebuild("params", tree["params"]),
                "state": rebuild("batch_stats", tree["batch_stats"], tree.get("carry")) if state is not None else None}

    return Adapter("plain function", "torch", False, canonical, apply, carry=state,
                   carried="the state jax_apply returns" if state is not None else "", export=export)
