"""The DCGAN's D step as lessons: detach() vs differentiating only D, and the proof in the compiled program."""

from __future__ import annotations

import dataclasses

import jax
import jax.numpy as jnp

from functional_gan.config import TUTORIAL, TrainConfig
from functional_gan.losses import bce_discriminator_loss
from functional_gan.train import make_models

from .registry import register

# Tiny nets for the lessons and the graph pictures; `--full-size` uses the tutorial's.
LESSON_GAN = dataclasses.replace(TUTORIAL, nz=8, ngf=4, ndf=4, image_size=32, batch_size=4, seed=0)
FULL_SIZE_GAN = dataclasses.replace(TUTORIAL, seed=0)

# Labels of the values the sides return (the comparison suite reads them too).
TORCH_G_GRADS_NONE = "{cut}: netG parameters whose .grad is None after the D step"
TORCH_G_GRAD_SUM = "{cut}: sum of |netG .grad| after the D step"
JAX_G_GRAD_SUM = "grad wrt G and D, {cut}: sum of |G's gradient|"


def gan_d_loss(config: TrainConfig = LESSON_GAN):
    """The DCGAN's D loss as a function of both networks' parameters, on a fixed batch and noise.

    Returns ``(d_loss, generator_params, discriminator_params)`` where
    ``d_loss(generator_params, discriminator_params, detach=True)`` runs G's forward and then the
    tutorial's D loss, with ``stop_gradient(fake)`` when ``detach``.
    """
    generator, discriminator = make_models(config)
    variables_g, variables_d, real, noise = gan_lesson_inputs(config)

    def d_loss(generator_params, discriminator_params, detach=True):
        fake, _ = generator.apply(
            {"params": generator_params, "batch_stats": variables_g["batch_stats"]}, noise, mutable=["batch_stats"]
        )
        loss, _ = bce_discriminator_loss(discriminator, discriminator_params, variables_d["batch_stats"], real, fake, detach=detach)
        return loss

    return d_loss, variables_g["params"], variables_d["params"]


def gan_lesson_inputs(config: TrainConfig = LESSON_GAN):
    """The lesson's Linen variables of G and D (``init`` from the config's seed), its real batch and its noise."""
    generator, discriminator = make_models(config)
    key_g, key_d, key_real, key_noise = jax.random.split(jax.random.key(config.seed), 4)
    size = config.image_size
    variables_g = generator.init(key_g, jnp.zeros((1, config.nz)))
    variables_d = discriminator.init(key_d, jnp.zeros((1, size, size, config.nc)))
    real = jax.random.uniform(key_real, (config.batch_size, size, size, config.nc), minval=-1, maxval=1)
    noise = jax.random.normal(key_noise, (config.batch_size, config.nz))
    return variables_g, variables_d, real, noise


def torch_d_step_cost(config: TrainConfig, detach: bool):
    """The tutorial's D step in PyTorch, backward included: (netG, FLOPs by FlopCounterMode, aten convolution calls)."""
    import torch

    from functional_gan.pytorch import counting, dcgan

    net_g, net_d = dcgan.make_models(config)
    real = torch.rand(config.batch_size, config.nc, config.image_size, config.image_size) * 2 - 1
    noise = torch.randn(config.batch_size, config.nz, 1, 1)
    flops, convolutions = counting.count(lambda: dcgan.d_step(net_g, net_d, torch.nn.BCELoss(), real, noise, detach))
    return net_g, flops, convolutions


# --------------------------------------------------------------------------------------------
# The GAN step
# --------------------------------------------------------------------------------------------


def torch_gan_step() -> dict:
    results = {}
    for detach, cut in ((True, "with detach()"), (False, "without detach()")):
        net_g, flops, _ = torch_d_step_cost(LESSON_GAN, detach)
        g_grads = [p.grad for p in net_g.parameters()]
        results["netG parameters"] = len(g_grads)
        results[TORCH_G_GRADS_NONE.format(cut=cut)] = sum(g is None for g in g_grads)
        results[TORCH_G_GRAD_SUM.format(cut=cut)] = sum(float(g.abs().sum()) for g in g_grads if g is not None)
        results[f"{cut}: D-step FLOPs"] = flops
    return results


