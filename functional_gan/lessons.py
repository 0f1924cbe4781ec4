"""The autograd lessons of the source notes, each run in PyTorch and in JAX side by side.

Every lesson is a pair of small functions, the PyTorch half and the JAX half, that return what
they computed (values, and the exception PyTorch raised where it raises one). :func:`run_lesson`
runs both and returns a :class:`LessonResult`; ``functional-gan lessons`` prints them and
``functional-gan lessons --markdown docs/lessons.md`` writes the documentation page from the
very code that ran. The PyTorch halves need the ``torch`` extra.
"""

from __future__ import annotations

import dataclasses
import inspect
import textwrap
from typing import Any, Callable

import jax
import jax.numpy as jnp
import numpy as np
import optax

from functional_gan import linreg


@dataclasses.dataclass(frozen=True)
class Raised:
    """An exception a PyTorch snippet raised, kept as data."""

    type: str
    message: str

    @classmethod
    def of(cls, error: BaseException) -> "Raised":
        return cls(type(error).__name__, str(error).strip().splitlines()[0])

    def __str__(self) -> str:
        return f"raises {self.type}: {self.message}"


@dataclasses.dataclass(frozen=True)
class Lesson:
    name: str
    title: str
    pytorch: Callable[[], dict]
    jax: Callable[[], dict]
    why: str


@dataclasses.dataclass
class LessonResult:
    name: str
    title: str
    pytorch: dict[str, Any]
    jax: dict[str, Any]
    why: str
    pytorch_code: str
    jax_code: str


LESSONS: dict[str, Lesson] = {}


def _register(name: str, title: str, why: str):
    def decorate(pair: tuple[Callable[[], dict], Callable[[], dict]]):
        LESSONS[name] = Lesson(name, title, pair[0], pair[1], textwrap.dedent(why).strip())
        return pair

    return decorate


def _value(x) -> Any:
    """Tensors and arrays as plain Python floats/lists for printing and comparing."""
    if hasattr(x, "detach"):
        x = x.detach().cpu().numpy()
    array = np.asarray(x)
    return float(array) if array.ndim == 0 else array.tolist()


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


_register(
    "detach",
    "detach() vs stop_gradient",
    """
    PyTorch builds the graph as it computes; `detach()` returns a tensor with no `grad_fn`, so a
    loss made from it has no path back to `x` and `torch.autograd.grad` refuses to run
    ("does not require grad"). JAX has no graph to break: `jax.grad` traces the function, and
    `stop_gradient` is an identity whose derivative is zero. So the same cut gives an *error* in
    PyTorch and a gradient of exactly *0.0* in JAX. That is a real difference: code that relied
    on PyTorch's error to catch a broken graph gets a silent zero in JAX. Connected, both give −2.
    """,
)((torch_detach, jax_stop_gradient))


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
        "does x carry a flag?": "no: arrays have no requires_grad; the call decides",
    }


_register(
    "requires_grad",
    "requires_grad propagation vs choosing what to differentiate",
    """
    In PyTorch a flag on each tensor decides whether operations on it are recorded; an output
    requires grad if any input does, so `x + y` doesn't and `(x + y) + z` does. In JAX arrays
    carry no flag: `jax.grad(f, argnums=...)` names the arguments to differentiate at the call,
    and anything else (an argument not named, a value closed over) is a constant.
    """,
)((torch_requires_grad, jax_argnums))


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


_register(
    "grad_fn",
    "grad_fn and the dynamic graph vs the jaxpr",
    """
    PyTorch attaches to every result a `grad_fn` node (`MulBackward0`, `AddBackward0`) whose
    `next_functions` link back to the inputs: the graph *is* the recorded history, built during
    the forward pass and walked by `backward()`. JAX records nothing while computing; when you ask
    for a gradient it traces the function into a jaxpr (`mul`, `add`) and transforms that program
    into another program that computes the gradient. Arrays stay plain values with no history.
    `functional-gan graph` draws both.
    """,
)((torch_grad_fn, jax_jaxpr))


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


_register(
    "no_grad",
    "torch.no_grad() vs simply not differentiating",
    """
    `torch.no_grad()` switches recording off for a block, to save the memory and time of a graph
    nobody will use (evaluation, parameter updates). In JAX nothing is recorded unless a
    transformation asks for it, so code outside `jax.grad` needs no guard at all. To keep a block
    *inside* a differentiated function from contributing, wrap its result in `stop_gradient`:
    d/dx x·stop_gradient(2x) is 2x = 4, while d/dx 2x² is 4x = 8.
    """,
)((torch_no_grad, jax_no_differentiation))


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
    data = linreg.make_data()
    x, y = jnp.asarray(data.x_train, jnp.float32), jnp.asarray(data.y_train, jnp.float32)
    b0, w0 = linreg.initial_parameters()
    params = {"b": jnp.float32(b0), "w": jnp.float32(w0)}
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


