"""Check a JAX port of any PyTorch model against PyTorch, judged against PyTorch's own rounding noise.

The port may be written with Flax Linen, Flax NNX, Equinox, or as plain functions of a parameter pytree
(:mod:`.port_apis` turns each into one form). ``check_port(spec)`` moves the PyTorch model's weights
into the port (:func:`transfer`: by definition order and shape, knowing each standard layer's layout in
each API), runs both on the same inputs and compares, in debugging order, every quantity a port can get
wrong:

1. each paired layer's output (PyTorch forward hooks ↔ the port's per-layer outputs), the model's
   output, the loss;
2. every parameter's gradient;
3. every parameter after one optimizer step from the same gradients (PyTorch's optimizer fed JAX's
   gradients), every buffer (BatchNorm's running statistics);
4. steps 2..N: the same, each step starting from PyTorch's parameters and buffers (teacher forcing;
   each framework keeps its own optimizer state).

The JAX side runs twice: compiled with ``jax.jit``, as training runs it, and op by op. The compiled
program is the one judged; where only one of the two programs departs from PyTorch, the report says
that the compiled program and the same code run op by op disagree (a JAX/XLA matter, not the port).

The reference is PyTorch in float64. In float32 a quantity passes when
``|JAX₃₂ − PyTorch₆₄| ≤ k · max(|PyTorch₃₂ − PyTorch₆₄|, 4 ulps of its scale)``: the port may be as far
from the exact answer as PyTorch itself is, k times over (``k`` = 3 by default). PyTorch's own
error is the largest of three float32 runs: as it is, and with the batch's samples in two other
orders (put back in order after), which makes every reduction over the batch sum in another order. Adam turns float32
rounding in near-zero gradients into lr-sized steps; PyTorch does that to itself too, and the
criterion knows it. In float64 the port must agree within 1e-10 of each tensor's scale. The first
quantity out of tolerance is named: stage, layer, tensor, both sides' values (or both shapes).

A spec is a Python file (or module) defining

* ``torch_model()``: the PyTorch module (a class will do: the checker builds it once under
  ``torch.manual_seed(seed)``, 0 by default, and loads those weights into every later build);
  ``example_inputs()``: NumPy arrays as the PyTorch model takes them;
* the port, one of: ``jax_model()`` returning a Flax Linen module, a Flax NNX module, or an Equinox
  module (or ``(module, state)`` from ``eqx.nn.make_with_state``; ``PER_SAMPLE = True`` when it acts on
  one sample, and the checker vmaps it over the batch with the axis name ``BATCH_AXIS``, default
  ``"batch"``); or ``jax_params()`` (a pytree) with ``jax_apply(params, *inputs)`` (and, for running
  statistics, ``jax_state()`` with ``jax_apply(params, state, *inputs) -> (output, state)``), where
  ``port_apis.tap("layer", x)`` marks a layer's output;
* optionally ``example_targets()``: arrays the losses take after the model's output and inputs;
  ``to_jax(*arrays)`` / ``from_jax(output)`` (default: the API's layout: Linen and NNX channels-last,
  arrays of 3 or more dimensions NC… ↔ N…C; Equinox and functions as PyTorch has them);
  ``param_map`` ({PyTorch module name: the port's module path "a/b"}); ``torch_loss(output, *inputs,
  *targets)`` with ``jax_loss(...)``; ``torch_optimizer(parameters)`` with ``jax_optimizer()`` (an optax
  transformation); for Linen, ``jax_apply(model, variables, *inputs, capture_intermediates)`` returning
  ``(output, {"batch_stats": ..., "intermediates": ...})`` for a model whose ``__call__`` needs more
  than the inputs; ``TRAIN = False`` to compare in eval mode (dropout off, running statistics used).

See ``examples/port/`` for models from public code; :func:`assert_port` is the same check for pytest.
"""

from __future__ import annotations

import contextlib
import copy
import dataclasses
import importlib.util
import sys
from pathlib import Path
from types import ModuleType
from typing import Any, Callable

import jax
import jax.numpy as jnp
import numpy as np
import torch

from functional_gan import xla_guard
from functional_gan.errors import UserError

from . import port_apis
from .judge import DEFAULT_K, FLOAT64_TOLERANCE, ULPS, Row, compare

PERMUTED_RUNS = 2  # float32 PyTorch runs with the batch in another order, besides the plain one
PROGRAMS = ("jit", "eager")  # the compiled program (judged) and the same code op by op


class SpecError(UserError):
    """A spec the checker cannot use; the message says what is missing or what could not be paired."""


class PortDtypeError(SpecError):
    """The port computes in another precision than the one asked: it cannot be checked in that one."""


# --- the spec -----------------------------------------------------------------------------------------


@dataclasses.dataclass
class Spec:
    torch_model: Callable[[], torch.nn.Module]
    jax_model: Callable[[], Any] | None = None  # or jax_params with jax_apply
    example_inputs: Callable[[], tuple] | None = None  # required
    example_targets: Callable[[], tuple] | None = None
    to_jax: Callable[..., tuple] | None = None
    from_jax: Callable[[Any], Any] | None = None
    param_map: dict[str, str] | None = None
    torch_loss: Callable | None = None
    jax_loss: Callable | None = None
    torch_optimizer: Callable | None = None
    jax_optimizer: Callable | None = None
    jax_apply: Callable | None = None
    jax_params: Callable[[], Any] | None = None
    jax_state: Callable[[], Any] | None = None
    train: bool = True
    per_sample: bool = False
    batch_axis: str = "batch"
    name: str = "spec"


