"""Counting what PyTorch computes: FLOPs (``FlopCounterMode``) and aten convolution calls."""

from __future__ import annotations

from typing import Callable

import torch
from torch.utils._python_dispatch import TorchDispatchMode
from torch.utils.flop_counter import FlopCounterMode


class ConvolutionCounter(TorchDispatchMode):
    """A dispatch mode that counts aten ``convolution`` and ``convolution_backward`` calls.

    A single ``convolution_backward`` call computes the input and the weight gradient together.
    """

    def __init__(self):
        super().__init__()
        self.count = 0

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        if "convolution" in func.__name__:
            self.count += 1
        return func(*args, **(kwargs or {}))


class _GlobalOnly:
    """Stands in for FlopCounterMode's ModuleTracker: every FLOP counted under "Global", no hooks installed.

    The tracker hangs gradient hooks on module outputs, and those refuse ``torch.autograd.grad``
    with respect to a leaf ("A leaf node was passed to _will_engine_execute_node ...", torch
    2.13), which is how every WGAN-GP gradient penalty is written. Only the total is read here.
    """

    parents = ("Global",)

    def __enter__(self):
        return self

    def __exit__(self, *args):
        return False


def count(fn: Callable[[], object], per_module: bool = True) -> tuple[int, int]:
    """Run ``fn()`` and return (FLOPs by ``FlopCounterMode``, aten convolution calls).

    FlopCounterMode's convention: 2 FLOPs per multiply-add, convolutions and matmuls only.
    ``per_module=False`` counts without FlopCounterMode's module tracking (needed for
    ``autograd.grad`` on a leaf tensor, as in a gradient penalty); the total is the same.
    """
    counter = FlopCounterMode(display=False)
    if not per_module:
        counter.mod_tracker = _GlobalOnly()
    with counter as flops, ConvolutionCounter() as convolutions:
        fn()
    return int(flops.get_total_flops()), convolutions.count


def tutorial_iteration_flops(config, batch_size: int | None = None) -> int:
    """FLOPs of one iteration of the tutorial's loop at the config's sizes (FlopCounterMode)."""
    from functional_gan.pytorch import dcgan

    batch = batch_size or config.batch_size
    net_g, net_d = dcgan.make_models(config)
    optimizer_g, optimizer_d = dcgan.make_optimizers(net_g, net_d, config)
    real = torch.rand(batch, config.nc, config.image_size, config.image_size) * 2 - 1
    noise = torch.randn(batch, config.nz, 1, 1)
    flops, _ = count(lambda: dcgan.tutorial_iteration(net_g, net_d, optimizer_g, optimizer_d, torch.nn.BCELoss(), real, noise))
    return flops