_register(
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
)((torch_accumulation, jax_gradients_are_values))


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
    data = linreg.make_data()
    x, y = jnp.asarray(data.x_train, jnp.float32), jnp.asarray(data.y_train, jnp.float32)
    b0, w0 = linreg.initial_parameters()
    params = {"b": jnp.float32(b0), "w": jnp.float32(w0)}
    lr = 0.1

    @jax.jit
    def step(params, _):
        grads = jax.grad(linreg.mse_loss)(params, x, y)
        return jax.tree_util.tree_map(lambda p, g: p - lr * g, params, grads), None  # a new value

    final, _ = jax.lax.scan(step, params, None, length=linreg.EPOCHS)
    try:
        params["b"].at[()].set(0.0)  # "in place" in JAX returns a new array ...
        in_place = "x.at[...].set(v) returns a new array; the old one is unchanged"
    except Exception as error:  # pragma: no cover - documents the behaviour if it ever changed
        in_place = Raised.of(error)
    return {
        "params = tree_map(p - lr * g), 1000 epochs: b, w": [float(final["b"]), float(final["w"])],
        "arrays are immutable": in_place,
        "original params untouched: b": float(params["b"]),
    }


_register(
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
)((torch_update_pitfalls, jax_new_values))


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


_register(
    "retain_graph",
    "retain_graph: the freed graph vs a reusable pullback",
    """
    `backward()` frees the saved tensors of the graph as it goes; a second `backward()` through
    it raises unless the first was called with `retain_graph=True`. This is why the DCGAN
    tutorial detaches `fake` in the D step: the G step later backpropagates through `netG(noise)`
    and needs that part of the graph intact. `jax.vjp` returns the pullback as an ordinary
    function closed over its residuals; it can be applied any number of times, and the GAN step
    here applies G's pullback once, to the cotangent from the G loss.
    """,
)((torch_retain_graph, jax_vjp_reuse))


# --------------------------------------------------------------------------------------------
# 8. The GAN step
# --------------------------------------------------------------------------------------------

LESSON_GAN_CONFIG = dict(nz=8, ngf=4, ndf=4, nc=3, image_size=32, batch_size=4)


def torch_d_step(net_g, net_d, config: dict, detach: bool) -> tuple[int, int]:
    """The tutorial's D step (real, then ``netD(fake.detach())`` or ``netD(fake)``), backward included.

    Returns (FLOPs by FlopCounterMode, number of aten convolution calls); gradients stay in ``.grad``.
    """
    import torch
    from torch.utils.flop_counter import FlopCounterMode

    c = config
    torch.manual_seed(0)
    real = torch.rand(c["batch_size"], c["nc"], c["image_size"], c["image_size"]) * 2 - 1
    noise = torch.randn(c["batch_size"], c["nz"], 1, 1)
    criterion = torch.nn.BCELoss()
    with FlopCounterMode(display=False) as counter, _ConvolutionCounter() as convolutions:
        net_d.zero_grad()
        criterion(net_d(real).view(-1), torch.ones(c["batch_size"])).backward()
        fake = net_g(noise)
        output = net_d(fake.detach() if detach else fake).view(-1)
        criterion(output, torch.zeros(c["batch_size"])).backward()
    return int(counter.get_total_flops()), convolutions.count


def torch_gan_step() -> dict:
    results = {}
    for detach in (True, False):
        net_g, net_d = torch_gan_models()
        flops, _ = torch_d_step(net_g, net_d, LESSON_GAN_CONFIG, detach)
        g_grads = [p.grad for p in net_g.parameters()]
        label = "with detach()" if detach else "without detach()"
        results[f"{label}: netG .grad after the D step"] = (
            "all None" if all(g is None for g in g_grads) else f"filled, |sum| = {sum(float(g.abs().sum()) for g in g_grads):.3g}"
        )
        results[f"{label}: D-step FLOPs"] = flops
    return results


def jax_gan_step() -> dict:
    d_loss, generator_params, discriminator_params = gan_d_loss()
    results = {}
    d_only = {d: jax.grad(d_loss, argnums=1)(generator_params, discriminator_params, d) for d in (True, False)}
    results["grad wrt D only: top-level keys of the result"] = sorted(d_only[True].keys())[:3] + ["..."]
    results["grad wrt D only: identical with and without stop_gradient"] = all(
        bool(jnp.array_equal(a, b)) for a, b in zip(jax.tree_util.tree_leaves(d_only[True]), jax.tree_util.tree_leaves(d_only[False]))
    )
    for detach in (True, False):
        g_grads, _ = jax.grad(d_loss, argnums=(0, 1))(generator_params, discriminator_params, detach)
        total = sum(float(jnp.sum(jnp.abs(leaf))) for leaf in jax.tree_util.tree_leaves(g_grads))
        label = "with stop_gradient" if detach else "without stop_gradient"
        results[f"grad wrt G and D, {label}: |sum of G's gradient|"] = total
    return results


