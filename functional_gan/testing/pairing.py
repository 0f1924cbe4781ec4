"""Layouts and the weight transfer: each PyTorch tensor paired with a leaf of the port, and moved between the two
layouts (a Linear's weight transposed, a convolution's kernel channels-last, a transposed convolution's flipped)."""

from __future__ import annotations

import dataclasses
import re

import jax
import jax.numpy as jnp
import numpy as np
import torch

from .spec import SpecError, check_param_map



# PyTorch's layers that keep several of a port's tensors in one (check-port pairs whole tensors): what each packs.
PACKED = {
    "LSTM": "the four gates (i, f, g, o) of each weight and bias",
    "LSTMCell": "the four gates (i, f, g, o) of each weight and bias",
    "GRU": "the three gates (r, z, n) of each weight and bias",
    "GRUCell": "the three gates (r, z, n) of each weight and bias",
    "MultiheadAttention": "the query, key and value projections (in_proj_weight, in_proj_bias)",
}


def _nchw_to_nhwc(x):
    return np.moveaxis(x, 1, -1) if isinstance(x, np.ndarray) and x.ndim >= 3 else x


def default_to_jax(*arrays):
    """Arrays of 3 or more dimensions go channels-last (PyTorch's NC… → Flax's N…C); others as they are.

    Args:
        *arrays: the example inputs (or targets) as PyTorch takes them.

    Returns:
        A tuple of NumPy arrays, one per argument.
    """
    return tuple(_nchw_to_nhwc(np.asarray(a)) if np.asarray(a).ndim >= 3 else np.asarray(a) for a in arrays)


def default_from_jax(output):
    """The inverse of :func:`default_to_jax` for one array.

    Args:
        output: one of the port's outputs.

    Returns:
        A NumPy array: channels moved from the last axis to axis 1 where it has 3 or more dimensions.
    """
    return np.moveaxis(np.asarray(output), -1, 1) if np.ndim(output) >= 3 else np.asarray(output)


# How a PyTorch tensor becomes the port's leaf: "=" as it is, "T" transposed (Linear), "conv" (out, in, *k) →
# (*k, in, out), "convT-flip" (in, out, *k) → (*k, in, out) flipped (Flax's ConvTranspose), "convT-eqx"
# (in, out, *k) → (out, in, *k) flipped (Equinox's ConvTranspose), "reshape" to the leaf's shape (Equinox's (out, 1, 1) bias).
TRANSFORMS = ("=", "T", "conv", "convT-flip", "convT-eqx", "reshape")


def to_flax_layout(value: np.ndarray, transform: str, shape: tuple | None = None) -> np.ndarray:
    """A PyTorch tensor in the port's layout.

    Args:
        value: the tensor's values, in PyTorch's layout.
        transform: one of :data:`TRANSFORMS`.
        shape: the port's leaf's shape (used by "reshape").

    Returns:
        The values in the port's layout (a view where the transform is a transposition).
    """
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
    """The inverse of :func:`to_flax_layout`.

    Args:
        value: the values, in the port's layout.
        transform: one of :data:`TRANSFORMS`.
        shape: PyTorch's tensor's shape (used by "reshape").

    Returns:
        The values in PyTorch's layout.
    """
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
    # a leaf stacked over layers (a scan over layers: Linen's nn.scan, nnx.scan, a vmapped init): this tensor is the
    # leaf's slice ``index`` along its first axis, and ``jax_shape`` that slice's shape
    index: int | None = None

    @property
    def jax_name(self) -> str:
        return f"{self.collection}/{'/'.join(self.jax_path)}" + (f"[{self.index}]" if self.index is not None else "")

    @property
    def layer(self) -> tuple[str, ...]:
        """The port's layer this tensor belongs to, as its per-layer outputs are keyed (a stacked layer: its
        module's path and ``#index``)."""
        return (*self.jax_path[:-1], *((f"#{self.index}",) if self.index is not None else ()))

    def leaf(self, tree):
        """This tensor's value in a tree of the port's arrays (a stacked leaf's slice).

        Args:
            tree: a collection of the port's variables (its ``params`` or ``batch_stats``), nested by module path.

        Returns:
            The leaf at :attr:`jax_path`, or its slice :attr:`index` for a stacked leaf.
        """
        value = leaf_at(tree, self.jax_path)
        return value if self.index is None else value[self.index]

    def to_jax(self, value: np.ndarray) -> np.ndarray:
        """PyTorch's tensor ``value`` (a NumPy array) in the port's layout (:func:`to_flax_layout`).

        Args:
            value: the tensor's values, in PyTorch's layout.
        """
        return to_flax_layout(value, self.transform, self.jax_shape)

    def to_torch(self, value: np.ndarray) -> np.ndarray:
        """The port's leaf ``value`` (a NumPy array) in PyTorch's layout (:func:`from_flax_layout`).

        Args:
            value: the leaf's values, in the port's layout.
        """
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
    """(name, module, its own tensors) of every module holding parameters or float buffers, in definition order; a
    tensor met before (a tied weight: GPT-2's ``lm_head.weight`` is ``transformer.wte.weight``) is left out where it
    is met again (see :func:`tied_tensors`)."""
    out = []
    seen: set[int] = set()
    for name, module in model.named_modules():
        own = {k: v for k, v in module.named_parameters(recurse=False)}
        persistent = {k: v for k, v in module.named_buffers(recurse=False) if k not in module._non_persistent_buffers_set}
        own.update({k: v for k, v in persistent.items() if v is not None and v.is_floating_point()})
        own = {k: v for k, v in own.items() if id(v) not in seen}
        seen.update(id(v) for v in own.values())
        if own:
            out.append((name, module, own))
    return out


