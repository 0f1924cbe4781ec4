"""A check-port spec: the Python file (or module, or keywords) that names a PyTorch model, its JAX port and how to
run them; :func:`load_spec` and :func:`spec_from_module` read one into a :class:`Spec`."""

from __future__ import annotations

import dataclasses
import importlib.util
import sys
from pathlib import Path
from types import ModuleType
from typing import TYPE_CHECKING, Any, Callable

from functional_gan.errors import UserError

if TYPE_CHECKING:
    import torch


class SpecError(UserError):
    """A spec the checker cannot use; the message says what is missing or what could not be paired."""


class PortDtypeError(SpecError):
    """The port computes in another precision than the one asked: it cannot be checked in that one."""






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
    output: str | int | None = None  # OUTPUT: the field (attribute or key) or index of both models' outputs compared
    per_sample: bool = False
    batch_axis: str = "batch"
    # --by-block: blocks() -> [(PyTorch module name, the port's block, or a function that builds it)], how a block's
    # inputs and outputs move between the frameworks (default: the API's layout), and BLOCK_OUTPUT (as OUTPUT)
    blocks: Callable[[], list] | None = None
    block_to_jax: Callable[..., tuple] | None = None
    block_from_jax: Callable[[Any], Any] | None = None
    block_output: str | int | None = None
    # INPUT_GRADIENTS: the gradient of the loss with respect to each floating-point input compared too (always, block
    # by block: a block's input gradient is what it passes to the blocks before it)
    input_gradients: bool = False
    # TAPS: {name: (PyTorch's function, the port's function)}, each "module:function": their outputs compared, per call
    # (functional_gan.testing.taps)
    taps: dict | None = None
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


def select_output(output, field: str | int | None, side: str, from_jax=None):
    """The model's output as compared: ``output`` itself when ``field`` is None, else its field ``field`` (a key of a
    dict, an attribute of an object such as Hugging Face's ``ModelOutput`` or a dataclass, or an index of a tuple).
    An output that is not an array (nor a number) without ``OUTPUT`` is a :class:`SpecError` naming its fields. An array
    is the output as it is, ``OUTPUT`` or not (one side may return ``(logits, loss)`` and the other the logits).
    ``from_jax`` (the port's side, without ``OUTPUT``): the spec's ``from_jax`` applied first where the output is not an
    array, as the spec's author meant it (``lambda out: out.logits``)."""
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
    check_param_map(values.get("param_map"))
    fields = {f.name for f in dataclasses.fields(Spec)} - {"name"}
    chosen = {k: v for k, v in values.items() if k in fields}
    chosen.setdefault("jax_model", None)
    for flag in ("train", "per_sample", "input_gradients"):
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


def _described(value) -> str:
    shape = getattr(value, "shape", None)
    if shape is not None:
        return f"{tuple(shape)} {getattr(value, 'dtype', '')}".strip()
    return type(value).__name__


def call_loss(loss, which: str, output, inputs: tuple, targets: tuple):
    """The spec's ``torch_loss``/``jax_loss`` called as ``loss(output, *inputs, *targets)`` (the output as compared,
    after ``OUTPUT``; the inputs as that framework's model takes them: on the JAX side, what ``to_jax`` made of
    them); a loss that fails, or returns more than one number, is a :class:`SpecError` that says what it was given."""
    given = (f"{which}(output, *inputs, *targets) with output {_described(output)}, inputs "
             f"[{', '.join(_described(x) for x in inputs)}], targets [{', '.join(_described(t) for t in targets)}]")
    try:
        value = loss(output, *inputs, *targets)
    except SpecError:
        raise
    except Exception as error:
        message = str(error).strip().splitlines()[0] if str(error).strip() else ""
        raise SpecError(f"{which} failed: {type(error).__name__}: {message}; check-port called {given}") from error
    size = getattr(value, "size", None)
    size = size() if callable(size) else size  # a torch.Tensor's size() is its shape
    if getattr(value, "shape", ()) not in ((), (1,)) and size != 1:
        raise SpecError(f"{which} returned {_described(value)}, not one number; check-port called {given}")
    return value
