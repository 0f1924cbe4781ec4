"""The pictures ``functional-gan graph`` draws: the notes' examples, the book's regression, the D step, the idioms.

Each set returns DOT sources by name; the PyTorch graphs are drawn when torch is installed.
"""

from __future__ import annotations

import jax

from functional_gan.graph import jaxpr_to_dot, torch_graph_to_dot
from functional_gan.linreg import make_data, mse_loss

from .gan import LESSON_GAN, gan_d_loss


def detach_example_graphs() -> dict[str, str]:
    """The note's x → a = 2x → ŷ = a + 3 → loss = 10 − ŷ, cut at ŷ, in JAX and PyTorch."""
    def loss(x):
        y_hat = 2 * x + 3
        return 10.0 - jax.lax.stop_gradient(y_hat)

    def connected(x):
        return 10.0 - (2 * x + 3)

    graphs = {
        "detach_jax_loss": jaxpr_to_dot(jax.make_jaxpr(loss)(5.0), ["x"], "JAX: 10 - stop_gradient(2x + 3)"),
        "detach_jax_grad": jaxpr_to_dot(jax.make_jaxpr(jax.grad(loss))(5.0), ["x"], "JAX: grad of the cut loss (a constant 0)", mark_cut=False),
        "connected_jax_grad": jaxpr_to_dot(jax.make_jaxpr(jax.grad(connected))(5.0), ["x"], "JAX: grad of 10 - (2x + 3)", mark_cut=False),
    }
    try:
        import torch
    except ImportError:
        return graphs
    x = torch.tensor([5.0], requires_grad=True)
    y_hat = x * 2 + 3
    graphs["detach_torch_loss"] = torch_graph_to_dot(10 - y_hat.detach(), {"x": x}, "PyTorch: 10 - y_hat.detach()")
    graphs["connected_torch_loss"] = torch_graph_to_dot(10 - y_hat, {"x": x}, "PyTorch: 10 - y_hat")
    return graphs


def linreg_graphs() -> dict[str, str]:
    """The book's y_hat = b + w·x and its MSE, as PyTorchViz draws it and as a jaxpr."""
    data = make_data()
    params = {"b": 0.5, "w": -0.1}
    x, y = jax.numpy.asarray(data.x_train), jax.numpy.asarray(data.y_train)
    graphs = {
        "linreg_jax_loss": jaxpr_to_dot(jax.make_jaxpr(lambda b, w: mse_loss({"b": b, "w": w}, x, y))(0.5, -0.1), ["b", "w"], "JAX: MSE of b + w·x"),
        "linreg_jax_grad": jaxpr_to_dot(
            jax.make_jaxpr(jax.grad(lambda b, w: mse_loss({"b": b, "w": w}, x, y), argnums=(0, 1)))(0.5, -0.1),
            ["b", "w"], "JAX: its gradient program", mark_cut=False,
        ),
    }
    try:
        import torch
    except ImportError:
        return graphs
    b = torch.tensor([params["b"]], requires_grad=True)
    w = torch.tensor([params["w"]], requires_grad=True)
    xt, yt = torch.as_tensor(data.x_train), torch.as_tensor(data.y_train)
    graphs["linreg_torch_loss"] = torch_graph_to_dot(((b + w * xt - yt) ** 2).mean(), {"b": b, "w": w}, "PyTorch: MSE of b + w·x")
    return graphs