def tied_tensors(model: torch.nn.Module) -> dict[str, str]:
    """{a tied tensor's later name: the name it is paired under}, in definition order: one tensor used by several
    modules (PyTorch's ``named_parameters`` lists it once, under its first name). It pairs once with the port, and its
    gradient on both sides is the sum over its uses.

    Args:
        model: the PyTorch model.

    Returns:
        {later name: first name}, empty where nothing is tied.
    """
    first: dict[int, str] = {}
    tied = {}
    for module_name, module in model.named_modules():
        for key, tensor in [*module.named_parameters(recurse=False), *module.named_buffers(recurse=False)]:
            if tensor is None:
                continue
            name = f"{module_name}.{key}" if module_name else key
            if id(tensor) in first:
                tied[name] = first[id(tensor)]
            else:
                first[id(tensor)] = name
    return tied


def _tied_modules(model: torch.nn.Module) -> list[tuple[str, torch.nn.Module, dict[str, torch.Tensor]]]:
    """(name, module, its parameters met before under another name) of each module that uses a tied parameter where
    it is met again (GPT-2's ``lm_head`` with ``transformer.wte``'s weight), in definition order: read off
    :func:`tied_tensors`."""
    found: dict[str, dict[str, torch.Tensor]] = {}
    for later in tied_tensors(model):
        name, _, key = later.rpartition(".")
        own = dict(model.get_submodule(name).named_parameters(recurse=False))
        if key in own:
            found.setdefault(name, {})[key] = own[key]
    return [(name, model.get_submodule(name), tensors) for name, tensors in found.items()]


def _pair_tied_copies(model, left: list, by_path: dict, stats: dict, param_map: dict | None, kinds: dict | None
                      ) -> list[Pairing]:
    """Pairings of the port's modules that received no weights with PyTorch's modules that use a tied tensor: a port
    that keeps its own copy of the tensor there (an output layer of its own beside the embedding). Each copy gets
    PyTorch's values; its gradient is its own use's, where PyTorch's tensor receives the sum over both uses (the
    check names the difference, and the run's notes say why). Pairs ``left``'s paths as it uses them."""
    pairings = []
    for name, module, tensors in _tied_modules(model):
        if param_map and name in param_map:
            candidates = [tuple(param_map[name].split("/"))]
        else:
            candidates = list(left)
        for path in candidates:
            if path not in left:
                continue
            try:
                pairs = _pair_module(name, module, tensors, path, by_path[path], stats.get(path, {}),
                                     (kinds or {}).get(path, ""))
            except (SpecError, ValueError, IndexError):  # not this module's place
                continue
            if {q.jax_path[-1] for q in pairs} != set(by_path[path]):  # the port's module holds the copy alone
                continue
            pairings.extend(pairs)
            left.remove(path)
            break
    return pairings


def _describe(name: str, module: torch.nn.Module, tensors: dict) -> str:
    return f"{name or 'model'} ({type(module).__name__}: {', '.join(f'{k} {tuple(v.shape)}' for k, v in tensors.items())})"


