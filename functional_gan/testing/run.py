"""What one check holds (:class:`Run`): the spec's pieces on both sides, the pairing, PyTorch's runs and what they
found, the notes for the report and the memory policy. :func:`.prepare.prepare` makes it."""

from __future__ import annotations

import dataclasses
from typing import Any, Callable

from . import apis
from .memory import MemoryPolicy
from .pairing import Pairing
from .spec import Spec


PERMUTED_RUNS = 2  # float32 PyTorch runs with the batch in another order, besides the plain one



@dataclasses.dataclass
class Run:
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
    working: dict = dataclasses.field(default_factory=dict)  # a working PyTorch model per dtype (see prepare)
    reference_rng: Any = None  # PyTorch's random state as the reference's step of this step began
    # a cause switched off → the last step's rows up to the gradients, by (stage, name), of the port without it
    counterfactuals: dict = dataclasses.field(default_factory=dict)
    make_working: Callable | None = None  # a working PyTorch model of a dtype, built on first use
    torch_islands: dict | None = None  # PyTorch64's lower-precision islands {module: dtype}, found at its first step
    memory: MemoryPolicy = dataclasses.field(default_factory=MemoryPolicy)  # how the check holds its memory
    parameter_bytes: int = 0  # the PyTorch model's parameters in float32 bytes (what the memory policy weighs)
