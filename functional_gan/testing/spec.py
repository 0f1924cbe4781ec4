"""A check-port spec: the Python file (or module, or keywords) that names a PyTorch model, its JAX port and how to
run them; :func:`load_spec` and :func:`spec_from_module` read one into a :class:`Spec`."""

from __future__ import annotations

import dataclasses
import importlib.util
import os
import sys
from pathlib import Path
from types import ModuleType
from typing import TYPE_CHECKING, Any, Callable

import numpy as np

from functional_gan.errors import UserError

if TYPE_CHECKING:
    import torch


class SpecError(UserError):
    """A spec the checker cannot use; the message says what is missing or what could not be paired."""


class PortDtypeError(SpecError):
    """The port computes in another precision than the one asked: it cannot be checked in that one."""






def _entry(written: str, doc: str, default=None, need: str = "optional"):
    """A spec's entry: how a spec file writes it, what it is (the reference table of docs/check-port.md is generated
    from these: :mod:`functional_gan.testing.reference`), and whether it is needed."""
    return dataclasses.field(default=default, metadata={"written": written, "doc": doc, "need": need})


@dataclasses.dataclass
class Spec:
    """What a check compares: a spec file's (or module's) entries, each read into the field of its name (lower-case
    for the constants: ``TRAIN`` is ``train``)."""

    torch_model: Callable[[], torch.nn.Module] = _entry(
        "torch_model()", "the PyTorch model (a class will do): built once under torch.manual_seed(seed), its weights "
        "loaded into every later build", need="required")
    jax_model: Callable[[], Any] | None = _entry(
        "jax_model()", "the port: a Flax Linen module, a Flax NNX module or an Equinox module (or (module, state) "
        "from eqx.nn.make_with_state)", need="required, or jax_params() with jax_apply")
    example_inputs: Callable[[], tuple] | None = _entry(
        "example_inputs()", "a tuple of NumPy arrays, as the PyTorch model takes them", need="required")
    example_targets: Callable[[], tuple] | None = _entry(
        "example_targets()", "arrays the losses take after the model's output and inputs")
    to_jax: Callable[..., tuple] | None = _entry(
        "to_jax(*arrays)", "the inputs as the port takes them (default: the API's layout: Linen and NNX channels-last, "
        "arrays of 3 or more dimensions NC… → N…C; Equinox and functions as PyTorch has them)")
    from_jax: Callable[[Any], Any] | None = _entry(
        "from_jax(output)", "the port's output (and layer outputs) in PyTorch's layout (default: the API's, back)")
    param_map: dict[str, str] | None = _entry(
        "param_map", "{PyTorch module name: the port's module path \"a/b\"} where pairing by definition order and "
        "shape is not enough")
    torch_loss: Callable | None = _entry(
        "torch_loss(output, *inputs, *targets)", "PyTorch's loss: the output as compared (after OUTPUT), the inputs "
        "as the model takes them, the targets; one number", need="with jax_loss")
    jax_loss: Callable | None = _entry(
        "jax_loss(output, *inputs, *targets)", "the port's loss, called as torch_loss (the inputs as to_jax made "
        "them)", need="with torch_loss")
    torch_optimizer: Callable | None = _entry(
        "torch_optimizer(parameters)", "a torch.optim optimizer over the parameters given", need="with jax_optimizer "
        "and a loss")
    jax_optimizer: Callable | None = _entry(
        "jax_optimizer()", "an optax transformation (for every API: an nnx.Optimizer applies the same one)",
        need="with torch_optimizer")
    jax_apply: Callable | None = _entry(
        "jax_apply(...)", "plain functions: jax_apply(params, *inputs) (with jax_state: jax_apply(params, state, "
        "*inputs) -> (output, state)); Linen: jax_apply(model, variables, *inputs, capture_intermediates) -> (output, "
        "{\"batch_stats\": …, \"intermediates\": …}) for a model whose __call__ needs more than the inputs")
    jax_params: Callable[[], Any] | None = _entry(
        "jax_params()", "plain functions: the port's parameters, a pytree (tap(\"layer\", x) marks a layer's output)")
    jax_state: Callable[[], Any] | None = _entry(
        "jax_state()", "plain functions: the port's running statistics, a pytree")
    train: bool = _entry(
        "TRAIN", "False compares in eval mode (dropout off, running statistics used; a Linen module's "
        "deterministic/use_running_average/train argument or field set)", default=True)
    output: str | int | None = _entry(
        "OUTPUT", "the field (attribute, key or index) of both models' outputs compared, where they return objects "
        "(\"logits\")")
    per_sample: bool = _entry(
        "PER_SAMPLE", "True for an Equinox model that acts on one sample: vmapped over the batch", default=False)
    batch_axis: str = _entry("BATCH_AXIS", "the vmapped batch's axis name (PER_SAMPLE)", default="batch")
    blocks: Callable[[], list] | None = _entry(
        "blocks()", "--by-block: [(PyTorch module name, the port's block, or a function that builds it)] "
        "(default: PyTorch's largest ModuleList paired with the port's list of as many modules)")
    block_to_jax: Callable[..., tuple] | None = _entry(
        "block_to_jax(*arrays)", "--by-block: a block's recorded inputs as the port's block takes them (default: the "
        "API's layout)")
    block_from_jax: Callable[[Any], Any] | None = _entry(
        "block_from_jax(output)", "--by-block: the port's block output in PyTorch's layout")
    block_output: str | int | None = _entry("BLOCK_OUTPUT", "--by-block: as OUTPUT, of a block's outputs")
    input_gradients: bool = _entry(
        "INPUT_GRADIENTS", "True compares the loss's gradient with respect to each floating-point input too (always "
        "on block by block: a block's input gradient is what it passes back)", default=False)
    taps: dict | None = _entry(
        "TAPS", "{name: (\"module:function\" of PyTorch's, of the port's)}: each pair's outputs compared, call by call "
        "(rows inside a layer)")
    name: str = "spec"
    # set by --by-block for each block's own spec: the block's name (the messages speak of it, not of the spec's
    # functions), and how many leading inputs are the block's positional arguments (the rest are its keyword
    # arguments' arrays; only the positional ones are differentiated for INPUT_GRADIENTS)
    block: str | None = None
    positional: int | None = None

    def words(self) -> dict[str, str]:
        """How messages name this spec's pieces: the whole model's (``torch_model()``, ``example_inputs()``,
        ``to_jax``), or a block's under --by-block (PyTorch's block, its recorded inputs, ``block_to_jax``)."""
        if self.block is None:
            return {"torch_step": "the spec's PyTorch step (torch_model() on example_inputs(), torch_loss, "
                                  "torch_optimizer)",
                    "inputs": "the example inputs", "to_jax_on": "example_inputs()", "to_jax": "to_jax",
                    "port": "the port's step",
                    "input_gradients": "INPUT_GRADIENTS"}
        return {"torch_step": f"PyTorch's block {self.block} (on the inputs and keyword arguments the whole model's "
                              "float64 run gave it, with the loss sum(output · cotangent))",
                "inputs": f"block {self.block}'s recorded inputs", "to_jax_on": f"block {self.block}'s recorded inputs",
                "to_jax": "block_to_jax",
                "port": f"the port's block for {self.block}",
                "input_gradients": "by-block's input gradients (of the block's positional inputs)"}


