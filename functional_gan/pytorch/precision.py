"""Precision settings on the PyTorch side: a default-dtype context and full float32 for parity."""

from __future__ import annotations

import contextlib

import torch


@contextlib.contextmanager
def default_dtype(dtype: torch.dtype):
    """``torch.set_default_dtype(dtype)`` for a block, restored afterwards (float64 reference runs)."""
    previous = torch.get_default_dtype()
    torch.set_default_dtype(dtype)
    try:
        yield
    finally:
        torch.set_default_dtype(previous)


def torch_dtype(name: str) -> torch.dtype:
    return {"float32": torch.float32, "float64": torch.float64}[name]


def full_float32_precision(allow_tf32: bool = False) -> None:
    """No TF32 passes on GPUs (no effect on CPU): what parity checks and fair benchmarks need.

    ``allow_tf32=True``: PyTorch's matmuls and cuDNN convolutions may round their inputs to TF32
    (10-bit mantissa) on GPUs that have it, the speed setting many training scripts turn on.
    """
    torch.backends.cuda.matmul.allow_tf32 = allow_tf32
    torch.backends.cudnn.allow_tf32 = allow_tf32
