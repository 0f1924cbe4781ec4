"""Layers and losses that reproduce PyTorch's semantics exactly.

Everything that must agree numerically with ``torch.nn`` lives here:

* :func:`conv2d` / :class:`Conv2d` — ``nn.Conv2d`` (weight ``(out, in, kH, kW)``, symmetric padding).
* :func:`conv_transpose2d` / :class:`ConvTranspose2d` — ``nn.ConvTranspose2d`` (weight
  ``(in, out, kH, kW)``, PyTorch's meaning of ``padding``), with a custom VJP that keeps XLA on CPU
  off its slow path for transposed-convolution kernel gradients.
* :class:`BatchNorm2d` — ``nn.BatchNorm2d`` in training and eval mode, running statistics included.
* :func:`bce_loss` — ``nn.BCELoss()`` with its clamp at −100 and its saturation-safe backward.

Parameters are stored in PyTorch's layouts so that a ``state_dict`` maps onto Flax variables by
renaming alone; activations are NHWC, the layout XLA prefers on every backend.
"""

from __future__ import annotations

from functools import partial

import flax.linen as nn
import jax
import jax.numpy as jnp
import numpy as np
from jax import lax

_NHWC_HWIO = ("NHWC", "HWIO", "NHWC")


def _torch_conv_weight_to_hwio(weight_OIHW: jax.Array) -> jax.Array:
    """PyTorch's Conv2d weight (out, in, kH, kW) → lax's HWIO kernel."""
    return jnp.transpose(weight_OIHW, (2, 3, 1, 0))


def conv2d(x_NHWC: jax.Array, weight_OIHW: jax.Array, stride: int, padding: int) -> jax.Array:
    """``torch.nn.functional.conv2d`` without bias, on NHWC activations.

    Args:
      x_NHWC: input, channels last.
      weight_OIHW: kernel in PyTorch's layout ``(out_channels, in_channels, kH, kW)``.
      stride: the same stride along both spatial axes.
      padding: PyTorch's ``padding``: ``p`` zeros on every side.

    Returns:
      The output, NHWC.
    """
    return lax.conv_general_dilated(
        x_NHWC,
        _torch_conv_weight_to_hwio(weight_OIHW),
        window_strides=(stride, stride),
        padding=((padding, padding), (padding, padding)),
        dimension_numbers=_NHWC_HWIO,
    )


def _conv_transpose2d_forward(x_NHWC, weight_IOHW, stride, padding):
    # ConvTranspose2d is the input-gradient of Conv2d(out → in) with the same weight: a
    # stride-1 convolution of the input dilated by `stride`, padded by k-1-p (not p: PyTorch's p
    # removes rows from the *output*), with the kernel flipped and in/out swapped.
    kernel_h, kernel_w = weight_IOHW.shape[2:]
    kernel_HWIO = jnp.transpose(weight_IOHW[:, :, ::-1, ::-1], (2, 3, 0, 1))
    return lax.conv_general_dilated(
        x_NHWC,
        kernel_HWIO,
        window_strides=(1, 1),
        padding=(
            (kernel_h - 1 - padding, kernel_h - 1 - padding),
            (kernel_w - 1 - padding, kernel_w - 1 - padding),
        ),
        lhs_dilation=(stride, stride),
        dimension_numbers=_NHWC_HWIO,
    )


@partial(jax.custom_vjp, nondiff_argnums=(2, 3))
def conv_transpose2d(x_NHWC: jax.Array, weight_IOHW: jax.Array, stride: int, padding: int) -> jax.Array:
    """``torch.nn.functional.conv_transpose2d`` without bias or output_padding, on NHWC activations.

    Output size: ``(H - 1) * stride - 2 * padding + kH``, as in PyTorch.

    The gradient is written by hand (a custom VJP). Writing ``F(z) = conv2d(z, weight, stride,
    padding)`` for the forward convolution whose input-gradient this layer is (so ``y = Fᵀ x``):

    * the input cotangent is ``F(dy)``, a plain strided convolution;
    * the kernel cotangent is the kernel gradient of ``F`` at input ``dy`` with output cotangent
      ``x`` (since ``<dy, F_w^T x> = <F_w dy, x>``).

    Both are regular-convolution primitives, which XLA on CPU runs on its fast path; the automatic
    kernel gradient of a dilated convolution runs 40–90× slower there (see NOTES-performance).
    The result is mathematically identical (tests compare both with PyTorch).

    Args:
      x_NHWC: input, channels last.
      weight_IOHW: kernel in PyTorch's ConvTranspose2d layout ``(in_channels, out_channels, kH, kW)``.
      stride: the same stride along both spatial axes.
      padding: PyTorch's ``padding`` (``k - 1 - padding`` zeros are added to the dilated input).
    """
    return _conv_transpose2d_forward(x_NHWC, weight_IOHW, stride, padding)


