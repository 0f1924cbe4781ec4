"""ResNet-50 at full width (torchvision's ``Bottleneck`` stacked [3, 4, 6, 3], 64 planes at the first stage: 23.5M
parameters with 10 classes) and its Flax Linen port, one SGD step with momentum in training mode, on 4 images of
32 × 32: the size of check the benchmark of check-port's memory measures.

    functional-gan check-port examples/port/resnet50.py --memory

The blocks, the port and the losses are ``resnet_bottleneck.py``'s (there at ResNet-152's depth and a small width);
the stem is a 3 × 3 convolution of stride 1 (CIFAR-sized images) where torchvision's has a 7 × 7 of stride 2 and a
max-pool, so the first stage runs at 32 × 32.
"""

import numpy as np
from resnet_bottleneck import (DeepResNet, FlaxDeepResNet, jax_loss, jax_optimizer,  # noqa: F401 (the spec's folder)
                               torch_loss, torch_optimizer)

LAYERS = (3, 4, 6, 3)  # ResNet-50
WIDTH = 64


def torch_model():
    return DeepResNet(layers=LAYERS, width=WIDTH)


def jax_model():
    return FlaxDeepResNet(layers=LAYERS, width=WIDTH)


def example_inputs():
    return (np.random.default_rng(0).normal(0.0, 1.0, (4, 3, 32, 32)).astype(np.float32),)


def example_targets():
    return (np.random.default_rng(1).integers(0, 10, 4),)
