"""Check a JAX (Flax Linen) port of any PyTorch model against PyTorch, judged against PyTorch's own rounding noise.

``check_port(spec)`` moves the PyTorch model's weights into the Flax model (:func:`transfer`: by
definition order and shape, knowing each standard layer's layout), runs both on the same inputs and
compares, in debugging order, every quantity a port can get wrong:

1. each paired layer's output (PyTorch forward hooks ↔ Flax ``capture_intermediates``), the model's
   output, the loss;
2. every parameter's gradient;
3. every parameter after one optimizer step from the same gradients (PyTorch's optimizer fed JAX's
   gradients), every buffer (BatchNorm's running statistics);
4. steps 2..N: the same, each step starting from PyTorch's parameters and buffers (teacher forcing;
   each framework keeps its own optimizer state).

The reference is PyTorch in float64. In float32 a quantity passes when
``|JAX₃₂ − PyTorch₆₄| ≤ k · max(|PyTorch₃₂ − PyTorch₆₄|, 4 ulps of its scale)``: the port may be as far
from the exact answer as PyTorch itself is, k times over (``k`` = 3 by default). PyTorch's own
error is the largest of three float32 runs: as it is, and with the batch's samples in two other
orders (put back in order after), which makes every reduction over the batch sum in another order. Adam turns float32
rounding in near-zero gradients into lr-sized steps; PyTorch does that to itself too, and the
criterion knows it. In float64 the port must agree within 1e-10 of each tensor's scale. The first
quantity out of tolerance is named: stage, layer, tensor, both sides' values.

A spec is a Python file (or module) defining

* ``torch_model()``: the PyTorch module (built fresh on each call, same weights: seed inside, or
  the checker's ``torch.manual_seed``); ``jax_model()``: the Flax Linen module;
* ``example_inputs()``: NumPy arrays as the PyTorch model takes them;
* optionally ``example_targets()``: arrays the losses take after the model's output and inputs;
  ``to_jax(*arrays)`` / ``from_jax(output)`` (default: arrays of 3 or more dimensions NC… ↔ N…C);
  ``param_map`` ({PyTorch module name: Flax module path}); ``torch_loss(output, *inputs, *targets)``
  with ``jax_loss(...)``; ``torch_optimizer(parameters)`` with ``jax_optimizer()`` (an optax
  transformation); ``jax_apply(model, variables, *inputs, capture_intermediates)`` returning
  ``(output, {"batch_stats": ..., "intermediates": ...})`` for a model whose ``__call__`` needs more
  than the inputs (``from_jax`` is applied to each layer's output too); ``TRAIN = False`` to compare in eval mode (dropout off, running statistics used).

See ``examples/port/`` for three models from public code.
"""

from __future__ import annotations

import copy
import dataclasses
import importlib.util
from pathlib import Path
from types import ModuleType
from typing import Any, Callable

import jax
import jax.numpy as jnp
import numpy as np
import torch

from functional_gan.errors import UserError

from .judge import DEFAULT_K, FLOAT64_TOLERANCE, ULPS, Row, compare

PERMUTED_RUNS = 2  # float32 PyTorch runs with the batch in another order, besides the plain one


class SpecError(UserError):
    """A spec the checker cannot use; the message says what is missing or what could not be paired."""


# --- the spec -----------------------------------------------------------------------------------------


@dataclasses.dataclass
class Spec:
    torch_model: Callable[[], torch.nn.Module]
    jax_model: Callable[[], Any]
    example_inputs: Callable[[], tuple]
    example_targets: Callable[[], tuple] | None = None
    to_jax: Callable[..., tuple] | None = None
    from_jax: Callable[[Any], Any] | None = None
    param_map: dict[str, str] | None = None
    torch_loss: Callable | None = None
    jax_loss: Callable | None = None
    torch_optimizer: Callable | None = None
    jax_optimizer: Callable | None = None
    jax_apply: Callable | None = None
    train: bool = True
    name: str = "spec"


REQUIRED = ("torch_model", "jax_model", "example_inputs")
PAIRS = (("torch_loss", "jax_loss"), ("torch_optimizer", "jax_optimizer"))


