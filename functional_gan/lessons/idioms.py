"""Gradient stopping in the wild: the detach idioms people port, in PyTorch, torch.func and JAX.

Every side computes in float64 from the same NumPy inputs (:func:`_inputs`) and returns its
gradients or updated values as lists, so the three columns can be compared number for number
(the tests ask for 1e-12).
"""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
import optax

from functional_gan import layers

from .registry import Raised, register
from .registry import value as _value


def _inputs(name: str) -> dict[str, np.ndarray]:
    """The float64 inputs of each lesson, drawn once from a seeded NumPy generator (the same for every side)."""
    rng = np.random.default_rng({"straight_through": 1, "tbptt": 2, "target_network": 3, "simsiam": 4,
                                 "gradient_penalty": 5}[name])
    if name == "straight_through":
        return {"x": rng.normal(size=(4, 3)), "codebook": rng.normal(size=(5, 3))}
    if name == "tbptt":
        return {"W": 0.5 * rng.normal(size=(3, 3)), "U": rng.normal(size=(3, 2)), "xs": rng.normal(size=(8, 2))}
    if name == "target_network":
        return {"online": rng.normal(size=4), "target": rng.normal(size=4), "s": rng.normal(size=(6, 4)),
                "s_next": rng.normal(size=(6, 3, 4)), "r": rng.normal(size=6)}
    if name == "simsiam":
        return {"f": rng.normal(size=(4, 3)), "h": rng.normal(size=(3, 3)), "x1": rng.normal(size=(5, 4)),
                "x2": rng.normal(size=(5, 4))}
    return {"weight": 0.3 * rng.normal(size=(2, 1, 3, 3)), "real": rng.normal(size=(2, 1, 6, 6)),
            "fake": rng.normal(size=(2, 1, 6, 6)), "eps": rng.uniform(size=(2, 1, 1, 1))}


# --------------------------------------------------------------------------------------------
# Straight-through estimator (VQ-VAE)
# --------------------------------------------------------------------------------------------


def _nearest(x, codebook):
    return np.argmin(((x[:, None, :] - codebook[None]) ** 2).sum(-1), axis=1)


def torch_straight_through() -> dict:
    import torch

    data = _inputs("straight_through")
    x = torch.tensor(data["x"], requires_grad=True)  # the encoder's output
    q = torch.tensor(data["codebook"][_nearest(data["x"], data["codebook"])])  # quantised: no gradient
    x_st = x + (q - x).detach()  # forward: q; backward: the identity to x
    torch.sin(x_st).sum().backward()  # a "decoder" loss
    return {"max |forward value − q|": float((x_st - q).detach().abs().max()), "d loss / d x": _value(x.grad)}


def torch_func_straight_through() -> dict:
    import torch
    from torch.func import grad

    data = _inputs("straight_through")
    q = torch.tensor(data["codebook"][_nearest(data["x"], data["codebook"])])

    def loss(x):
        return torch.sin(x + (q - x).detach()).sum()

    return {"d loss / d x": _value(grad(loss)(torch.tensor(data["x"])))}


def jax_straight_through() -> dict:
    data = _inputs("straight_through")
    with jax.enable_x64():
        q = jnp.asarray(data["codebook"][_nearest(data["x"], data["codebook"])])

        def loss(x):
            return jnp.sum(jnp.sin(x + jax.lax.stop_gradient(q - x)))

        x = jnp.asarray(data["x"])
        return {"max |forward value − q|": float(jnp.max(jnp.abs(x + jax.lax.stop_gradient(q - x) - q))),
                "d loss / d x": _value(jax.grad(loss)(x))}


def nnx_straight_through() -> dict:
    from flax import nnx

    data = _inputs("straight_through")
    with jax.enable_x64():
        class Quantiser(nnx.Module):
            def __init__(self, codebook):
                self.codebook = nnx.Variable(jnp.asarray(codebook))  # state, not a parameter (PyTorch: a buffer)

            def __call__(self, x):
                codes = self.codebook[...]
                q = codes[jnp.argmin(jnp.sum((x[:, None, :] - codes[None]) ** 2, -1), axis=1)]
                return x + jax.lax.stop_gradient(q - x)  # forward: q; backward: the identity to x

        class Encoder(nnx.Module):  # stands for an encoder whose output is x
            def __init__(self, x):
                self.x = nnx.Param(jnp.asarray(x))

        def loss(encoder, quantiser):
            return jnp.sum(jnp.sin(quantiser(encoder.x[...])))

        encoder, quantiser = Encoder(data["x"]), Quantiser(data["codebook"])
        grads = nnx.grad(loss, argnums=(0, 1))(encoder, quantiser)
        return {"d loss / d x": _value(grads[0]["x"][...]),
                "the quantiser's gradient entries (its codebook is no nnx.Param)": len(jax.tree.leaves(grads[1]))}