def transfer(model: torch.nn.Module, variables: dict, param_map: dict[str, str] | None = None,
             kinds: dict[tuple[str, ...], str] | None = None) -> list[Pairing]:
    """Pair every tensor of ``model``'s state_dict with a leaf of the port's ``variables``: the port's module of the
    same path where it has one (PyTorch's ``model.layers.0.mlp`` with ``model/layers/0/mlp``), else by definition order
    and shape.

    Args:
        model: the PyTorch model.
        variables: the port's ``{"params": ..., "batch_stats": ...}``, nested by module path (arrays or shapes).
        param_map: {PyTorch module name: the port's module path ``"A/B"``} for modules the order does not pair.
        kinds: each path's module class where the layout depends on it (Equinox's ConvTranspose).

    Returns:
        One :class:`Pairing` per PyTorch tensor: the port's leaf, and the layout change between them.

    Raises:
        SpecError: a tensor that pairs with no leaf (or with several), or a malformed ``param_map``; the message names
            them and the shapes on both sides.
    """
    check_param_map(param_map)
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
    torch_modules = _torch_modules(model)
    lists = _list_lengths([name for name, _, _ in torch_modules])
    stacked: dict[tuple[str, ...], set[int]] = {}  # a stacked module of the port → the layers of it paired so far
    for name, module, tensors in torch_modules:
        element = _LIST_ELEMENT.fullmatch(name)
        if element and not (param_map and name in param_map):  # layer i of a PyTorch ModuleList/Sequential
            length, index = lists[element.group(1)], int(element.group(2))
            candidates = [q for q in order if q not in mapped and index not in stacked.get(q, set()) and
                          (q not in used or q in stacked) and
                          _stacked_fits(module, tensors, by_path[q], stats.get(q, {}), length)]
            if candidates:  # the port holds this list as one module stacked over layers: the same name first
                last = name.rsplit(".", 1)[-1]
                path = next((q for q in candidates if q[-1] == last), candidates[0])
                stacked.setdefault(path, set()).add(index)
                used.add(path)
                pairings.extend(_pair_module(name, module, tensors, path, _sliced(by_path[path]),
                                             _sliced(stats.get(path, {})), (kinds or {}).get(path, ""), index))
                continue
        if param_map and name in param_map:
            path = tuple(param_map[name].split("/"))
            if path not in by_path:
                raise SpecError(f"param_map sends {name!r} to {param_map[name]!r}, which the port does not have; "
                                f"its modules: {', '.join('/'.join(p) for p in order)}")
        elif (named := tuple(name.split("."))) in by_path and named not in used and named not in mapped \
                and named not in stacked:  # the port's module of the same path ("model/layers/0/mlp"): by name
            path = named
        else:
            while position < len(order) and (order[position] in used or order[position] in mapped or
                                             order[position] in stacked):
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
    partly = [f"{'/'.join(q)} ({len(layers)} of {_leading(by_path[q])} layers)" for q, layers in stacked.items()
              if len(layers) != _leading(by_path[q])]
    if partly:
        raise SpecError(f"the port's stacked module(s) {', '.join(partly)} received PyTorch weights for only some of "
                        "their layers; the PyTorch list has another length, or pairs elsewhere: name it in param_map")
    left = [p for p in order if p not in used]
    if left:  # a port that keeps a copy of a tensor PyTorch ties (lm_head beside the embedding)
        pairings.extend(_pair_tied_copies(model, left, by_path, stats, param_map, kinds))
    if left:
        raise SpecError(f"the port's module(s) {', '.join('/'.join(p) for p in left)} received no PyTorch weights; "
                        "pair them with param_map = {'torch.module.name': 'port/path'}")
    return pairings


_LIST_ELEMENT = re.compile(r"(.+)\.(\d+)\.(.+)")  # "h.3.attn.c_attn": the list "h", its layer 3, the module in it


def _list_lengths(names: list[str]) -> dict[str, int]:
    """{PyTorch list's name: its number of layers}, read off module names of the form ``list.i.rest``."""
    lengths: dict[str, int] = {}
    for name in names:
        element = _LIST_ELEMENT.fullmatch(name)
        if element:
            lengths[element.group(1)] = max(lengths.get(element.group(1), 0), int(element.group(2)) + 1)
    return lengths


def _leading(leaves: dict) -> int | None:
    dims = {np.shape(v)[0] for v in leaves.values() if np.ndim(v) > 0}
    return dims.pop() if len(dims) == 1 else None


def _sliced(leaves: dict) -> dict:
    """A stacked module's leaves as one layer's: each one's slice 0 (for shapes and names)."""
    return {k: np.zeros(np.shape(v)[1:]) for k, v in leaves.items()}


