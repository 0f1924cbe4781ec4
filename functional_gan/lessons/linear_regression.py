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


# --------------------------------------------------------------------------------------------
# 5. Accumulation and zero_()
# --------------------------------------------------------------------------------------------


def torch_accumulation() -> dict:
    import torch

    data = linreg.make_data()
    x = torch.as_tensor(data.x_train, dtype=torch.float32)
    y = torch.as_tensor(data.y_train, dtype=torch.float32)
    b0, w0 = linreg.initial_parameters()
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
    return seen


def jax_gradients_are_values() -> dict:
    x, y, params = book_setup()
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


register(
    "accumulation",
    "Gradient accumulation and zero_()",
    """
    `backward()` *adds* into `.grad`, so running the book's step twice without `zero_()` doubles
    the gradient (−3.0448 → −6.0896 for b here, from the book's NumPy starting point). PyTorch
    does this on purpose, to sum micro-batches that don't fit in memory at once, at the price of
    remembering `zero_grad()` every step. In JAX a gradient is a return value: calling `jax.grad`
    twice gives the same value twice, and accumulating is something you write (`tree_map(add)`),
    or ask optax for: `optax.MultiSteps` averages k micro-batch gradients and steps once, which
    for equal micro-batches of a mean loss equals one step on the whole batch.
    """,
    {"PyTorch": torch_accumulation, "JAX": jax_gradients_are_values},
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


register(
    "update",
    "Updating parameters: the two errors and no_grad",
    """
    `b = b - lr * b.grad` rebinds `b` to a *new* tensor computed from the old one: it has a
    `grad_fn`, it is not a leaf, and its `.grad` is None, so the next `b.grad.zero_()` fails with
    AttributeError. `b -= lr * b.grad` modifies the leaf in place while autograd is recording,
    which PyTorch forbids. Only the update under `torch.no_grad()` works (b = 1.0235, w = 1.9690).
    JAX arrays are immutable: the update *is* a new value (`tree_map(lambda p, g: p - lr * g)` or
    `optax.apply_updates`), there is no recording to hide it from and no `.grad` to lose.
    """,
    {"PyTorch": torch_update_pitfalls, "JAX": jax_new_values},
)