register(
    "straight_through",
    "Straight-through estimator (VQ-VAE): x + (q − x).detach()",
    """
    Quantisation (the nearest codebook vector q) has no useful gradient. VQ-VAE's trick writes
    the decoder's input as `x + (q - x).detach()`: its value is q, its derivative with respect to
    x is the identity, so the encoder receives the decoder's gradient unchanged (here cos(q)).
    `stop_gradient` takes `detach()`'s place one for one, and `torch.func.grad` of the same
    expression agrees; the three gradients are equal to float64 rounding.
    In Flax NNX the codebook is an `nnx.Variable` that is not an `nnx.Param` (PyTorch's buffer):
    `nnx.grad` gives it no gradient entry at all, and the estimator's `stop_gradient` is JAX's.
    """,
    {"PyTorch": torch_straight_through, "torch.func": torch_func_straight_through, "JAX": jax_straight_through,
     "NNX": nnx_straight_through},
    family="idioms",
)


# --------------------------------------------------------------------------------------------
# Truncated backpropagation through time
# --------------------------------------------------------------------------------------------

TBPTT_CHUNK = 4


def torch_tbptt() -> dict:
    import torch

    data = _inputs("tbptt")
    W = torch.tensor(data["W"], requires_grad=True)
    U = torch.tensor(data["U"], requires_grad=True)
    xs = torch.tensor(data["xs"])
    hidden = torch.zeros(3, dtype=torch.float64)
    for start in range(0, len(xs), TBPTT_CHUNK):
        hidden = hidden.detach()  # word_language_model's repackage_hidden: cut the graph between chunks
        loss = torch.zeros((), dtype=torch.float64)
        for x in xs[start : start + TBPTT_CHUNK]:
            hidden = torch.tanh(W @ hidden + U @ x)
            loss = loss + hidden.sum()
        loss.backward()  # gradients of the chunks accumulate in .grad
    return {"d loss / d W (truncated every 4 steps)": _value(W.grad)}


def torch_func_tbptt() -> dict:
    import torch
    from torch.func import grad

    data = _inputs("tbptt")
    xs = torch.tensor(data["xs"])

    def loss(W, U, truncate):
        hidden, total = torch.zeros(3, dtype=torch.float64), torch.zeros((), dtype=torch.float64)
        for t, x in enumerate(xs):
            if truncate and t % TBPTT_CHUNK == 0:
                hidden = hidden.detach()
            hidden = torch.tanh(W @ hidden + U @ x)
            total = total + hidden.sum()
        return total

    W, U = torch.tensor(data["W"]), torch.tensor(data["U"])
    return {"d loss / d W (truncated every 4 steps)": _value(grad(loss)(W, U, True)),
            "d loss / d W (full BPTT)": _value(grad(loss)(W, U, False))}


def jax_tbptt() -> dict:
    data = _inputs("tbptt")
    with jax.enable_x64():
        xs = jnp.asarray(data["xs"]).reshape(-1, TBPTT_CHUNK, 2)  # (chunks, steps, features)

        def loss(W, U, truncate):
            def chunk(hidden, chunk_xs):
                if truncate:
                    hidden = jax.lax.stop_gradient(hidden)  # where repackage_hidden detached

                def step(h, x):
                    h = jnp.tanh(W @ h + U @ x)
                    return h, h.sum()

                hidden, sums = jax.lax.scan(step, hidden, chunk_xs)
                return hidden, sums.sum()

            _, totals = jax.lax.scan(chunk, jnp.zeros(3), xs)
            return totals.sum()

        W, U = jnp.asarray(data["W"]), jnp.asarray(data["U"])
        return {"d loss / d W (truncated every 4 steps)": _value(jax.grad(loss)(W, U, True)),
                "d loss / d W (full BPTT)": _value(jax.grad(loss)(W, U, False))}