def torch_gan_models():
    from comparisons.torch_reference import make_models

    c = LESSON_GAN_CONFIG
    return make_models(nz=c["nz"], ngf=c["ngf"], ndf=c["ndf"], nc=c["nc"], image_size=c["image_size"], seed=0)


def gan_d_loss(config: dict | None = None):
    """The DCGAN's D loss as a function of both networks' parameters, on a fixed batch and noise.

    Returns ``(d_loss, generator_params, discriminator_params)`` where
    ``d_loss(generator_params, discriminator_params, detach=True)`` runs G's forward and then the
    tutorial's D loss, with ``stop_gradient(fake)`` when ``detach``.
    """
    from functional_gan.models import Discriminator, Generator
    from functional_gan.train import discriminator_loss

    c = config or LESSON_GAN_CONFIG
    generator = Generator(nz=c["nz"], ngf=c["ngf"], nc=c["nc"], image_size=c["image_size"])
    discriminator = Discriminator(ndf=c["ndf"], nc=c["nc"], image_size=c["image_size"])
    key_g, key_d, key_real, key_noise = jax.random.split(jax.random.key(0), 4)
    variables_g = generator.init(key_g, jnp.zeros((1, c["nz"])))
    size = c["image_size"]
    variables_d = discriminator.init(key_d, jnp.zeros((1, size, size, c["nc"])))
    real = jax.random.uniform(key_real, (c["batch_size"], size, size, c["nc"]), minval=-1, maxval=1)
    noise = jax.random.normal(key_noise, (c["batch_size"], c["nz"]))

    def d_loss(generator_params, discriminator_params, detach=True):
        fake, _ = generator.apply(
            {"params": generator_params, "batch_stats": variables_g["batch_stats"]}, noise, mutable=["batch_stats"]
        )
        loss, _ = discriminator_loss(discriminator, discriminator_params, variables_d["batch_stats"], real, fake, detach=detach)
        return loss

    return d_loss, variables_g["params"], variables_d["params"]


_register(
    "gan_step",
    "The GAN's D step: detach() vs differentiating only D",
    """
    Without `detach()`, `errD_fake.backward()` runs on through `netG`: it computes and stores
    gradients for every G parameter (which `netG.zero_grad()` must then throw away) and spends the
    FLOPs of G's backward pass; the G step would also fail for want of the freed graph. With
    `detach()` G is untouched. In JAX the D step differentiates the D loss with respect to D's
    parameters only, so G's parameters are constants: the gradient has no G entries at all,
    stop_gradient or not, and XLA never computes G's backward (see `functional-gan lessons
    compiled`). `stop_gradient` decides the outcome only when G is differentiated too: then it
    cuts G's gradient to exact zeros.
    """,
)((torch_gan_step, jax_gan_step))


# --------------------------------------------------------------------------------------------
# 9. Proof at the compiled level
# --------------------------------------------------------------------------------------------


def torch_compiled_cost() -> dict:
    return compiled_cost_table()["pytorch"]


def jax_compiled_cost() -> dict:
    return compiled_cost_table()["jax"]


def compiled_cost_table(config: dict | None = None) -> dict:
    """Convolutions and FLOPs of the D step, in XLA's compiled program and in PyTorch's FlopCounterMode.

    JAX variants: differentiate the D loss (G's forward included) with respect to D only or to
    G and D, each with and without ``stop_gradient(fake)``. XLA's FLOPs come from
    ``compiled.cost_analysis()`` (it skips padding, so it runs ~13% under PyTorch's convention);
    the convolution count is the number of ``convolution`` ops in the optimised HLO.
    """
    c = config or LESSON_GAN_CONFIG
    d_loss, generator_params, discriminator_params = gan_d_loss(c)
    jax_rows = {}
    for argnums, wrt in ((1, "D"), ((0, 1), "G and D")):
        for detach in (True, False):
            fn = jax.jit(jax.grad(lambda g, d, detach=detach, argnums=argnums: d_loss(g, d, detach), argnums=argnums))
            compiled = fn.lower(generator_params, discriminator_params).compile()
            cost = compiled.cost_analysis()
            cost = cost[0] if isinstance(cost, (list, tuple)) else cost
            convolutions = sum(" convolution(" in line for line in compiled.as_text().splitlines())
            label = f"grad wrt {wrt}, {'with' if detach else 'without'} stop_gradient"
            jax_rows[label] = {"convolutions": convolutions, "GFLOP (XLA)": round(float(cost.get("flops", float("nan"))) / 1e9, 4)}

    torch_rows = {}
    try:
        from comparisons.torch_reference import make_models
    except ImportError as error:  # the JAX half stands alone
        torch_rows["unavailable"] = Raised.of(error)
    else:
        for detach in (True, False):
            net_g, net_d = make_models(nz=c["nz"], ngf=c["ngf"], ndf=c["ndf"], nc=c["nc"], image_size=c["image_size"], seed=0)
            flops, convolutions = torch_d_step(net_g, net_d, c, detach)
            torch_rows[f"D step {'with' if detach else 'without'} detach()"] = {
                "aten convolution calls (a backward call computes both gradients)": convolutions,
                "GFLOP (FlopCounterMode)": round(flops / 1e9, 4),
            }
    return {"jax": jax_rows, "pytorch": torch_rows}