REQUIRED = ("torch_model", "example_inputs")
PAIRS = (("torch_loss", "jax_loss"), ("torch_optimizer", "jax_optimizer"))
CONSTANTS = {"TRAIN": "train", "PER_SAMPLE": "per_sample", "BATCH_AXIS": "batch_axis"}


def _check_param_map(param_map) -> None:
    if param_map is None:
        return
    if callable(param_map) and not isinstance(param_map, dict):
        raise SpecError("param_map is a function; it must be a dict {'torch.module.name': 'port/module/path'} "
                        "(call it in the spec: param_map = make_param_map())")
    if not isinstance(param_map, dict):
        raise SpecError(f"param_map is a {type(param_map).__name__}; it must be a dict "
                        "{'torch.module.name': 'port/module/path'}")
    wrong = [f"{k!r}: {v!r}" for k, v in param_map.items() if not isinstance(k, str) or not isinstance(v, str)]
    if wrong:
        raise SpecError(f"param_map maps names to paths, both strings ('layer1.0.conv1': 'layer1_0/conv1'); "
                        f"not {', '.join(wrong[:3])}")


def spec_from_module(module: ModuleType | dict) -> Spec:
    """A :class:`Spec` from a spec module's names (or a dict of them: the fields, lower-case, as keywords)."""
    values = dict(module) if isinstance(module, dict) else dict(vars(module))
    for constant, field in CONSTANTS.items():
        if constant in values:
            values[field] = values.pop(constant)
    missing = [name for name in REQUIRED if not callable(values.get(name))]
    function_port = callable(values.get("jax_params")) and callable(values.get("jax_apply"))
    if not callable(values.get("jax_model")) and not function_port:
        missing.append("jax_model() (or jax_params() with jax_apply(params, *inputs))")
    if missing:
        raise SpecError(f"the spec defines no {', '.join(m if m.endswith(')') else f'{m}()' for m in missing)} "
                        f"(required: torch_model(), example_inputs(), and jax_model() or jax_params() with jax_apply())")
    for a, b in PAIRS:
        if (values.get(a) is None) != (values.get(b) is None):
            given, absent = (a, b) if values.get(a) is not None else (b, a)
            raise SpecError(f"the spec defines {given}() but not {absent}(): give both or neither")
    if values.get("torch_optimizer") is not None and values.get("torch_loss") is None:
        raise SpecError("an optimizer pair needs a loss pair (torch_loss and jax_loss) to compute gradients")
    _check_param_map(values.get("param_map"))
    fields = {f.name for f in dataclasses.fields(Spec)} - {"name"}
    chosen = {k: v for k, v in values.items() if k in fields}
    chosen.setdefault("jax_model", None)
    for flag in ("train", "per_sample"):
        if flag in chosen:
            chosen[flag] = bool(chosen[flag])
    return Spec(**chosen, name=str(values.get("__name__", "spec")))


def load_spec(path: str | Path) -> Spec:
    """A spec file: ``SPEC.py`` defining the functions above. Its folder goes on ``sys.path`` (first), so that it
    can import its neighbours (``import my_port``) as a script would."""
    path = Path(path)
    if not path.is_file():
        raise SpecError(f"spec file {str(path)!r} does not exist")
    folder = str(path.resolve().parent)
    if folder not in sys.path:
        sys.path.insert(0, folder)
    module_spec = importlib.util.spec_from_file_location(f"port_spec_{path.stem}", path)
    module = importlib.util.module_from_spec(module_spec)
    try:
        module_spec.loader.exec_module(module)
    except Exception as error:
        raise SpecError(f"the spec {path} fails to import: {type(error).__name__}: {error}") from error
    spec = spec_from_module(module)
    spec.name = str(path)
    return spec


# --- layouts and the weight transfer -----------------------------------------------------------------


def _nchw_to_nhwc(x):
    return np.moveaxis(x, 1, -1) if isinstance(x, np.ndarray) and x.ndim >= 3 else x


def default_to_jax(*arrays):
    """Arrays of 3 or more dimensions go channels-last (PyTorch's NC… → Flax's N…C); others as they are."""
    return tuple(_nchw_to_nhwc(np.asarray(a)) if np.asarray(a).ndim >= 3 else np.asarray(a) for a in arrays)


def default_from_jax(output):
    """The inverse of :func:`default_to_jax` for one array."""
    return np.moveaxis(np.asarray(output), -1, 1) if np.ndim(output) >= 3 else np.asarray(output)


# How a PyTorch tensor becomes the port's leaf: "=" as it is, "T" transposed (Linear), "conv" (out, in, *k) →
# (*k, in, out), "convT-flip" (in, out, *k) → (*k, in, out) flipped (Flax's ConvTranspose), "convT-eqx"
# (in, out, *k) → (out, in, *k) flipped (Equinox's ConvTranspose), "reshape" to the leaf's shape (Equinox's (out, 1, 1) bias).
TRANSFORMS = ("=", "T", "conv", "convT-flip", "convT-eqx", "reshape")