def spec_from_module(module: ModuleType | dict) -> Spec:
    values = module if isinstance(module, dict) else vars(module)
    missing = [name for name in REQUIRED if not callable(values.get(name))]
    if missing:
        raise SpecError(f"the spec defines no {', '.join(f'{m}()' for m in missing)} (required: "
                        f"{', '.join(f'{r}()' for r in REQUIRED)})")
    for a, b in PAIRS:
        if (values.get(a) is None) != (values.get(b) is None):
            given, absent = (a, b) if values.get(a) is not None else (b, a)
            raise SpecError(f"the spec defines {given}() but not {absent}(): give both or neither")
    if values.get("torch_optimizer") is not None and values.get("torch_loss") is None:
        raise SpecError("an optimizer pair needs a loss pair (torch_loss and jax_loss) to compute gradients")
    fields = {f.name for f in dataclasses.fields(Spec)}
    chosen = {k: v for k, v in values.items() if k in fields}
    if "TRAIN" in values:
        chosen["train"] = bool(values["TRAIN"])
    return Spec(**chosen, name=values.get("__name__", "spec"))


def load_spec(path: str | Path) -> Spec:
    """A spec file: ``SPEC.py`` defining the functions above."""
    path = Path(path)
    if not path.is_file():
        raise SpecError(f"spec file {str(path)!r} does not exist")
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


@dataclasses.dataclass
class Pairing:
    """One PyTorch tensor ↔ one Flax leaf and the transform between their layouts."""

    torch_key: str
    collection: str  # "params" or "batch_stats"
    jax_path: tuple[str, ...]
    transform: str  # how the PyTorch tensor becomes the Flax leaf: "=", "T", "conv", "convT-flip"

    @property
    def jax_name(self) -> str:
        return f"{self.collection}/{'/'.join(self.jax_path)}"


def to_flax_layout(value: np.ndarray, transform: str) -> np.ndarray:
    if transform == "=":
        return value
    if transform == "T":
        return value.T
    if transform == "conv":  # (out, in/groups, *k) → (*k, in/groups, out)
        return np.transpose(value, (*range(2, value.ndim), 1, 0))
    if transform == "convT-flip":  # (in, out/groups, *k) → (*k, in, out), spatially flipped (lax.conv_transpose)
        spatial = tuple(range(2, value.ndim))
        return np.transpose(np.flip(value, spatial), (*spatial, 0, 1))
    raise ValueError(transform)


def from_flax_layout(value: np.ndarray, transform: str) -> np.ndarray:
    """The inverse of :func:`to_flax_layout`."""
    if transform == "=":
        return value
    if transform == "T":
        return value.T
    n = value.ndim
    if transform == "conv":  # (*k, in/groups, out) → (out, in/groups, *k)
        return np.transpose(value, (n - 1, n - 2, *range(n - 2)))
    if transform == "convT-flip":  # (*k, in, out) → (in, out, *k), flipped back
        return np.flip(np.transpose(value, (n - 2, n - 1, *range(n - 2))), tuple(range(2, n)))
    raise ValueError(transform)


# PyTorch module type → (its tensor, the Flax leaf, the transform) for each tensor; a Flax module holding
# PyTorch's own names and layouts (this project's layers) pairs with "=" instead.
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
    """(path, {leaf name: array}) of every Flax module that holds arrays, in definition order (dict order)."""
    found, leaves = [], {}
    for name, value in tree.items():
        if isinstance(value, dict) or hasattr(value, "items") and not hasattr(value, "shape"):
            found.extend(_flax_modules(dict(value), (*prefix, name)))
        else:
            leaves[name] = value
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


