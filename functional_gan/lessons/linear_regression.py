"""The book's linear regression as lessons: gradient accumulation and the update pitfalls."""

from __future__ import annotations

import jax
import jax.numpy as jnp
import optax

from functional_gan import linreg

from .registry import Raised, register
from .registry import value as _value


def book_setup():
    """The book's training data and starting point as float32 JAX values: (x, y, {"b": b0, "w": w0})."""
    data = linreg.make_data()
    b0, w0 = linreg.initial_parameters()
    x, y = jnp.asarray(data.x_train, jnp.float32), jnp.asarray(data.y_train, jnp.float32)
    return x, y, {"b": jnp.float32(b0), "w": jnp.float32(w0)}


def nnx_line(b: float, w: float):
    """The book's model ``b + w·x`` as a Flax NNX module owning its two float32 parameters (like an ``nn.Module``)."""
    from flax import nnx

    class Line(nnx.Module):
        def __init__(self, b, w):
            self.b, self.w = nnx.Param(jnp.float32(b)), nnx.Param(jnp.float32(w))

        def __call__(self, x):
            return self.b[...] + self.w[...] * x

    return Line(b, w)


def nnx_mse(model, x, y):
    """The book's loss for an NNX model: the mean squared error of ``model(x)``."""
    return jnp.mean((model(x) - y) ** 2)


# --------------------------------------------------------------------------------------------
# 5. Accumulation and zero_()
# --------------------------------------------------------------------------------------------


def torch_accumulation() -> dict:
    import torch

    data = linreg.make_data()
    x = torch.as_tensor(data.x_train, dtype=torch.float32)
    y = torch.as_tensor(data.y_train, dtype=torch.float32)
    b0, w0 = linreg.BOOK_TORCH_START  # the book's torch.manual_seed(42) draw on its GPU
    b = torch.tensor([b0], requires_grad=True)
    w = torch.tensor([w0], requires_grad=True)
    seen = {}
    for run in ("first", "second"):
        loss = ((b + w * x - y) ** 2).mean()
        loss.backward()  # adds into .grad
        seen[f"after {run} backward(): b.grad, w.grad"] = [_value(b.grad)[0], _value(w.grad)[0]]
    b.grad.zero_()
    w.grad.zero_()
    seen["after zero_(): b.grad"] = _value(b.grad)[0]
    torch.manual_seed(42)  # the same seed on the CPU draws other numbers than on CUDA
    b_cpu, w_cpu = torch.randn(1, requires_grad=True), torch.randn(1, requires_grad=True)
    ((b_cpu + w_cpu * x - y) ** 2).mean().backward()
    seen["manual_seed(42) on the CPU: b, w"] = [round(_value(b_cpu)[0], 4), round(_value(w_cpu)[0], 4)]
    seen["its first backward(): b.grad"] = _value(b_cpu.grad)[0]
    return seen


def torch_func_accumulation() -> dict:
    import torch
    from torch.func import grad

    data = linreg.make_data()
    x = torch.as_tensor(data.x_train, dtype=torch.float32)
    y = torch.as_tensor(data.y_train, dtype=torch.float32)
    params = {"b": torch.tensor([linreg.BOOK_TORCH_START[0]]), "w": torch.tensor([linreg.BOOK_TORCH_START[1]])}

    def loss(p):
        return ((p["b"] + p["w"] * x - y) ** 2).mean()

    first = grad(loss)(params)  # a return value, as in JAX: no .grad is filled
    second = grad(loss)(params)
    return {
        "first torch.func.grad: b, w": [_value(first["b"])[0], _value(first["w"])[0]],
        "second torch.func.grad: b, w": [_value(second["b"])[0], _value(second["w"])[0]],
        "params['b'].grad afterwards": params["b"].grad,
    }


def jax_gradients_are_values() -> dict:
    x, y, _ = book_setup()
    params = {"b": jnp.float32(linreg.BOOK_TORCH_START[0]), "w": jnp.float32(linreg.BOOK_TORCH_START[1])}
    first = jax.grad(linreg.mse_loss)(params, x, y)
    second = jax.grad(linreg.mse_loss)(params, x, y)  # the same value again: nothing accumulated
    added = jax.tree_util.tree_map(jnp.add, first, second)  # accumulate on purpose

    # Micro-batches: optax.MultiSteps averages 4 micro-batch gradients, then takes one step.
    sgd = optax.sgd(0.1)
    multi = optax.MultiSteps(sgd, every_k_schedule=4)
    state = multi.init(params)
    accumulated = params
    for part in range(4):
        sl = slice(20 * part, 20 * (part + 1))
        grads = jax.grad(linreg.mse_loss)(accumulated, x[sl], y[sl])
        updates, state = multi.update(grads, state, accumulated)
        accumulated = optax.apply_updates(accumulated, updates)
    updates, _ = sgd.update(first, sgd.init(params), params)
    whole_batch = optax.apply_updates(params, updates)
    return {
        "first jax.grad: b, w": [float(first["b"]), float(first["w"])],
        "second jax.grad: b, w": [float(second["b"]), float(second["w"])],
        "added on purpose: b, w": [float(added["b"]), float(added["w"])],
        "MultiSteps(4 × 20 examples): b, w": [float(accumulated["b"]), float(accumulated["w"])],
        "one SGD step on all 80: b, w": [float(whole_batch["b"]), float(whole_batch["w"])],
    }


