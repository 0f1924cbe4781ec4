"""A small ResNet of torchvision's ``BasicBlock`` (conv3x3, BatchNorm, a 1×1 downsample) and a Flax port.

    functional-gan check-port examples/port/resnet_basic.py [--dtype float64] [--steps 3]

``BasicBlock``, ``conv3x3`` and ``conv1x1`` are torchvision's (torchvision/models/resnet.py), the
network around them is CIFAR-sized: a stem, one block at 16 channels, one at 32 with stride 2, a
global average pool and a linear layer. Trained in train mode (batch statistics, running
statistics updated) with SGD and momentum.

The port writes its own BatchNorm because PyTorch's differs from ``flax.linen.BatchNorm`` in two
ways a port must copy: the running variance is updated with the *unbiased* batch variance, and
``momentum=0.1`` weighs the new batch (Flax's ``momentum=0.9`` weighs the old average). Its strided
convolutions pad 1 on both sides, as PyTorch's ``padding=1``; Flax's ``padding="SAME"`` pads (0, 1)
at stride 2 on an even input.
"""

import flax.linen as fnn
import jax.numpy as jnp
import numpy as np
import optax
import torch
import torch.nn as nn
import torch.nn.functional as F

# --- PyTorch (torchvision's building blocks) ---


def conv3x3(in_planes, out_planes, stride=1, groups=1, dilation=1):
    return nn.Conv2d(in_planes, out_planes, kernel_size=3, stride=stride, padding=dilation, groups=groups, bias=False,
                     dilation=dilation)


def conv1x1(in_planes, out_planes, stride=1):
    return nn.Conv2d(in_planes, out_planes, kernel_size=1, stride=stride, bias=False)


class BasicBlock(nn.Module):
    expansion = 1

    def __init__(self, inplanes, planes, stride=1, downsample=None):
        super().__init__()
        self.conv1 = conv3x3(inplanes, planes, stride)
        self.bn1 = nn.BatchNorm2d(planes)
        self.relu = nn.ReLU(inplace=True)
        self.conv2 = conv3x3(planes, planes)
        self.bn2 = nn.BatchNorm2d(planes)
        self.downsample = downsample
        self.stride = stride

    def forward(self, x):
        identity = x
        out = self.conv1(x)
        out = self.bn1(out)
        out = self.relu(out)
        out = self.conv2(out)
        out = self.bn2(out)
        if self.downsample is not None:
            identity = self.downsample(x)
        out += identity
        out = self.relu(out)
        return out


class SmallResNet(nn.Module):
    def __init__(self, num_classes=10):
        super().__init__()
        self.conv1 = conv3x3(3, 16)
        self.bn1 = nn.BatchNorm2d(16)
        self.layer1 = BasicBlock(16, 16)
        self.layer2 = BasicBlock(16, 32, stride=2, downsample=nn.Sequential(conv1x1(16, 32, 2), nn.BatchNorm2d(32)))
        self.fc = nn.Linear(32, num_classes)

    def forward(self, x):
        x = F.relu(self.bn1(self.conv1(x)))
        x = self.layer2(self.layer1(x))
        return self.fc(torch.flatten(F.adaptive_avg_pool2d(x, 1), 1))


# --- Flax ---


class TorchBatchNorm(fnn.Module):
    """BatchNorm2d as PyTorch computes it in train mode (biased normalisation, unbiased running variance)."""

    momentum: float = 0.1
    epsilon: float = 1e-5
    mistake: str | None = None

    @fnn.compact
    def __call__(self, x):
        features = x.shape[-1]
        scale = self.param("scale", fnn.initializers.ones, (features,))
        bias = self.param("bias", fnn.initializers.zeros, (features,))
        mean_ra = self.variable("batch_stats", "mean", jnp.zeros, (features,))
        var_ra = self.variable("batch_stats", "var", jnp.ones, (features,))
        mean = x.mean(axis=(0, 1, 2))
        var = x.var(axis=(0, 1, 2))
        n = x.size / features
        momentum = 0.9 if self.mistake == "bn-momentum" else self.momentum  # Flax's meaning written into PyTorch's
        unbiased = var if self.mistake == "bn-biased-var" else var * n / (n - 1)
        if not self.is_initializing():
            mean_ra.value = (1 - momentum) * mean_ra.value + momentum * mean
            var_ra.value = (1 - momentum) * var_ra.value + momentum * unbiased
        return (x - mean) / jnp.sqrt(var + self.epsilon) * scale + bias


def _conv(features, kernel, stride=1, mistake=None):
    padding = "SAME" if (mistake == "same-padding" and stride == 2) else [(kernel // 2, kernel // 2)] * 2
    return fnn.Conv(features, (kernel, kernel), strides=(stride, stride), padding=padding, use_bias=False)


class FlaxBlock(fnn.Module):
    planes: int
    stride: int = 1
    downsample: bool = False
    mistake: str | None = None

    @fnn.compact
    def __call__(self, x):
        out = fnn.relu(TorchBatchNorm(mistake=self.mistake)(_conv(self.planes, 3, self.stride, self.mistake)(x)))
        out = TorchBatchNorm(mistake=self.mistake)(_conv(self.planes, 3)(out))
        if self.downsample:
            x = TorchBatchNorm(mistake=self.mistake)(_conv(self.planes, 1, self.stride)(x))
        return fnn.relu(out + x)


class FlaxSmallResNet(fnn.Module):
    mistake: str | None = None

    @fnn.compact
    def __call__(self, x):
        x = fnn.relu(TorchBatchNorm(mistake=self.mistake)(_conv(16, 3)(x)))
        x = FlaxBlock(16, mistake=self.mistake)(x)
        x = FlaxBlock(32, stride=2, downsample=True, mistake=self.mistake)(x)
        return fnn.Dense(10)(x.mean(axis=(1, 2)))


# Planted mistakes (tests/test_check_port.py): name → (the stage, the layer the report must name).
MISTAKES = {"same-padding": ("forward", "layer2.conv1"), "bn-momentum": ("buffer", "bn1.running_mean"),
            "bn-biased-var": ("buffer", "bn1.running_var")}
MISTAKE = None


torch_model = SmallResNet  # built under the checker's torch.manual_seed(0)


def jax_model():
    return FlaxSmallResNet(mistake=MISTAKE)


def example_inputs():
    return (np.random.default_rng(0).normal(0.0, 1.0, (8, 3, 16, 16)).astype(np.float32),)


def example_targets():
    return (np.random.default_rng(1).integers(0, 10, 8),)


def torch_loss(output, x, target):
    return F.cross_entropy(output, target)


def jax_loss(output, x, target):
    return optax.softmax_cross_entropy_with_integer_labels(output, target).mean()


def torch_optimizer(parameters):
    return torch.optim.SGD(parameters, lr=0.1, momentum=0.9)


def jax_optimizer():
    return optax.sgd(0.1, momentum=0.9)
