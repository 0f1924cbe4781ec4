"""PyTorch ``state_dict`` ↔ Flax variables, exactly (no copy changes a bit).

Parameters are stored in PyTorch's layouts (see :mod:`functional_gan.layers`), so the conversion
is a renaming: ``main.N.<name>`` ↔ ``{'params' or 'batch_stats': {'main_N': {<name>: ...}}}``.
BatchNorm's ``running_mean``, ``running_var`` and ``num_batches_tracked`` are batch statistics;
everything else is a parameter.

File I/O never unpickles code: ``.pt``/``.pth`` files are read with ``torch.load(weights_only=True)``
and ``.safetensors`` files with safetensors. Both need the ``torch`` extra.
"""

from __future__ import annotations

import os
from pathlib import Path

import numpy as np

from functional_gan.errors import UserError

BATCH_STAT_NAMES = ("running_mean", "running_var", "num_batches_tracked")


class CheckpointFormatError(UserError):
    """A weights file that cannot be read or does not fit the model."""


def state_dict_to_variables(state_dict: dict[str, np.ndarray]) -> dict:
    """``{'main.3.weight': array, ...}`` → ``{'params': {...}, 'batch_stats': {...}}`` (NumPy leaves).

    PyTorch: reads what ``net.state_dict()`` returns (as arrays); the inverse of :func:`variables_to_state_dict`.
    """
    variables: dict = {"params": {}, "batch_stats": {}}
    for key, value in state_dict.items():
        parts = key.split(".")
        if len(parts) != 3 or parts[0] != "main" or not parts[1].isdigit():
            raise CheckpointFormatError(f"unexpected state_dict key {key!r}: expected 'main.<index>.<name>' as in the tutorial")
        _, index, name = parts
        collection = "batch_stats" if name in BATCH_STAT_NAMES else "params"
        array = np.asarray(value)
        if name == "num_batches_tracked":
            array = array.astype(np.int32)  # PyTorch keeps int64; JAX's default integer is int32
        variables[collection].setdefault(f"main_{index}", {})[name] = array
    return variables


def variables_to_state_dict(params, batch_stats) -> dict[str, np.ndarray]:
    """Flax variables → ``state_dict`` arrays with PyTorch's names (``num_batches_tracked`` as int64).

    PyTorch: the result loads with ``net.load_state_dict(..., strict=True)`` into the tutorial's models.
    """
    state_dict = {}
    for collection in (params, batch_stats):
        for module_name, leaves in collection.items():
            index = module_name.removeprefix("main_")
            for name, value in leaves.items():
                array = np.asarray(value)
                if name == "num_batches_tracked":
                    array = array.astype(np.int64)
                state_dict[f"main.{index}.{name}"] = array
    order = {name: i for i, name in enumerate(("weight", "bias") + BATCH_STAT_NAMES)}  # PyTorch's order
    return dict(sorted(state_dict.items(), key=lambda kv: (int(kv[0].split(".")[1]), order.get(kv[0].split(".")[2], 99))))


def state_dict_shapes(params, batch_stats) -> dict[str, tuple[int, ...]]:
    """The ``state_dict`` keys and shapes of Flax variables (arrays or ``jax.ShapeDtypeStruct``s)."""
    return {
        f"main.{module_name.removeprefix('main_')}.{name}": tuple(value.shape)
        for collection in (params, batch_stats)
        for module_name, leaves in collection.items()
        for name, value in leaves.items()
    }


def check_state_dict(state_dict: dict[str, np.ndarray], expected: dict[str, tuple[int, ...]], what: str) -> None:
    """Raise :class:`CheckpointFormatError` naming every missing, unexpected or mis-shaped key.

    PyTorch: what ``load_state_dict(strict=True)`` reports (missing keys, unexpected keys, size mismatch).
    """
    problems = [f"missing key {key} (the model expects shape {shape})" for key, shape in expected.items() if key not in state_dict]
    problems += [f"unexpected key {key} (shape {np.shape(value)})" for key, value in state_dict.items() if key not in expected]
    problems += [
        f"{key}: the file has shape {np.shape(value)}, the model expects {expected[key]}"
        for key, value in state_dict.items()
        if key in expected and tuple(np.shape(value)) != expected[key]
    ]
    if problems:
        raise CheckpointFormatError(f"the {what} state_dict does not fit the model:\n  " + "\n  ".join(problems))


