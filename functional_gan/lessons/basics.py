"""The autograd basics of the source notes: detach, requires_grad, grad_fn, no_grad, retain_graph."""

from __future__ import annotations

import jax
import jax.numpy as jnp

from .registry import Raised, register
from .registry import value as _value


# --------------------------------------------------------------------------------------------
# 1. detach() vs stop_gradient
# --------------------------------------------------------------------------------------------


def torch_detach() -> dict:
    import torch

    x = torch.tensor([5.0], requires_grad=True)
    a = x * 2
    y_hat = a + 3
    y = torch.tensor([10.0])
    try:
        torch.autograd.grad(y - y_hat.detach(), x)
        detached = "no error"
    except RuntimeError as error:
        detached = Raised.of(error)
    (connected,) = torch.autograd.grad(y - y_hat, x)
    return {"grad through y_hat.detach()": detached, "grad, connected": _value(connected)}


def jax_stop_gradient() -> dict:
    def loss(x, cut):
        a = x * 2
        y_hat = a + 3
        if cut:
            y_hat = jax.lax.stop_gradient(y_hat)
        return 10.0 - y_hat

    return {
        "grad through stop_gradient(y_hat)": float(jax.grad(loss)(5.0, True)),
        "grad, connected": float(jax.grad(loss)(5.0, False)),
    }


def torch_func_detach() -> dict:
    import torch
    from torch.func import grad

    def loss(x, cut):
        a = x * 2
        y_hat = a + 3
        if cut:
            y_hat = y_hat.detach()
        return 10.0 - y_hat

    x = torch.tensor(5.0)
    return {
        "torch.func.grad through y_hat.detach()": _value(grad(lambda x: loss(x, True))(x)),
        "torch.func.grad, connected": _value(grad(lambda x: loss(x, False))(x)),
    }

register(
    "detach",
    "detach() vs stop_gradient",
    """
    PyTorch builds the graph as it computes; `detach()` returns a tensor with no `grad_fn`, so a
    loss made from it has no path back to `x` and `torch.autograd.grad` refuses to run
    ("does not require grad"). JAX has no graph to break: `jax.grad` traces the function, and
    `stop_gradient` is an identity whose derivative is zero. So the same cut gives an *error* in
    PyTorch and a gradient of exactly *0.0* in JAX. That is a real difference: code that relied
    on PyTorch's error to catch a broken graph gets a silent zero in JAX. Connected, both give −2.
    `torch.func.grad`, PyTorch's functional API, sides with JAX: differentiating a function whose
    output was detached gives a gradient of 0.0, not an error.
    """,
    {"PyTorch": torch_detach, "torch.func": torch_func_detach, "JAX": jax_stop_gradient},
    family="basics",
)


# --------------------------------------------------------------------------------------------
# 2. requires_grad propagation vs choosing what to differentiate
# --------------------------------------------------------------------------------------------


def torch_requires_grad() -> dict:
    import torch

    x = torch.randn(5, 5)  # requires_grad=False by default
    y = torch.randn(5, 5)
    z = torch.randn((5, 5), requires_grad=True)
    a = x + y
    b = a + z
    b.sum().backward()
    return {
        "a = x + y: requires_grad": a.requires_grad,
        "b = a + z: requires_grad": b.requires_grad,
        "z.grad after b.sum().backward()": _value(z.grad[0, :2]),
        "x.grad": x.grad,
    }


def jax_argnums() -> dict:
    def f(x, y, z):
        return jnp.sum((x + y) + z)

    x = y = z = jnp.ones((5, 5))
    grad_z = jax.grad(f, argnums=2)(x, y, z)  # only z is differentiated
    grad_xz = jax.grad(f, argnums=(0, 2))(x, y, z)  # choose any subset
    grad_closure = jax.grad(lambda z_: f(x, y, z_))(z)  # or close over the constants
    return {
        "grad wrt z (argnums=2)": _value(grad_z[0, :2]),
        "grads wrt x and z (argnums=(0, 2))": len(grad_xz),
        "grad wrt z via a closure": _value(grad_closure[0, :2]),
        "x has a requires_grad attribute": hasattr(x, "requires_grad"),  # no flag: the call decides
    }


