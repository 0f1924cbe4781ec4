"""PyTorch reference runs of the DCGAN tutorial loop, recorded for the comparisons.

Data and noise come from NumPy (a seeded ``default_rng``) so that both frameworks see the same
arrays; the initial weights come from the tutorial's own ``weights_init`` under
``torch.manual_seed``. Each run records the per-step metrics and the states the checks need.
"""

from __future__ import annotations

import dataclasses

import numpy as np
import torch

from functional_gan.config import TrainConfig
from functional_gan.metrics import METRIC_NAMES
from functional_gan.pytorch import dcgan
from functional_gan.pytorch.precision import default_dtype, torch_dtype

from .common import make_batches, make_mix


@dataclasses.dataclass
class TorchRun:
    initial_generator: dict[str, np.ndarray]
    initial_discriminator: dict[str, np.ndarray]
    metrics: dict[str, np.ndarray]  # each (steps,)
    final_generator: dict[str, np.ndarray]
    final_discriminator: dict[str, np.ndarray]
    snapshots: list[dict] = dataclasses.field(default_factory=list)  # per-step full states (teacher forcing)


def optimizer_state_numpy(optimizer: torch.optim.Adam, module: torch.nn.Module) -> dict:
    """Adam's per-parameter state keyed by the parameter's state_dict name: step, exp_avg, exp_avg_sq."""
    by_param = {}
    for name, param in module.named_parameters():
        state = optimizer.state.get(param, {})
        if state:
            by_param[name] = {
                "step": int(state["step"]),
                "exp_avg": state["exp_avg"].detach().cpu().numpy().copy(),
                "exp_avg_sq": state["exp_avg_sq"].detach().cpu().numpy().copy(),
            }
    return by_param


class SummedBatchNorm2d(torch.nn.BatchNorm2d):
    """``nn.BatchNorm2d`` with its training statistics as plain sums (mean, then the mean squared deviation).

    The same mathematics as PyTorch's fused kernel in another summation order: the fused CPU kernel
    accumulates the statistics one element after another, and plain sums (``torch.sum``'s cascade) are
    the order an XLA reduction with several accumulators takes. Measured on 8×64×8×8 float64 activations
    against a long-double reference: the fused kernel's mean 1.1e-15, plain sums 2.2e-16, jax 0.12's
    reduction 2.9e-16 (benchmarks/reduction_accuracy.py). Running statistics as PyTorch keeps them.
    """

    def forward(self, x):
        if not self.training:
            return super().forward(x)
        n = x.numel() // x.shape[1]
        mean = x.sum(dim=(0, 2, 3)) / n
        centred = x - mean[None, :, None, None]
        var = (centred * centred).sum(dim=(0, 2, 3)) / n
        with torch.no_grad():
            self.num_batches_tracked += 1
            self.running_mean.mul_(1 - self.momentum).add_(self.momentum * mean)
            self.running_var.mul_(1 - self.momentum).add_(self.momentum * var * n / (n - 1))
        scale = self.weight / torch.sqrt(var + self.eps)
        return centred * scale[None, :, None, None] + self.bias[None, :, None, None]


def _sum_batchnorm_statistics(*nets: torch.nn.Module) -> None:
    for net in nets:
        for module in net.modules():
            if type(module) is torch.nn.BatchNorm2d:
                module.__class__ = SummedBatchNorm2d