def nnx_gradients_are_values() -> dict:
    from flax import nnx

    x, y, _ = book_setup()
    model = nnx_line(*linreg.BOOK_TORCH_START)
    first = nnx.to_pure_dict(nnx.grad(nnx_mse)(model, x, y))  # returned, as in JAX; the model keeps no .grad
    second = nnx.to_pure_dict(nnx.grad(nnx_mse)(model, x, y))
    # Micro-batches: optax.MultiSteps inside an nnx.Optimizer; the running sum is the optimizer's state.
    micro = nnx_line(*linreg.BOOK_TORCH_START)
    optimizer = nnx.Optimizer(micro, optax.MultiSteps(optax.sgd(0.1), every_k_schedule=4), wrt=nnx.Param)
    for part in range(4):
        sl = slice(20 * part, 20 * (part + 1))
        optimizer.update(micro, nnx.grad(nnx_mse)(micro, x[sl], y[sl]))  # in place; steps on the 4th call
    whole = nnx_line(*linreg.BOOK_TORCH_START)
    nnx.Optimizer(whole, optax.sgd(0.1), wrt=nnx.Param).update(whole, nnx.grad(nnx_mse)(whole, x, y))
    return {
        "first nnx.grad: b, w": [float(first["b"]), float(first["w"])],
        "second nnx.grad: b, w": [float(second["b"]), float(second["w"])],
        "the model's parameters have a .grad": hasattr(model.b, "grad"),
        "MultiSteps(4 × 20 examples) in an nnx.Optimizer: b, w": [float(micro.b[...]), float(micro.w[...])],
        "one SGD step on all 80: b, w": [float(whole.b[...]), float(whole.w[...])],
    }


register(
    "accumulation",
    "Gradient accumulation and zero_()",
    """
    `backward()` *adds* into `.grad`, so running the book's step twice without `zero_()` doubles
    the gradient: −3.38815, −1.94395 → −6.7763, −3.8879 here; the book and the source note print
    −3.3881, −1.9439 → −6.7762, −3.8878. Both start from the book's PyTorch draw b = 0.1940,
    w = 0.1391 (`torch.manual_seed(42)` then `randn` on its GPU; printed to 4 decimals, which
    accounts for the last digit). The same seed on a CPU draws 0.3367, 0.1288 (CUDA's generator is
    another algorithm), which gives −3.1125, so every column here starts from the book's printed
    values. PyTorch accumulates on purpose, to sum micro-batches that don't fit in memory at once,
    at the price of remembering `zero_grad()` every step. `torch.func.grad` works like `jax.grad`: the
    gradient is a return value, twice gives the same value twice, and no `.grad` is filled. In JAX
    accumulating is something you write (`tree_map(add)`), or ask optax for: `optax.MultiSteps`
    averages k micro-batch gradients and steps once, which for equal micro-batches of a mean loss
    equals one step on the whole batch. Flax NNX models own their parameters as PyTorch's do, but
    `nnx.grad` still returns the gradient: nothing accumulates and there is no `zero_grad()`;
    `optax.MultiSteps` inside an `nnx.Optimizer` keeps the micro-batch sum in the optimizer's state.
    """,
    {"PyTorch": torch_accumulation, "torch.func": torch_func_accumulation, "JAX": jax_gradients_are_values,
     "NNX": nnx_gradients_are_values},
    family="linear_regression",
)


# --------------------------------------------------------------------------------------------
# 6. Update pitfalls
# --------------------------------------------------------------------------------------------


def torch_update_pitfalls() -> dict:
    import warnings

    import torch

    data = linreg.make_data()
    x = torch.as_tensor(data.x_train, dtype=torch.float32)
    y = torch.as_tensor(data.y_train, dtype=torch.float32)
    b0, w0 = linreg.initial_parameters()
    lr = 0.1
    results = {}

    b = torch.tensor([b0], requires_grad=True)
    ((b + w0 * x - y) ** 2).mean().backward()
    b = b - lr * b.grad  # a new, non-leaf tensor: its .grad is None
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")  # PyTorch warns about .grad of a non-leaf
            b.grad.zero_()
        results["b = b - lr * b.grad, then b.grad.zero_()"] = "no error"
    except AttributeError as error:
        results["b = b - lr * b.grad, then b.grad.zero_()"] = Raised.of(error)

    b = torch.tensor([b0], requires_grad=True)
    ((b + w0 * x - y) ** 2).mean().backward()
    try:
        b -= lr * b.grad
        results["b -= lr * b.grad"] = "no error"
    except RuntimeError as error:
        results["b -= lr * b.grad"] = Raised.of(error)

    b = torch.tensor([b0], requires_grad=True)
    w = torch.tensor([w0], requires_grad=True)
    for _ in range(linreg.EPOCHS):
        ((b + w * x - y) ** 2).mean().backward()
        with torch.no_grad():
            b -= lr * b.grad
            w -= lr * w.grad
        b.grad.zero_()
        w.grad.zero_()
    results["under no_grad, 1000 epochs: b, w"] = [_value(b)[0], _value(w)[0]]
    return results


