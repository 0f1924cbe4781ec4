"""The pictures ``functional-gan graph`` draws: the notes' examples, the book's regression, the D step.

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


GRAPH_SETS = {"detach": detach_example_graphs, "linreg": linreg_graphs, "dstep": d_step_graphs}
