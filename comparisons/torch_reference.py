"""The PyTorch side: the DCGAN tutorial's models and loop exactly as published.

Modules are wrapped in ``self.main = nn.Sequential(...)`` as in the tutorial and pytorch/examples,
so ``state_dict`` keys (``main.0.weight``, ``main.1.running_mean`` ...) match their checkpoints.
Image sizes 32 and 128 drop or add one stride-2 block, mirroring :mod:`functional_gan.models`.
"""

from __future__ import annotations

import math

import numpy as np
import torch
from torch import nn


def _stride2_blocks(image_size: int) -> int:
    return int(math.log2(image_size)) - 2


class Generator(nn.Module):
    def __init__(self, nz=100, ngf=64, nc=3, image_size=64):
        super().__init__()
        n_up = _stride2_blocks(image_size)
        channels = [ngf * 2 ** i for i in reversed(range(n_up))]
        layers = [nn.ConvTranspose2d(nz, channels[0], 4, 1, 0, bias=False)]
        for i in range(n_up):
            out_channels = channels[i + 1] if i + 1 < n_up else nc
            layers += [nn.BatchNorm2d(channels[i]), nn.ReLU(True), nn.ConvTranspose2d(channels[i], out_channels, 4, 2, 1, bias=False)]
        layers.append(nn.Tanh())
        self.main = nn.Sequential(*layers)

    def forward(self, input):
        return self.main(input)


class Discriminator(nn.Module):
    def __init__(self, ndf=64, nc=3, image_size=64):
        super().__init__()
        n_down = _stride2_blocks(image_size)
        channels = [ndf * 2 ** i for i in range(n_down)]
        layers = [nn.Conv2d(nc, channels[0], 4, 2, 1, bias=False), nn.LeakyReLU(0.2, inplace=True)]
        for i in range(1, n_down):
            layers += [
                nn.Conv2d(channels[i - 1], channels[i], 4, 2, 1, bias=False),
                nn.BatchNorm2d(channels[i]),
                nn.LeakyReLU(0.2, inplace=True),
            ]
        layers += [nn.Conv2d(channels[-1], 1, 4, 1, 0, bias=False), nn.Sigmoid()]
        self.main = nn.Sequential(*layers)

    def forward(self, input):
        return self.main(input)


def weights_init(m):
    """The tutorial's custom weight initialisation, called on netG and netD."""
    classname = m.__class__.__name__
    if classname.find("Conv") != -1:
        nn.init.normal_(m.weight.data, 0.0, 0.02)
    elif classname.find("BatchNorm") != -1:
        nn.init.normal_(m.weight.data, 1.0, 0.02)
        nn.init.constant_(m.bias.data, 0)


def make_models(nz=100, ngf=64, ndf=64, nc=3, image_size=64, seed=999, dtype=torch.float32):
    """netG and netD built and initialised as the tutorial does (``manual_seed``, then ``apply(weights_init)``)."""
    torch.manual_seed(seed)
    net_g = Generator(nz, ngf, nc, image_size).to(dtype)
    net_g.apply(weights_init)
    net_d = Discriminator(ndf, nc, image_size).to(dtype)
    net_d.apply(weights_init)
    return net_g, net_d


def tutorial_iteration(net_g, net_d, optimizer_g, optimizer_d, criterion, real, noise, detach=True):
    """One iteration of the tutorial's loop, in its order. Returns (errD, errG, D_x, D_G_z1, D_G_z2) as floats.

    ``detach=False`` drops ``.detach()`` from the D step (the lessons measure what that costs); the
    G step then needs ``retain_graph=True`` on the D-step backward, which is passed only in that case.
    """
    real_label, fake_label = 1.0, 0.0
    b_size = real.size(0)
    # (1) Update D network: maximize log(D(x)) + log(1 - D(G(z)))
    net_d.zero_grad()
    label = torch.full((b_size,), real_label, dtype=real.dtype)
    output = net_d(real).view(-1)
    err_d_real = criterion(output, label)
    err_d_real.backward()
    d_x = output.mean().item()
    fake = net_g(noise)
    label.fill_(fake_label)
    output = net_d(fake.detach() if detach else fake).view(-1)
    err_d_fake = criterion(output, label)
    err_d_fake.backward(retain_graph=not detach)
    d_g_z1 = output.mean().item()
    err_d = err_d_real + err_d_fake
    optimizer_d.step()
    # (2) Update G network: maximize log(D(G(z)))
    net_g.zero_grad()
    label.fill_(real_label)
    output = net_d(fake).view(-1)
    err_g = criterion(output, label)
    err_g.backward()
    d_g_z2 = output.mean().item()
    optimizer_g.step()
    return err_d.item(), err_g.item(), d_x, d_g_z1, d_g_z2


def make_optimizers(net_g, net_d, lr=2e-4, beta1=0.5):
    optimizer_d = torch.optim.Adam(net_d.parameters(), lr=lr, betas=(beta1, 0.999))
    optimizer_g = torch.optim.Adam(net_g.parameters(), lr=lr, betas=(beta1, 0.999))
    return optimizer_g, optimizer_d


def state_dict_numpy(module: nn.Module) -> dict[str, np.ndarray]:
    """A module's state_dict as NumPy arrays (what :mod:`functional_gan.convert` consumes)."""
    return {key: value.detach().cpu().numpy().copy() for key, value in module.state_dict().items()}  # a copy: training mutates the tensors in place


def load_state_dict_numpy(module: nn.Module, arrays: dict[str, np.ndarray]) -> None:
    reference = module.state_dict()
    module.load_state_dict(
        {key: torch.from_numpy(np.asarray(arrays[key])).to(reference[key].dtype) for key in reference}, strict=True
    )
