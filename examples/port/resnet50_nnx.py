"""torchvision's ``resnet50`` (its architecture written out: the 7 × 7 stride-2 stem and max-pool, ``Bottleneck``
stacked [3, 4, 6, 3], 1000 classes: 25.6M parameters) and a Flax NNX port, one SGD step with momentum in training
mode on 4 images of 32 × 32: the ResNet-50 check whose peak memory the benchmark of check-port measures.

    functional-gan check-port examples/port/resnet50_nnx.py --memory

``Bottleneck`` is torchvision's (imported from ``resnet_bottleneck.py`` in the spec's folder), the stem, ``_make_layer``
and the initialisation follow torchvision/models/resnet.py (its zero-init and groups options left out). The port's
``TorchBatchNorm`` is ``resnet18_nnx.py``'s (PyTorch's momentum and unbiased running variance). At 32 × 32 the stem
brings the images to 8 × 8 and layer4 to 1 × 1, as torchvision's model does with CIFAR-sized inputs;
``resnet50.py`` is the same depth with a CIFAR stem (the first stage at 32 × 32, activations 16 times larger).
"""

import numpy as np
import torch.nn as nn
from flax import nnx
from resnet18_nnx import (TorchBatchNorm, jax_loss, jax_optimizer, torch_loss,  # noqa: F401 (the spec's folder)
                          torch_optimizer)
from resnet_basic import conv1x1
from resnet_bottleneck import Bottleneck

LAYERS = (3, 4, 6, 3)


class ResNet50(nn.Module):
    def __init__(self, num_classes=1000, layers=LAYERS):
        super().__init__()
        self.inplanes = 64
        self.conv1 = nn.Conv2d(3, 64, kernel_size=7, stride=2, padding=3, bias=False)
        self.bn1 = nn.BatchNorm2d(64)
        self.relu = nn.ReLU(inplace=True)
        self.maxpool = nn.MaxPool2d(kernel_size=3, stride=2, padding=1)
        self.layer1 = self._make_layer(64, layers[0])
        self.layer2 = self._make_layer(128, layers[1], stride=2)
        self.layer3 = self._make_layer(256, layers[2], stride=2)
        self.layer4 = self._make_layer(512, layers[3], stride=2)
        self.avgpool = nn.AdaptiveAvgPool2d((1, 1))
        self.fc = nn.Linear(512 * Bottleneck.expansion, num_classes)
        for m in self.modules():  # torchvision's initialisation
            if isinstance(m, nn.Conv2d):
                nn.init.kaiming_normal_(m.weight, mode="fan_out", nonlinearity="relu")
            elif isinstance(m, nn.BatchNorm2d):
                nn.init.constant_(m.weight, 1)
                nn.init.constant_(m.bias, 0)

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
        x = self.maxpool(self.relu(self.bn1(self.conv1(x))))
        x = self.layer4(self.layer3(self.layer2(self.layer1(x))))
        return self.fc(self.avgpool(x).flatten(1))


class NNXBottleneck(nnx.Module):
    def __init__(self, inplanes, planes, stride, rngs):
        def conv(i, o, k, s=1):
            return nnx.Conv(i, o, (k, k), strides=s, padding=[(k // 2, k // 2)] * 2, use_bias=False, rngs=rngs)

        self.conv1, self.bn1 = conv(inplanes, planes, 1), TorchBatchNorm(planes)
        self.conv2, self.bn2 = conv(planes, planes, 3, stride), TorchBatchNorm(planes)
        self.conv3, self.bn3 = conv(planes, planes * 4, 1), TorchBatchNorm(planes * 4)
        self.downsample = nnx.data(None)  # a submodule or None: NNX is told it holds data
        if stride != 1 or inplanes != planes * 4:
            self.downsample = nnx.Sequential(conv(inplanes, planes * 4, 1, stride), TorchBatchNorm(planes * 4))

    def __call__(self, x):
        out = nnx.relu(self.bn1(self.conv1(x)))
        out = nnx.relu(self.bn2(self.conv2(out)))
        out = self.bn3(self.conv3(out))
        return nnx.relu(out + (self.downsample(x) if self.downsample is not None else x))


class NNXResNet50(nnx.Module):
    def __init__(self, rngs, num_classes=1000, layers=LAYERS):
        self.conv1 = nnx.Conv(3, 64, (7, 7), strides=2, padding=[(3, 3)] * 2, use_bias=False, rngs=rngs)
        self.bn1 = TorchBatchNorm(64)
        inplanes, stages = 64, []
        for stage, blocks in enumerate(layers):
            planes, stride = 64 * 2 ** stage, 1 if stage == 0 else 2
            stages.append(nnx.Sequential(*[NNXBottleneck(inplanes if b == 0 else planes * 4, planes,
                                                         stride if b == 0 else 1, rngs) for b in range(blocks)]))
            inplanes = planes * 4
        self.layer1, self.layer2, self.layer3, self.layer4 = stages
        self.fc = nnx.Linear(2048, num_classes, rngs=rngs)

    def __call__(self, x):  # NHWC
        x = nnx.relu(self.bn1(self.conv1(x)))
        x = nnx.max_pool(x, (3, 3), strides=(2, 2), padding=((1, 1), (1, 1)))
        x = self.layer4(self.layer3(self.layer2(self.layer1(x))))
        return self.fc(x.mean(axis=(1, 2)))


torch_model = ResNet50  # built under the checker's torch.manual_seed(0)


def jax_model():
    return NNXResNet50(nnx.Rngs(0))


def example_inputs():
    return (np.random.default_rng(0).normal(0.0, 1.0, (4, 3, 32, 32)).astype(np.float32),)


def example_targets():
    return (np.array([3, 1, 7, 0]),)
