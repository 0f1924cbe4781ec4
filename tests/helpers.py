"""Shared test helpers: NCHW↔NHWC, PyTorch model ↔ GANState, one tree_allclose, a free port, a run's grids."""

from __future__ import annotations

import socket
from pathlib import Path

import jax
import jax.numpy as jnp
import numpy as np

from functional_gan import convert
from functional_gan.replay import state_from_state_dicts
from functional_gan.train import GANState


def nchw_to_nhwc(x):
    return np.asarray(x).transpose(0, 2, 3, 1)


def nhwc_to_nchw(x):
    return np.asarray(x).transpose(0, 3, 1, 2)


def tree_allclose(a, b, rtol: float = 0.0, atol: float = 0.0) -> bool:
    """Same structure, and every leaf equal within the tolerances (exact by default)."""
    if jax.tree_util.tree_structure(a) != jax.tree_util.tree_structure(b):
        return False
    return all(
        np.allclose(np.asarray(x), np.asarray(y), rtol=rtol, atol=atol)
        for x, y in zip(jax.tree_util.tree_leaves(a), jax.tree_util.tree_leaves(b))
    )


def state_from_torch(config, net_g, net_d) -> GANState:
    """A fresh GANState (fresh Adam) holding the PyTorch models' exact weights and running statistics."""
    from functional_gan.pytorch.dcgan import state_dict_numpy

    dtype = jnp.float64 if next(net_g.parameters()).dtype.itemsize == 8 else jnp.float32
    return state_from_state_dicts(config, state_dict_numpy(net_g), state_dict_numpy(net_d), dtype)


def max_state_dict_difference(jax_params, jax_batch_stats, torch_module) -> float:
    from functional_gan.pytorch.dcgan import state_dict_numpy

    ours = convert.variables_to_state_dict(jax_params, jax_batch_stats)
    theirs = state_dict_numpy(torch_module)
    assert ours.keys() == theirs.keys()
    return max(float(np.max(np.abs(ours[k].astype(np.float64) - theirs[k].astype(np.float64)))) for k in theirs)


def free_port() -> int:
    """A TCP port free on 127.0.0.1 now (for a test's coordinator)."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def run_grids(run: Path) -> dict[str, bytes]:
    """A run folder's fixed-noise grids, by file name: two runs that trained alike drew the same bytes."""
    return {p.name: p.read_bytes() for p in sorted((run / "samples").glob("iter_*.png"))}