def transfer(model: torch.nn.Module, variables: dict, param_map: dict[str, str] | None = None) -> list[Pairing]:
    """Pair every tensor of ``model``'s state_dict with a leaf of the Flax ``variables`` (definition order and shape).

    ``param_map``: {PyTorch module name: Flax module path "A/B"} for modules the order does not pair.
    Raises SpecError naming what could not be paired.
    """
    params = _flax_modules(dict(variables.get("params", {})))
    stats = {path: leaves for path, leaves in _flax_modules(dict(variables.get("batch_stats", {})))}
    by_path = {path: leaves for path, leaves in params}
    order = [path for path, _ in params]
    used: set[tuple[str, ...]] = set()
    pairings = []
    mapped = {tuple(p.split("/")) for p in (param_map or {}).values()}
    position = 0
    for name, module, tensors in _torch_modules(model):
        if param_map and name in param_map:
            path = tuple(param_map[name].split("/"))
            if path not in by_path:
                raise SpecError(f"param_map sends {name!r} to {param_map[name]!r}, which the Flax model does not have; "
                                f"its modules: {', '.join('/'.join(p) for p in order)}")
        else:
            while position < len(order) and (order[position] in used or order[position] in mapped):
                position += 1
            if position == len(order):
                raise SpecError(f"PyTorch's {name or 'model'} ({type(module).__name__}: "
                                f"{', '.join(f'{k} {tuple(v.shape)}' for k, v in tensors.items())}) has no Flax module "
                                "left to pair with; name it in param_map = {'" + name + "': 'Flax/path'}")
            path = order[position]
        used.add(path)
        pairings.extend(_pair_module(name, module, tensors, path, by_path[path], stats.get(path, {})))
    left = [p for p in order if p not in used]
    if left:
        raise SpecError(f"Flax module(s) {', '.join('/'.join(p) for p in left)} received no PyTorch weights; "
                        "pair them with param_map = {'torch.module.name': 'Flax/path'}")
    return pairings


def _pair_module(name, module, tensors, path, leaves, stats) -> list[Pairing]:
    rules = _rules(module) or _rules_by_flax_names(tensors, leaves)
    identity = set(tensors) <= set(leaves) | set(stats)  # a Flax module with PyTorch's own names (this project's layers)
    result = []
    for key, tensor in tensors.items():
        full = f"{name}.{key}" if name else key
        if identity:
            collection = "params" if key in leaves else "batch_stats"
            leaf_name, transform = key, "="
        elif key in rules:
            collection, leaf_name, transform = rules[key]
        else:
            raise SpecError(f"{full}: no known place for it in Flax module {'/'.join(path)} "
                            f"({type(module).__name__} → leaves {', '.join(leaves) or 'none'}); use param_map or "
                            "a Flax module with PyTorch's names")
        target = leaves if collection == "params" else stats
        if leaf_name not in target:
            raise SpecError(f"{full} ({type(module).__name__}) pairs by order with Flax module {'/'.join(path)}, which "
                            f"has no {collection} leaf {leaf_name!r} (it has {', '.join(target) or 'none'}); the models "
                            "are defined in a different order? name it in param_map")
        expected = tuple(np.shape(target[leaf_name]))
        moved = to_flax_layout(tensor.detach().cpu().numpy(), transform).shape
        if moved != expected:
            raise SpecError(f"{full} has shape {tuple(tensor.shape)} ({moved} in Flax's layout, transform {transform}), "
                            f"but Flax's {collection}/{'/'.join(path)}/{leaf_name} has shape {expected}; the models "
                            "are defined in a different order or with other sizes? name it in param_map")
        result.append(Pairing(full, collection, (*path, leaf_name), transform))
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
        value = to_flax_layout(tensors[p.torch_key].detach().cpu().numpy().copy(), p.transform)  # not a view: the step changes it
        out[p.collection] = _set(out[p.collection], p.jax_path, jnp.asarray(value, dtype))
    return out


def torch_in_flax_layout(model: torch.nn.Module, pairings: list[Pairing], which: str = "value") -> dict[str, np.ndarray]:
    """Each paired tensor (or its ``.grad``) in Flax's layout, float64, by PyTorch key."""
    tensors = {**dict(model.named_parameters()), **dict(model.named_buffers())}
    out = {}
    for p in pairings:
        tensor = tensors[p.torch_key]
        if which == "grad":
            if p.collection != "params":
                continue
            tensor = tensor.grad if tensor.grad is not None else torch.zeros_like(tensor)
        out[p.torch_key] = to_flax_layout(tensor.detach().cpu().double().numpy(), p.transform)
    return out


