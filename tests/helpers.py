"""Shared test helpers: NCHW↔NHWC and PyTorch model ↔ GANState."""

from __future__ import annotations

import jax.numpy as jnp
import numpy as np

from functional_gan import convert
from functional_gan.replay import state_from_state_dicts
from functional_gan.train import GANState


def nchw_to_nhwc(x):
    return np.asarray(x).transpose(0, 2, 3, 1)


def nhwc_to_nchw(x):
    return np.asarray(x).transpose(0, 3, 1, 2)


def state_from_torch(config, net_g, net_d) -> GANState:
    """A fresh GANState (fresh Adam) holding the PyTorch models' exact weights and running statistics."""
    from comparisons.torch_reference import state_dict_numpy

    dtype = jnp.float64 if next(net_g.parameters()).dtype.itemsize == 8 else jnp.float32
    return state_from_state_dicts(config, state_dict_numpy(net_g), state_dict_numpy(net_d), dtype)


def max_state_dict_difference(jax_params, jax_batch_stats, torch_module) -> float:
    from comparisons.torch_reference import state_dict_numpy

    ours = convert.variables_to_state_dict(jax_params, jax_batch_stats)
    theirs = state_dict_numpy(torch_module)
    assert ours.keys() == theirs.keys()
    return max(float(np.max(np.abs(ours[k].astype(np.float64) - theirs[k].astype(np.float64)))) for k in theirs)
