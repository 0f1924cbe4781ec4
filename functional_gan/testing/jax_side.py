"""The JAX side of a check: one step of the port as a pure function (forward with per-layer outputs, loss, gradients,
optimizer update), and the check that it computes in the precision asked."""

from __future__ import annotations

from typing import Callable

import jax
import jax.numpy as jnp
import numpy as np

from . import apis
from .spec import PortDtypeError, Spec, call_loss, select_output


def jax_step_function(adapter: apis.Adapter, spec: Spec, optimizer, keep_state: bool = True) -> Callable:
    """One step of the port as a pure function: (variables, inputs, targets, opt_state) -> what it computed.

    ``opt_state`` None: the optimizer's initial state, made inside (not held beside the step as an input).
    ``keep_state`` False: the optimizer's state after the step is not returned (a check's last step: no step follows;
    Adam's state over 124M parameters is 2 GB in float64)."""

    def step(variables, inputs, targets, opt_state):
        # ``variables``: params (PyTorch's, each step), batch_stats and the adapter's "carry" (the port's own state,
        # from its previous step): the capture call and the training call both start from that state, and the
        # training call's state is the one carried to the next step.
        output, stats, layers, carry = adapter.apply(variables, inputs, True)
        seen = {"output": select_output(output, spec.output, "the port", spec.from_jax), "layers": layers,
                "batch_stats": stats,
                "carry": carry}
        if spec.jax_loss is None:
            return seen

        # INPUT_GRADIENTS: the floating-point inputs are differentiated too, by position
        # (under --by-block, the block's positional inputs only: its keyword arguments' arrays follow them)
        limit = len(inputs) if spec.positional is None else spec.positional
        floats = {i: x for i, x in enumerate(inputs[:limit])
                  if x is not None and jnp.issubdtype(jnp.asarray(x).dtype, jnp.floating)} if spec.input_gradients else {}

        def loss_fn(params, differentiated):
            given = tuple(differentiated.get(i, x) for i, x in enumerate(inputs))
            out, stats, _, carry = adapter.apply({**variables, "params": params}, given, False)
            out = select_output(out, spec.output, "the port", spec.from_jax)
            return call_loss(spec.jax_loss, "jax_loss", out, given, targets).reshape(()), (stats, carry)

        if spec.input_gradients:
            (loss, (stats, carry)), (grads, input_grads) = jax.value_and_grad(loss_fn, argnums=(0, 1), has_aux=True)(
                variables["params"], floats)
            seen.update(input_grads=input_grads)
        else:
            (loss, (stats, carry)), grads = jax.value_and_grad(loss_fn, has_aux=True)(variables["params"], {})
        seen.update(loss=loss, grads=grads, batch_stats=stats, carry=carry)
        if optimizer is not None:
            import optax

            if opt_state is None:
                opt_state = optimizer.init(variables["params"])
            updates, opt_state = optimizer.update(grads, opt_state, variables["params"])
            seen.update(params=optax.apply_updates(variables["params"], updates))
            if keep_state:
                seen.update(opt_state=opt_state)
        return seen

    return step


def check_dtypes(seen: dict, dtype: str, run) -> None:
    """The port's outputs are in the precision asked, or a PortDtypeError names the first layer that is not. In float64
    a layer that computes in float32 inside a model whose output is float64 is an island, not refused: the check
    measures its error (:mod:`.widen`) and judges what follows against it."""
    torch_order = [n for n, _ in run.sides["ref"][0].named_modules() if n in run.layer_paths]
    layer_paths = run.layer_paths
    def wrong(value) -> str | None:  # read off the arrays the port returned (a Python number has no dtype of its own)
        for leaf in jax.tree_util.tree_leaves(value):
            kind = np.dtype(getattr(leaf, "dtype", np.dtype(dtype)))
            if np.issubdtype(kind, np.floating) and kind != np.dtype(dtype):
                return str(kind)
        return None

    places = [(name or "(model)", seen["layers"].get(layer_paths[name])) for name in torch_order]
    places.append(("its output", seen["output"]))
    if dtype == "float64" and wrong(seen["output"]) is None:
        return  # a layer narrower inside a float64 output: an island, judged against its own precision (widen.py)
    for where, value in places:
        got = wrong(value) if value is not None else None
        if got is not None:
            raise PortDtypeError(
                f"the port computes in {got}, not {dtype} as asked: {where} gives {got} from {dtype} inputs and "
                f"parameters (a dtype fixed inside the port: Flax's dtype='{got}', a cast, or an NNX layer built with "
                f"param_dtype={got}, the default, which nnx.Embed also takes as the dtype it computes in). It cannot be "
                f"checked in {dtype} as it is: check it with --dtype {got}, or build it to compute in {dtype} (for NNX, "
                f"param_dtype=jnp.zeros(()).dtype in jax_model(), which is {dtype} under the check)")


