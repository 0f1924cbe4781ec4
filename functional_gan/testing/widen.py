"""A JAX function with its lower-precision islands removed: every floating-point value it computes narrower than the
check's dtype (a cast to float32 inside a float64 model, a dot asked for a float32 result, a Flax module whose
``dtype`` is float32) computed in that dtype instead.

A port that computes part of a float64 model in float32 (Hugging Face's Flax Llama computes its RMSNorm's variance in
float32 whatever the model's dtype) errs there as float32 does, and everything downstream inherits that error. The
same program with the casts removed is the port as it would be without its islands; the difference between the two is
the islands' own error, which :func:`functional_gan.testing.check_port` counts as the port's noise.

The program is traced to a jaxpr and evaluated again equation by equation (`jax.make_jaxpr`; the jaxpr interpreter of
JAX's "Writing custom interpreters" tutorial), with three changes: a ``convert_element_type`` to a narrower floating
type keeps its operand's type, a narrower floating dtype asked of a primitive (``preferred_element_type``, ``dtype``)
is the wide one, and operands of mixed floating types are widened to the widest among them. Calls (``jit``,
``custom_jvp_call``, ``custom_vjp_call``, remat) are evaluated inline; ``scan``, ``while`` and ``cond`` are rebuilt
with their bodies widened. Any other primitive, or one that refuses widened operands, runs on its operands cast back
to the types it was traced with.
"""

from __future__ import annotations

import re
from typing import Callable

import jax
import jax.numpy as jnp
import numpy as np
from jax import lax
from jax.extend import core

_CALL_PARAMS = ("jaxpr", "call_jaxpr", "fun_jaxpr")


def _floating(dtype) -> bool:
    try:
        return jax.dtypes.issubdtype(dtype, np.floating)
    except TypeError:  # an extended dtype (a PRNG key)
        return False


def _narrower(dtype, wide) -> bool:
    return _floating(dtype) and np.dtype(dtype).itemsize < np.dtype(wide).itemsize


def islands(fun: Callable, *args, wide=jnp.float64) -> dict[str, str]:
    """Where ``fun`` on ``args`` computes a floating-point value narrower than ``wide`` from a ``wide`` one: {module
    path of JAX's name stack (Flax Linen names its modules there; "" where the stack names none): the narrow dtype's
    name}, in the order they first narrow. Empty: no island.

    Args:
        fun: a JAX function.
        *args: its arguments (arrays, or shapes such as ``jax.ShapeDtypeStruct``): it is traced, not run.
        wide: the check's floating-point dtype.

    Returns:
        The islands, as above.
    """
    found: dict[str, str] = {}

    def visit(jaxpr):
        for eqn in jaxpr.eqns:
            for sub in core.jaxprs_in_params(eqn.params):
                visit(sub)
            wide_in = any(_floating(getattr(v.aval, "dtype", None)) and not _narrower(v.aval.dtype, wide)
                          for v in eqn.invars)
            narrow = [v.aval.dtype for v in eqn.outvars if _narrower(getattr(v.aval, "dtype", None), wide)]
            if wide_in and narrow:
                found.setdefault(_module_path(str(eqn.source_info.name_stack)), np.dtype(narrow[0]).name)

    visit(jax.make_jaxpr(fun)(*args).jaxpr)
    return found


def _module_path(stack: str) -> str:
    """"transpose(jvp(Model))/layers_0/ln" → "layers_0/ln": the transformations and the top module left out."""
    parts = [re.sub(r"^(?:\w+\()+|\)+$", "", p) for p in stack.split("/") if p]
    return "/".join(parts[1:])


def widened(fun: Callable, wide=jnp.float64) -> Callable:
    """``fun`` with its islands narrower than ``wide`` computed in ``wide`` (see the module's docstring). The result is
    traced afresh on each call; wrap it in ``jax.jit`` to run it compiled.

    Args:
        fun: a JAX function of positional arguments (pytrees).
        wide: the floating-point dtype the islands are computed in.

    Returns:
        A function of the same arguments, with the structure of ``fun``'s output.
    """

    def run(*args):
        closed, shapes = jax.make_jaxpr(fun, return_shape=True)(*args)
        outs = _eval(closed.jaxpr, closed.consts, jax.tree_util.tree_leaves(args), wide)
        return jax.tree_util.tree_unflatten(jax.tree_util.tree_structure(shapes), outs)

    return run


def _widen(x, wide):
    return lax.convert_element_type(x, wide) if _narrower(jnp.result_type(x), wide) else x


def _as(x, dtype):
    return x if jnp.result_type(x) == dtype else lax.convert_element_type(x, dtype)


