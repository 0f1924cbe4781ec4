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


