"""By block, the rest of the model: the parts outside the blocks (embeddings, a final norm, the head, the loss, the
optimizer's update of their parameters) and the wiring between blocks, checked at the memory of those parts alone.

Each block, on both sides, is replaced by a stand-in that adds to its first input what PyTorch's block added to it in
the float64 run (``output - input``, recorded): fed PyTorch's own input it gives PyTorch's block's output; its gradient
passes straight through (the identity's), the same on both sides. The whole model is then checked as usual
(:func:`.check.check_port`) with the stand-ins in place: the embeddings' output and gradients, the final norm's, the
head's, the loss and the update are compared as in a whole-model check, but with no block's parameters in memory.

The wiring shows at the stand-ins' inputs: each records the arguments its model gives it (rows named
``model.layers.3:block input[0]``), PyTorch's converted by the spec's ``block_to_jax`` to the port's block's arguments
(without one, the first argument alone), paired in order with the port's. A port that feeds block 3 the output of
block 1, scales the stream between blocks, or computes a rotary table or an attention mask of its own wrongly
outside the blocks diverges there.

Where a block's output has another shape than its first input (a downsampling ResNet stage), its stand-in gives the
recorded output as a constant: no gradient passes it, on either side, so the gradients of what lies before it are
compared as zero. Found only where the port's blocks are a list the port's model holds (NNX's ``nnx.List`` or a
Python list, found as the default ``--by-block`` finds them); elsewhere (Linen, a stack run by a scan) the report
says the outside parts were not compared.
"""

from __future__ import annotations

import dataclasses
from typing import Any

import numpy as np
import torch

TAP = "block input"


# An additive attention mask's masked entries: PyTorch's are its dtype's lowest value (float64's -1.8e308 in the
# float64 run, float32's -3.4e38 in float32), a port's as often -1e9 or -inf; any of them masks the same (exp of it is
# 0). Compared, they would differ by all of their scale: each argument's values are compared clipped below at MASKED.
MASKED = -1e4


def torch_block_input(*tensors):
    """The arguments a block is given in PyTorch's model (tapped: their values are rows, masked entries clipped)."""
    return tuple(torch.clamp(t.detach(), min=MASKED) for t in tensors)


def port_block_input(*arrays):
    """The arguments a block is given in the port's model (tapped: their values are rows, masked entries clipped)."""
    import jax
    import jax.numpy as jnp

    return tuple(jnp.maximum(jax.lax.stop_gradient(a), MASKED) for a in arrays)


@dataclasses.dataclass(eq=False)
class Recorded:
    """What PyTorch's block did in the float64 run: its output less its first input (PyTorch's layout and the port's,
    float64), or its output where the shapes differ (``constant``)."""

    torch_offset: np.ndarray
    port_offset: np.ndarray | None  # None: the port's layout is found from its input's shape (as is, or channels-last)
    constant: bool
    tuple_output: int | None  # the output's length where the block returned a tuple (its first item the stream)


def _channels_last(array: np.ndarray) -> np.ndarray:
    return np.moveaxis(array, 1, -1) if array.ndim >= 3 else array


def _float(value) -> bool:
    dtype = getattr(value, "dtype", None)
    return dtype is not None and np.dtype(str(dtype).replace("torch.", "")).kind == "f"


class TorchStandIn(torch.nn.Module):
    """PyTorch's block replaced: its first input plus the recorded offset (or the recorded output)."""

    def __init__(self, recorded: Recorded, to_port=None, positional: int = 1):
        super().__init__()
        self.recorded = recorded
        self.to_port = to_port
        self.positional = positional

    def forward(self, *args, **kwargs):
        x = args[0]
        torch_block_input(*self._as_port(args, kwargs))
        offset = torch.as_tensor(self.recorded.torch_offset, dtype=x.dtype, device=x.device)
        y = offset + 0 * x.sum() if self.recorded.constant else x + offset
        if self.recorded.tuple_output is not None:
            return (y,) + (None,) * (self.recorded.tuple_output - 1)
        return y

    def _as_port(self, args, kwargs) -> list:
        """The block's arguments as the port's block takes them (``block_to_jax``), its float tensors only."""
        if self.to_port is None:
            return [args[0]]
        from torch.utils import _pytree

        def plain(value):
            return value.detach().cpu().numpy() if torch.is_tensor(value) else value

        converted = self.to_port(*[plain(a) for a in args], **_pytree.tree_map(plain, dict(kwargs)))
        converted = converted if isinstance(converted, (tuple, list)) else (converted,)
        return [torch.as_tensor(np.asarray(v)) for v in converted if _float(np.asarray(v))]