register(
    "tbptt",
    "Truncated backpropagation through time: hidden.detach() vs stop_gradient on a scan's carry",
    """
    pytorch/examples' word_language_model detaches the hidden state at the start of every chunk
    (`repackage_hidden`), so each `backward()` reaches back at most one chunk and the graph of
    earlier chunks can be freed; the chunks' gradients add up in `.grad`. In JAX the recurrence
    is a `lax.scan` over chunks whose carry passes through `stop_gradient` at each chunk's start:
    one `jax.grad` of the summed loss gives the same truncated gradient, equal to PyTorch's to
    float64 rounding (a small RNN, 8 steps in chunks of 4). Without the cut (full BPTT) the
    gradient differs: the cut is doing its work.
    """,
    {"PyTorch": torch_tbptt, "torch.func": torch_func_tbptt, "JAX": jax_tbptt},
    family="idioms",
)


# --------------------------------------------------------------------------------------------
# Target network and soft (Polyak) update
# --------------------------------------------------------------------------------------------

GAMMA, TAU = 0.9, 0.05


def torch_target_network() -> dict:
    import torch

    data = _inputs("target_network")
    online = torch.tensor(data["online"], requires_grad=True)  # a linear Q-function: Q(s) = online · s
    # s_next holds, for each of 6 transitions, the features of 3 possible actions: Q(s', a) = target · s_next[a].
    target = torch.tensor(data["target"])
    s, s_next, r = (torch.tensor(data[k]) for k in ("s", "s_next", "r"))
    with torch.no_grad():  # the TD target must not be differentiated
        td_target = r + GAMMA * (s_next @ target).max(dim=1).values
    ((s @ online - td_target) ** 2).mean().backward()
    with torch.no_grad():  # Polyak averaging in place: target ← (1 − τ)·target + τ·online
        target.mul_(1 - TAU).add_(online, alpha=TAU)
    return {"d loss / d online": _value(online.grad), "target after the soft update": _value(target)}


def torch_func_target_network() -> dict:
    import torch
    from torch.func import grad

    data = _inputs("target_network")
    target = torch.tensor(data["target"])
    s, s_next, r = (torch.tensor(data[k]) for k in ("s", "s_next", "r"))

    def loss(online):
        td_target = (r + GAMMA * (s_next @ target).max(dim=1).values).detach()
        return ((s @ online - td_target) ** 2).mean()

    online = torch.tensor(data["online"])
    return {"d loss / d online": _value(grad(loss)(online)),
            "target after the soft update": _value((1 - TAU) * target + TAU * online)}  # a new value


def jax_target_network() -> dict:
    data = _inputs("target_network")
    with jax.enable_x64():
        target = jnp.asarray(data["target"])
        s, s_next, r = (jnp.asarray(data[k]) for k in ("s", "s_next", "r"))

        def loss(online, target):
            td_target = jax.lax.stop_gradient(r + GAMMA * jnp.max(s_next @ target, axis=1))
            return jnp.mean((s @ online - td_target) ** 2)

        online = jnp.asarray(data["online"])
        # optax.incremental_update(new, old, step_size=τ) = τ·new + (1 − τ)·old: the soft update, as a value.
        return {"d loss / d online": _value(jax.grad(loss)(online, target)),
                "target after the soft update": _value(optax.incremental_update(online, target, step_size=TAU))}


def nnx_target_network() -> dict:
    from flax import nnx

    data = _inputs("target_network")
    with jax.enable_x64():
        class LinearQ(nnx.Module):  # Q(s) = w · s
            def __init__(self, w):
                self.w = nnx.Param(jnp.asarray(w))

            def __call__(self, s):
                return s @ self.w[...]

        online, target = LinearQ(data["online"]), LinearQ(data["target"])
        s, s_next, r = (jnp.asarray(data[k]) for k in ("s", "s_next", "r"))

        def loss(online, target):
            td_target = jax.lax.stop_gradient(r + GAMMA * jnp.max(target(s_next), axis=1))
            return jnp.mean((online(s) - td_target) ** 2)

        grads = nnx.grad(loss)(online, target)  # only the first argument, the online network, is differentiated
        # The soft update in place, as PyTorch's mul_/add_, and with no no_grad: nothing is being recorded.
        nnx.update(target, optax.incremental_update(nnx.state(online, nnx.Param), nnx.state(target, nnx.Param), TAU))
        return {"d loss / d online": _value(grads["w"][...]), "target after the soft update": _value(target.w[...])}