def _stacked_fits(module, tensors: dict, leaves: dict, stats: dict, length: int) -> bool:
    """True when the port's module holds every tensor of ``module`` stacked ``length`` times along a first axis."""
    if not leaves or _leading(leaves) != length or (stats and _leading(stats) != length):
        return False
    try:
        _pair_module("", module, tensors, (), _sliced(leaves), _sliced(stats))
    except (SpecError, ValueError, IndexError):  # a layout that does not fit these leaves
        return False
    return True


def _by_name(key: str, tensor, target: dict, kind: str) -> tuple[str, tuple | None]:
    """A tensor paired with the port's leaf of the same name: its transform, and the leaf's shape."""
    expected = tuple(np.shape(target[key]))
    if kind.startswith("eqx.ConvTranspose") and key == "weight":
        return "convT-eqx", expected
    if tuple(tensor.shape) != expected and tensor.numel() == int(np.prod(expected)) and \
            [d for d in tensor.shape if d != 1] == [d for d in expected if d != 1]:
        return "reshape", expected  # Equinox's convolution bias, (out, 1, 1)
    return "=", expected


def _pair_module(name, module, tensors, path, leaves, stats, kind: str = "", index: int | None = None) -> list[Pairing]:
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
            packed = PACKED.get(type(module).__name__)
            raise SpecError(f"{full}: no known place for it in the port's module {'/'.join(path)} "
                            f"({type(module).__name__} → leaves {', '.join(leaves) or 'none'}); use param_map or "
                            "a module with PyTorch's names" + (
                                f". PyTorch's {type(module).__name__} keeps {packed} in one tensor, which check-port "
                                "moves whole: keep it so in the port's module, under PyTorch's names (docs/check-port.md, "
                                "\"Packed weights\")" if packed else ""))
        moved = to_flax_layout(tensor.detach().cpu().numpy(), transform, expected).shape
        if moved != expected:
            raise SpecError(f"{full} has shape {tuple(tensor.shape)} ({moved} in the port's layout, transform {transform}), "
                            f"but the port's {collection}/{'/'.join(path)}/{leaf_name} has shape {expected}; the models "
                            "are defined in a different order or with other sizes? name it in param_map")
        result.append(Pairing(full, collection, (*path, leaf_name), transform, tuple(tensor.shape), expected, index))
    return result


def _set(tree: dict, path: tuple[str, ...], value) -> dict:
    tree = dict(tree)
    if len(path) == 1:
        tree[path[0]] = value
    else:
        tree[path[0]] = _set(dict(tree.get(path[0], {})), path[1:], value)
    return tree


def leaf_at(tree, path):
    """The value at ``path`` in the nested ``tree``.

    Args:
        tree: nested dicts (a collection of the port's variables).
        path: the keys, outermost first.

    Raises:
        KeyError: a key on the path is not in the tree.
    """
    for key in path:
        tree = tree[key]
    return tree


def shapes_of_paired(variables: dict, pairings: list[Pairing]) -> dict:
    """``variables`` with each leaf that PyTorch's tensors fill entirely (every layer of a stacked leaf) as its shape and
    dtype: every step's variables are made from PyTorch's tensors, and the port's own initial values of those leaves
    are not held (half a gigabyte for a model of 124M parameters).

    Args:
        variables: the port's ``{"params": ..., "batch_stats": ...}``, nested by module path.
        pairings: the check's pairing (:func:`transfer`).

    Returns:
        A copy of ``variables`` with those leaves as ``jax.ShapeDtypeStruct``; the other leaves as they were.
    """
    out = {k: dict(v) for k, v in variables.items()}
    for collection, path in _filled(variables, pairings):
        leaf = leaf_at(out[collection], path)
        out[collection] = _set(out[collection], path, jax.ShapeDtypeStruct(np.shape(leaf), leaf.dtype))
    return out


def _filled(variables: dict, pairings: list[Pairing]) -> set[tuple[str, tuple[str, ...]]]:
    """(collection, path) of each leaf of ``variables`` that PyTorch's tensors fill entirely (a stacked leaf: every
    layer of it)."""
    layers: dict[tuple, set] = {}
    for p in pairings:
        layers.setdefault((p.collection, p.jax_path), set()).add(p.index)
    filled = set()
    for (collection, path), indices in layers.items():
        leaf = leaf_at(variables[collection], path)
        if indices == {None} or indices == set(range(np.shape(leaf)[0] if np.ndim(leaf) else 0)):
            filled.add((collection, path))
    return filled