def d_step_graphs() -> dict[str, str]:
    """The DCGAN's D loss as a function of G's and D's parameters: the G side is seen to be cut."""
    d_loss, generator_params, discriminator_params = gan_d_loss()
    closed = jax.make_jaxpr(d_loss)(generator_params, discriminator_params)
    leaves_g = jax.tree_util.tree_flatten_with_path(generator_params)[0]
    leaves_d = jax.tree_util.tree_flatten_with_path(discriminator_params)[0]
    names = [f"G {jax.tree_util.keystr(p)}" for p, _ in leaves_g] + [f"D {jax.tree_util.keystr(p)}" for p, _ in leaves_d]
    graphs = {"dstep_jax_loss": jaxpr_to_dot(closed, names, "JAX: the D loss of the DCGAN step, G's side cut by stop_gradient(fake)")}
    gradient = jax.make_jaxpr(jax.grad(d_loss, argnums=(0, 1)))(generator_params, discriminator_params)
    graphs["dstep_jax_grad"] = jaxpr_to_dot(
        gradient, names, "JAX: its gradient wrt G and D: G's entries are constant zeros, no G backward", mark_cut=False
    )
    try:
        import torch
    except ImportError:
        return graphs
    from functional_gan.pytorch import dcgan

    c = LESSON_GAN
    net_g, net_d = dcgan.make_models(c)
    params = {f"netG.{n}": p for n, p in net_g.named_parameters()} | {f"netD.{n}": p for n, p in net_d.named_parameters()}
    real = torch.rand(c.batch_size, c.nc, c.image_size, c.image_size) * 2 - 1
    noise = torch.randn(c.batch_size, c.nz, 1, 1)
    d = dcgan.d_step(net_g, net_d, torch.nn.BCELoss(), real, noise, detach=True, backward=False)
    err_d = d.err_d_real + d.err_d_fake
    graphs["dstep_torch_loss"] = torch_graph_to_dot(err_d, params, "PyTorch: errD with netD(fake.detach()): no netG node")
    return graphs