def jax_new_values() -> dict:
    x, y, params = book_setup()
    lr = 0.1

    @jax.jit
    def step(params, _):
        grads = jax.grad(linreg.mse_loss)(params, x, y)
        return jax.tree_util.tree_map(lambda p, g: p - lr * g, params, grads), None  # a new value

    final, _ = jax.lax.scan(step, params, None, length=linreg.EPOCHS)
    zeroed = params["b"].at[()].set(0.0)  # JAX's "in-place" syntax returns a new array
    return {
        "params = tree_map(p - lr * g), 1000 epochs: b, w": [float(final["b"]), float(final["w"])],
        "b.at[()].set(0.0) returns": float(zeroed),
        "b afterwards (unchanged: arrays are immutable)": float(params["b"]),
    }


def torch_func_new_values() -> dict:
    import torch
    from torch.func import grad

    data = linreg.make_data()
    x = torch.as_tensor(data.x_train, dtype=torch.float32)
    y = torch.as_tensor(data.y_train, dtype=torch.float32)
    b0, w0 = linreg.initial_parameters()
    params = {"b": torch.tensor(b0), "w": torch.tensor(w0)}
    lr = 0.1

    def loss(p):
        return ((p["b"] + p["w"] * x - y) ** 2).mean()

    for _ in range(linreg.EPOCHS):
        grads = grad(loss)(params)
        params = {k: params[k] - lr * grads[k] for k in params}  # a new value, no no_grad needed
    return {"params = p - lr * g, 1000 epochs: b, w": [_value(params["b"]), _value(params["w"])]}


def nnx_in_place_updates() -> dict:
    from flax import nnx

    x, y, params = book_setup()
    lr = 0.1
    model = nnx_line(params["b"], params["w"])
    grads = nnx.grad(nnx_mse)(model, x, y)
    model.b[...] -= lr * grads["b"][...]  # in place, on a parameter, outside any no_grad: allowed
    by_hand = float(model.b[...])

    model = nnx_line(params["b"], params["w"])
    optimizer = nnx.Optimizer(model, optax.sgd(lr), wrt=nnx.Param)
    # A loop of 1000 steps in one program: the objects split into (graph, state) once, merged inside the scan's body.
    graph, state = nnx.split((model, optimizer))

    def epoch(state, _):
        model, optimizer = nnx.merge(graph, state)
        optimizer.update(model, nnx.grad(nnx_mse)(model, x, y))  # optimizer.step(): in place, no zero_grad
        return nnx.state((model, optimizer)), None

    state, _ = jax.lax.scan(epoch, state, None, length=linreg.EPOCHS)
    nnx.update((model, optimizer), state)
    return {
        "model.b[...] -= lr * grad, outside no_grad: b": by_hand,
        "nnx.Optimizer.update in place, 1000 epochs: b, w": [float(model.b[...]), float(model.w[...])],
    }


register(
    "update",
    "Updating parameters: the two errors and no_grad",
    """
    `b = b - lr * b.grad` rebinds `b` to a *new* tensor computed from the old one: it has a
    `grad_fn`, it is not a leaf, and its `.grad` is None, so the next `b.grad.zero_()` fails with
    AttributeError. `b -= lr * b.grad` modifies the leaf in place while autograd is recording,
    which PyTorch forbids. Only the update under `torch.no_grad()` works (b = 1.0235, w = 1.9690).
    JAX arrays are immutable: the update *is* a new value (`tree_map(lambda p, g: p - lr * g)` or
    `optax.apply_updates`), there is no recording to hide it from and no `.grad` to lose. With
    `torch.func.grad` PyTorch can be written the same way: plain tensors, the gradient returned,
    the update a new dict (1.0235, 1.9690 again). Flax NNX brings PyTorch's in-place updates back
    without its errors: `optimizer.update(model, grads)` writes the new values into the model, like
    `optimizer.step()`, and `model.b[...] -= lr * g` is allowed anywhere, because nothing is recorded
    (the gradient comes from `nnx.grad`, which reads the values). The same 1000 epochs give 1.0235,
    1.9690; `nnx.split`/`nnx.merge` put the loop in one compiled `lax.scan`.
    """,
    {"PyTorch": torch_update_pitfalls, "torch.func": torch_func_new_values, "JAX": jax_new_values,
     "NNX": nnx_in_place_updates},
    family="linear_regression",
)