def _eval(jaxpr, consts, args, wide) -> list:
    env = {}

    def read(v):
        return v.val if isinstance(v, core.Literal) else env[v]

    for var, value in zip(jaxpr.constvars, consts):
        env[var] = value
    for var, value in zip(jaxpr.invars, args):
        env[var] = value
    for eqn in jaxpr.eqns:
        outs = _apply(eqn, [read(v) for v in eqn.invars], wide)
        for var, value in zip(eqn.outvars, outs):
            if not isinstance(var, core.DropVar):
                env[var] = value
    return [read(v) for v in jaxpr.outvars]


def _closed(sub):
    return (sub.jaxpr, sub.consts) if isinstance(sub, core.ClosedJaxpr) else (sub, ())


def _apply(eqn, invals: list, wide) -> list:
    prim, params = eqn.primitive, dict(eqn.params)
    name = prim.name
    if name == "convert_element_type" and _narrower(params["new_dtype"], wide):
        return [_as(invals[0], wide)]
    if name == "reduce_precision":
        return [invals[0]]
    if name == "scan":
        return _scan(params, invals, wide)
    if name == "while":
        return _while(params, invals, wide)
    if name == "cond":
        return _cond(params, invals, wide)
    for key in _CALL_PARAMS:  # jit, custom_jvp_call, custom_vjp_call, remat: evaluated inline
        if key in params and isinstance(params[key], (core.ClosedJaxpr, core.Jaxpr)):
            sub, consts = _closed(params[key])
            return _eval(sub, consts, invals[len(invals) - len(sub.invars):], wide)
    try:
        if list(core.jaxprs_in_params(params)):
            raise TypeError("a primitive with a body of its own")
        widened_params = {k: (wide if k in ("dtype", "preferred_element_type", "new_dtype")
                              and v is not None and _narrower(v, wide) else v) for k, v in params.items()}
        floats = [jnp.result_type(x) for x in invals if _floating(jnp.result_type(x))]
        if floats and name not in ("bitcast_convert_type",):
            widest = max(floats, key=lambda d: np.dtype(d).itemsize)
            invals = [_as(x, widest) if _narrower(jnp.result_type(x), widest) else x for x in invals]
        out = prim.bind(*invals, **widened_params)
    except Exception:  # as it was traced: its operands in their own types
        invals = [_as(x, v.aval.dtype) if hasattr(v.aval, "dtype") and _floating(v.aval.dtype) else x
                  for x, v in zip(invals, eqn.invars)]
        out = prim.bind(*invals, **params)
    return list(out) if prim.multiple_results else [out]


def _scan(params, invals, wide) -> list:
    body, body_consts = _closed(params["jaxpr"])
    if "num_consts" in params:
        n_consts, n_carry = params["num_consts"], params["num_carry"]
    else:  # jax 0.12: the operands' grouping (consts, carry, xs) as a flat tree
        n_consts, n_carry = (len(list(group.vals)) for group in params["ft_in"].unpack()[:2])
    consts, init, xs = invals[:n_consts], invals[n_consts:n_consts + n_carry], invals[n_consts + n_carry:]
    init = [_widen(x, wide) for x in init]

    def step(carry, x):
        out = _eval(body, body_consts, [*consts, *carry, *x], wide)
        return [_as(o, jnp.result_type(c)) for o, c in zip(out[:n_carry], carry)], out[n_carry:]

    carry, ys = lax.scan(step, init, xs, length=params["length"], reverse=params["reverse"],
                         unroll=params.get("unroll", 1))
    return [*carry, *ys]


def _while(params, invals, wide) -> list:
    cond, cond_consts = _closed(params["cond_jaxpr"])
    body, body_consts = _closed(params["body_jaxpr"])
    nc, nb = params["cond_nconsts"], params["body_nconsts"]
    cc, bc, init = invals[:nc], invals[nc:nc + nb], [_widen(x, wide) for x in invals[nc + nb:]]

    def body_fn(carry):
        out = _eval(body, body_consts, [*bc, *carry], wide)
        return [_as(o, jnp.result_type(c)) for o, c in zip(out, carry)]

    return list(lax.while_loop(lambda carry: _eval(cond, cond_consts, [*cc, *carry], wide)[0], body_fn, init))


def _cond(params, invals, wide) -> list:
    index, operands = invals[0], invals[1:]

    def branch(closed):
        sub, consts = _closed(closed)
        return lambda *ops: [_widen(o, wide) for o in _eval(sub, consts, list(ops), wide)]

    return list(lax.switch(index, [branch(b) for b in params["branches"]], *operands))