# --- comparing --------------------------------------------------------------------------------------


@dataclasses.dataclass
class Report:
    spec: str
    dtype: str
    k: float
    pairings: list[Pairing]
    rows: list[Row]

    @property
    def first_divergence(self) -> Row | None:
        return next((r for r in self.rows if not r.passed), None)

    @property
    def passed(self) -> bool:
        return self.first_divergence is None

    def to_json(self) -> dict:
        return {"spec": self.spec, "dtype": self.dtype, "k": self.k, "passed": self.passed,
                "transfer": [dataclasses.asdict(p) for p in self.pairings],
                "rows": [{**dataclasses.asdict(r), "passed": r.passed, "ratio_to_pytorch_noise": r.ratio} for r in self.rows],
                "first_divergence": None if self.passed else dataclasses.asdict(self.first_divergence)}

    def format(self, markdown: bool = False) -> str:
        lines = []
        if markdown:
            lines += [f"# check-port: {self.spec} ({self.dtype})", ""]
        lines.append("Weight transfer (PyTorch → Flax):")
        for p in self.pairings:
            lines.append(f"  {p.torch_key:<32} → {p.jax_name:<40} {p.transform}")
        criterion = (f"|JAX − PyTorch64| ≤ {self.k:g} × max(|PyTorch32 − PyTorch64|, {ULPS} ulps), relative to each tensor's scale"
                     if self.dtype == "float32" else f"|JAX − PyTorch64| ≤ {FLOAT64_TOLERANCE:g} of each tensor's scale")
        lines += ["", f"Criterion: {criterion}", ""]
        header = f"{'stage':<22} {'quantity':<34} {'port error':>11} {'PyTorch noise':>13} {'ratio':>7}  ok"
        lines += [header, "-" * len(header)]
        for r in self.rows:
            noise = f"{r.noise:.2e}" if r.noise is not None else "—"
            ratio = f"{r.ratio:.2f}" if r.ratio is not None else "—"
            lines.append(f"{r.stage:<22} {r.name[:34]:<34} {r.port_error:>11.2e} {noise:>13} {ratio:>7}  {'✓' if r.passed else '✗'}")
        first = self.first_divergence
        lines.append("")
        if first is None:
            lines.append(f"Agreement: all {len(self.rows)} quantities within tolerance.")
        else:
            lines.append(f"First divergence: {first.stage}, {first.name}: error {first.port_error:.3g} of the tensor's scale "
                         f"{first.scale:.3g} (allowed {first.allowed:.3g}); at the largest difference JAX has "
                         f"{first.jax_value:.8g}, PyTorch (float64) {first.torch_value:.8g}.")
        text = "\n".join(lines)
        return f"```text\n{text}\n```\n" if markdown else text


# --- running both -------------------------------------------------------------------------------------


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


def _step_with_gradients(model, optimizer, start: dict, pairings: list[Pairing], flax_grads) -> dict[str, np.ndarray]:
    """One PyTorch optimizer step from the parameters ``start`` with the given (Flax-layout) gradients; the result in Flax's layout."""
    dtype = next(model.parameters()).dtype
    model.load_state_dict({k: v.to(dtype) if v.is_floating_point() else v for k, v in start.items()})
    parameters = dict(model.named_parameters())
    optimizer.zero_grad()
    for p in pairings:
        if p.collection == "params":
            gradient = from_flax_layout(np.asarray(_get(flax_grads, p.jax_path), np.float64), p.transform)
            parameters[p.torch_key].grad = torch.tensor(np.array(gradient), dtype=dtype)
    optimizer.step()
    return torch_in_flax_layout(model, pairings)


def _flax_intermediates(tree, prefix=()):
    out = {}
    for name, value in dict(tree).items():
        if name == "__call__":
            out[prefix] = value[0]
        elif isinstance(value, dict) or hasattr(value, "items"):
            out.update(_flax_intermediates(value, (*prefix, name)))
    return out