def nnx_filters() -> dict:
    import optax
    from flax import nnx

    class Sum(nnx.Module):  # x, y: state that is not a parameter (PyTorch: tensors without requires_grad)
        def __init__(self):
            self.x, self.y = nnx.Variable(jnp.ones((5, 5))), nnx.Variable(jnp.ones((5, 5)))
            self.z = nnx.Param(jnp.ones((5, 5)))

        def __call__(self):
            return jnp.sum((self.x[...] + self.y[...]) + self.z[...])

    grads = nnx.to_pure_dict(nnx.grad(lambda model: model())(Sum()))  # the module's nnx.Params only

    class Net(nnx.Module):
        def __init__(self, rngs: nnx.Rngs):
            self.encoder, self.head = nnx.Linear(3, 4, rngs=rngs), nnx.Linear(4, 1, rngs=rngs)

        def __call__(self, x):
            return self.head(jnp.tanh(self.encoder(x)))

    # Freezing (PyTorch: encoder.requires_grad_(False)): a filter names what is differentiated and updated.
    model, head_only = Net(nnx.Rngs(0)), nnx.All(nnx.Param, nnx.PathContains("head"))
    before = nnx.to_pure_dict(nnx.state(model, nnx.Param))
    frozen = nnx.grad(lambda model: jnp.mean(model(jnp.ones((2, 3))) ** 2), argnums=nnx.DiffState(0, head_only))(model)
    optimizer = nnx.Optimizer(model, optax.sgd(0.1), wrt=head_only)
    optimizer.update(model, frozen)  # in place, like optimizer.step()
    after = nnx.to_pure_dict(nnx.state(model, nnx.Param))
    return {
        "grad wrt z (nnx.grad: the module's nnx.Param)": _value(grads["z"][0, :2]),
        "the gradient's entries (x, y are nnx.Variable, not Param)": sorted(grads),
        "DiffState(0, head filter): the gradient's modules": sorted(nnx.to_pure_dict(frozen)),
        "after optimizer.update: encoder unchanged": all(
            bool(jnp.array_equal(a, b)) for a, b in zip(jax.tree.leaves(before["encoder"]), jax.tree.leaves(after["encoder"]))),
        "after optimizer.update: head changed": not bool(jnp.array_equal(before["head"]["kernel"], after["head"]["kernel"])),
    }


def torch_func_argnums() -> dict:
    import torch
    from torch.func import grad

    def f(x, y, z):
        return ((x + y) + z).sum()

    x = y = z = torch.ones(5, 5)  # no requires_grad anywhere
    grad_z = grad(f, argnums=2)(x, y, z)
    grad_xz = grad(f, argnums=(0, 2))(x, y, z)
    return {
        "grad wrt z (argnums=2)": _value(grad_z[0, :2]),
        "grads wrt x and z (argnums=(0, 2))": len(grad_xz),
        "z.requires_grad afterwards": z.requires_grad,
    }

register(
    "requires_grad",
    "requires_grad propagation vs choosing what to differentiate",
    """
    In PyTorch a flag on each tensor decides whether operations on it are recorded; an output
    requires grad if any input does, so `x + y` doesn't and `(x + y) + z` does. In JAX arrays
    carry no flag: `jax.grad(f, argnums=...)` names the arguments to differentiate at the call,
    and anything else (an argument not named, a value closed over) is a constant. `torch.func.grad`
    has the same `argnums`: no tensor needs `requires_grad=True`, and none is changed by the call.
    Flax NNX puts the flag back on the module's state, by type: `nnx.grad` differentiates a
    module's `nnx.Param`s and treats other `nnx.Variable`s as constants, and freezing part of a
    model (PyTorch: `requires_grad_(False)`) is a filter given to `nnx.grad` (`DiffState`) and to
    `nnx.Optimizer` (`wrt=`), not a flag on each tensor.
    """,
    {"PyTorch": torch_requires_grad, "torch.func": torch_func_argnums, "JAX": jax_argnums, "NNX": nnx_filters},
    family="basics",
)


# --------------------------------------------------------------------------------------------
# 3. grad_fn and the graph vs the jaxpr
# --------------------------------------------------------------------------------------------