def to_flax_layout(value: np.ndarray, transform: str, shape: tuple | None = None) -> np.ndarray:
    """A PyTorch tensor in the port's layout (``shape``: the leaf's, for "reshape")."""
    if transform == "=":
        return value
    if transform == "T":
        return value.T
    if transform == "conv":  # (out, in/groups, *k) → (*k, in/groups, out)
        return np.transpose(value, (*range(2, value.ndim), 1, 0))
    spatial = tuple(range(2, value.ndim))
    if transform == "convT-flip":  # (in, out/groups, *k) → (*k, in, out), spatially flipped (lax.conv_transpose)
        return np.transpose(np.flip(value, spatial), (*spatial, 0, 1))
    if transform == "convT-eqx":  # (in, out, *k) → (out, in, *k), spatially flipped (a convolution of the dilated input)
        return np.swapaxes(np.flip(value, spatial), 0, 1)
    if transform == "reshape":
        return value.reshape(shape)
    raise ValueError(transform)


def from_flax_layout(value: np.ndarray, transform: str, shape: tuple | None = None) -> np.ndarray:
    """The inverse of :func:`to_flax_layout` (``shape``: PyTorch's, for "reshape")."""
    if transform == "=":
        return value
    if transform == "T":
        return value.T
    n = value.ndim
    if transform == "conv":  # (*k, in/groups, out) → (out, in/groups, *k)
        return np.transpose(value, (n - 1, n - 2, *range(n - 2)))
    if transform == "convT-flip":  # (*k, in, out) → (in, out, *k), flipped back
        return np.flip(np.transpose(value, (n - 2, n - 1, *range(n - 2))), tuple(range(2, n)))
    if transform == "convT-eqx":
        return np.flip(np.swapaxes(value, 0, 1), tuple(range(2, n)))
    if transform == "reshape":
        return value.reshape(shape)
    raise ValueError(transform)


@dataclasses.dataclass
class Pairing:
    """One PyTorch tensor ↔ one leaf of the port and the transform between their layouts."""

    torch_key: str
    collection: str  # "params" or "batch_stats"
    jax_path: tuple[str, ...]
    transform: str  # one of TRANSFORMS
    torch_shape: tuple = ()
    jax_shape: tuple = ()

    @property
    def jax_name(self) -> str:
        return f"{self.collection}/{'/'.join(self.jax_path)}"

    def to_jax(self, value: np.ndarray) -> np.ndarray:
        return to_flax_layout(value, self.transform, self.jax_shape)

    def to_torch(self, value: np.ndarray) -> np.ndarray:
        return from_flax_layout(value, self.transform, self.torch_shape)


# PyTorch module type → (its tensor, the Flax leaf, the transform) for each tensor; a module of the port holding
# PyTorch's own names (this project's layers, Equinox's, a plain function's) pairs by name instead.
def _rules(module: torch.nn.Module) -> dict[str, tuple[str, str, str]]:
    nn = torch.nn
    if isinstance(module, nn.Linear):
        return {"weight": ("params", "kernel", "T"), "bias": ("params", "bias", "=")}
    if isinstance(module, (nn.Conv1d, nn.Conv2d, nn.Conv3d)):
        return {"weight": ("params", "kernel", "conv"), "bias": ("params", "bias", "=")}
    if isinstance(module, (nn.ConvTranspose1d, nn.ConvTranspose2d, nn.ConvTranspose3d)):
        return {"weight": ("params", "kernel", "convT-flip"), "bias": ("params", "bias", "=")}
    if isinstance(module, (nn.modules.batchnorm._BatchNorm,)):
        return {"weight": ("params", "scale", "="), "bias": ("params", "bias", "="),
                "running_mean": ("batch_stats", "mean", "="), "running_var": ("batch_stats", "var", "=")}
    if isinstance(module, (nn.LayerNorm, nn.GroupNorm)):
        return {"weight": ("params", "scale", "="), "bias": ("params", "bias", "=")}
    if isinstance(module, nn.Embedding):
        return {"weight": ("params", "embedding", "=")}
    return {}


def _rules_by_flax_names(tensors: dict, leaves: dict) -> dict[str, tuple[str, str, str]]:
    """For a PyTorch module of another type (a custom LayerNorm, say): the Flax leaf names decide."""
    rules = {}
    weight = tensors.get("weight")
    if weight is not None:
        if "kernel" in leaves:
            rules["weight"] = ("params", "kernel", "T" if weight.ndim == 2 else "conv")
        elif "scale" in leaves:
            rules["weight"] = ("params", "scale", "=")
        elif "embedding" in leaves:
            rules["weight"] = ("params", "embedding", "=")
    if "bias" in tensors and "bias" in leaves:
        rules["bias"] = ("params", "bias", "=")
    return rules


def _flax_modules(tree: dict, prefix: tuple[str, ...] = ()) -> list[tuple[tuple[str, ...], dict]]:
    """(path, {leaf name: array}) of every module of the port that holds arrays, in definition order (dict order)."""
    found, leaves = [], {}
    for name, value in tree.items():
        if isinstance(value, dict) or hasattr(value, "items") and not hasattr(value, "shape"):
            found.extend(_flax_modules(dict(value), (*prefix, str(name))))
        else:
            leaves[str(name)] = value
    return ([(prefix, leaves)] if leaves else []) + found


def _torch_modules(model: torch.nn.Module) -> list[tuple[str, torch.nn.Module, dict[str, torch.Tensor]]]:
    """(name, module, its own tensors) of every module holding parameters or float buffers, in definition order."""
    out = []
    for name, module in model.named_modules():
        own = {k: v for k, v in module.named_parameters(recurse=False)}
        persistent = {k: v for k, v in module.named_buffers(recurse=False) if k not in module._non_persistent_buffers_set}
        own.update({k: v for k, v in persistent.items() if v is not None and v.is_floating_point()})
        if own:
            out.append((name, module, own))
    return out