register(
    "target_network",
    "Target network and soft update (DQN-style TD target)",
    """
    A TD target `r + γ·max Q_target(s')` is a label, not something to differentiate: PyTorch
    computes it under `no_grad` (or `.detach()`s it), JAX wraps it in `stop_gradient`, or simply
    passes the target parameters as an argument that `jax.grad` does not differentiate. The soft
    update `target ← (1 − τ)·target + τ·online` is an in-place `mul_`/`add_` under `no_grad` in
    PyTorch and a new value in JAX (`optax.incremental_update`, or a `tree_map`); the EMA of a
    generator's weights (next lesson) is the same update with τ = 1 − decay. Gradients and
    updated targets agree to float64 rounding in all three columns.
    In Flax NNX both networks are modules: `nnx.grad(loss)(online, target)` differentiates the
    first argument only, and the soft update writes into the target module in place
    (`nnx.update` with `optax.incremental_update`), as PyTorch's `mul_`/`add_` do, without `no_grad`.
    """,
    {"PyTorch": torch_target_network, "torch.func": torch_func_target_network, "JAX": jax_target_network,
     "NNX": nnx_target_network},
    family="idioms",
)


# --------------------------------------------------------------------------------------------
# The EMA of a generator's weights
# --------------------------------------------------------------------------------------------

EMA_DECAY, EMA_LR, EMA_STEPS = 0.9, 0.1, 4


def _ema_inputs():
    rng = np.random.default_rng(7)
    return {"W1": 0.5 * rng.normal(size=(3, 4)), "W2": 0.5 * rng.normal(size=(4, 2)),
            "z": rng.normal(size=(6, 3)), "target": rng.normal(size=(6, 2))}


def torch_ema_generator() -> dict:
    import copy

    import torch
    from torch import nn

    data = _ema_inputs()
    net = nn.Sequential(nn.Linear(3, 4, bias=False), nn.Tanh(), nn.Linear(4, 2, bias=False)).double()  # a tiny "generator"
    with torch.no_grad():
        net[0].weight.copy_(torch.tensor(data["W1"].T))
        net[2].weight.copy_(torch.tensor(data["W2"].T))
    ema = copy.deepcopy(net).requires_grad_(False)  # the averaged copy: never trained, never differentiated
    z, target = torch.tensor(data["z"]), torch.tensor(data["target"])
    optimizer = torch.optim.SGD(net.parameters(), lr=EMA_LR)
    for _ in range(EMA_STEPS):
        optimizer.zero_grad()
        ((net(z) - target) ** 2).mean().backward()
        optimizer.step()
        with torch.no_grad():  # ema ← decay·ema + (1 − decay)·net, in place
            for p_ema, p in zip(ema.parameters(), net.parameters()):
                p_ema.lerp_(p, 1 - EMA_DECAY)
    try:  # the same in-place update on a trained parameter, outside no_grad
        net[0].weight.mul_(EMA_DECAY)
        outside = "no error"
    except RuntimeError as error:
        outside = Raised.of(error)
    return {"EMA W1": _value(ema[0].weight.T), "EMA W2": _value(ema[2].weight.T),
            "the EMA generator's output, row 0": _value(ema(z)[0]),
            "the EMA copy requires grad": any(p.requires_grad for p in ema.parameters()),
            "in-place mul_ on a parameter outside no_grad": outside}


def torch_func_ema_generator() -> dict:
    import torch
    from torch import nn
    from torch.func import functional_call, grad

    data = _ema_inputs()
    net = nn.Sequential(nn.Linear(3, 4, bias=False), nn.Tanh(), nn.Linear(4, 2, bias=False)).double()
    params = {"0.weight": torch.tensor(data["W1"].T), "2.weight": torch.tensor(data["W2"].T)}  # plain tensors
    ema = dict(params)
    z, target = torch.tensor(data["z"]), torch.tensor(data["target"])

    def loss(params):
        return ((functional_call(net, params, (z,)) - target) ** 2).mean()

    for _ in range(EMA_STEPS):
        grads = grad(loss)(params)
        params = {k: params[k] - EMA_LR * grads[k] for k in params}
        ema = {k: torch.lerp(ema[k], params[k], 1 - EMA_DECAY) for k in ema}  # new tensors, nothing in place
    return {"EMA W1": _value(ema["0.weight"].T), "EMA W2": _value(ema["2.weight"].T),
            "the EMA generator's output, row 0": _value(functional_call(net, ema, (z,))[0])}