def check_port(spec: Spec, dtype: str = "float32", steps: int = 1, k: float = DEFAULT_K, seed: int = 0) -> Report:
    """Compare the spec's JAX port with its PyTorch model (see the module's docstring) and return the report."""
    if dtype not in ("float32", "float64"):
        raise SpecError(f"dtype must be float32 or float64, got {dtype!r}")
    if steps < 1:
        raise SpecError(f"steps must be at least 1, got {steps}")
    torch.manual_seed(seed)
    try:
        inputs = tuple(np.asarray(x) for x in spec.example_inputs())
        targets = tuple(np.asarray(x) for x in spec.example_targets()) if spec.example_targets else ()
        reference_model = spec.torch_model()
    except Exception as error:
        raise SpecError(f"the spec's torch_model()/example_inputs() failed: {type(error).__name__}: {error}") from error
    state = copy.deepcopy(reference_model.state_dict())
    to_jax = spec.to_jax or default_to_jax
    from_jax = spec.from_jax or (lambda y: np.moveaxis(np.asarray(y), -1, 1) if np.ndim(y) >= 3 else np.asarray(y))
    jax_dtype = jnp.float64 if dtype == "float64" else jnp.float32
    with jax.enable_x64(True):
        def on_jax(arrays):
            return tuple(jnp.asarray(x, jax_dtype) if np.asarray(x).dtype.kind == "f" else jnp.asarray(x) for x in arrays)

        jax_inputs, jax_targets = on_jax(to_jax(*inputs)), on_jax(targets)
        flax_model = spec.jax_model()
        try:
            variables = flax_model.init(jax.random.key(seed), *jax_inputs)
        except Exception as error:
            raise SpecError(f"jax_model().init on the example inputs failed: {type(error).__name__}: {error}") from error
        variables = {c: dict(v) for c, v in variables.items()}
        pairings = transfer(reference_model, variables, spec.param_map)
        layer_paths = {p.torch_key.rsplit(".", 1)[0] if "." in p.torch_key else "": p.jax_path[:-1] for p in pairings}
        rows: list[Row] = []
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
        noise_sides = [name for name in sides if name != "ref"] or ["ref"]
        optimizer = spec.jax_optimizer() if spec.jax_optimizer else None
        opt_state = None
        # The update stage is judged from the same gradients: PyTorch's optimizer (float64, and float32 for its
        # own noise) fed JAX's gradients, its state evolving with them as optax's does. Judged from each
        # framework's own gradients instead, Adam's lr-sized steps on near-zero gradients make the
        # comparison a matter of chance.
        shadows = {}
        if optimizer is not None:
            shadows["ref"] = _torch_side(spec, torch.float64, state)
            if dtype == "float32":
                shadows["t32"] = _torch_side(spec, torch.float32, state)
        for step in range(1, steps + 1):
            prefix = f"step {step}: " if steps > 1 else ""
            start = sides["ref"][0]  # teacher forcing: every side starts the step from PyTorch64's parameters and buffers
            params_state = {k: v.detach().clone() for k, v in start.state_dict().items()}
            for name in noise_sides:
                if name != "ref":
                    sides[name][0].load_state_dict({k: v.to(torch.float32) if v.is_floating_point() else v
                                                    for k, v in params_state.items()})
            before = variables_from_torch(start, pairings, variables, jax_dtype)
            seen = {name: _torch_step(spec, model, opt, inputs, targets, torch.float64 if name == "ref" else torch.float32,
                                      layer_paths, permutations.get(name))
                    for name, (model, opt) in sides.items()}
            for name, (model, _) in sides.items():
                seen[name]["grads"] = torch_in_flax_layout(model, pairings, "grad")
                seen[name]["after"] = torch_in_flax_layout(model, pairings)
            jax_seen = _jax_step(spec, flax_model, before, jax_inputs, jax_targets, optimizer, opt_state)
            opt_state = jax_seen.get("opt_state")
            ref = seen["ref"]

            def add(stage, name, port, reference, pick):
                rows.append(compare(prefix + stage, name, port, reference, [pick(seen[n]) for n in noise_sides], dtype, k))

            for torch_name in ref["layers"]:  # in the order PyTorch ran them
                path = layer_paths[torch_name]
                if path in jax_seen["layers"]:
                    expected = ref["layers"][torch_name]
                    add("forward", torch_name or "(model)", _torch_layout(jax_seen["layers"][path], expected.shape, from_jax),
                        expected, lambda side, n=torch_name: side["layers"][n])
            add("output", "output", np.asarray(from_jax(jax_seen["output"])), ref["output"], lambda side: side["output"])
            if spec.torch_loss is None:
                continue
            add("loss", "loss", jax_seen["loss"], ref["loss"], lambda side: side["loss"])
            for p in pairings:
                if p.collection == "params":
                    add("gradient", p.torch_key, _get(jax_seen["grads"], p.jax_path), ref["grads"][p.torch_key],
                        lambda side, key=p.torch_key: side["grads"][key])
            if optimizer is not None:
                fed = {name: _step_with_gradients(model, opt, params_state, pairings, jax_seen["grads"])
                       for name, (model, opt) in shadows.items()}
                for p in pairings:
                    if p.collection == "params":
                        rows.append(compare(prefix + "update", p.torch_key, _get(jax_seen["params"], p.jax_path),
                                             fed["ref"][p.torch_key], [fed.get("t32", fed["ref"])[p.torch_key]], dtype, k))
            for p in pairings:
                if p.collection == "batch_stats" and "batch_stats" in jax_seen:
                    add("buffer", p.torch_key, _get(jax_seen["batch_stats"], p.jax_path), ref["after"][p.torch_key],
                        lambda side, key=p.torch_key: side["after"][key])
    return Report(spec.name, dtype, k, pairings, rows)


