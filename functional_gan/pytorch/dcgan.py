"""The DCGAN tutorial in PyTorch, exactly as published: its models, ``weights_init`` and loop.

Modules are wrapped in ``self.main = nn.Sequential(...)`` as in the tutorial and pytorch/examples,
so ``state_dict`` keys (``main.0.weight``, ``main.1.running_mean`` ...) match their checkpoints.
Image sizes 32 and 128 drop or add one stride-2 block, mirroring :mod:`functional_gan.models`.
Settings come from a :class:`functional_gan.config.TrainConfig`, the same the JAX side trains with.
"""

from __future__ import annotations

import math
from typing import NamedTuple

import numpy as np
import torch
from torch import nn

from functional_gan.config import TrainConfig
from functional_gan.losses import FAKE_LABEL, REAL_LABEL


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


def make_models(config: TrainConfig, dtype=torch.float32):
    """netG and netD built and initialised as the tutorial does (``manual_seed(seed)``, then ``apply(weights_init)``)."""
    torch.manual_seed(config.seed)
    net_g = Generator(config.nz, config.ngf, config.nc, config.image_size).to(dtype)
    net_g.apply(weights_init)
    net_d = Discriminator(config.ndf, config.nc, config.image_size).to(dtype)
    net_d.apply(weights_init)
    return net_g, net_d


def make_optimizers(net_g, net_d, config: TrainConfig):
    """The tutorial's ``optim.Adam(net.parameters(), lr=lr, betas=(beta1, 0.999))``, beta2 from the config."""
    optimizer_d = torch.optim.Adam(net_d.parameters(), lr=config.lr, betas=(config.beta1, config.beta2))
    optimizer_g = torch.optim.Adam(net_g.parameters(), lr=config.lr, betas=(config.beta1, config.beta2))
    return optimizer_g, optimizer_d


class DStep(NamedTuple):
    """What the tutorial's D step leaves behind: the losses, D's outputs and ``fake`` (with its graph)."""

    err_d_real: torch.Tensor
    err_d_fake: torch.Tensor
    output_real: torch.Tensor
    output_fake: torch.Tensor
    fake: torch.Tensor


class IterationHooks:
    """Points of the tutorial's iteration where a caller may look (or, for teacher forcing, change D) without
    retyping it: the divergence finder records every intermediate through them. Every method does nothing here."""

    def before_pass(self, name: str) -> None:
        """A forward pass starts: "D(real)", "G", "D(fake.detach())", then "D updated (fake)" (the G step's)."""

    def before_d_step(self, net_d, d: DStep) -> None:
        """D's losses are backpropagated (its gradients in ``.grad``); ``optimizerD.step()`` comes next."""

    def after_d_step(self, net_d) -> None:
        """D has been updated; the G step comes next (it may load another D here)."""

    def before_g_step(self, net_g, err_g) -> None:
        """errG is backpropagated (G's gradients in ``.grad``); ``optimizerG.step()`` comes next."""

    def after_g_step(self, net_g, net_d) -> None:
        """The iteration is done."""


NO_HOOKS = IterationHooks()


def d_step(net_g, net_d, criterion, real, noise, detach: bool = True, backward: bool = True,
           hooks: IterationHooks = NO_HOOKS) -> DStep:
    """The tutorial's step (1): ``errD_real`` on the real batch, then ``netD(fake.detach())``.

    With ``backward`` each loss is backpropagated as the tutorial does (gradients accumulate in
    ``.grad``; call ``net_d.zero_grad()`` first). ``detach=False`` drops ``.detach()`` (the lessons
    measure what that costs); the G step then needs the graph, so the fake loss's backward keeps it.
    """
    b_size = real.size(0)
    label = torch.full((b_size,), REAL_LABEL, dtype=real.dtype, device=real.device)
    hooks.before_pass("D(real)")
    output_real = net_d(real).view(-1)
    err_d_real = criterion(output_real, label)
    if backward:
        err_d_real.backward()
    hooks.before_pass("G")
    fake = net_g(noise)
    label = torch.full((b_size,), FAKE_LABEL, dtype=real.dtype, device=real.device)
    hooks.before_pass("D(fake.detach())" if detach else "D(fake)")
    output_fake = net_d(fake.detach() if detach else fake).view(-1)
    err_d_fake = criterion(output_fake, label)
    if backward:
        err_d_fake.backward(retain_graph=not detach)
    return DStep(err_d_real, err_d_fake, output_real, output_fake, fake)


def tutorial_iteration(net_g, net_d, optimizer_g, optimizer_d, criterion, real, noise, detach=True,
                       hooks: IterationHooks = NO_HOOKS):
    """One iteration of the tutorial's loop, in its order. Returns (errD, errG, D_x, D_G_z1, D_G_z2) as floats.

    ``hooks`` (:class:`IterationHooks`) are called at the iteration's points, e.g. by the divergence finder.
    """
    # (1) Update D network: maximize log(D(x)) + log(1 - D(G(z)))
    net_d.zero_grad()
    d = d_step(net_g, net_d, criterion, real, noise, detach, hooks=hooks)
    err_d = d.err_d_real + d.err_d_fake
    hooks.before_d_step(net_d, d)
    optimizer_d.step()
    hooks.after_d_step(net_d)
    # (2) Update G network: maximize log(D(G(z)))
    net_g.zero_grad()
    label = torch.full((real.size(0),), REAL_LABEL, dtype=real.dtype, device=real.device)
    hooks.before_pass("D updated (fake)")
    output = net_d(d.fake).view(-1)
    err_g = criterion(output, label)
    err_g.backward()
    hooks.before_g_step(net_g, err_g)
    optimizer_g.step()
    hooks.after_g_step(net_g, net_d)
    return err_d.item(), err_g.item(), d.output_real.mean().item(), d.output_fake.mean().item(), output.mean().item()


def state_dict_numpy(module: nn.Module) -> dict[str, np.ndarray]:
    """A module's state_dict as NumPy arrays (what :mod:`functional_gan.state_dicts` consumes)."""
    return {key: value.detach().cpu().numpy().copy() for key, value in module.state_dict().items()}  # a copy: training mutates the tensors in place


def load_state_dict_numpy(module: nn.Module, arrays: dict[str, np.ndarray]) -> None:
    reference = module.state_dict()
    module.load_state_dict(
        {key: torch.from_numpy(np.asarray(arrays[key])).to(reference[key].dtype) for key in reference}, strict=True
    )


def iteration(net_g, net_d, optimizer_g, optimizer_d, real, noise, mix, index: int, config: TrainConfig):
    """The loss entry's reference iteration (:data:`functional_gan.losses.LOSSES`): the tutorial's, with BCELoss."""
    if config.n_critic != 1:
        raise ValueError("the tutorial's loop updates G every iteration (n_critic 1)")
    return tutorial_iteration(net_g, net_d, optimizer_g, optimizer_d, nn.BCELoss(), real, noise)
