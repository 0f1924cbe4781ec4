"""torchvision's ``resnet18`` (its architecture, written out here) and a Flax NNX port, trained one SGD step.

    functional-gan check-port examples/port/resnet18_nnx.py [--dtype float64] [--steps 2]

The PyTorch side follows torchvision/models/resnet.py (``ResNet`` with layers [2, 2, 2, 2], torchvision's
``BasicBlock`` and ``conv1x1`` imported from ``resnet_basic.py`` in the spec's folder;
its ``_make_layer``, zero-init and groups options left out), 10 classes, in
train mode (batch statistics; running statistics updated), SGD with momentum 0.9 and weight decay 1e-4,
on a batch of 4 images of 32 × 32 (a CIFAR-sized input: the stem's stride-2 convolution and max-pool
bring it to 8 × 8, layer4 to 1 × 1).

The port is NNX: each ``BasicBlock`` an ``nnx.Module``, the four stages ``nnx.Sequential``s (their
paths ``layer1/layers/0/conv1`` pair with PyTorch's ``layer1.0.conv1`` by definition order). Its
``TorchBatchNorm`` keeps PyTorch's semantics, which ``nnx.BatchNorm`` does not: ``momentum=0.1`` weighs
the new batch (NNX's ``momentum=0.9`` weighs the old average) and the running variance receives the
*unbiased* batch variance (NNX keeps the biased one). The planted mistakes below are the ones a port
to ``nnx.BatchNorm`` makes; ``check-port`` names each at the first running statistic it touches.
"""

import jax.numpy as jnp
import numpy as np
import optax
import torch
import torch.nn as nn
from flax import nnx

from resnet_basic import BasicBlock, conv1x1  # torchvision's building blocks (the spec's folder)

# --- PyTorch: torchvision's resnet18, written out (its BasicBlock and conv1x1 from resnet_basic.py) ------


class ResNet18(nn.Module):
    def __init__(self, num_classes=10):
        super().__init__()
        self.inplanes = 64
        self.conv1 = nn.Conv2d(3, 64, kernel_size=7, stride=2, padding=3, bias=False)
        self.bn1 = nn.BatchNorm2d(64)
        self.relu = nn.ReLU(inplace=True)
        self.maxpool = nn.MaxPool2d(kernel_size=3, stride=2, padding=1)
        self.layer1 = self._make_layer(64, 1)
        self.layer2 = self._make_layer(128, 2)
        self.layer3 = self._make_layer(256, 2)
        self.layer4 = self._make_layer(512, 2)
        self.avgpool = nn.AdaptiveAvgPool2d((1, 1))
        self.fc = nn.Linear(512, num_classes)
        for m in self.modules():  # torchvision's initialisation
            if isinstance(m, nn.Conv2d):
                nn.init.kaiming_normal_(m.weight, mode="fan_out", nonlinearity="relu")
            elif isinstance(m, nn.BatchNorm2d):
                nn.init.constant_(m.weight, 1)
                nn.init.constant_(m.bias, 0)

    def _make_layer(self, planes, stride):
        downsample = None
        if stride != 1 or self.inplanes != planes:
            downsample = nn.Sequential(conv1x1(self.inplanes, planes, stride), nn.BatchNorm2d(planes))
        layers = [BasicBlock(self.inplanes, planes, stride, downsample)]
        self.inplanes = planes
        layers.append(BasicBlock(self.inplanes, planes))
        return nn.Sequential(*layers)

    def forward(self, x):
        x = self.maxpool(self.relu(self.bn1(self.conv1(x))))
        x = self.layer4(self.layer3(self.layer2(self.layer1(x))))
        return self.fc(torch.flatten(self.avgpool(x), 1))


# --- Flax NNX ------------------------------------------------------------------------------------------