REQUIRED = ("torch_model", "example_inputs")
PAIRS = (("torch_loss", "jax_loss"), ("torch_optimizer", "jax_optimizer"))
CONSTANTS = {"TRAIN": "train", "PER_SAMPLE": "per_sample", "BATCH_AXIS": "batch_axis", "OUTPUT": "output",
             "BLOCK_OUTPUT": "block_output", "BLOCKS": "blocks", "INPUT_GRADIENTS": "input_gradients",
             "TAPS": "taps"}


def _fields_of(value) -> list[str]:
    if isinstance(value, dict):
        return [str(k) for k in value]
    if dataclasses.is_dataclass(value):
        return [f.name for f in dataclasses.fields(value)]
    return [k for k in vars(value) if not k.startswith("_")] if hasattr(value, "__dict__") else []


def layer_output(value):
    """A layer's output as check-port compares it: the array itself, or, where the layer returns a tuple or a list
    (PyTorch's ``nn.LSTM``: ``(output, (h, c))``; ``nn.MultiheadAttention``: ``(output, weights)``; a port's module
    written alike), its first array, depth first.

    Args:
        value: what the layer's call returned (a torch.Tensor, a NumPy or JAX array or tracer, or a nest of them).

    Returns:
        That array, or None where it holds none (the layer then has no row of its output).
    """
    if hasattr(value, "shape") and hasattr(value, "dtype"):
        return value
    if isinstance(value, (tuple, list)):
        for item in value:
            found = layer_output(item)
            if found is not None:
                return found
    return None