def all_filled(variables: dict, pairings: list[Pairing]) -> bool:
    """Whether PyTorch's tensors fill every leaf of the port's ``variables`` entirely: no value of the port's own is
    used (then the port built as shapes alone is enough).

    Args:
        variables: the port's ``{"params": ..., "batch_stats": ...}``, arrays or shapes.
        pairings: the check's pairing (:func:`transfer`).
    """
    filled = _filled(variables, pairings)
    return all((collection, path) in filled for collection, tree in variables.items()
               for path, _ in _leaves(tree))


def _leaves(tree, prefix: tuple[str, ...] = ()):
    for name, value in tree.items():
        if isinstance(value, dict) or hasattr(value, "items") and not hasattr(value, "shape"):
            yield from _leaves(value, (*prefix, str(name)))
        else:
            yield (*prefix, str(name)), value


def variables_from_torch(model: torch.nn.Module | dict, pairings: list[Pairing], variables: dict, dtype) -> dict:
    """The port's variables holding ``model``'s tensors (a module, or a ``state_dict``), moved by the pairing.

    Args:
        model: the PyTorch model, or its ``state_dict``.
        pairings: the check's pairing (:func:`transfer`).
        variables: the port's variables as the adapter holds them: each leaf left unpaired keeps its value from here.
        dtype: the JAX dtype the leaves are made in.

    Returns:
        A copy of ``variables`` with every paired leaf (a stacked one: each paired layer of it) holding PyTorch's
        values in the port's layout, as JAX arrays.
    """
    tensors = model if isinstance(model, dict) else {**dict(model.named_parameters(remove_duplicate=False)),
                                                     **dict(model.named_buffers())}
    out = {k: dict(v) for k, v in variables.items()}
    stacked: dict[tuple, np.ndarray] = {}  # a stacked leaf's layers, gathered before it is set once
    for p in pairings:
        value = p.to_jax(tensors[p.torch_key].detach().cpu().numpy().copy())  # not a view: the step changes it
        if p.index is None:
            out[p.collection] = _set(out[p.collection], p.jax_path, jnp.asarray(value, dtype))
            continue
        key = (p.collection, p.jax_path)
        if key not in stacked:
            leaf = leaf_at(out[p.collection], p.jax_path)  # its values where a layer is not paired; a shape where all are
            stacked[key] = (np.zeros(leaf.shape, np.float64) if isinstance(leaf, jax.ShapeDtypeStruct)
                            else np.array(leaf, np.float64))
        stacked[key][p.index] = value
    for (collection, path), value in stacked.items():
        out[collection] = _set(out[collection], path, jnp.asarray(value, dtype))
    return out


def torch_in_flax_layout(model: torch.nn.Module, pairings: list[Pairing], which: str = "value",
                         release: bool = False) -> dict[str, np.ndarray]:
    """Each paired tensor (or its ``.grad``) in the port's layout, float64, by PyTorch key.

    Args:
        model: the PyTorch model.
        pairings: the check's pairing (:func:`transfer`).
        which: ``"value"``, the tensors; ``"grad"``, the parameters' gradients (zeros where a parameter has none).
        release: each ``.grad`` let go of as soon as it is read (after its last pairing, for a tensor paired twice).

    Returns:
        {PyTorch key: a float64 NumPy array in the port's layout}, copies that the model's next step does not change.
    """
    tensors = {**dict(model.named_parameters(remove_duplicate=False)), **dict(model.named_buffers())}
    uses: dict[int, int] = {}  # a tensor paired twice (a port's copy of a tied tensor) is let go after its last read
    for p in pairings:
        uses[id(tensors[p.torch_key])] = uses.get(id(tensors[p.torch_key]), 0) + 1
    out = {}
    for p in pairings:
        tensor = tensors[p.torch_key]
        if which == "grad":
            if p.collection != "params":
                continue
            parameter, tensor = tensor, tensor.grad if tensor.grad is not None else torch.zeros_like(tensor)
            uses[id(parameter)] -= 1
            if release and not uses[id(parameter)]:
                parameter.grad = None
        # a copy: a float64 tensor's numpy() is its memory, which the model's next step (or the next run loading
        # its start into the same model) overwrites
        out[p.torch_key] = np.array(p.to_jax(tensor.detach().cpu().double().numpy()), np.float64)
    return out