class TorchBatchNorm(nnx.Module):
    """BatchNorm2d as PyTorch computes it, on NHWC activations: in train mode from the batch, updating the running
    statistics; in eval mode (``model.eval()`` sets ``use_running_average``, as on NNX's own norms) from them."""

    def __init__(self, features, mistake=None):
        self.scale = nnx.Param(jnp.ones(features))
        self.bias = nnx.Param(jnp.zeros(features))
        self.mean = nnx.BatchStat(jnp.zeros(features))
        self.var = nnx.BatchStat(jnp.ones(features))
        # nnx.BatchNorm's momentum=0.9 (Flax's meaning) passed where PyTorch means 0.1
        self.momentum = 0.9 if mistake == "bn-momentum" else 0.1
        self.mistake = mistake
        self.use_running_average = False

    def __call__(self, x):
        if self.use_running_average:
            return (x - self.mean[...]) / jnp.sqrt(self.var[...] + 1e-5) * self.scale[...] + self.bias[...]
        mean, var = x.mean(axis=(0, 1, 2)), x.var(axis=(0, 1, 2))
        n = x.size / x.shape[-1]
        unbiased = var if self.mistake == "bn-biased-var" else var * n / (n - 1)
        self.mean[...] = (1 - self.momentum) * self.mean[...] + self.momentum * mean
        self.var[...] = (1 - self.momentum) * self.var[...] + self.momentum * unbiased
        return (x - mean) / jnp.sqrt(var + 1e-5) * self.scale[...] + self.bias[...]


class NNXBasicBlock(nnx.Module):
    def __init__(self, inplanes, planes, stride, rngs, mistake=None):
        def conv(i, o, k, s):
            return nnx.Conv(i, o, (k, k), strides=s, padding=[(k // 2, k // 2)] * 2, use_bias=False, rngs=rngs)

        self.conv1 = conv(inplanes, planes, 3, stride)
        self.bn1 = TorchBatchNorm(planes, mistake)
        self.conv2 = conv(planes, planes, 3, 1)
        self.bn2 = TorchBatchNorm(planes, mistake)
        self.downsample = nnx.data(None)  # a submodule or None: NNX is told it holds data
        if stride != 1 or inplanes != planes:
            self.downsample = nnx.Sequential(conv(inplanes, planes, 1, stride), TorchBatchNorm(planes, mistake))

    def __call__(self, x):
        out = self.bn2(self.conv2(nnx.relu(self.bn1(self.conv1(x)))))
        return nnx.relu(out + (self.downsample(x) if self.downsample is not None else x))


class NNXResNet18(nnx.Module):
    def __init__(self, rngs, num_classes=10, mistake=None):
        self.mistake = mistake
        self.conv1 = nnx.Conv(3, 64, (7, 7), strides=2, padding=[(3, 3)] * 2, use_bias=False, rngs=rngs)
        self.bn1 = TorchBatchNorm(64, mistake)
        planes = [(64, 64, 1), (64, 128, 2), (128, 256, 2), (256, 512, 2)]
        self.layer1, self.layer2, self.layer3, self.layer4 = (
            nnx.Sequential(NNXBasicBlock(i, o, s, rngs, mistake), NNXBasicBlock(o, o, 1, rngs, mistake)) for i, o, s in planes)
        self.fc = nnx.Linear(512, num_classes, rngs=rngs)

    def __call__(self, x):  # NHWC
        x = nnx.relu(self.bn1(self.conv1(x)))
        # PyTorch's MaxPool2d(3, 2, padding=1) pads with −inf; "max-pool-valid" forgets the padding.
        padding = "VALID" if self.mistake == "max-pool-valid" else ((1, 1), (1, 1))
        x = nnx.max_pool(x, (3, 3), strides=(2, 2), padding=padding)
        x = self.layer4(self.layer3(self.layer2(self.layer1(x))))
        return self.fc(x.mean(axis=(1, 2)))


# Planted mistakes (tests/test_check_port_apis.py): name → (the stage, the layer the report must name).
MISTAKES = {"bn-momentum": ("buffer", "bn1.running_mean"), "bn-biased-var": ("buffer", "bn1.running_var"),
            "max-pool-valid": ("forward", "layer1.0.conv1")}
MISTAKE = None


torch_model = ResNet18  # built under the checker's torch.manual_seed(0)


def jax_model():
    return NNXResNet18(nnx.Rngs(0), mistake=MISTAKE)


def example_inputs():
    return (np.random.default_rng(0).normal(0.0, 1.0, (4, 3, 32, 32)).astype(np.float32),)


def example_targets():
    return (np.array([3, 1, 7, 0]),)


def torch_loss(output, x, target):
    return nn.functional.cross_entropy(output, target)


def jax_loss(output, x, target):
    return optax.softmax_cross_entropy_with_integer_labels(output, target).mean()


def torch_optimizer(parameters):
    return torch.optim.SGD(parameters, lr=0.1, momentum=0.9, weight_decay=1e-4)


def jax_optimizer():  # PyTorch's SGD: weight decay added to the gradient, then momentum, then the step
    return optax.chain(optax.add_decayed_weights(1e-4), optax.sgd(0.1, momentum=0.9))