def jax_gan_step() -> dict:
    d_loss, generator_params, discriminator_params = gan_d_loss()
    d_only = {d: jax.grad(d_loss, argnums=1)(generator_params, discriminator_params, d) for d in (True, False)}
    results = {
        "grad wrt D only: its top-level keys are D's modules": sorted(d_only[True]) == sorted(discriminator_params),
        "grad wrt D only: identical with and without stop_gradient": all(
            bool(jnp.array_equal(a, b)) for a, b in zip(jax.tree_util.tree_leaves(d_only[True]), jax.tree_util.tree_leaves(d_only[False]))
        ),
    }
    for detach, cut in ((True, "with stop_gradient"), (False, "without stop_gradient")):
        g_grads, _ = jax.grad(d_loss, argnums=(0, 1))(generator_params, discriminator_params, detach)
        results[JAX_G_GRAD_SUM.format(cut=cut)] = sum(float(jnp.sum(jnp.abs(leaf))) for leaf in jax.tree_util.tree_leaves(g_grads))
    return results


def nnx_gan_step() -> dict:
    from flax import nnx

    from functional_gan import nnx_dcgan
    from functional_gan.layers import bce_loss

    variables_g, variables_d, real, noise = gan_lesson_inputs()
    generator, discriminator = nnx_dcgan.make_models(LESSON_GAN)  # the same weights as the JAX column's
    nnx_dcgan.load_linen(generator, variables_g["params"], variables_g["batch_stats"])
    nnx_dcgan.load_linen(discriminator, variables_d["params"], variables_d["batch_stats"])

    def bce(output, label):
        return bce_loss(output, jnp.full(output.shape, label, output.dtype))

    def d_loss(discriminator, generator, detach=True):
        fake = generator(noise)
        fake = jax.lax.stop_gradient(fake) if detach else fake  # PyTorch: fake.detach()
        return bce(discriminator(real), 1.0) + bce(discriminator(fake), 0.0)

    def g_loss(generator, discriminator):
        return bce(discriminator(generator(noise)), 1.0)

    # nnx.grad differentiates its first argument's nnx.Params: only D here, G is a constant.
    d_only = {d: nnx.to_pure_dict(nnx.grad(d_loss)(discriminator, generator, d)) for d in (True, False)}
    results = {
        "grad wrt D only: its top-level keys are D's modules": sorted(d_only[True]) == sorted(discriminator.names),
        "grad wrt D only: identical with and without stop_gradient": all(
            bool(jnp.array_equal(a, b)) for a, b in zip(jax.tree.leaves(d_only[True]), jax.tree.leaves(d_only[False]))),
    }
    for detach, cut in ((True, "with stop_gradient"), (False, "without stop_gradient")):
        _, g_grads = nnx.grad(d_loss, argnums=(0, 1))(discriminator, generator, detach)
        results[JAX_G_GRAD_SUM.format(cut=cut)] = sum(float(jnp.sum(jnp.abs(leaf))) for leaf in jax.tree.leaves(g_grads))
    g_only = nnx.to_pure_dict(nnx.grad(g_loss)(generator, discriminator))  # the G step: only G is differentiated
    results["G step, nnx.grad(g_loss)(G, D): its keys are G's modules"] = sorted(g_only) == sorted(generator.names)
    # model.eval() / model.train(), as in PyTorch: BatchNorm's running statistics move in train mode only.
    before = nnx.to_pure_dict(nnx.state(generator, nnx.BatchStat))
    generator.eval()
    generator(noise)
    unchanged = nnx.to_pure_dict(nnx.state(generator, nnx.BatchStat))
    generator.train()
    generator(noise)
    moved = nnx.to_pure_dict(nnx.state(generator, nnx.BatchStat))
    same = [bool(jnp.array_equal(a, b)) for a, b in zip(jax.tree.leaves(before), jax.tree.leaves(unchanged))]
    results["after a pass in G.eval(): running statistics unchanged"] = all(same)
    results["after a pass in G.train(): running means moved"] = not all(
        bool(jnp.array_equal(a, b)) for a, b in zip(jax.tree.leaves(unchanged), jax.tree.leaves(moved)))
    return results