def torch_grad_fn() -> dict:
    import torch

    x = torch.tensor([2.0], requires_grad=True)
    y = x * 3
    b = torch.tensor([1.0], requires_grad=True)
    w = torch.tensor([2.0], requires_grad=True)
    y_hat = b + w * torch.tensor([0.5])
    return {
        "y = x * 3": repr(y),
        "y_hat.grad_fn": type(y_hat.grad_fn).__name__,
        "y_hat.grad_fn.next_functions": [type(f).__name__ for f, _ in y_hat.grad_fn.next_functions],
    }


def jax_jaxpr() -> dict:
    def predict(b, w, x):
        return b + w * x

    jaxpr = jax.make_jaxpr(predict)(1.0, 2.0, 0.5)
    grad_jaxpr = jax.make_jaxpr(jax.grad(predict, argnums=(0, 1)))(1.0, 2.0, 0.5)
    return {
        "jaxpr of y_hat: equations": [eqn.primitive.name for eqn in jaxpr.jaxpr.eqns],
        "jaxpr of its gradient: equations": [eqn.primitive.name for eqn in grad_jaxpr.jaxpr.eqns],
        "y = x * 3": repr(jnp.asarray([2.0]) * 3),
    }


def torch_func_make_fx() -> dict:
    import torch
    from torch.func import grad
    from torch.fx.experimental.proxy_tensor import make_fx

    def predict(b, w, x):
        return b + w * x

    args = (torch.tensor(1.0), torch.tensor(2.0), torch.tensor(0.5))
    graph = make_fx(predict)(*args).graph
    grad_graph = make_fx(grad(predict, argnums=(0, 1)))(*args).graph
    return {
        "make_fx of y_hat: aten ops": [str(n.target) for n in graph.nodes if n.op == "call_function"],
        "make_fx of its gradient: aten ops": [str(n.target) for n in grad_graph.nodes if n.op == "call_function"],
    }

register(
    "grad_fn",
    "grad_fn and the dynamic graph vs the jaxpr",
    """
    PyTorch attaches to every result a `grad_fn` node (`MulBackward0`, `AddBackward0`) whose
    `next_functions` link back to the inputs: the graph *is* the recorded history, built during
    the forward pass and walked by `backward()`. JAX records nothing while computing; when you ask
    for a gradient it traces the function into a jaxpr (`mul`, `add`) and transforms that program
    into another program that computes the gradient. Arrays stay plain values with no history.
    PyTorch's closest counterpart is tracing a function with `make_fx` (torch.fx): the aten ops
    `mul`, `add` of the forward, and a whole program for its `torch.func.grad`, like a jaxpr.
    `functional-gan graph` draws PyTorch's graph and the jaxpr.
    """,
    {"PyTorch": torch_grad_fn, "torch.func": torch_func_make_fx, "JAX": jax_jaxpr},
    family="basics",
)


# --------------------------------------------------------------------------------------------
# 4. no_grad vs simply not differentiating
# --------------------------------------------------------------------------------------------


def torch_no_grad() -> dict:
    import torch

    x = torch.tensor([2.0], requires_grad=True)
    with torch.no_grad():
        y = x * 2
    z = x * 2
    return {
        "inside no_grad: y.requires_grad": y.requires_grad,
        "inside no_grad: y.grad_fn": y.grad_fn,
        "outside: z.grad_fn": type(z.grad_fn).__name__,
    }


def jax_no_differentiation() -> dict:
    def block(x):
        return x * 2

    x = jnp.array([2.0])
    evaluated = block(x)  # no jax.grad around it: nothing is traced for differentiation
    # To exclude a block *inside* a differentiated function, wrap its result in stop_gradient.
    grad_with_block_stopped = jax.grad(lambda x: jnp.sum(x * jax.lax.stop_gradient(block(x))))(x)
    grad_with_block = jax.grad(lambda x: jnp.sum(x * block(x)))(x)
    return {
        "block(x) evaluated": _value(evaluated),
        "d/dx x·stop_gradient(2x)": _value(grad_with_block_stopped),
        "d/dx x·2x": _value(grad_with_block),
    }