def select_output(output, field: str | int | None, side: str, from_jax=None):
    """The model's output as compared: ``output`` itself when ``field`` is None, else its field ``field`` (a key of a
    dict, an attribute of an object such as Hugging Face's ``ModelOutput`` or a dataclass, or an index of a tuple).
    An output that is not an array (nor a number) without ``OUTPUT`` is a :class:`SpecError` naming its fields. An array
    is the output as it is, ``OUTPUT`` or not (one side may return ``(logits, loss)`` and the other the logits).
    ``from_jax`` (the port's side, without ``OUTPUT``): the spec's ``from_jax`` applied first where the output is not an
    array, as the spec's author meant it (``lambda out: out.logits``).

    Args:
        output: a model's output: an array, a number, a dict, a tuple, or an object with fields.
        field: ``OUTPUT`` (or ``BLOCK_OUTPUT``): a key, an attribute's name or an index; None: the output itself.
        side: the model, as messages name it (``"PyTorch's model"``, ``"the port"``).
        from_jax: the spec's ``from_jax``, tried on an output that is not an array where ``field`` is None.

    Returns:
        The output compared.

    Raises:
        SpecError: ``output`` has no ``field``, or, without ``field``, it is neither an array nor a number (nor does
            ``from_jax`` make one of it); the message names its fields.
    """
    if hasattr(output, "shape") and hasattr(output, "dtype"):
        return output
    if field is None and from_jax is not None:
        try:
            picked = from_jax(output)
        except Exception:  # a from_jax written for arrays (NumPy's transposes): OUTPUT is then what is missing
            picked = None
        if hasattr(picked, "shape") and hasattr(picked, "dtype"):
            return picked
    if field is not None:
        try:
            if isinstance(field, int) and not isinstance(field, bool):
                return output[field]
            if isinstance(output, dict) or (hasattr(output, "keys") and not hasattr(output, field)):
                return output[field]
            return getattr(output, field)
        except (KeyError, IndexError, AttributeError, TypeError) as error:
            fields = _fields_of(output)
            raise SpecError(f"{side} returns a {type(output).__name__}, which has no field {field!r} (OUTPUT)"
                            + (f"; its fields: {', '.join(fields)}" if fields else "")) from error
    if isinstance(output, (int, float)):
        return output
    fields = _fields_of(output)
    kind = type(output).__name__
    example = fields[0] if fields else (0 if isinstance(output, (tuple, list)) else "logits")
    raise SpecError(f"{side} returns a {kind}, not an array: name the field compared, in the spec, "
                    f"OUTPUT = {example!r} (for both models)" + (f"; its fields: {', '.join(fields)}" if fields else ""))


def check_param_map(param_map) -> None:
    """A spec's ``param_map`` checked: None, or a dict of strings to strings.

    Args:
        param_map: the spec's ``param_map``.

    Raises:
        SpecError: ``param_map`` is a function or not a dict, or one of its keys or values is not a string.
    """
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
    """A :class:`Spec` from a spec module's names.

    Args:
        module: an imported spec module, or a dict of its names (the fields' names, or the constants' upper-case ones:
            ``TRAIN``); each entry is a :class:`Spec` field, documented there.

    Returns:
        The :class:`Spec`, named after the module.

    Raises:
        SpecError: a required entry missing (``torch_model``, ``example_inputs``, and ``jax_model`` or ``jax_params``
            with ``jax_apply``), one of a pair without the other (the losses, the optimizers), an optimizer without a
            loss, or a malformed ``param_map``.
    """
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
    check_param_map(values.get("param_map"))
    fields = {f.name for f in dataclasses.fields(Spec)} - {"name"}
    chosen = {k: v for k, v in values.items() if k in fields}
    chosen.setdefault("jax_model", None)
    for flag in ("train", "per_sample", "input_gradients"):
        if flag in chosen:
            chosen[flag] = bool(chosen[flag])
    return Spec(**chosen, name=str(values.get("__name__", "spec")))