def torch_func_gan_step() -> dict:
    import torch
    from torch.func import functional_call, grad

    from functional_gan.losses import FAKE_LABEL, REAL_LABEL
    from functional_gan.pytorch import dcgan

    config = LESSON_GAN
    net_g, net_d = dcgan.make_models(config)
    real = torch.rand(config.batch_size, config.nc, config.image_size, config.image_size) * 2 - 1
    noise = torch.randn(config.batch_size, config.nz, 1, 1)
    params_g = {name: p.detach() for name, p in net_g.named_parameters()}
    params_d = {name: p.detach() for name, p in net_d.named_parameters()}
    # BatchNorm updates its running statistics in place: under torch.func they must be inputs.
    buffers = {name: b.clone() for net in (net_g, net_d) for name, b in net.named_buffers()}
    bce = torch.nn.functional.binary_cross_entropy

    def d_loss(params_g, params_d, buffers, detach):
        fake = functional_call(net_g, (params_g, buffers), (noise,), strict=False)
        out_real = functional_call(net_d, (params_d, buffers), (real,), strict=False).view(-1)
        out_fake = functional_call(net_d, (params_d, buffers), (fake.detach() if detach else fake,), strict=False).view(-1)
        return bce(out_real, torch.full_like(out_real, REAL_LABEL)) + bce(out_fake, torch.full_like(out_fake, FAKE_LABEL))

    d_only = {detach: grad(d_loss, argnums=1)(params_g, params_d, dict(buffers), detach) for detach in (True, False)}
    results = {
        "grad wrt D only: its keys are D's parameters": sorted(d_only[True]) == sorted(params_d),
        "grad wrt D only: identical with and without detach()": all(torch.equal(d_only[True][k], d_only[False][k]) for k in params_d),
    }
    for detach, cut in ((True, "with detach()"), (False, "without detach()")):
        g_grads, _ = grad(d_loss, argnums=(0, 1))(params_g, params_d, dict(buffers), detach)
        results[f"grad wrt G and D, {cut}: sum of |G's gradient|"] = sum(float(g.abs().sum()) for g in g_grads.values())
    results["netG parameters with a .grad afterwards"] = sum(p.grad is not None for p in net_g.parameters())
    return results


register(
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
    cuts G's gradient to exact zeros. `torch.func.grad` over `functional_call` behaves as JAX does:
    with respect to D's parameters only, the gradient is the same with or without `detach()` and
    no `.grad` is filled anywhere; with respect to both, `detach()` makes G's gradient exactly 0.
    Flax NNX brings PyTorch's objects back (G and D own their weights and BatchNorm statistics,
    `eval()`/`train()` switch BatchNorm) while gradients stay functional: `nnx.grad(d_loss)(D, G)`
    differentiates its first argument's parameters, so the D step differentiates D alone because
    only D is the argument, and the G step `nnx.grad(g_loss)(G, D)` differentiates G alone;
    `detach()` is still `stop_gradient`, with the same numbers as the JAX column.
    """,
    {"PyTorch": torch_gan_step, "torch.func": torch_func_gan_step, "JAX": jax_gan_step, "NNX": nnx_gan_step},
    family="gan_step",
)


# --------------------------------------------------------------------------------------------
# Proof at the compiled level
# --------------------------------------------------------------------------------------------


def torch_compiled_cost(config: TrainConfig) -> dict:
    rows = {}
    for detach in (True, False):
        _, flops, convolutions = torch_d_step_cost(config, detach)
        rows[f"D step {'with' if detach else 'without'} detach()"] = {
            "aten convolution calls (a backward call computes both gradients)": convolutions,
            "GFLOP (FlopCounterMode)": round(flops / 1e9, 4),
        }
    return rows


def jax_compiled_cost(config: TrainConfig) -> dict:
    d_loss, generator_params, discriminator_params = gan_d_loss(config)
    rows = {}
    for argnums, wrt in ((1, "D"), ((0, 1), "G and D")):
        for detach in (True, False):
            grad = jax.jit(jax.grad(lambda g, d, detach=detach: d_loss(g, d, detach), argnums=argnums))
            compiled = grad.lower(generator_params, discriminator_params).compile()
            cost = compiled.cost_analysis()
            cost = cost[0] if isinstance(cost, (list, tuple)) else cost
            rows[f"grad wrt {wrt}, {'with' if detach else 'without'} stop_gradient"] = {
                "convolutions in the optimised HLO": count_convolutions(compiled.as_text()),
                "GFLOP (XLA cost analysis)": round(float(cost.get("flops", float("nan"))) / 1e9, 4),
            }
    return rows


def count_convolutions(hlo_text: str) -> int:
    """Convolutions of an optimised HLO module: XLA's own and those handed to a library (YNNPACK, oneDNN)."""
    return sum(" convolution(" in line for line in hlo_text.splitlines())