def _describe(name: str, module: torch.nn.Module, tensors: dict) -> str:
    return f"{name or 'model'} ({type(module).__name__}: {', '.join(f'{k} {tuple(v.shape)}' for k, v in tensors.items())})"


def transfer(model: torch.nn.Module, variables: dict, param_map: dict[str, str] | None = None,
             kinds: dict[tuple[str, ...], str] | None = None) -> list[Pairing]:
    """Pair every tensor of ``model``'s state_dict with a leaf of the port's ``variables`` (definition order and shape).

    ``variables``: ``{"params": ..., "batch_stats": ...}`` nested by module path; ``param_map``: {PyTorch module
    name: the port's module path "A/B"} for modules the order does not pair; ``kinds``: each path's module class
    where the layout depends on it (Equinox's ConvTranspose). Raises SpecError naming what could not be paired.
    """
    _check_param_map(param_map)
    params = _flax_modules(dict(variables.get("params", {})))
    stats = {path: leaves for path, leaves in _flax_modules(dict(variables.get("batch_stats", {})))}
    by_path = {path: leaves for path, leaves in params}
    for path in stats:  # a module that holds running statistics only
        by_path.setdefault(path, {})
    order = [path for path, _ in params] + [p for p in stats if p not in dict(params)]
    used: set[tuple[str, ...]] = set()
    pairings = []
    mapped = {tuple(p.split("/")) for p in (param_map or {}).values()}
    position = 0
    for name, module, tensors in _torch_modules(model):
        if param_map and name in param_map:
            path = tuple(param_map[name].split("/"))
            if path not in by_path:
                raise SpecError(f"param_map sends {name!r} to {param_map[name]!r}, which the port does not have; "
                                f"its modules: {', '.join('/'.join(p) for p in order)}")
        else:
            while position < len(order) and (order[position] in used or order[position] in mapped):
                position += 1
            if position == len(order):
                raise SpecError(f"PyTorch's {_describe(name, module, tensors)} has no counterpart in the port: every "
                                f"module of the port that holds weights ({len(order)}) is paired already. The port lacks "
                                "this layer, or holds it where the definition order does not find it: then name it in "
                                "param_map = {'" + name + "': 'port/path'}")
            path = order[position]
        used.add(path)
        pairings.extend(_pair_module(name, module, tensors, path, by_path[path], stats.get(path, {}),
                                     (kinds or {}).get(path, "")))
    left = [p for p in order if p not in used]
    if left:
        raise SpecError(f"the port's module(s) {', '.join('/'.join(p) for p in left)} received no PyTorch weights; "
                        "pair them with param_map = {'torch.module.name': 'port/path'}")
    return pairings


def _by_name(key: str, tensor, target: dict, kind: str) -> tuple[str, tuple | None]:
    """A tensor paired with the port's leaf of the same name: its transform, and the leaf's shape."""
    expected = tuple(np.shape(target[key]))
    if kind.startswith("eqx.ConvTranspose") and key == "weight":
        return "convT-eqx", expected
    if tuple(tensor.shape) != expected and tensor.numel() == int(np.prod(expected)) and \
            [d for d in tensor.shape if d != 1] == [d for d in expected if d != 1]:
        return "reshape", expected  # Equinox's convolution bias, (out, 1, 1)
    return "=", expected


def _pair_module(name, module, tensors, path, leaves, stats, kind: str = "") -> list[Pairing]:
    rules = _rules(module) or _rules_by_flax_names(tensors, leaves)
    identity = set(tensors) <= set(leaves) | set(stats)  # a module with PyTorch's own names (Equinox, this project's layers)
    result = []
    for key, tensor in tensors.items():
        full = f"{name}.{key}" if name else key
        if identity:
            collection = "params" if key in leaves else "batch_stats"
            target = leaves if collection == "params" else stats
            leaf_name = key
            transform, expected = _by_name(key, tensor, target, kind)
        elif key in rules:
            collection, leaf_name, transform = rules[key]
            target = leaves if collection == "params" else stats
            if leaf_name not in target:
                raise SpecError(f"{full} ({type(module).__name__}) pairs by order with the port's module {'/'.join(path)}, "
                                f"which has no {collection} leaf {leaf_name!r} (it has {', '.join(target) or 'none'}); the "
                                "models are defined in a different order? name it in param_map")
            expected = tuple(np.shape(target[leaf_name]))
        else:
            raise SpecError(f"{full}: no known place for it in the port's module {'/'.join(path)} "
                            f"({type(module).__name__} → leaves {', '.join(leaves) or 'none'}); use param_map or "
                            "a module with PyTorch's names")
        moved = to_flax_layout(tensor.detach().cpu().numpy(), transform, expected).shape
        if moved != expected:
            raise SpecError(f"{full} has shape {tuple(tensor.shape)} ({moved} in the port's layout, transform {transform}), "
                            f"but the port's {collection}/{'/'.join(path)}/{leaf_name} has shape {expected}; the models "
                            "are defined in a different order or with other sizes? name it in param_map")
        result.append(Pairing(full, collection, (*path, leaf_name), transform, tuple(tensor.shape), expected))
    return result


def _set(tree: dict, path: tuple[str, ...], value) -> dict:
    tree = dict(tree)
    if len(path) == 1:
        tree[path[0]] = value
    else:
        tree[path[0]] = _set(dict(tree.get(path[0], {})), path[1:], value)
    return tree