def _torch_layout(jax_output, torch_shape: tuple, from_jax) -> np.ndarray:
    """A Flax layer's output in PyTorch's layout: what ``from_jax`` makes of it (as for the model's output);
    if that does not give PyTorch's shape, the output as it is, or with its channels moved to axis 1."""
    for candidate in (lambda y: np.asarray(from_jax(y)), np.asarray, lambda y: np.moveaxis(np.asarray(y), -1, 1)):
        converted = candidate(jax_output)
        if converted.shape == tuple(torch_shape):
            return converted
    return np.asarray(jax_output)


def _jax_step(spec: Spec, model, variables: dict, inputs: tuple, targets: tuple, optimizer, opt_state) -> dict:
    params = variables["params"]
    others = {c: v for c, v in variables.items() if c != "params"}
    mutable = [c for c in others if c != "intermediates"]

    def forward(params, capture: bool):
        full = {"params": params, **others}
        if spec.jax_apply is not None:
            return spec.jax_apply(model, full, *inputs, capture_intermediates=capture)
        result = model.apply(full, *inputs, capture_intermediates=capture, mutable=[*mutable, "intermediates"])
        return result

    output, state = forward(params, True)
    seen = {"output": np.asarray(output), "layers": {k: np.asarray(v) for k, v in _flax_intermediates(state.get("intermediates", {})).items()}}
    if spec.jax_loss is None:
        return seen

    def loss_fn(params):
        out, new_state = forward(params, False)
        return spec.jax_loss(out, *inputs, *targets), new_state

    (loss, new_state), grads = jax.value_and_grad(loss_fn, has_aux=True)(params)
    seen.update(loss=float(loss), grads=jax.tree_util.tree_map(np.asarray, grads))
    if "batch_stats" in new_state:
        seen["batch_stats"] = jax.tree_util.tree_map(np.asarray, dict(new_state["batch_stats"]))
    if optimizer is not None:
        import optax

        if opt_state is None:
            opt_state = optimizer.init(params)
        updates, opt_state = optimizer.update(grads, opt_state, params)
        seen["params"] = jax.tree_util.tree_map(np.asarray, optax.apply_updates(params, updates))
        seen["opt_state"] = opt_state
    return seen