register(
    "compiled",
    "Proof at the compiled level: what the D step costs",
    """
    The same D step compiled four ways. Differentiating only D's parameters gives the same program
    with or without `stop_gradient`: XLA never builds G's backward because nothing asks for it.
    Differentiating G too without `stop_gradient` adds G's backward convolutions and FLOPs — the
    work PyTorch does when `detach()` is forgotten; with `stop_gradient` G's gradient is a
    constant zero and XLA removes that work again. PyTorch's FlopCounterMode shows the same
    difference between the D step with and without `detach()`. XLA's FLOP count skips the
    padding's zeros, so it runs below FlopCounterMode's for the same convolutions. Run
    `functional-gan lessons compiled --full-size` for the tutorial's 64×64 nets at batch 128.
    """,
    {"PyTorch": torch_compiled_cost, "JAX": jax_compiled_cost},
    sizes={"small": LESSON_GAN, "full": FULL_SIZE_GAN},
    family="compiled",
)


# --------------------------------------------------------------------------------------------
# Proof at the compiled level, WGAN-GP: what the gradient penalty and the cut cost
# --------------------------------------------------------------------------------------------


def wgan_gp_critic_loss_fn(config: TrainConfig):
    """WGAN-GP's critic loss as a function of G's and the critic's parameters, on a fixed batch, noise and ε.

    Returns ``(loss, generator_params, critic_params)``; ``loss(generator_params, critic_params,
    detach=True, penalty=True)`` runs G's forward and the critic's loss, with ``stop_gradient(fake)``
    when ``detach`` and the gradient penalty when ``penalty``.
    """
    from functional_gan import losses

    config = dataclasses.replace(config, loss="wgan-gp")
    generator, critic = make_models(config)
    key_g, key_c, key_real, key_noise, key_mix = jax.random.split(jax.random.key(config.seed), 5)
    size = config.image_size
    variables_g = generator.init(key_g, jnp.zeros((1, config.nz)))
    variables_c = critic.init(key_c, jnp.zeros((1, size, size, config.nc)))
    real = jax.random.uniform(key_real, (config.batch_size, size, size, config.nc), minval=-1, maxval=1)
    noise = jax.random.normal(key_noise, (config.batch_size, config.nz))
    mix = jax.random.uniform(key_mix, (config.batch_size,))

    def loss(generator_params, critic_params, detach=True, penalty=True):
        fake, _ = generator.apply(
            {"params": generator_params, "batch_stats": variables_g["batch_stats"]}, noise, mutable=["batch_stats"]
        )
        if penalty:
            return losses.wgan_gp_critic_loss(critic, critic_params, {}, real, fake, mix, config.gp_weight, detach)[0]
        # The Wasserstein term alone (λ = 0 would still compute the penalty: 0·x is not folded away for floats).
        fake_input = jax.lax.stop_gradient(fake) if detach else fake
        return critic.apply({"params": critic_params}, fake_input).mean() - critic.apply({"params": critic_params}, real).mean()

    return loss, variables_g["params"], variables_c["params"]