def jax_ema_generator() -> dict:
    data = _ema_inputs()
    with jax.enable_x64():
        params = {"W1": jnp.asarray(data["W1"]), "W2": jnp.asarray(data["W2"])}
        z, target = jnp.asarray(data["z"]), jnp.asarray(data["target"])

        def generate(params, z):
            return jnp.tanh(z @ params["W1"]) @ params["W2"]

        def loss(params):
            return jnp.mean((generate(params, z) - target) ** 2)

        optimizer = optax.sgd(EMA_LR)
        opt_state, ema = optimizer.init(params), params  # the EMA starts as the same values: nothing is shared or mutated
        for _ in range(EMA_STEPS):
            updates, opt_state = optimizer.update(jax.grad(loss)(params), opt_state)
            params = optax.apply_updates(params, updates)
            ema = optax.incremental_update(params, ema, step_size=1 - EMA_DECAY)  # (1 − decay)·params + decay·ema
        return {"EMA W1": _value(ema["W1"]), "EMA W2": _value(ema["W2"]),
                "the EMA generator's output, row 0": _value(generate(ema, z)[0])}


def nnx_ema_generator() -> dict:
    from flax import nnx

    data = _ema_inputs()
    with jax.enable_x64():
        class Generator(nnx.Module):  # the same tiny "generator": tanh(z W1) W2
            def __init__(self, W1, W2):
                self.W1, self.W2 = nnx.Param(jnp.asarray(W1)), nnx.Param(jnp.asarray(W2))

            def __call__(self, z):
                return jnp.tanh(z @ self.W1[...]) @ self.W2[...]

        net = Generator(data["W1"], data["W2"])
        ema = nnx.clone(net)  # PyTorch: copy.deepcopy(net); nothing to switch off, it is never differentiated
        z, target = jnp.asarray(data["z"]), jnp.asarray(data["target"])
        optimizer = nnx.Optimizer(net, optax.sgd(EMA_LR), wrt=nnx.Param)
        for _ in range(EMA_STEPS):
            optimizer.update(net, nnx.grad(lambda net: jnp.mean((net(z) - target) ** 2))(net))
            # ema ← decay·ema + (1 − decay)·net, written into the EMA module in place (no no_grad needed)
            nnx.update(ema, optax.incremental_update(nnx.state(net, nnx.Param), nnx.state(ema, nnx.Param),
                                                     1 - EMA_DECAY))
        scratch = nnx.clone(net)
        try:  # the in-place update PyTorch refuses outside no_grad (see its column)
            scratch.W1[...] *= EMA_DECAY
            outside = f"no error; W1 scaled by {float(scratch.W1[0, 0] / net.W1[0, 0]):g}"
        except Exception as error:
            outside = Raised.of(error)
        return {"EMA W1": _value(ema.W1[...]), "EMA W2": _value(ema.W2[...]),
                "the EMA generator's output, row 0": _value(ema(z)[0]),
                "in-place update of a parameter, outside any no_grad": outside}


register(
    "ema_generator",
    "The EMA of a generator's weights (a GAN habit): in-place lerp_ under no_grad vs optax.incremental_update",
    """
    GANs are often sampled from an exponential moving average of the generator's weights, updated
    after each optimizer step: `ema ← decay·ema + (1 − decay)·params`. PyTorch keeps a
    `deepcopy` with `requires_grad_(False)` and updates it in place (`lerp_`) under `no_grad`;
    without `no_grad`, an in-place update of a parameter that requires grad is refused (the
    in-place-leaf error of the basics). torch.func and JAX hold the weights as values: the
    average is a new value each step (`torch.lerp`, `optax.incremental_update` or a `tree_map`),
    and it can never receive a gradient because it is never an argument that is differentiated.
    After 4 SGD steps (lr 0.1, decay 0.9) the averaged weights and the averaged generator's output
    agree to float64 rounding in all three columns.
    Flax NNX keeps PyTorch's shape of the code — `nnx.clone` for the copy, an in-place update of
    the EMA module after each `optimizer.update` — without `no_grad` or `requires_grad_(False)`:
    nothing is recorded, and the copy is never an argument of `nnx.grad`.
    """,
    {"PyTorch": torch_ema_generator, "torch.func": torch_func_ema_generator, "JAX": jax_ema_generator,
     "NNX": nnx_ema_generator},
    family="idioms",
)