def _conv_transpose2d_fwd(x_NHWC, weight_IOHW, stride, padding):
    return _conv_transpose2d_forward(x_NHWC, weight_IOHW, stride, padding), (x_NHWC, weight_IOHW)


def _conv_transpose2d_bwd(stride, padding, residuals, dy_NHWC):
    x_NHWC, weight_IOHW = residuals
    # weight (in, out, kH, kW) read as a Conv2d weight (out=in, in=out, kH, kW) maps `out` channels
    # back to `in` channels: exactly the forward convolution F whose transpose this layer is.
    dx_NHWC = conv2d(dy_NHWC, weight_IOHW, stride, padding)
    _, kernel_vjp = jax.vjp(lambda w: conv2d(dy_NHWC, w, stride, padding), weight_IOHW)
    (dweight_IOHW,) = kernel_vjp(x_NHWC)
    return dx_NHWC, dweight_IOHW


conv_transpose2d.defvjp(_conv_transpose2d_fwd, _conv_transpose2d_bwd)


def conv_transpose2d_reference(x_NHWC, weight_IOHW, stride, padding):
    """The same layer without the custom VJP: JAX differentiates the dilated convolution itself.

    Kept for tests and for the benchmark that shows why the custom VJP exists.
    """
    return _conv_transpose2d_forward(x_NHWC, weight_IOHW, stride, padding)


def normal_init(mean: float, stddev: float):
    """``nn.init.normal_(w, mean, std)`` as a Flax initializer (the tutorial's ``weights_init``)."""

    def init(key, shape, dtype=jnp.float32):
        return mean + stddev * jax.random.normal(key, shape, dtype)

    return init


class Conv2d(nn.Module):
    """``nn.Conv2d(in, out, kernel_size, stride, padding, bias=False)``; parameter ``weight`` (out, in, kH, kW).

    Initialised N(0, 0.02), the tutorial's ``weights_init`` for every module named "Conv".
    """

    in_channels: int
    out_channels: int
    kernel_size: int
    stride: int
    padding: int

    @nn.compact
    def __call__(self, x_NHWC):
        k = self.kernel_size
        weight = self.param(
            "weight", normal_init(0.0, 0.02), (self.out_channels, self.in_channels, k, k), x_NHWC.dtype
        )
        return conv2d(x_NHWC, weight, self.stride, self.padding)


class ConvTranspose2d(nn.Module):
    """``nn.ConvTranspose2d(in, out, kernel_size, stride, padding, bias=False)``; ``weight`` (in, out, kH, kW).

    Initialised N(0, 0.02), the tutorial's ``weights_init``.
    """

    in_channels: int
    out_channels: int
    kernel_size: int
    stride: int
    padding: int

    @nn.compact
    def __call__(self, x_NHWC):
        k = self.kernel_size
        weight = self.param(
            "weight", normal_init(0.0, 0.02), (self.in_channels, self.out_channels, k, k), x_NHWC.dtype
        )
        return conv_transpose2d(x_NHWC, weight, self.stride, self.padding)