def run_tutorial(spec: TrainConfig, dtype: str = "float64", record_snapshots: bool = False, real=None, noise=None,
                 batches=None, channels_last: bool = False, summed_batchnorm: bool = False) -> TorchRun:
    """Train the tutorial's loop for ``spec.steps`` iterations in PyTorch on the seeded batches (or ``batches``: (real, noise)).

    ``channels_last``: the models and inputs in PyTorch's NHWC memory format, the same mathematics
    through other convolution kernels (another summation order). ``summed_batchnorm``: BatchNorm's
    training statistics as plain sums (:class:`SummedBatchNorm2d`), another summation order for them.
    """
    tdtype = torch_dtype(dtype)
    with default_dtype(tdtype):
        net_g, net_d = dcgan.make_models(spec, dtype=tdtype)
        if summed_batchnorm:
            _sum_batchnorm_statistics(net_g, net_d)
        memory_format = torch.channels_last if channels_last else torch.contiguous_format
        net_g, net_d = net_g.to(memory_format=memory_format), net_d.to(memory_format=memory_format)
        optimizer_g, optimizer_d = dcgan.make_optimizers(net_g, net_d, spec)
        criterion = torch.nn.BCELoss()
        if batches is not None:
            real, noise = batches
        if real is None or noise is None:
            real, noise = make_batches(spec)
        initial_g, initial_d = dcgan.state_dict_numpy(net_g), dcgan.state_dict_numpy(net_d)
        rows, snapshots = [], []
        for t in range(spec.steps):
            if record_snapshots:
                snapshots.append(snapshot(net_g, net_d, optimizer_g, optimizer_d))
            rows.append(
                dcgan.tutorial_iteration(
                    net_g, net_d, optimizer_g, optimizer_d, criterion,
                    torch.as_tensor(real[t], dtype=tdtype).contiguous(memory_format=memory_format),
                    torch.as_tensor(noise[t], dtype=tdtype).contiguous(memory_format=memory_format),
                )
            )
        if record_snapshots:
            snapshots.append(snapshot(net_g, net_d, optimizer_g, optimizer_d))
        rows = np.array(rows)
        metrics = {key: rows[:, i] for i, key in enumerate(METRIC_NAMES)}
        return TorchRun(initial_g, initial_d, metrics, dcgan.state_dict_numpy(net_g), dcgan.state_dict_numpy(net_d), snapshots)


def torch_reference(loss: str):
    """The PyTorch reference module a loss's entry names (``make_models`` and ``iteration``)."""
    import importlib

    from functional_gan.losses import LOSSES

    return importlib.import_module(LOSSES[loss].torch_reference)


def run_loss(spec: TrainConfig, dtype: str = "float64", batches=None) -> TorchRun:
    """Train the PyTorch reference loop of ``spec.loss``'s entry for ``spec.steps`` iterations on the seeded
    batches (and interpolation weights, for a loss that draws them), or on ``batches``: (real, noise, mix)."""
    reference = torch_reference(spec.loss)
    tdtype = torch_dtype(dtype)
    with default_dtype(tdtype):
        net_g, net_d = reference.make_models(spec, dtype=tdtype)
        optimizer_g, optimizer_d = dcgan.make_optimizers(net_g, net_d, spec)
        real, noise, mix = batches if batches is not None else (*make_batches(spec), make_mix(spec))
        initial_g, initial_d = dcgan.state_dict_numpy(net_g), dcgan.state_dict_numpy(net_d)
        rows = [
            reference.iteration(
                net_g, net_d, optimizer_g, optimizer_d, torch.as_tensor(real[t], dtype=tdtype),
                torch.as_tensor(noise[t], dtype=tdtype), None if mix is None else torch.as_tensor(mix[t], dtype=tdtype),
                t, spec,
            )
            for t in range(spec.steps)
        ]
        rows = np.array(rows)
        metrics = {key: rows[:, i] for i, key in enumerate(METRIC_NAMES)}
        return TorchRun(initial_g, initial_d, metrics, dcgan.state_dict_numpy(net_g), dcgan.state_dict_numpy(net_d))


def snapshot(net_g, net_d, optimizer_g, optimizer_d) -> dict:
    """The tutorial loop's whole training state (weights, running statistics, Adam) as NumPy arrays."""
    return {
        "generator": dcgan.state_dict_numpy(net_g),
        "discriminator": dcgan.state_dict_numpy(net_d),
        "generator_adam": optimizer_state_numpy(optimizer_g, net_g),
        "discriminator_adam": optimizer_state_numpy(optimizer_d, net_d),
    }