# --------------------------------------------------------------------------------------------
# SimSiam / BYOL: the symmetric loss with a stop-gradient branch
# --------------------------------------------------------------------------------------------


def torch_simsiam() -> dict:
    import torch
    import torch.nn.functional as F

    data = _inputs("simsiam")
    f = torch.tensor(data["f"], requires_grad=True)  # encoder (a linear map)
    h = torch.tensor(data["h"], requires_grad=True)  # predictor
    x1, x2 = torch.tensor(data["x1"]), torch.tensor(data["x2"])
    z1, z2 = x1 @ f, x2 @ f
    p1, p2 = z1 @ h, z2 @ h

    def D(p, z):  # SimSiam's negative cosine similarity, with the stop-gradient on z
        return -F.cosine_similarity(p, z.detach(), dim=-1).mean()

    (D(p1, z2) / 2 + D(p2, z1) / 2).backward()
    return {"d loss / d encoder": _value(f.grad), "d loss / d predictor": _value(h.grad)}


def torch_func_simsiam() -> dict:
    import torch
    import torch.nn.functional as F
    from torch.func import grad

    data = _inputs("simsiam")
    x1, x2 = torch.tensor(data["x1"]), torch.tensor(data["x2"])

    def loss(f, h, stop):
        z1, z2 = x1 @ f, x2 @ f
        p1, p2 = z1 @ h, z2 @ h
        cut = (lambda z: z.detach()) if stop else (lambda z: z)
        return -(F.cosine_similarity(p1, cut(z2), dim=-1).mean() + F.cosine_similarity(p2, cut(z1), dim=-1).mean()) / 2

    f, h = torch.tensor(data["f"]), torch.tensor(data["h"])
    grads = grad(loss, argnums=(0, 1))(f, h, True)
    return {"d loss / d encoder": _value(grads[0]), "d loss / d predictor": _value(grads[1]),
            "d loss / d encoder, without the stop-gradient": _value(grad(loss)(f, h, False))}


def jax_simsiam() -> dict:
    data = _inputs("simsiam")
    with jax.enable_x64():
        x1, x2 = jnp.asarray(data["x1"]), jnp.asarray(data["x2"])

        def cosine(a, b):  # PyTorch's cosine_similarity: a·b / max(‖a‖·‖b‖, eps)
            return jnp.sum(a * b, -1) / jnp.maximum(jnp.linalg.norm(a, axis=-1) * jnp.linalg.norm(b, axis=-1), 1e-8)

        def loss(f, h, stop):
            z1, z2 = x1 @ f, x2 @ f
            p1, p2 = z1 @ h, z2 @ h
            cut = jax.lax.stop_gradient if stop else (lambda z: z)
            return -(cosine(p1, cut(z2)).mean() + cosine(p2, cut(z1)).mean()) / 2

        f, h = jnp.asarray(data["f"]), jnp.asarray(data["h"])
        grads = jax.grad(loss, argnums=(0, 1))(f, h, True)
        return {"d loss / d encoder": _value(grads[0]), "d loss / d predictor": _value(grads[1]),
                "d loss / d encoder, without the stop-gradient": _value(jax.grad(loss)(f, h, False))}


register(
    "simsiam",
    "SimSiam / BYOL: the symmetric loss with z.detach()",
    """
    SimSiam compares each view's prediction p with the *other* view's projection z, and stops the
    gradient on z: `D(p1, z2.detach()) / 2 + D(p2, z1.detach()) / 2`. Without the stop-gradient
    the network can collapse to a constant; with it, only the prediction branch pulls. In JAX the
    same loss is written with `stop_gradient(z)`; gradients for the encoder and the predictor are
    equal in all three columns to float64 rounding, and differ without the stop-gradient.
    """,
    {"PyTorch": torch_simsiam, "torch.func": torch_func_simsiam, "JAX": jax_simsiam},
    family="idioms",
)


