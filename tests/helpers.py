"""Shared test helpers: NCHW↔NHWC and PyTorch model ↔ GANState."""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np

from functional_gan import convert
from functional_gan.train import GANState, make_optimizer


def nchw_to_nhwc(x):
    return np.asarray(x).transpose(0, 2, 3, 1)


def nhwc_to_nchw(x):
    return np.asarray(x).transpose(0, 3, 1, 2)


def state_from_torch(config, net_g, net_d) -> GANState:
    """A fresh GANState (fresh Adam) holding the PyTorch models' exact weights and running statistics."""
    from comparisons.torch_reference import state_dict_numpy

    g = convert.state_dict_to_variables(state_dict_numpy(net_g))
    d = convert.state_dict_to_variables(state_dict_numpy(net_d))
    optimizer = make_optimizer(config)
    state = GANState(
        step=np.zeros((), np.int32),
        generator_params=g["params"],
        generator_batch_stats=g["batch_stats"],
        discriminator_params=d["params"],
        discriminator_batch_stats=d["batch_stats"],
        generator_opt_state=optimizer.init(g["params"]),
        discriminator_opt_state=optimizer.init(d["params"]),
    )
    return jax.tree_util.tree_map(jnp.asarray, state)


def max_state_dict_difference(jax_params, jax_batch_stats, torch_module) -> float:
    from comparisons.torch_reference import state_dict_numpy

    ours = convert.variables_to_state_dict(jax_params, jax_batch_stats)
    theirs = state_dict_numpy(torch_module)
    assert ours.keys() == theirs.keys()
    return max(float(np.max(np.abs(ours[k].astype(np.float64) - theirs[k].astype(np.float64)))) for k in theirs)