def idiom_graphs() -> dict[str, str]:
    """The cuts of the idioms lessons (straight-through, truncated BPTT, TD target, SimSiam) and
    WGAN-GP's gradient of a gradient, each as a jaxpr and as PyTorch's autograd graph."""
    import jax.numpy as jnp
    import numpy as np

    from functional_gan import layers

    from . import idioms

    graphs = {}
    with jax.enable_x64():
        st = idioms._inputs("straight_through")
        q = jnp.asarray(st["codebook"][idioms._nearest(st["x"], st["codebook"])])
        graphs["straight_through_jax"] = jaxpr_to_dot(
            jax.make_jaxpr(lambda x: jnp.sum(jnp.sin(x + jax.lax.stop_gradient(q - x))))(jnp.asarray(st["x"])), ["x (encoder output)"],
            "JAX: x + stop_gradient(q − x): forward q, backward the identity to x")

        rnn = idioms._inputs("tbptt")
        xs = jnp.asarray(rnn["xs"][:4])

        def tbptt_loss(W, U):  # 4 steps, the hidden state cut after 2 (unrolled, so every step is drawn)
            h = jnp.zeros(3)
            total = 0.0
            for t in range(4):
                if t == 2:
                    h = jax.lax.stop_gradient(h)  # repackage_hidden
                h = jnp.tanh(W @ h + U @ xs[t])
                total = total + jnp.sum(h ** 2)
            return total

        graphs["tbptt_jax"] = jaxpr_to_dot(jax.make_jaxpr(tbptt_loss)(jnp.asarray(rnn["W"]), jnp.asarray(rnn["U"])), ["W", "U"],
                                           "JAX: 4 RNN steps, stop_gradient on the hidden state after 2: steps 3–4 send no gradient back into steps 1–2")
        tn = idioms._inputs("target_network")
        s_, s_next, r = (jnp.asarray(tn[k]) for k in ("s", "s_next", "r"))

        def td_loss(online, target):
            td_target = jax.lax.stop_gradient(r + idioms.GAMMA * jnp.max(s_next @ target, axis=1))
            return jnp.mean((s_ @ online - td_target) ** 2)

        graphs["target_network_jax"] = jaxpr_to_dot(jax.make_jaxpr(td_loss)(jnp.asarray(tn["online"]), jnp.asarray(tn["target"])),
                                                     ["online", "target"], "JAX: the TD target under stop_gradient: target gets no gradient")
        ss = idioms._inputs("simsiam")
        x1, x2 = jnp.asarray(ss["x1"]), jnp.asarray(ss["x2"])

        def simsiam_loss(f, h):
            def cosine(a, b):
                return jnp.sum(a * b, axis=1) / jnp.maximum(jnp.linalg.norm(a, axis=1) * jnp.linalg.norm(b, axis=1), 1e-8)

            z1, z2 = x1 @ f, x2 @ f
            p1, p2 = z1 @ h, z2 @ h
            return -(cosine(p1, jax.lax.stop_gradient(z2)).mean() + cosine(p2, jax.lax.stop_gradient(z1)).mean()) / 2

        graphs["simsiam_jax"] = jaxpr_to_dot(jax.make_jaxpr(simsiam_loss)(jnp.asarray(ss["f"]), jnp.asarray(ss["h"])),
                                             ["encoder f", "predictor h"], "JAX: SimSiam's symmetric loss, stop_gradient on z")
        gp = idioms._inputs("gradient_penalty")
        real, fake, eps = (jnp.asarray(gp[k]).transpose(0, 2, 3, 1) for k in ("real", "fake", "eps"))
        x_hat = eps * real + (1 - eps) * fake

        def penalty(weight):
            gradients = jax.grad(lambda x: jnp.sum(jnp.mean(jax.nn.leaky_relu(layers.conv2d(x, weight, 2, 1), 0.2), axis=(1, 2, 3))))(x_hat)
            return jnp.mean((jnp.linalg.norm(gradients.reshape(gradients.shape[0], -1), axis=1) - 1) ** 2)

        graphs["gradient_penalty_jax"] = jaxpr_to_dot(
            jax.make_jaxpr(penalty)(jnp.asarray(gp["weight"])), ["critic weight"],
            "JAX: the gradient penalty, jax.grad inside: the input gradient's program (conv VJP) is part of the function")
    try:
        import torch
    except ImportError:
        return graphs
    import torch.nn.functional as F

    x = torch.tensor(st["x"], requires_grad=True)
    q_t = torch.tensor(np.asarray(q))
    graphs["straight_through_torch"] = torch_graph_to_dot(torch.sin(x + (q_t - x).detach()).sum(), {"x": x},
                                                          "PyTorch: x + (q − x).detach()")
    W, U = torch.tensor(rnn["W"], requires_grad=True), torch.tensor(rnn["U"], requires_grad=True)
    h, total = torch.zeros(3, dtype=torch.float64), 0.0
    for t in range(4):
        if t == 2:
            h = h.detach()
        h = torch.tanh(W @ h + U @ torch.tensor(rnn["xs"][t]))
        total = total + (h ** 2).sum()
    graphs["tbptt_torch"] = torch_graph_to_dot(total, {"W": W, "U": U}, "PyTorch: hidden.detach() after 2 of 4 steps")
    online = torch.tensor(tn["online"], requires_grad=True)
    target = torch.tensor(tn["target"], requires_grad=True)
    with torch.no_grad():
        td_target = torch.tensor(tn["r"]) + idioms.GAMMA * (torch.tensor(tn["s_next"]) @ target).max(dim=1).values
    graphs["target_network_torch"] = torch_graph_to_dot(((torch.tensor(tn["s"]) @ online - td_target) ** 2).mean(),
                                                        {"online": online, "target": target}, "PyTorch: TD target under no_grad")
    weight = torch.tensor(gp["weight"], requires_grad=True)
    xh = (torch.tensor(gp["eps"]) * torch.tensor(gp["real"]) + (1 - torch.tensor(gp["eps"])) * torch.tensor(gp["fake"])).requires_grad_(True)
    critic = F.leaky_relu(F.conv2d(xh, weight, stride=2, padding=1), 0.2).mean(dim=(1, 2, 3))
    (gradients,) = torch.autograd.grad(critic.sum(), xh, create_graph=True)
    graphs["gradient_penalty_torch"] = torch_graph_to_dot(
        ((gradients.flatten(1).norm(2, dim=1) - 1) ** 2).mean(), {"critic weight": weight},
        "PyTorch: the penalty after autograd.grad(create_graph=True): backward nodes recorded in the graph")
    return graphs


GRAPH_SETS = {"detach": detach_example_graphs, "linreg": linreg_graphs, "dstep": d_step_graphs, "idioms": idiom_graphs}