class BatchNorm2d(nn.Module):
    """``nn.BatchNorm2d(num_features)`` with PyTorch's exact training-mode behaviour.

    Parameters ``weight`` (init N(1, 0.02), the tutorial's ``weights_init``) and ``bias`` (0);
    batch statistics ``running_mean``, ``running_var`` and ``num_batches_tracked`` in the
    ``batch_stats`` collection.

    Training mode (``use_running_average=False``) normalises with the batch mean and the *biased*
    batch variance. The running statistics are updated only when ``batch_stats`` is mutable in
    ``apply``, as PyTorch does on every training-mode forward:
    ``running = (1 - momentum) * running + momentum * batch_stat``, where ``running_var`` receives
    the *unbiased* variance (× n/(n−1)). Flax's own ``nn.BatchNorm`` differs on all three counts
    (its momentum is the complement, it keeps the biased variance, and it has no counter).
    """

    num_features: int
    momentum: float = 0.1  # PyTorch's momentum: weight of the *new* statistic
    eps: float = 1e-5
    use_running_average: bool = False

    @nn.compact
    def __call__(self, x_NHWC):
        c = self.num_features
        dtype = x_NHWC.dtype
        weight = self.param("weight", normal_init(1.0, 0.02), (c,), dtype)
        bias = self.param("bias", nn.initializers.zeros, (c,), dtype)
        running_mean = self.variable("batch_stats", "running_mean", lambda: jnp.zeros((c,), dtype))
        running_var = self.variable("batch_stats", "running_var", lambda: jnp.ones((c,), dtype))
        num_batches_tracked = self.variable(
            "batch_stats", "num_batches_tracked", lambda: jnp.zeros((), jnp.int32)
        )
        if self.use_running_average:
            mean, var = running_mean.value, running_var.value
        else:
            mean = jnp.mean(x_NHWC, axis=(0, 1, 2))
            # Two-pass variance (not E[x²]−E[x]²) for PyTorch-level accuracy; biased, as PyTorch
            # normalises with the biased variance.
            var = jnp.mean(jnp.square(x_NHWC - mean), axis=(0, 1, 2))
            if self.is_mutable_collection("batch_stats") and not self.is_initializing():
                n = x_NHWC.shape[0] * x_NHWC.shape[1] * x_NHWC.shape[2]
                # PyTorch tracks running_var with the unbiased variance.
                unbiased_var = var * (n / max(n - 1, 1))
                m = self.momentum
                running_mean.value = (1 - m) * running_mean.value + m * lax.stop_gradient(mean)
                running_var.value = (1 - m) * running_var.value + m * lax.stop_gradient(unbiased_var)
                num_batches_tracked.value = num_batches_tracked.value + 1
        inv_std = lax.rsqrt(var + self.eps)
        return (x_NHWC - mean) * (inv_std * weight) + bias


# --- Binary cross-entropy exactly as nn.BCELoss() -----------------------------------------------

_LOG_CLAMP = -100.0  # PyTorch clamps each log term at -100 so that log(0) stays finite.
# PyTorch's backward divides by max(p(1-p), EPSILON) with EPSILON = 1e-12 declared as a C++ float,
# so even in float64 the floor is float32(1e-12) = 9.9999999600e-13.
_BCE_BACKWARD_EPS = float(np.float32(1e-12))


@jax.custom_vjp
def bce_loss(probabilities: jax.Array, targets: jax.Array) -> jax.Array:
    """``nn.BCELoss()`` (mean reduction) on probabilities, PyTorch's clamps included.

    ``-mean(y·max(log p, −100) + (1−y)·max(log(1−p), −100))``.

    The backward is PyTorch's formula ``(p − y) / max(p(1 − p), 1e-12) / N``: it stays finite when
    the sigmoid saturates (p == 1.0 in float32 for logits above ~17), where differentiating the
    clamped logs naively gives NaN (0·∞). ``optax.sigmoid_binary_cross_entropy`` on logits is
    numerically better but is not what the tutorial computes (Sigmoid, then BCELoss).

    Args:
      probabilities: predictions in [0, 1], any shape.
      targets: labels of the same shape (floats, as the tutorial's 1.0 / 0.0).

    Returns:
      The scalar mean loss.
    """
    return _bce_forward(probabilities, targets)


def _bce_forward(p, y):
    log_p = jnp.maximum(jnp.log(p), _LOG_CLAMP)
    log_1mp = jnp.maximum(jnp.log1p(-p), _LOG_CLAMP)
    return -jnp.mean(y * log_p + (1 - y) * log_1mp)


def _bce_fwd(p, y):
    return _bce_forward(p, y), (p, y)


def _bce_bwd(residuals, g):
    p, y = residuals
    n = p.size
    dp = g * (p - y) / jnp.maximum(p * (1 - p), _BCE_BACKWARD_EPS) / n
    log_p = jnp.maximum(jnp.log(p), _LOG_CLAMP)
    log_1mp = jnp.maximum(jnp.log1p(-p), _LOG_CLAMP)
    dy = g * (log_1mp - log_p) / n
    return dp, dy


bce_loss.defvjp(_bce_fwd, _bce_bwd)