def infer_generator_shape(state_dict: dict[str, np.ndarray]) -> dict:
    """nz, ngf, nc and image size of a tutorial Generator from its weight shapes."""
    conv_keys = sorted((k for k in state_dict if k.endswith(".weight") and np.ndim(state_dict[k]) == 4), key=lambda k: int(k.split(".")[1]))
    if not conv_keys:
        raise CheckpointFormatError("no transposed-convolution weights (main.N.weight of rank 4) in the Generator state_dict")
    first, last = np.shape(state_dict[conv_keys[0]]), np.shape(state_dict[conv_keys[-1]])
    return {"nz": first[0], "ngf": last[0], "nc": last[1], "image_size": 4 * 2 ** (len(conv_keys) - 1)}


def infer_discriminator_shape(state_dict: dict[str, np.ndarray]) -> dict:
    """ndf, nc and image size of a tutorial Discriminator from its weight shapes."""
    conv_keys = sorted((k for k in state_dict if k.endswith(".weight") and np.ndim(state_dict[k]) == 4), key=lambda k: int(k.split(".")[1]))
    if not conv_keys:
        raise CheckpointFormatError("no convolution weights (main.N.weight of rank 4) in the Discriminator state_dict")
    first = np.shape(state_dict[conv_keys[0]])
    return {"ndf": first[0], "nc": first[1], "image_size": 4 * 2 ** (len(conv_keys) - 1)}


def load_state_dict_file(path: str | os.PathLike) -> dict[str, np.ndarray]:
    """Read a ``torch.save(model.state_dict())`` file (weights only) or a ``.safetensors`` file as NumPy arrays.

    PyTorch: ``torch.load(path, weights_only=True)``; a pickle that carries code is refused, never run.
    """
    path = Path(path)
    if not path.is_file():
        raise CheckpointFormatError(f"weights file {str(path)!r} does not exist")
    if path.suffix == ".safetensors":
        from safetensors.numpy import load_file

        try:
            arrays = dict(load_file(str(path)))
        except Exception as error:  # safetensors raises its own error types
            raise CheckpointFormatError(f"cannot read {str(path)!r} as safetensors: {error}") from error
        # safetensors' NumPy helper hands back 0-d tensors as shape (1,); PyTorch's counters are 0-d.
        return {k: v.reshape(()) if k.endswith("num_batches_tracked") and v.size == 1 else v for k, v in arrays.items()}
    import torch

    try:
        # weights_only=True: tensors and plain containers only; a pickle that carries code is refused.
        loaded = torch.load(str(path), map_location="cpu", weights_only=True)
    except Exception as error:
        raise CheckpointFormatError(
            f"cannot read {str(path)!r} as a weights-only PyTorch state_dict "
            f"(corrupt, or a pickle carrying code, which is never unpickled): {type(error).__name__}: {error}"
        ) from error
    if not isinstance(loaded, dict) or not all(hasattr(v, "numpy") for v in loaded.values()):
        raise CheckpointFormatError(f"{str(path)!r} does not hold a state_dict (a dict of tensors)")
    return {key: value.detach().cpu().numpy() for key, value in loaded.items()}


def save_state_dict_file(state_dict: dict[str, np.ndarray], path: str | os.PathLike) -> None:
    """Write arrays as a PyTorch state_dict (``.pt``/``.pth``) or as ``.safetensors``, by the suffix.

    Written to a temporary file and renamed, so an existing file is replaced only by a complete one.
    PyTorch: ``torch.save(state_dict, path)``.
    """
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    temporary = path.with_name(path.name + ".tmp")
    try:
        if path.suffix == ".safetensors":
            from safetensors.numpy import save_file

            save_file({k: np.ascontiguousarray(v) for k, v in state_dict.items()}, str(temporary))
        else:
            import torch

            torch.save({k: torch.from_numpy(np.array(v)) for k, v in state_dict.items()}, str(temporary))  # np.array: a writable copy
        os.replace(temporary, path)
    finally:
        temporary.unlink(missing_ok=True)
