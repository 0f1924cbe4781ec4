"""Rows inside a layer: functions a spec names on each side (``TAPS``), recorded per call and paired in order.

Attention has no modules of its own between its projections and its output: a rotary embedding written interleaved
instead of rotate-half, or grouped-query attention that tiles the key/value heads instead of repeating each, shows
first at ``o_proj``, and the two look alike there. A spec names the functions that do that work on each side::

    TAPS = {"rope": ("transformers.models.llama.modeling_llama:apply_rotary_pos_emb", "my_port:apply_rope"),
            "repeat_kv": ("transformers.models.llama.modeling_llama:repeat_kv", "my_port:repeat_kv")}

Each target is ``"module:function"``, a module-level function itself (a spec's own), or ``(object, "attribute")``,
replaced while the check runs by a wrapper that
records every call's output: PyTorch's by the innermost module running it (rows named
``model.layers.0.self_attn:rope[0]``, one per tensor of its output, in order), the port's through :func:`.apis.tap`.
The n-th tensor PyTorch's function gave is paired with the n-th the port's gave: a function returning ``(q, k)`` on
one side and called once for q and once for k on the other pairs alike.
"""

from __future__ import annotations

import contextlib
import importlib
from typing import Any

import numpy as np
import torch

from .apis import next_tap_index, tap
from .spec import SpecError

ROOT = "__tap__"  # the first element of a tapped value's path among the port's layer outputs
_TORCH: list["TorchTaps"] = []  # the PyTorch recorders under way (innermost last)


class _Globals:
    """A function's module namespace (its ``__globals__``) as an object whose attributes can be replaced: a spec
    loaded from a file names its own functions, whose module need not be importable by name."""

    def __init__(self, namespace: dict):
        object.__setattr__(self, "namespace", namespace)

    def __getattr__(self, name):
        return self.namespace[name]

    def __setattr__(self, name, value):
        self.namespace[name] = value


def _resolve(target) -> tuple[Any, str]:
    if isinstance(target, tuple) and len(target) == 2 and isinstance(target[1], str):
        return target
    if callable(target) and hasattr(target, "__globals__") and "." not in target.__qualname__:
        return _Globals(target.__globals__), target.__name__  # replaced where its own module's code looks it up
    if isinstance(target, str) and ":" in target:
        module, attribute = target.split(":", 1)
        try:
            owner = importlib.import_module(module)
        except ImportError as error:
            raise SpecError(f"TAPS: cannot import {module!r} ({error})") from error
        for part in attribute.split(".")[:-1]:
            if not hasattr(owner, part):
                raise SpecError(f"TAPS: {target!r}: {getattr(owner, '__name__', owner)!r} has no attribute {part!r}")
            owner = getattr(owner, part)
        return owner, attribute.split(".")[-1]
    raise SpecError(f"TAPS: a target is 'module:function', a module-level function, or (object, 'attribute'), got "
                    f"{target!r}")


def validate(taps) -> dict:
    """A spec's ``TAPS`` checked: each name's two targets found, each a function.

    Args:
        taps: {name: (PyTorch's target, the port's target)}, each ``"module:function"``, a module-level function, or
            ``(object, "attribute")``; or None.

    Returns:
        A copy of ``taps`` as a dict; empty for None.

    Raises:
        SpecError: ``taps`` is not a dict of pairs, a target's module cannot be imported, a name on a target's path
            is missing, a target has another form, or a target is not a function.
    """
    if taps is None:
        return {}
    if not isinstance(taps, dict) or not all(isinstance(v, (tuple, list)) and len(v) == 2 for v in taps.values()):
        raise SpecError("TAPS must be a dict {name: (PyTorch's function, the port's function)}, each as "
                        "'module:function'")
    for name, (torch_target, port_target) in taps.items():
        for side, target in (("PyTorch's", torch_target), ("the port's", port_target)):
            owner, attribute = _resolve(target)
            if not callable(getattr(owner, attribute, None)):
                raise SpecError(f"TAPS[{name!r}]: {side} {target!r} is not a function")
    return dict(taps)


@contextlib.contextmanager
def installed(taps: dict):
    """While active, each tapped function on both sides records its outputs (when a recorder is collecting).

    Args:
        taps: the spec's taps, as :func:`validate` returns them.
    """
    patched = []
    try:
        for name, (torch_target, port_target) in taps.items():
            for side, target in (("torch", torch_target), ("port", port_target)):
                owner, attribute = _resolve(target)
                original = getattr(owner, attribute)
                wrapper = _torch_wrapper(name, original) if side == "torch" else _port_wrapper(name, original)
                setattr(owner, attribute, wrapper)
                patched.append((owner, attribute, original))
        yield
    finally:
        for owner, attribute, original in reversed(patched):
            setattr(owner, attribute, original)