def _get(tree, path):
    for key in path:
        tree = tree[key]
    return tree


def variables_from_torch(model: torch.nn.Module, pairings: list[Pairing], variables: dict, dtype) -> dict:
    tensors = {**dict(model.named_parameters()), **dict(model.named_buffers())}
    out = {k: dict(v) for k, v in variables.items()}
    for p in pairings:
        value = p.to_jax(tensors[p.torch_key].detach().cpu().numpy().copy())  # not a view: the step changes it
        out[p.collection] = _set(out[p.collection], p.jax_path, jnp.asarray(value, dtype))
    return out


def torch_in_flax_layout(model: torch.nn.Module, pairings: list[Pairing], which: str = "value") -> dict[str, np.ndarray]:
    """Each paired tensor (or its ``.grad``) in the port's layout, float64, by PyTorch key."""
    tensors = {**dict(model.named_parameters()), **dict(model.named_buffers())}
    out = {}
    for p in pairings:
        tensor = tensors[p.torch_key]
        if which == "grad":
            if p.collection != "params":
                continue
            tensor = tensor.grad if tensor.grad is not None else torch.zeros_like(tensor)
        out[p.torch_key] = p.to_jax(tensor.detach().cpu().double().numpy())
    return out


# --- the report ---------------------------------------------------------------------------------------


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
        why = {"plain function": "mark each with port_apis.tap('layer path', x)",
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


# --- the PyTorch side ---------------------------------------------------------------------------------


def _torch_side(spec: Spec, dtype: torch.dtype, state: dict | None):
    model = spec.torch_model()
    if state is not None:
        model.load_state_dict(state)
    model = model.to(dtype)
    model.train(spec.train)
    optimizer = spec.torch_optimizer(model.parameters()) if spec.torch_optimizer else None
    return model, optimizer


def _torch_step(spec: Spec, model, optimizer, inputs, targets, dtype, record_layers: dict[str, str],
                permutation: np.ndarray | None = None):
    """One forward (with each paired layer's output), loss, backward, optimizer step. Returns what it saw.

    With ``permutation`` the samples go in that order and every output is put back in the original order.
    """
    if permutation is not None:
        inputs = tuple(np.asarray(x)[permutation] for x in inputs)
        targets = tuple(np.asarray(x)[permutation] for x in targets)
        inverse = np.argsort(permutation)
    unpermute = (lambda a: a[inverse] if a.ndim and a.shape[0] == len(inverse) else a) if permutation is not None \
        else (lambda a: a)
    outputs, handles = {}, []

    def recorder(name):
        def hook(_module, _inputs, out):  # returns None: the module's output is left as it is
            # a copy: a later in-place op (ReLU(inplace=True), +=) must not change what was recorded
            outputs.setdefault(name, unpermute(out.detach().double().cpu().numpy().copy()))
        return hook

    for name, module in model.named_modules():
        if name in record_layers:
            handles.append(module.register_forward_hook(recorder(name)))

    def on_torch(arrays):
        return [torch.as_tensor(np.asarray(x)).to(dtype) if np.asarray(x).dtype.kind == "f" else torch.as_tensor(np.asarray(x))
                for x in arrays]

    tensors, target_tensors = on_torch(inputs), on_torch(targets)
    if optimizer is not None:
        optimizer.zero_grad()
    output = model(*tensors)
    for h in handles:
        h.remove()
    seen = {"layers": outputs, "output": unpermute(output.detach().double().cpu().numpy().copy())}
    if spec.torch_loss is not None:
        loss = spec.torch_loss(output, *tensors, *target_tensors)
        seen["loss"] = float(loss.detach())
        loss.backward()
        if optimizer is not None:
            optimizer.step()
    return seen


def step_with_gradients(model: torch.nn.Module, optimizer, gradients: dict[str, np.ndarray],
                        start: dict | None = None) -> torch.nn.Module:
    """One PyTorch optimizer step with the given gradients (by parameter name, PyTorch's layout), from the
    parameters ``start`` (a state_dict) when given: PyTorch's optimizer fed another framework's gradients.
    Returns ``model``, updated."""
    dtype = next(model.parameters()).dtype
    if start is not None:
        model.load_state_dict({k: v.to(dtype) if v.is_floating_point() else v for k, v in start.items()})
    optimizer.zero_grad()
    for name, parameter in model.named_parameters():
        if name in gradients:
            parameter.grad = torch.tensor(np.array(gradients[name]), dtype=dtype)
    optimizer.step()
    return model


def _fed_update(model, optimizer, start: dict, pairings: list[Pairing], jax_grads) -> dict[str, np.ndarray]:
    """PyTorch's optimizer step from ``start`` with the port's gradients; the parameters after it in the port's layout."""
    gradients = {p.torch_key: p.to_torch(np.asarray(_get(jax_grads, p.jax_path), np.float64))
                 for p in pairings if p.collection == "params"}
    step_with_gradients(model, optimizer, gradients, start)
    return torch_in_flax_layout(model, pairings)


# --- the JAX side -------------------------------------------------------------------------------------


def _jax_step_function(adapter: port_apis.Adapter, spec: Spec, optimizer) -> Callable:
    """One step of the port as a pure function: (variables, inputs, targets, opt_state) -> what it computed."""

    def step(variables, inputs, targets, opt_state):
        output, _, layers = adapter.apply(variables, inputs, True)
        seen = {"output": output, "layers": layers}
        if spec.jax_loss is None:
            return seen

        def loss_fn(params):
            out, stats, _ = adapter.apply({**variables, "params": params}, inputs, False)
            return spec.jax_loss(out, *inputs, *targets), stats

        (loss, stats), grads = jax.value_and_grad(loss_fn, has_aux=True)(variables["params"])
        seen.update(loss=loss, grads=grads, batch_stats=stats)
        if optimizer is not None:
            import optax

            updates, opt_state = optimizer.update(grads, opt_state, variables["params"])
            seen.update(params=optax.apply_updates(variables["params"], updates), opt_state=opt_state)
        return seen

    return step


def _check_dtypes(seen: dict, dtype: str, run: "_Run") -> None:
    """The port's outputs are in the precision asked, or a PortDtypeError names the first layer that is not."""
    torch_order = [n for n, _ in run.sides["ref"][0].named_modules() if n in run.layer_paths]
    layer_paths = run.layer_paths
    def wrong(value) -> str | None:
        kind = np.dtype(getattr(value, "dtype", np.float64))
        return str(kind) if np.issubdtype(kind, np.floating) and kind != np.dtype(dtype) else None

    places = [(name or "(model)", seen["layers"].get(layer_paths[name])) for name in torch_order]
    places.append(("its output", seen["output"]))
    for where, value in places:
        got = wrong(value) if value is not None else None
        if got is not None:
            raise PortDtypeError(
                f"the port computes in {got}, not {dtype} as asked: {where} gives {got} from {dtype} inputs and "
                f"parameters (a dtype fixed inside the port, e.g. Flax's dtype='{got}', or a cast). It cannot be checked "
                f"in {dtype} as it is: check it with --dtype {got}, or build it to compute in {dtype}")


# --- comparing --------------------------------------------------------------------------------------


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
    adapter: port_apis.Adapter
    pairings: list[Pairing]
    layer_paths: dict[str, tuple[str, ...]]
    sides: dict  # PyTorch's runs: "ref" (float64), "t32" and permuted float32 runs
    permutations: dict
    shadows: dict  # per program: PyTorch's optimizers fed that program's gradients


def _layout_of(jax_output, torch_shape: tuple, from_jax) -> np.ndarray:
    """A layer's output of the port in PyTorch's layout: what ``from_jax`` makes of it (as for the model's output);
    if that does not give PyTorch's shape, the output as it is, or with its channels moved to axis 1."""
    for candidate in (lambda y: np.asarray(from_jax(y)), np.asarray, lambda y: np.moveaxis(np.asarray(y), -1, 1)):
        try:
            converted = candidate(jax_output)
        except Exception:  # a from_jax written for the model's output only
            continue
        if converted.shape == tuple(torch_shape):
            return converted
    return np.asarray(jax_output)


def _rows(run: _Run, prefix: str, seen: dict, jax_seen: dict, fed: dict | None, jax_noisy: list[tuple[dict, dict]]) -> list[Row]:
    """Every quantity of one step compared, in debugging order. ``jax_noisy``: (float32, float64) runs of one JAX
    program, for JAX's own float32 error."""
    rows: list[Row] = []
    noise_sides = [name for name in run.sides if name != "ref"] or ["ref"]
    ref = seen["ref"]

    def add(stage, name, pick_jax, reference, pick_torch, port_shape=None, noisy=None):
        rows.append(compare(prefix + stage, name, pick_jax(jax_seen), reference,
                            noisy if noisy is not None else [pick_torch(seen[n]) for n in noise_sides], run.dtype, run.k,
                            port_shape=port_shape, jax_noisy=[(pick_jax(a), pick_jax(b)) for a, b in jax_noisy]))

    for torch_name in ref["layers"]:  # in the order PyTorch ran them
        path = run.layer_paths[torch_name]
        if path in jax_seen["layers"]:
            expected = ref["layers"][torch_name]
            add("forward", torch_name or "(model)", lambda s, p=path, e=expected: _layout_of(s["layers"][p], e.shape, run.from_jax),
                expected, lambda side, n=torch_name: side["layers"][n], np.shape(jax_seen["layers"][path]))
    add("output", "output", lambda s: _layout_of(s["output"], ref["output"].shape, run.from_jax), ref["output"],
        lambda side: side["output"], np.shape(jax_seen["output"]))
    if run.spec.torch_loss is None:
        return rows
    add("loss", "loss", lambda s: s["loss"], ref["loss"], lambda side: side["loss"])
    params = [p for p in run.pairings if p.collection == "params"]
    for p in params:
        add("gradient", p.torch_key, lambda s, path=p.jax_path: _get(s["grads"], path), ref["grads"][p.torch_key],
            lambda side, key=p.torch_key: side["grads"][key])
    if fed is not None:  # judged from the same gradients: PyTorch's optimizer fed the port's
        for p in params:
            add("update", p.torch_key, lambda s, path=p.jax_path: _get(s["params"], path), fed["ref"][p.torch_key], None,
                noisy=[fed.get("t32", fed["ref"])[p.torch_key]])
    for p in run.pairings:
        if p.collection == "batch_stats" and _has(jax_seen.get("batch_stats", {}), p.jax_path):
            add("buffer", p.torch_key, lambda s, path=p.jax_path: _get(s["batch_stats"], path), ref["after"][p.torch_key],
                lambda side, key=p.torch_key: side["after"][key])
    return rows


def _has(tree, path) -> bool:
    try:
        _get(tree, path)
        return True
    except (KeyError, TypeError, IndexError):
        return False


def _prepare(spec: Spec, dtype: str, k: float, seed: int, programs: tuple[str, ...]) -> _Run:
    """The spec's pieces built, the port adapted and paired with the PyTorch model, PyTorch's runs set up."""
    if spec.example_inputs is None or (spec.jax_model is None and (spec.jax_params is None or spec.jax_apply is None)):
        raise SpecError("a spec needs torch_model, example_inputs, and jax_model or jax_params with jax_apply")
    torch.manual_seed(seed)
    try:
        inputs = tuple(np.asarray(x) for x in spec.example_inputs())
        targets = tuple(np.asarray(x) for x in spec.example_targets()) if spec.example_targets else ()
        reference_model = spec.torch_model()
    except Exception as error:
        raise SpecError(f"the spec's torch_model()/example_inputs() failed: {type(error).__name__}: {error}") from error
    state = copy.deepcopy(reference_model.state_dict())
    jax_dtype = jnp.float64 if dtype == "float64" else jnp.float32

    def on_jax(arrays):
        return tuple(jnp.asarray(x, jax_dtype) if np.asarray(x).dtype.kind == "f" else jnp.asarray(x) for x in arrays)

    def jax_inputs(channels_last: bool) -> tuple:
        to_jax = spec.to_jax or (default_to_jax if channels_last else lambda *a: tuple(np.asarray(x) for x in a))
        return on_jax(to_jax(*inputs))

    try:
        adapter = port_apis.adapter_for(spec, jax_inputs, seed)
    except UserError as error:
        raise SpecError(str(error)) from error
    from_jax = spec.from_jax or (default_from_jax if adapter.channels_last else np.asarray)
    pairings = transfer(reference_model, adapter.variables, spec.param_map, adapter.kinds)
    layer_paths = {p.torch_key.rsplit(".", 1)[0] if "." in p.torch_key else "": p.jax_path[:-1] for p in pairings}
    # PyTorch's own float32 noise: the float32 run, and the same twice with the batch's samples in
    # other orders (the reductions over the batch sum in other orders; outputs are put back in order);
    # the largest of their errors counts.
    sides = {"ref": _torch_side(spec, torch.float64, state)}
    batch = {np.shape(x)[0] for x in (*inputs, *targets) if np.ndim(x) > 0}
    permutations = {}
    if dtype == "float32":
        sides["t32"] = _torch_side(spec, torch.float32, state)
        if len(batch) == 1 and (size := batch.pop()) > 1:
            for variant in range(PERMUTED_RUNS):
                permutations[f"t32-permuted-{variant}"] = np.random.default_rng([seed, variant]).permutation(size)
                sides[f"t32-permuted-{variant}"] = _torch_side(spec, torch.float32, state)
    # The update stage is judged from the same gradients: PyTorch's optimizer (float64, and float32 for its
    # own noise) fed JAX's gradients, its state evolving with them as optax's does. Judged from each
    # framework's own gradients instead, Adam's lr-sized steps on near-zero gradients make the
    # comparison a matter of chance.
    shadows = {program: {} for program in programs}
    if spec.jax_optimizer is not None:
        for program in programs:
            shadows[program]["ref"] = _torch_side(spec, torch.float64, state)
            if dtype == "float32":
                shadows[program]["t32"] = _torch_side(spec, torch.float32, state)
    return _Run(spec, dtype, k, inputs, targets, jax_inputs(adapter.channels_last), on_jax(targets), from_jax, adapter,
                pairings, layer_paths, sides, permutations, shadows)


def _torch_steps(run: _Run) -> tuple[dict, dict]:
    """Every PyTorch side runs one step from PyTorch64's state; returns what each saw and that starting state."""
    start = run.sides["ref"][0]  # teacher forcing: every side starts the step from PyTorch64's parameters and buffers
    params_state = {k: v.detach().clone() for k, v in start.state_dict().items()}
    for name, (model, _) in run.sides.items():
        if name != "ref":
            model.load_state_dict({k: v.to(torch.float32) if v.is_floating_point() else v for k, v in params_state.items()})
    seen = {name: _torch_step(run.spec, model, opt, run.inputs, run.targets,
                              torch.float64 if name == "ref" else torch.float32, run.layer_paths, run.permutations.get(name))
            for name, (model, opt) in run.sides.items()}
    for name, (model, _) in run.sides.items():
        seen[name]["grads"] = torch_in_flax_layout(model, run.pairings, "grad")
        seen[name]["after"] = torch_in_flax_layout(model, run.pairings)
    return seen, params_state


def _run_program(run: _Run, function, program: str, before: dict, opt_state, first: bool) -> dict:
    """One step of the port by ``function``; on the first call, a port that raises is a spec the checker cannot use."""
    try:
        return jax.device_get(function(before, run.jax_inputs, run.jax_targets, opt_state))
    except Exception as error:
        if not first:
            raise
        hints = []
        if run.adapter.api == "Equinox" and not run.spec.per_sample:
            hints.append("an Equinox model that acts on one sample needs PER_SAMPLE = True")
        if run.adapter.channels_last and run.spec.to_jax is None and any(np.ndim(x) >= 3 for x in run.inputs):
            hints.append("its inputs of 3 or more dimensions were moved channels-last; to_jax says otherwise")
        message = str(error).strip().splitlines()[0] if str(error).strip() else ""
        raise SpecError(f"the port's step ({_program_words((program,))}) failed on the example inputs: "
                        f"{type(error).__name__}: {message}" + (f" ({'; '.join(hints)})" if hints else "")) from error


def _float64_twin(run: _Run, function, before: dict, opt_state, optimizer) -> dict:
    """A program's step in float64 from the same start (PyTorch64's parameters and buffers ``before``, the optimizer
    state its float32 run had), for JAX's own float32 error. Its optimizer state is not kept."""
    with jax.enable_x64(True):
        def wide(tree):
            return jax.tree_util.tree_map(
                lambda a: jnp.asarray(a, jnp.float64) if jnp.issubdtype(jnp.asarray(a).dtype, jnp.floating) else a, tree)

        if optimizer is not None and opt_state is None:
            opt_state = optimizer.init(before["params"])
        return jax.device_get(function(before, wide(run.jax_inputs), wide(run.jax_targets), wide(opt_state)))


def check_port(spec: Spec, dtype: str = "float32", steps: int = 1, k: float = DEFAULT_K, seed: int = 0,
               programs: tuple[str, ...] = PROGRAMS) -> Report:
    """Compare the spec's JAX port with its PyTorch model (see the module's docstring) and return the report.

    ``programs``: which JAX programs run, the first judged: ("jit", "eager") (default), ("jit",) or ("eager",).
    """
    if dtype not in ("float32", "float64"):
        raise SpecError(f"dtype must be float32 or float64, got {dtype!r}")
    if steps < 1:
        raise SpecError(f"steps must be at least 1, got {steps}")
    if not programs or any(p not in PROGRAMS for p in programs):
        raise SpecError(f"programs must be taken from {PROGRAMS}, got {programs!r}")
    # Full float32 on GPUs/TPUs (no TF32 or bf16 passes, no effect on CPUs): PyTorch's side runs on the CPU, and its
    # float32 noise is the yardstick.
    with jax.enable_x64(True) if dtype == "float64" else contextlib.nullcontext(), jax.default_matmul_precision("highest"):
        run = _prepare(spec, dtype, k, seed, programs)
        optimizer = spec.jax_optimizer() if spec.jax_optimizer else None
        step_fn = _jax_step_function(run.adapter, spec, optimizer)
        functions = {program: jax.jit(step_fn) if program == "jit" else step_fn for program in programs}
        order = sorted(programs, key=lambda p: p != "eager")  # op by op first: a bad dtype shows there
        # JAX's own float32 error, |JAX₃₂ − JAX₆₄| of one program (op by op where it runs: a fault of the compiler
        # alone stays out of it); float64 needs none.
        noise_program = order[0] if dtype == "float32" else None
        opt_states: dict[str, Any] = {}
        rows: dict[str, list[Row]] = {program: [] for program in programs}
        for step in range(1, steps + 1):
            before = variables_from_torch(run.sides["ref"][0], run.pairings, run.adapter.variables,
                                          jnp.float64 if dtype == "float64" else jnp.float32)
            opt_before = dict(opt_states)
            if noise_program:  # the float64 twin starts from the same state (taken before PyTorch's step changes it)
                with jax.enable_x64(True):
                    before64 = variables_from_torch(run.sides["ref"][0], run.pairings, run.adapter.variables, jnp.float64)
            seen, params_state = _torch_steps(run)
            outcomes = {}
            for program in order:
                if program not in opt_states:
                    opt_states[program] = optimizer.init(before["params"]) if optimizer is not None else None
                outcomes[program] = _run_program(run, functions[program], program, before, opt_states[program],
                                                 first=step == 1 and program == order[0])
                if step == 1 and program == order[0]:
                    _check_dtypes(outcomes[program], dtype, run)
                    uncaptured = [n or "(model)" for n in seen["ref"]["layers"]
                                  if run.layer_paths[n] not in outcomes[program]["layers"]]
                opt_states[program] = outcomes[program].get("opt_state")
            twin = _float64_twin(run, functions[noise_program], before64, opt_before.get(noise_program), optimizer) \
                if noise_program else None
            jax_noisy = [(outcomes[noise_program], twin)] if twin is not None else []
            for program in programs:
                fed = None
                if optimizer is not None and spec.torch_loss is not None:
                    fed = {name: _fed_update(model, opt, params_state, run.pairings, outcomes[program]["grads"])
                           for name, (model, opt) in run.shadows[program].items()}
                rows[program] += _rows(run, f"step {step}: " if steps > 1 else "", seen, outcomes[program], fed, jax_noisy)
    return Report(spec.name, dtype, k, run.pairings, rows[programs[0]], run.adapter.api, tuple(programs),
                  rows[programs[1]] if len(programs) > 1 else [], jax_build(), len(seen["ref"]["layers"]), uncaptured)


def assert_port(spec: Spec | ModuleType | str | Path | None = None, /, *, dtype: str = "float32", steps: int = 1,
                k: float = DEFAULT_K, seed: int = 0, programs: tuple[str, ...] = PROGRAMS, **pieces) -> Report:
    """``check_port`` for a test suite: returns the report when the port agrees, raises ``AssertionError`` otherwise.

    ``spec``: a :class:`Spec`, a spec module, a spec file's path, or nothing, with the spec's pieces as keywords
    (``torch_model=``, ``jax_model=``, ``example_inputs=``, ``train=False``, ...); keywords given with a module
    replace its names. The error's message is the first divergence, then the whole report. A spec the checker
    cannot use raises :class:`SpecError`.
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
    report = check_port(spec, dtype, steps, k, seed, programs)
    if not report.passed:
        raise AssertionError(f"{report.verdict()}\n\n{report.format()}")
    return report
