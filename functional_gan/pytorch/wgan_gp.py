"""WGAN-GP in PyTorch, written the way reference implementations write it: the critic and the loop.

The gradient penalty is the one of Gulrajani et al.'s published code and of its PyTorch ports
(e.g. caogang/wgan-gp's ``calc_gradient_penalty``)::

    interpolates = alpha * real + (1 - alpha) * fake
    interpolates.requires_grad_(True)
    disc_interpolates = netD(interpolates)
    gradients = autograd.grad(outputs=disc_interpolates, inputs=interpolates,
                              grad_outputs=torch.ones_like(disc_interpolates),
                              create_graph=True, retain_graph=True)[0]
    penalty = ((gradients.view(b, -1).norm(2, dim=1) - 1) ** 2).mean() * LAMBDA

and the loop updates the critic every iteration and the generator every ``n_critic``-th, reusing
the iteration's ``fake`` (as the DCGAN tutorial does) for the generator's step. The generator is
the tutorial's (:class:`functional_gan.pytorch.dcgan.Generator`); the critic is the tutorial's
Discriminator without BatchNorm and Sigmoid, its convolutions with biases.
"""

from __future__ import annotations

import torch
from torch import nn

from functional_gan.config import TrainConfig
from functional_gan.pytorch import dcgan


class Critic(nn.Module):
    def __init__(self, ndf=64, nc=3, image_size=64):
        super().__init__()
        n_down = dcgan._stride2_blocks(image_size)
        channels = [ndf * 2 ** i for i in range(n_down)]
        layers = []
        for i in range(n_down):
            layers += [nn.Conv2d(channels[i - 1] if i else nc, channels[i], 4, 2, 1), nn.LeakyReLU(0.2, inplace=True)]
        layers.append(nn.Conv2d(channels[-1], 1, 4, 1, 0))
        self.main = nn.Sequential(*layers)

    def forward(self, input):
        return self.main(input).view(-1)


def make_models(config: TrainConfig, dtype=torch.float32):
    """netG (the tutorial's) and the critic, initialised with the tutorial's ``weights_init`` under ``manual_seed``."""
    torch.manual_seed(config.seed)
    net_g = dcgan.Generator(config.nz, config.ngf, config.nc, config.image_size).to(dtype)
    net_g.apply(dcgan.weights_init)
    net_c = Critic(config.ndf, config.nc, config.image_size).to(dtype)
    net_c.apply(dcgan.weights_init)  # conv weights N(0, 0.02); biases keep PyTorch's default U(±1/√fan_in)
    return net_g, net_c


def calc_gradient_penalty(net_c, real, fake, alpha):
    """``((‖∇_x̂ C(x̂)‖₂ − 1)²).mean()`` at ``x̂ = α·real + (1 − α)·fake``; ``fake`` must already be detached."""
    interpolates = alpha.view(-1, 1, 1, 1) * real + (1 - alpha.view(-1, 1, 1, 1)) * fake
    interpolates.requires_grad_(True)
    disc_interpolates = net_c(interpolates)
    gradients = torch.autograd.grad(
        outputs=disc_interpolates, inputs=interpolates, grad_outputs=torch.ones_like(disc_interpolates),
        create_graph=True, retain_graph=True,
    )[0]
    return ((gradients.view(gradients.size(0), -1).norm(2, dim=1) - 1) ** 2).mean()


def wgan_gp_iteration(net_g, net_c, optimizer_g, optimizer_c, real, noise, alpha, iteration: int, config: TrainConfig):
    """One iteration: a critic update, and a generator update when ``(iteration + 1) % n_critic == 0``.

    Returns (errD, errG, C(x), C(G(z)) before, C(G(z)) after the critic's update) as floats; on
    iterations without a generator update ``errG`` is computed under ``no_grad`` for the log.
    """
    # (1) Update the critic: minimize C(G(z)) − C(x) + λ·GP.
    net_c.zero_grad()
    fake = net_g(noise)
    output_real = net_c(real)
    output_fake = net_c(fake.detach())
    penalty = calc_gradient_penalty(net_c, real, fake.detach(), alpha)
    err_d = output_fake.mean() - output_real.mean() + config.gp_weight * penalty
    err_d.backward()
    optimizer_c.step()
    # (2) Every n_critic-th iteration, update G: minimize −C(G(z)), on the same fake, through the updated critic.
    if (iteration + 1) % config.n_critic == 0:
        net_g.zero_grad()
        output = net_c(fake)
        err_g = -output.mean()
        err_g.backward()
        optimizer_g.step()
    else:
        with torch.no_grad():
            output = net_c(fake)
            err_g = -output.mean()
    return err_d.item(), err_g.item(), output_real.mean().item(), output_fake.mean().item(), output.mean().item()


def iteration(net_g, net_c, optimizer_g, optimizer_c, real, noise, mix, index: int, config: TrainConfig):
    """The loss entry's reference iteration (:data:`functional_gan.losses.LOSSES`): :func:`wgan_gp_iteration`."""
    return wgan_gp_iteration(net_g, net_c, optimizer_g, optimizer_c, real, noise, mix, index, config)