class _Held:
    """A constant a port's stand-in holds: not an array of the port's state (no row, no parameter)."""

    def __init__(self, value):
        self.value = value


def _port_call(held: _Held, all_arguments: bool, args, kwargs):
    import jax.numpy as jnp

    recorded: Recorded = held.value
    x = args[0]
    values = list(args) + list(kwargs.values()) if all_arguments else [x]
    port_block_input(*[v for v in values if hasattr(v, "dtype") and jnp.issubdtype(v.dtype, jnp.floating)])
    offset = recorded.port_offset
    if offset is None:
        offset = recorded.torch_offset
        if not recorded.constant and tuple(offset.shape) != tuple(x.shape):
            offset = _channels_last(offset)
    offset = jnp.asarray(offset, x.dtype)
    y = offset + 0 * jnp.sum(x) if recorded.constant else x + offset
    if recorded.tuple_output is not None:
        return (y,) + (None,) * (recorded.tuple_output - 1)
    return y


def nnx_stand_in(recorded: Recorded, all_arguments: bool):
    """The port's stand-in for one block: an NNX module that adds PyTorch's recorded offset to its first argument (or
    gives the recorded output), its arguments tapped as the block's input.

    Args:
        recorded: what PyTorch's block did in the float64 run (:class:`Recorded`).
        all_arguments: tap every floating-point argument, positional and keyword (the spec has ``block_to_jax``); False:
            the first argument alone.

    Returns:
        An NNX module holding no variables, called as the port's block: its first argument plus the offset (the port's
        layout of it, or PyTorch's moved channels-last where the shapes differ), a tuple padded with None where
        PyTorch's block returned one.
    """
    from flax import nnx

    class StandIn(nnx.Module):
        """The port's block replaced: its first input plus the recorded offset."""

        def __init__(self):
            self.held = _Held(recorded)
            self.all_arguments = all_arguments

        def __call__(self, *args, **kwargs):
            return _port_call(self.held, self.all_arguments, args, kwargs)

    return StandIn()


def find_list(port, length: int, lists) -> tuple[Any, str] | None:
    """(the object holding the port's list of blocks, the attribute's name), where the port holds exactly one list of
    ``length`` modules (``lists``: :func:`.blocks._module_lists`'s finding).

    Args:
        port: the port's model.
        length: the number of blocks.
        lists: ``lists(port, length) -> [(dotted attribute path, modules)]``, as :func:`.blocks._module_lists`.

    Returns:
        ``(owner, attribute name)``, or None where the port holds no such list or more than one.
    """
    found = lists(port, length)
    if len(found) != 1:
        return None
    path = found[0][0].split(".")
    owner = port
    for part in path[:-1]:
        owner = getattr(owner, part)
    return owner, path[-1]


def replace_torch_blocks(model: torch.nn.Module, stand_ins: dict[str, torch.nn.Module]) -> None:
    """Each named block of PyTorch's ``model`` replaced by its stand-in, in place.

    Args:
        model: PyTorch's model.
        stand_ins: {a block's dotted module name: the module put in its place (a :class:`TorchStandIn`)}.
    """
    for name, stand_in in stand_ins.items():
        parent, _, last = name.rpartition(".")
        setattr(model.get_submodule(parent) if parent else model, last, stand_in)
