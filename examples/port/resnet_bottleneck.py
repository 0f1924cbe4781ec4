"""ResNet-152's layout at a small width: torchvision's ``Bottleneck`` stacked [3, 8, 36, 3] (156 layers with weights:
the stem, 150 convolutions in 50 blocks, 4 downsampling convolutions, the classifier) and a Flax Linen port.

    functional-gan check-port examples/port/resnet_bottleneck.py --dtype float64 --program jit

``Bottleneck``, ``conv3x3`` and ``conv1x1`` are torchvision's (torchvision/models/resnet.py, BSD-3-Clause, the
building blocks of its resnet50/101/152); ``_make_layer`` follows torchvision's. The width is 4 planes at the first
stage (torchvision's 64), the images 16 × 16: deep enough that float64 rounding grows through 150 convolutions and
BatchNorms, small enough to check on a CPU. The port is ``resnet_basic.py``'s BatchNorm and convolutions.
"""

import flax.linen as fnn
import numpy as np
import torch
import torch.nn as nn
import torch.nn.functional as F
from resnet_basic import (TorchBatchNorm, _conv, conv1x1, conv3x3, jax_loss, jax_optimizer,  # noqa: F401 (the spec's folder)
                          torch_loss, torch_optimizer)

LAYERS = (3, 8, 36, 3)  # ResNet-152
WIDTH = 4

# --- PyTorch (torchvision) ---


class Bottleneck(nn.Module):
    expansion = 4

    def __init__(self, inplanes, planes, stride=1, downsample=None, groups=1, base_width=64, dilation=1):
        super().__init__()
        width = int(planes * (base_width / 64.0)) * groups
        self.conv1 = conv1x1(inplanes, width)
        self.bn1 = nn.BatchNorm2d(width)
        self.conv2 = conv3x3(width, width, stride, groups, dilation)
        self.bn2 = nn.BatchNorm2d(width)
        self.conv3 = conv1x1(width, planes * self.expansion)
        self.bn3 = nn.BatchNorm2d(planes * self.expansion)
        self.relu = nn.ReLU(inplace=True)
        self.downsample = downsample
        self.stride = stride

    def forward(self, x):
        identity = x
        out = self.relu(self.bn1(self.conv1(x)))
        out = self.relu(self.bn2(self.conv2(out)))
        out = self.bn3(self.conv3(out))
        if self.downsample is not None:
            identity = self.downsample(x)
        out += identity
        return self.relu(out)


class DeepResNet(nn.Module):
    def __init__(self, num_classes=10, layers=LAYERS, width=WIDTH):
        super().__init__()
        self.inplanes = width
        self.conv1 = conv3x3(3, width)
        self.bn1 = nn.BatchNorm2d(width)
        self.layer1 = self._make_layer(width, layers[0])
        self.layer2 = self._make_layer(2 * width, layers[1], stride=2)
        self.layer3 = self._make_layer(4 * width, layers[2], stride=2)
        self.layer4 = self._make_layer(8 * width, layers[3], stride=2)
        self.fc = nn.Linear(8 * width * Bottleneck.expansion, num_classes)

    def _make_layer(self, planes, blocks, stride=1):
        downsample = None
        if stride != 1 or self.inplanes != planes * Bottleneck.expansion:
            downsample = nn.Sequential(conv1x1(self.inplanes, planes * Bottleneck.expansion, stride),
                                       nn.BatchNorm2d(planes * Bottleneck.expansion))
        layers = [Bottleneck(self.inplanes, planes, stride, downsample)]
        self.inplanes = planes * Bottleneck.expansion
        layers += [Bottleneck(self.inplanes, planes) for _ in range(1, blocks)]
        return nn.Sequential(*layers)

    def forward(self, x):
        x = F.relu(self.bn1(self.conv1(x)))
        x = self.layer4(self.layer3(self.layer2(self.layer1(x))))
        return self.fc(torch.flatten(F.adaptive_avg_pool2d(x, 1), 1))


# --- Flax ---


class FlaxBottleneck(fnn.Module):
    planes: int
    stride: int = 1
    downsample: bool = False
    mistake: float = 0.0  # a planted mistake: the block's last BatchNorm output scaled by 1 + mistake

    @fnn.compact
    def __call__(self, x):
        out = fnn.relu(TorchBatchNorm()(_conv(self.planes, 1)(x)))
        out = fnn.relu(TorchBatchNorm()(_conv(self.planes, 3, self.stride)(out)))
        out = TorchBatchNorm()(_conv(self.planes * 4, 1)(out)) * (1 + self.mistake)
        if self.downsample:
            x = TorchBatchNorm()(_conv(self.planes * 4, 1, self.stride)(x))
        return fnn.relu(out + x)


class FlaxDeepResNet(fnn.Module):
    mistake_at: tuple = ()  # (stage, block) where a mistake of 1e-6 is planted
    layers: tuple = LAYERS
    width: int = WIDTH

    @fnn.compact
    def __call__(self, x):
        x = fnn.relu(TorchBatchNorm()(_conv(self.width, 3)(x)))
        inplanes = self.width
        for stage, blocks in enumerate(self.layers):
            planes, stride = self.width * 2 ** stage, 1 if stage == 0 else 2
            for block in range(blocks):
                first = block == 0
                x = FlaxBottleneck(planes, stride if first else 1, first and (stride != 1 or inplanes != planes * 4),
                                   1e-6 if (stage + 1, block) == self.mistake_at else 0.0)(x)
                inplanes = planes * 4
        return fnn.Dense(10)(x.mean(axis=(1, 2)))


# Planted mistakes (tests/test_check_port_verdicts.py): name → (the stage, the layer the report must name).
MISTAKES = {"1e-6-in-layer3.20": ("forward", "layer3.21.conv1")}
MISTAKE = None

torch_model = DeepResNet  # built under the checker's torch.manual_seed(0)


def jax_model():
    return FlaxDeepResNet(mistake_at=(3, 20) if MISTAKE == "1e-6-in-layer3.20" else ())


def example_inputs():
    return (np.random.default_rng(0).normal(0.0, 1.0, (4, 3, 16, 16)).astype(np.float32),)


def example_targets():
    return (np.random.default_rng(1).integers(0, 10, 4),)
