"""The DCGAN tutorial's Generator and Discriminator as Flax modules.

The layer lists are the tutorial's ``self.main = nn.Sequential(...)``; every submodule is named
``main_N`` after its index N in that Sequential, so the PyTorch ``state_dict`` key ``main.N.weight``
is the Flax parameter ``params['main_N']['weight']`` (see :mod:`functional_gan.state_dicts`).

Image size 64 is the tutorial's; 32 removes one stride-2 block and 128 adds one.
"""

from __future__ import annotations

import math

import flax.linen as nn
import jax
import jax.numpy as jnp

from functional_gan.config import SUPPORTED_IMAGE_SIZES
from functional_gan.layers import BatchNorm2d, Conv2d, ConvTranspose2d


def num_stride2_blocks(image_size: int) -> int:
    """How many stride-2 (de)convolutions take 4×4 to ``image_size``: 3 for 32, 4 for 64, 5 for 128."""
    if image_size not in SUPPORTED_IMAGE_SIZES:
        raise ValueError(
            f"image size {image_size} is not supported; choose one of {SUPPORTED_IMAGE_SIZES} "
            "(the DCGAN stack doubles the size from 4×4 with each stride-2 block)"
        )
    return int(math.log2(image_size)) - 2


def leaky_relu(x):
    return nn.leaky_relu(x, negative_slope=0.2)


class Generator(nn.Module):
    """The tutorial's ``Generator``: z (N, nz) → images (N, H, W, nc) in [−1, 1].

    PyTorch: ``Generator(ngpu)`` of the DCGAN tutorial (``self.main = nn.Sequential(...)``). Built
    from a config by :func:`functional_gan.train.make_models`.

    For 64×64: ConvT(nz→8·ngf, 4, 1, 0), then ConvT stride-2 blocks 8·ngf→4·ngf→2·ngf→ngf, each
    followed by BatchNorm and ReLU, then ConvT(ngf→nc, 4, 2, 1) and Tanh. All convolutions bias-free.
    """

    nz: int
    ngf: int
    nc: int
    image_size: int
    use_running_average: bool = False  # the tutorial never calls .eval(): train-mode BN everywhere

    @nn.compact
    def __call__(self, z_NZ):
        x = z_NZ.reshape(z_NZ.shape[0], 1, 1, -1)  # PyTorch's (N, nz, 1, 1), channels last
        n_up = num_stride2_blocks(self.image_size)
        channels = [self.ngf * 2 ** i for i in reversed(range(n_up))]  # 64×64: [8, 4, 2, 1]·ngf
        index = 0
        x = ConvTranspose2d(self.nz, channels[0], 4, 1, 0, name=f"main_{index}")(x)
        for i in range(n_up):
            x = BatchNorm2d(channels[i], use_running_average=self.use_running_average, name=f"main_{index + 1}")(x)
            x = nn.relu(x)
            out_channels = channels[i + 1] if i + 1 < n_up else self.nc
            index += 3
            x = ConvTranspose2d(channels[i], out_channels, 4, 2, 1, name=f"main_{index}")(x)
        return jnp.tanh(x)


class Discriminator(nn.Module):
    """The tutorial's ``Discriminator``: images (N, H, W, nc) → probabilities (N,).

    PyTorch: ``Discriminator(ngpu)`` of the DCGAN tutorial.

    For 64×64: Conv(nc→ndf, 4, 2, 1) and LeakyReLU(0.2) (no BatchNorm on the first block), then
    stride-2 Conv blocks ndf→2·ndf→4·ndf→8·ndf with BatchNorm and LeakyReLU(0.2), then
    Conv(8·ndf→1, 4, 1, 0) and Sigmoid. All convolutions bias-free.
    """

    ndf: int
    nc: int
    image_size: int
    use_running_average: bool = False

    @nn.compact
    def __call__(self, images_NHWC):
        n_down = num_stride2_blocks(self.image_size)
        channels = [self.ndf * 2 ** i for i in range(n_down)]  # 64×64: [1, 2, 4, 8]·ndf
        x = Conv2d(self.nc, channels[0], 4, 2, 1, name="main_0")(images_NHWC)
        x = leaky_relu(x)
        index = 2
        for i in range(1, n_down):
            x = Conv2d(channels[i - 1], channels[i], 4, 2, 1, name=f"main_{index}")(x)
            x = BatchNorm2d(channels[i], use_running_average=self.use_running_average, name=f"main_{index + 1}")(x)
            x = leaky_relu(x)
            index += 3
        x = Conv2d(channels[-1], 1, 4, 1, 0, name=f"main_{index}")(x)
        return jax.nn.sigmoid(x).reshape(-1)  # output.view(-1)


class Critic(nn.Module):
    """The WGAN-GP critic: the tutorial's Discriminator without BatchNorm and without the Sigmoid.

    Gulrajani et al. (2017, "Improved Training of Wasserstein GANs", section 4) drop batch
    normalization from the critic because the gradient penalty is taken per input, and batch
    normalization makes each output depend on the whole batch. Without BatchNorm to absorb them,
    the convolutions carry biases. The output is an unbounded score per image (N,), not a probability.

    PyTorch: :class:`functional_gan.pytorch.wgan_gp.Critic`, ``nn.Sequential`` of Conv2d and
    LeakyReLU(0.2); parameters are named ``main_N`` after the index N in that Sequential
    (convolutions at 0, 2, 4, ...).
    """

    ndf: int
    nc: int
    image_size: int
    use_running_average: bool = False  # no BatchNorm: accepted for a uniform interface, changes nothing

    @nn.compact
    def __call__(self, images_NHWC):
        n_down = num_stride2_blocks(self.image_size)
        channels = [self.ndf * 2 ** i for i in range(n_down)]
        x = images_NHWC
        for i in range(n_down):
            x = Conv2d(channels[i - 1] if i else self.nc, channels[i], 4, 2, 1, bias=True, name=f"main_{2 * i}")(x)
            x = leaky_relu(x)
        x = Conv2d(channels[-1], 1, 4, 1, 0, bias=True, name=f"main_{2 * n_down}")(x)
        return x.reshape(-1)  # output.view(-1): scores, no sigmoid


def count_params(params) -> int:
    """Total number of parameters (what ``sum(p.numel() for p in model.parameters())`` gives)."""
    return sum(int(leaf.size) for leaf in jax.tree_util.tree_leaves(params))