def silent(taps: dict, torch_rows, port_paths) -> list[str]:
    """Notes on the taps one side never called in a step: no rows for them there, so nothing of theirs is compared
    (transformers' Llama runs its attention through SDPA unless asked for its eager code, whose function is then
    never called).

    Args:
        taps: the spec's taps, as :func:`validate` returns them.
        torch_rows: the names of PyTorch's rows in the step (a tapped value's ``module:name[i]``).
        port_paths: the paths of the port's recorded values (a tapped value's ``(ROOT, name, n)``).

    Returns:
        One note per tap and side that gave no value, naming the function and the likely reason.
    """
    called_torch = {row.rpartition(":")[2].partition("[")[0] for row in torch_rows if ":" in row}
    called_port = {path[1] for path in port_paths if isinstance(path, tuple) and len(path) > 1 and path[0] == ROOT}
    notes = []
    for name, (torch_target, port_target) in taps.items():
        for side, target, called in (("PyTorch's", torch_target, called_torch), ("the port's", port_target, called_port)):
            if name not in called:
                function = target if isinstance(target, str) else getattr(target, "__name__", None) or target[1]
                notes.append(f"TAPS[{name!r}]: {side} function {function} was never called in the step: none of its "
                             "values is compared (the model may run another implementation of it: transformers' "
                             "attention runs SDPA unless built with attn_implementation='eager')")
    return notes


def _tensors(out) -> list:
    if isinstance(out, (tuple, list)):
        return [t for o in out for t in _tensors(o)]
    return [out] if hasattr(out, "shape") else []


def _torch_wrapper(name: str, original):
    def wrapper(*args, **kwargs):
        out = original(*args, **kwargs)
        if _TORCH:
            _TORCH[-1].record(name, _tensors(out))
        return out
    wrapper.__wrapped__ = original
    return wrapper


def _port_wrapper(name: str, original):
    def wrapper(*args, **kwargs):
        out = original(*args, **kwargs)
        for value in _tensors(out):
            n = next_tap_index(name)
            if n is None:  # no capture under way (the training call)
                break
            tap(f"{ROOT}/{name}/{n}", value)
        return out
    wrapper.__wrapped__ = original
    return wrapper


class ModuleStack:
    """While active (a context manager), the names of ``model``'s modules running, outermost first: ``current`` is
    the innermost one's ("" for the model itself, or where none runs)."""

    def __init__(self, model: torch.nn.Module):
        self.names = {id(m): name for name, m in model.named_modules()}
        self.model = model
        self.stack: list[str] = []
        self.handles = []

    @property
    def current(self) -> str:
        return self.stack[-1] if self.stack else ""

    def __enter__(self):
        def push(module, _args):
            self.stack.append(self.names.get(id(module), ""))

        def pop(_module, _args, _out):
            if self.stack:
                self.stack.pop()

        for module in self.model.modules():
            self.handles += [module.register_forward_pre_hook(push), module.register_forward_hook(pop)]
        return self

    def __exit__(self, *exc):
        for handle in self.handles:
            handle.remove()
        self.handles.clear()


class TorchTaps(ModuleStack):
    """Records, during one PyTorch step, each tapped function's output tensors by the innermost module of ``model``
    running it, handed to ``emit(row name, value)`` in call order; ``paths``: {row name: the port's path}."""

    def __init__(self, model: torch.nn.Module, emit):
        super().__init__(model)
        self.emit = emit
        self.counts: dict[str, int] = {}  # per tap: values given so far (the pairing with the port's)
        self.within: dict[tuple[str, str], int] = {}  # per (module, tap): values given (the row's index)
        self.paths: dict[str, tuple] = {}

    def __enter__(self):
        _TORCH.append(self)
        return super().__enter__()

    def __exit__(self, *exc):
        _TORCH.remove(self)
        super().__exit__(*exc)

    def record(self, name: str, values: list) -> None:
        """One call's output tensors of the tapped function ``name``, recorded by the innermost module running: each
        handed to ``emit`` as the row ``module:name[i]`` (``i`` counting per module and tap), its port's path ``(ROOT,
        name, n)`` kept in ``paths`` (``n`` counting per tap).

        Args:
            name: the tap's name (a key of ``TAPS``).
            values: the call's output tensors, in order.
        """
        where = self.current
        for value in values:
            n = self.counts.get(name, 0)
            self.counts[name] = n + 1
            i = self.within.get((where, name), 0)
            self.within[where, name] = i + 1
            row = f"{where}:{name}[{i}]"  # ":rope[0]" where the model itself runs it (a block checked alone)
            self.paths[row] = (ROOT, name, str(n))
            self.emit(row, value)


def as_array(value) -> np.ndarray:
    """A PyTorch tensor as a NumPy array of its own: detached, float64, on the CPU, copied.

    Args:
        value: a tensor.

    Returns:
        The float64 array.
    """
    return value.detach().double().cpu().numpy().copy()
