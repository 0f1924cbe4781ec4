"""The hinge loss in PyTorch, as BigGAN-PyTorch's ``losses.py`` writes it, in the tutorial's loop.

    def loss_hinge_dis(dis_fake, dis_real):
        loss_real = torch.mean(F.relu(1. - dis_real))
        loss_fake = torch.mean(F.relu(1. + dis_fake))
        return loss_real, loss_fake

    def loss_hinge_gen(dis_fake):
        return -torch.mean(dis_fake)

The networks are the tutorial's generator and the critic (the tutorial's Discriminator without
BatchNorm and Sigmoid: the hinge acts on raw scores). D updates every iteration, G every
``n_critic``-th, on the iteration's ``fake`` through the updated D, as the tutorial's loop does.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F

from functional_gan.config import TrainConfig
from functional_gan.pytorch.wgan_gp import make_models  # noqa: F401  (the entry's models: netG and the critic)


def iteration(net_g, net_d, optimizer_g, optimizer_d, real, noise, mix, index: int, config: TrainConfig):
    """One iteration. Returns (errD, errG, D(x), D(G(z)) before, D(G(z)) after D's update) as floats."""
    net_d.zero_grad()
    fake = net_g(noise)
    output_real = net_d(real)
    output_fake = net_d(fake.detach())
    err_d = torch.mean(F.relu(1.0 - output_real)) + torch.mean(F.relu(1.0 + output_fake))
    err_d.backward()
    optimizer_d.step()
    if (index + 1) % config.n_critic == 0:
        net_g.zero_grad()
        output = net_d(fake)
        err_g = -torch.mean(output)
        err_g.backward()
        optimizer_g.step()
    else:
        with torch.no_grad():
            output = net_d(fake)
            err_g = -torch.mean(output)
    return err_d.item(), err_g.item(), output_real.mean().item(), output_fake.mean().item(), output.mean().item()