def torch_wgan_gp_cost(config: TrainConfig) -> dict:
    import torch

    from functional_gan.pytorch import counting, wgan_gp

    config = dataclasses.replace(config, loss="wgan-gp", gp_weight=10.0)
    net_g, net_c = wgan_gp.make_models(config)
    real = torch.rand(config.batch_size, config.nc, config.image_size, config.image_size) * 2 - 1
    noise = torch.randn(config.batch_size, config.nz, 1, 1)
    alpha = torch.rand(config.batch_size)

    def critic_step(penalty: bool, detach: bool):
        fake = net_g(noise)
        fake_input = fake.detach() if detach else fake
        loss = net_c(fake_input).mean() - net_c(real).mean()
        if penalty:
            loss = loss + config.gp_weight * wgan_gp.calc_gradient_penalty(net_c, real, fake_input, alpha)
        loss.backward()

    rows = {}
    for penalty, detach, label in ((False, True, "critic step without the penalty, with detach()"),
                                   (True, True, "critic step with the penalty, with detach()"),
                                   (True, False, "critic step with the penalty, without detach()")):
        flops, convolutions = counting.count(lambda: critic_step(penalty, detach), per_module=False)
        rows[label] = {"aten convolution calls": convolutions, "GFLOP (FlopCounterMode)": round(flops / 1e9, 4)}
    return rows


def jax_wgan_gp_cost(config: TrainConfig) -> dict:
    loss, generator_params, critic_params = wgan_gp_critic_loss_fn(config)
    rows = {}
    for argnums, penalty, detach, label in (
        (1, False, True, "grad wrt the critic, without the penalty"),
        (1, True, True, "grad wrt the critic, with the penalty (the real step)"),
        ((0, 1), True, True, "grad wrt G and the critic, with the penalty, with stop_gradient"),
        ((0, 1), True, False, "grad wrt G and the critic, with the penalty, without stop_gradient"),
    ):
        grad = jax.jit(jax.grad(lambda g, c, penalty=penalty, detach=detach: loss(g, c, detach, penalty), argnums=argnums))
        compiled = grad.lower(generator_params, critic_params).compile()
        cost = compiled.cost_analysis()
        cost = cost[0] if isinstance(cost, (list, tuple)) else cost
        rows[label] = {
            "convolutions in the optimised HLO": count_convolutions(compiled.as_text()),
            "GFLOP (XLA cost analysis)": round(float(cost.get("flops", float("nan"))) / 1e9, 4),
        }
    return rows


register(
    "compiled_wgan_gp",
    "Proof at the compiled level: what WGAN-GP's critic step costs (the penalty, and the cut)",
    """
    The critic's step of WGAN-GP, compiled. The gradient penalty is a gradient inside the loss, so
    its cost shows in the program: the interpolates' forward, the backward to the input, and, to
    differentiate that with respect to the critic's weights, the backward of the backward
    (PyTorch records those as `ConvolutionBackwardBackward0` nodes when `create_graph=True`;
    see `functional-gan graph idioms`). At these sizes the penalty roughly doubles the critic
    step's convolutions and FLOPs, in PyTorch's aten calls as in XLA's program. Differentiating
    G as well: without `stop_gradient` (PyTorch: without `detach()`) G's backward convolutions
    are added; with it, XLA removes them again and the program is the critic-only one, as in the
    DCGAN's `compiled` lesson. XLA's FLOP count skips the padding's zeros; FlopCounterMode does
    not. `--full-size` compiles the tutorial's 64×64 nets at batch 128.
    """,
    {"PyTorch": torch_wgan_gp_cost, "JAX": jax_wgan_gp_cost},
    sizes={"small": LESSON_GAN, "full": FULL_SIZE_GAN},
    family="compiled",
)