def _ConvolutionCounter():
    """A dispatch mode that counts aten convolution and convolution_backward calls."""
    from torch.utils._python_dispatch import TorchDispatchMode

    class ConvolutionCounter(TorchDispatchMode):
        count = 0

        def __torch_dispatch__(self, func, types, args=(), kwargs=None):
            if "convolution" in func.__name__:
                self.count += 1
            return func(*args, **(kwargs or {}))

    return ConvolutionCounter()


_register(
    "compiled",
    "Proof at the compiled level: what the D step costs",
    """
    The same D step compiled four ways. Differentiating only D's parameters gives the same program
    with or without `stop_gradient`: XLA never builds G's backward because nothing asks for it.
    Differentiating G too without `stop_gradient` adds G's backward convolutions and FLOPs — the
    work PyTorch does when `detach()` is forgotten; with `stop_gradient` G's gradient is a
    constant zero and XLA removes that work again. PyTorch's FlopCounterMode shows the same
    difference between the D step with and without `detach()`. Run
    `functional-gan lessons compiled --full-size` for the tutorial's 64×64 nets at batch 128.
    """,
)((torch_compiled_cost, jax_compiled_cost))


# --------------------------------------------------------------------------------------------
# Running, printing, documenting
# --------------------------------------------------------------------------------------------

FULL_SIZE_GAN_CONFIG = dict(nz=100, ngf=64, ndf=64, nc=3, image_size=64, batch_size=128)


def run_lesson(name: str) -> LessonResult:
    """Run one lesson's PyTorch and JAX halves."""
    if name not in LESSONS:
        raise ValueError(f"unknown lesson {name!r}; choose from {', '.join(LESSONS)}")
    lesson = LESSONS[name]
    try:
        pytorch = lesson.pytorch()
    except ImportError as error:
        pytorch = {"unavailable": Raised(type(error).__name__, f"{error} (install the torch extra: pip install -e '.[torch]')")}
    return LessonResult(
        lesson.name, lesson.title, pytorch, lesson.jax(), lesson.why,
        textwrap.dedent(inspect.getsource(lesson.pytorch)), textwrap.dedent(inspect.getsource(lesson.jax)),
    )


def _format_value(value) -> str:
    if isinstance(value, float):
        return f"{value:.6g}"
    if isinstance(value, list):
        return "[" + ", ".join(_format_value(v) for v in value) + "]"
    if isinstance(value, dict):
        return ", ".join(f"{k} {_format_value(v)}" for k, v in value.items())
    return str(value)


def format_result(result: LessonResult) -> str:
    lines = [f"== {result.name}: {result.title} =="]
    for side, values in (("PyTorch", result.pytorch), ("JAX", result.jax)):
        lines.append(f"  {side}:")
        for key, value in values.items():
            lines.append(f"    {key}: {_format_value(value)}")
    lines.append("  Why: " + textwrap.fill(result.why, 96, subsequent_indent="       "))
    return "\n".join(lines)


def to_markdown(results: list[LessonResult]) -> str:
    parts = [
        "# Autograd lessons: PyTorch and JAX side by side\n",
        "Generated by `functional-gan lessons --markdown docs/lessons.md` from the code that ran; "
        "the values are what it printed.\n",
    ]
    for r in results:
        parts.append(f"## {r.title}\n\n`functional-gan lessons {r.name}`\n")
        parts.append(f"### PyTorch\n\n```python\n{r.pytorch_code}```\n")
        parts.append("| | PyTorch |\n|---|---|\n" + "".join(f"| {k} | {_format_value(v)} |\n" for k, v in r.pytorch.items()))
        parts.append(f"\n### JAX\n\n```python\n{r.jax_code}```\n")
        parts.append("| | JAX |\n|---|---|\n" + "".join(f"| {k} | {_format_value(v)} |\n" for k, v in r.jax.items()))
        parts.append(f"\n### Why\n\n{r.why}\n")
    return "\n".join(parts)