# --------------------------------------------------------------------------------------------
# WGAN-GP's gradient penalty: a gradient inside a gradient
# --------------------------------------------------------------------------------------------


def torch_gradient_penalty() -> dict:
    import torch
    import torch.nn.functional as F

    data = _inputs("gradient_penalty")
    weight = torch.tensor(data["weight"], requires_grad=True)  # a one-layer critic: conv, LeakyReLU, mean
    real, fake, eps = (torch.tensor(data[k]) for k in ("real", "fake", "eps"))
    x_hat = (eps * real + (1 - eps) * fake).requires_grad_(True)
    critic = F.leaky_relu(F.conv2d(x_hat, weight, stride=2, padding=1), 0.2).mean(dim=(1, 2, 3))
    (gradients,) = torch.autograd.grad(critic.sum(), x_hat, create_graph=True)  # keep the graph: differentiate again
    penalty = ((gradients.flatten(1).norm(2, dim=1) - 1) ** 2).mean()
    penalty.backward()
    return {"penalty": _value(penalty), "d penalty / d weight": _value(weight.grad)}


def torch_func_gradient_penalty() -> dict:
    import torch
    import torch.nn.functional as F
    from torch.func import grad

    data = _inputs("gradient_penalty")
    real, fake, eps = (torch.tensor(data[k]) for k in ("real", "fake", "eps"))
    x_hat = eps * real + (1 - eps) * fake

    def critic_sum(x, weight):
        return F.leaky_relu(F.conv2d(x, weight, stride=2, padding=1), 0.2).mean(dim=(1, 2, 3)).sum()

    def penalty(weight):
        gradients = grad(critic_sum)(x_hat, weight)  # grad inside grad: no create_graph needed
        return ((gradients.flatten(1).norm(2, dim=1) - 1) ** 2).mean()

    return {"d penalty / d weight": _value(grad(penalty)(torch.tensor(data["weight"])))}


def jax_gradient_penalty() -> dict:
    data = _inputs("gradient_penalty")
    with jax.enable_x64():
        real, fake, eps = (jnp.asarray(data[k]).transpose(0, 2, 3, 1) for k in ("real", "fake", "eps"))
        x_hat = eps * real + (1 - eps) * fake  # NHWC

        def critic_sum(x, weight_OIHW):  # this project's conv2d, with its hand-written VJP
            return jnp.sum(jnp.mean(jax.nn.leaky_relu(layers.conv2d(x, weight_OIHW, 2, 1), 0.2), axis=(1, 2, 3)))

        def penalty(weight_OIHW):
            gradients = jax.grad(critic_sum)(x_hat, weight_OIHW)
            return jnp.mean((jnp.linalg.norm(gradients.reshape(gradients.shape[0], -1), axis=1) - 1) ** 2)

        weight = jnp.asarray(data["weight"])
        value, weight_grad = jax.value_and_grad(penalty)(weight)
        return {"penalty": _value(value), "d penalty / d weight": _value(weight_grad)}


register(
    "gradient_penalty",
    "WGAN-GP's gradient penalty: autograd.grad(create_graph=True) vs jax.grad inside jax.grad",
    """
    WGAN-GP penalises the critic's input gradient at points between real and fake images,
    `(‖∇_x̂ D(x̂)‖₂ − 1)²`, and trains the critic through that penalty: a gradient of a gradient.
    PyTorch needs `torch.autograd.grad(..., create_graph=True)` so that the first gradient is
    itself recorded, then `backward()`. In JAX a gradient is just a function, so `jax.grad` of a
    function that calls `jax.grad` is the whole story; `torch.func.grad` nests the same way. The
    JAX column runs through this project's own `conv2d` and its hand-written VJP (differentiated
    a second time here), and agrees with PyTorch's `F.conv2d` to float64 rounding.
    """,
    {"PyTorch": torch_gradient_penalty, "torch.func": torch_func_gradient_penalty, "JAX": jax_gradient_penalty},
    family="idioms",
)


# --------------------------------------------------------------------------------------------
# no_grad and memory
# --------------------------------------------------------------------------------------------

MEMORY_BATCH, MEMORY_WIDTH, MEMORY_LAYERS = 256, 512, 8