def torch_func_no_grad() -> dict:
    import torch
    from torch.func import grad

    def f(x):
        with torch.no_grad():  # inside the function: respected, this block is a constant
            c = x * 3
        return c + x * 2

    x = torch.tensor(5.0)
    with torch.no_grad():  # outside torch.func.grad: ignored, the gradient is computed anyway
        outside = grad(lambda x: x * 3 + x * 2)(x)
    return {
        "grad of (no_grad: 3x) + 2x": _value(grad(f)(x)),
        "grad of 3x + 2x, called under no_grad": _value(outside),
    }

register(
    "no_grad",
    "torch.no_grad() vs simply not differentiating",
    """
    `torch.no_grad()` switches recording off for a block, to save the memory and time of a graph
    nobody will use (evaluation, parameter updates). In JAX nothing is recorded unless a
    transformation asks for it, so code outside `jax.grad` needs no guard at all. To keep a block
    *inside* a differentiated function from contributing, wrap its result in `stop_gradient`:
    d/dx x·stop_gradient(2x) is 2x = 4, while d/dx 2x² is 4x = 8. `torch.func.grad` respects a
    `no_grad` block *inside* the function it differentiates (that block acts like `stop_gradient`:
    d/dx of (no_grad: 3x) + 2x is 2) and ignores a `no_grad` *around* the call (5), as settled in
    pytorch/functorch#13.
    """,
    {"PyTorch": torch_no_grad, "torch.func": torch_func_no_grad, "JAX": jax_no_differentiation},
    family="basics",
)


# --------------------------------------------------------------------------------------------
# 7. retain_graph
# --------------------------------------------------------------------------------------------


def torch_retain_graph() -> dict:
    import torch

    x = torch.tensor([3.0], requires_grad=True)
    loss = (x.exp() * x).sum()  # exp saves its output for backward
    loss.backward()
    first = _value(x.grad)[0]
    try:
        loss.backward()
        second = "no error"
    except RuntimeError as error:
        second = Raised.of(error)
    x.grad = None
    kept = (x.exp() * x).sum()
    kept.backward(retain_graph=True)
    kept.backward()
    return {
        "first backward(): x.grad": first,
        "second backward()": second,
        "twice with retain_graph=True: x.grad (accumulated)": _value(x.grad)[0],
    }


def jax_vjp_reuse() -> dict:
    value, vjp = jax.vjp(lambda x: jnp.sum(jnp.exp(x) * x), jnp.array([3.0]))
    first = vjp(jnp.float32(1.0))[0]
    second = vjp(jnp.float32(1.0))[0]  # the pullback is a function: apply it as often as needed
    doubled = vjp(jnp.float32(2.0))[0]
    return {"vjp(1.0), first": _value(first)[0], "vjp(1.0), second": _value(second)[0], "vjp(2.0)": _value(doubled)[0]}


def torch_func_vjp_reuse() -> dict:
    import torch
    from torch.func import vjp

    value, pullback = vjp(lambda x: (x.exp() * x).sum(), torch.tensor([3.0]))
    first = pullback(torch.tensor(1.0))[0]
    second = pullback(torch.tensor(1.0))[0]  # no retain_graph: the pullback can be applied again
    return {"vjp(1.0), first": _value(first)[0], "vjp(1.0), second": _value(second)[0]}

register(
    "retain_graph",
    "retain_graph: the freed graph vs a reusable pullback",
    """
    `backward()` frees the saved tensors of the graph as it goes; a second `backward()` through
    it raises unless the first was called with `retain_graph=True`. This is why the DCGAN
    tutorial detaches `fake` in the D step: the G step later backpropagates through `netG(noise)`
    and needs that part of the graph intact. `jax.vjp` returns the pullback as an ordinary
    function closed over its residuals; it can be applied any number of times, and the GAN step
    here applies G's pullback once, to the cotangent from the G loss. `torch.func.vjp` returns a
    pullback that can be applied again too, with no `retain_graph`.
    """,
    {"PyTorch": torch_retain_graph, "torch.func": torch_func_vjp_reuse, "JAX": jax_vjp_reuse},
    family="basics",
)