def as_spec(spec: Spec | str | os.PathLike) -> Spec:
    """``spec`` itself, or the spec file at that path read by :func:`load_spec` (what :func:`.check.check_port` and
    :func:`.blocks.check_by_block` take).

    Args:
        spec: a :class:`Spec`, or a spec file's path.

    Returns:
        The :class:`Spec`.

    Raises:
        SpecError: as :func:`load_spec`'s, for a path.
    """
    return load_spec(spec) if isinstance(spec, (str, os.PathLike)) else spec


def load_spec(path: str | Path) -> Spec:
    """Read a spec file. Its folder goes on ``sys.path`` (first), so that it can import its neighbours
    (``import my_port``) as a script would.

    Args:
        path: the spec's Python file, defining :class:`Spec`'s entries.

    Returns:
        The :class:`Spec`, named after the file's path.

    Raises:
        SpecError: the file does not exist, it raises on import (the exception's type and message said), or
            :func:`spec_from_module` refuses its entries.
    """
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


def _described(value) -> str:
    shape = getattr(value, "shape", None)
    if shape is not None:
        return f"{tuple(shape)} {getattr(value, 'dtype', '')}".strip()
    return type(value).__name__


def call_loss(loss, which: str, output, inputs: tuple, targets: tuple):
    """The spec's ``torch_loss``/``jax_loss`` called as ``loss(output, *inputs, *targets)`` (the output as compared,
    after ``OUTPUT``; the inputs as that framework's model takes them: on the JAX side, what ``to_jax`` made of
    them); a loss that fails, or returns more than one number, is a :class:`SpecError` that says what it was given.

    Args:
        loss: the spec's loss function.
        which: ``"torch_loss"`` or ``"jax_loss"``, as messages name it.
        output: the model's output, as compared.
        inputs: the inputs, as that framework's model takes them.
        targets: the targets.

    Returns:
        The loss's value as it returned it: a number, or an array of one element whatever its shape.

    Raises:
        SpecError: the loss raised (a SpecError of its own passes as it is), or returned more than one number; the
            message says what it was given.
    """
    given = (f"{which}(output, *inputs, *targets) with output {_described(output)}, inputs "
             f"[{', '.join(_described(x) for x in inputs)}], targets [{', '.join(_described(t) for t in targets)}]")
    try:
        value = loss(output, *inputs, *targets)
    except SpecError:
        raise
    except Exception as error:
        message = str(error).strip().splitlines()[0] if str(error).strip() else ""
        raise SpecError(f"{which} failed: {type(error).__name__}: {message}; check-port called {given}") from error
    # How many numbers it holds, whatever its shape ((), (1,), (1, 1) ...): a torch.Tensor's numel() (its size() is its
    # shape), a NumPy or JAX array's size, 1 for a Python number.
    count = value.numel() if callable(getattr(value, "numel", None)) else np.size(value)
    if count != 1:
        raise SpecError(f"{which} returned {_described(value)}, not one number; check-port called {given}")
    return value


def differentiated_inputs(spec: Spec, inputs) -> list[int]:
    """INPUT_GRADIENTS: the positions of the inputs differentiated: the floating-point ones (under --by-block, among
    the block's positional arguments only; its keyword arguments' arrays follow them, not differentiated).

    Args:
        spec: the spec (``positional``: under --by-block, how many leading inputs are the block's positional ones).
        inputs: the model's inputs.

    Returns:
        The positions, in order.
    """
    limit = len(inputs) if spec.positional is None else spec.positional
    return [i for i, x in enumerate(inputs[:limit]) if np.asarray(x).dtype.kind == "f"]