def _mlp_inputs():
    rng = np.random.default_rng(6)
    weights = [rng.normal(size=(MEMORY_WIDTH, MEMORY_WIDTH)) / np.sqrt(MEMORY_WIDTH) for _ in range(MEMORY_LAYERS)]
    return rng.normal(size=(MEMORY_BATCH, MEMORY_WIDTH)).astype(np.float32), [w.astype(np.float32) for w in weights]


def torch_no_grad_memory() -> dict:
    import torch

    x_np, weights_np = _mlp_inputs()
    x = torch.from_numpy(x_np)
    weights = [torch.from_numpy(w).requires_grad_(True) for w in weights_np]
    saved = {"bytes": 0}
    inputs = {t.data_ptr() for t in [x, *weights]}  # kept anyway: only what the recording adds counts

    def pack(tensor):  # called for every tensor autograd keeps for the backward pass
        if tensor.data_ptr() not in inputs:
            saved["bytes"] += tensor.numel() * tensor.element_size()
        return tensor

    def forward():
        h = x
        for w in weights:
            h = torch.tanh(h @ w)
        return h.sum()

    with torch.autograd.graph.saved_tensors_hooks(pack, lambda t: t):
        forward()
        recorded = saved["bytes"]
        saved["bytes"] = 0
        with torch.no_grad():
            forward()
        under_no_grad = saved["bytes"]
    return {"MB kept for backward, recording": round(recorded / 2**20, 3),
            "MB kept for backward, under no_grad": round(under_no_grad / 2**20, 3)}


def jax_residual_memory() -> dict:
    x_np, weights_np = _mlp_inputs()
    x, weights = jnp.asarray(x_np), [jnp.asarray(w) for w in weights_np]

    def layer(h, w):
        return jnp.tanh(h @ w)

    def forward(weights, remat=False):
        h = x
        for w in weights:
            h = (jax.checkpoint(layer) if remat else layer)(h, w)
        return jnp.sum(h)

    inputs = {a.unsafe_buffer_pointer() for a in [x, *weights]}  # kept anyway: only what differentiation adds counts

    def residual_mb(fn):  # what a pullback closes over: the analogue of autograd's saved tensors
        _, pullback = jax.vjp(fn, weights)
        arrays = [leaf for leaf in jax.tree_util.tree_leaves(pullback) if isinstance(leaf, jax.Array)]
        unique = {a.unsafe_buffer_pointer(): a.nbytes for a in arrays if a.unsafe_buffer_pointer() not in inputs}
        return round(sum(unique.values()) / 2**20, 3)

    evaluated = jax.jit(forward).lower(weights).compile().memory_analysis()
    differentiated = jax.jit(jax.grad(forward)).lower(weights).compile().memory_analysis()
    return {
        "MB a jax.vjp pullback keeps": residual_mb(forward),
        "MB it keeps with jax.checkpoint on each layer": residual_mb(lambda w: forward(w, remat=True)),
        "MB of temporaries, compiled forward only": round(evaluated.temp_size_in_bytes / 2**20, 3),
        "MB of temporaries, compiled jax.grad": round(differentiated.temp_size_in_bytes / 2**20, 3),
    }


register(
    "no_grad_memory",
    "What no_grad saves, and how JAX gets the same",
    """
    `torch.no_grad()` is not only about correctness: while autograd records, every operation
    keeps the tensors its backward will need (here, for 8 layers of a 256 × 512 float32 MLP,
    each layer's input and its tanh output: 7.5 MB beyond the inputs and weights), and under
    `no_grad` nothing is kept. `stop_gradient` does *not* do this in
    JAX (jax#1937): it cuts a derivative, not a recording, because JAX records nothing in the
    first place. A forward pass that is not differentiated keeps no residuals; `jax.vjp` keeps
    what its pullback closes over (8 MB here, against autograd's 7.5 MB: the same activations), and
    `jax.checkpoint` on each layer keeps only the layers' inputs (3.5 MB) and recomputes the rest
    in the backward pass. Compiled, XLA plans the memory and reuses buffers: the compiled `jax.grad`
    needs 1 MB of temporaries here, far less than what a pullback keeps op by op, and never less than
    the forward alone (which needs 0 or 1 MB, as XLA sums the final reduction in place or in a
    buffer: jax 0.10.2 with its miscompile's workaround takes the buffer).
    """,
    {"PyTorch": torch_no_grad_memory, "JAX": jax_residual_memory},
    family="idioms",
)
