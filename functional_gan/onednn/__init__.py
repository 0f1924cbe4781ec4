"""oneDNN's convolutions for XLA:CPU, through JAX's FFI: the optional ``onednn`` extra.

XLA:CPU runs a strided convolution's forward and kernel gradient, and every transposed convolution's kernel gradient,
in kernels of its own that take 1.3-3.6x the time of oneDNN's (the library PyTorch runs them in) on the DCGAN's
shapes; no route inside jaxlib takes them to a library (its YNNPACK and oneDNN routes accept stride 1 only). XLA's
FFI lets a project register its own kernels: ``conv.cc`` holds three handlers on oneDNN 3.2 (PyPI's
``onednn-cpu-gomp``) — a convolution's forward, its input gradient and its kernel gradient — built at first use
(:mod:`functional_gan.onednn._build`).

The three are closed under differentiation: the input gradient of ``y = conv(x, w)`` is ``backward_data(dy, w)``, its
kernel gradient ``backward_weights(x, dy)``, and each of those two is linear in each argument with derivatives that
are again the three (see :func:`backward_data` and :func:`backward_weights`). So first and second derivatives
(WGAN-GP's penalty) stay in oneDNN. A transposed convolution is the input gradient of the convolution with the same
weight: :func:`conv_transpose2d` is ``backward_data``.

Where it runs: :func:`use_for` says yes on the CPU backend, with one device in the job (a sharded or multi-process
run keeps XLA's convolution, which its partitioner understands), in float32, when ``$FUNCTIONAL_GAN_CONV`` is
``onednn`` or unset and the extra is installed. ``vmap`` runs the handlers once per batch element ("sequential").
Left unset, convolutions smaller than :data:`MIN_FLOPS` stay with XLA (a oneDNN call's fixed cost outweighs its gain
there). ``FUNCTIONAL_GAN_CONV=xla`` keeps XLA's convolutions everywhere; ``=onednn`` sends every convolution it can
take to oneDNN and makes a missing or unbuildable extra an error instead of a one-line warning.

May import: jax, numpy, :mod:`functional_gan.errors`. Not the layers (they import this).
"""

from __future__ import annotations

import os
import warnings
from functools import partial

import jax
import jax.numpy as jnp
import numpy as np

from functional_gan.errors import UserError
from functional_gan.onednn import _build
from functional_gan.onednn._build import Unavailable

CONV_ENV = "FUNCTIONAL_GAN_CONV"
CONVS = ("onednn", "xla")  # the default: oneDNN where the extra is installed, else XLA
THREADS_ENV = "FUNCTIONAL_GAN_ONEDNN_THREADS"  # OpenMP threads per oneDNN call (default: OpenMP's, the usable cores)
SERIAL_ENV = "FUNCTIONAL_GAN_ONEDNN_SERIAL"  # "1": oneDNN calls take turns (at most one OpenMP team busy)

__all__ = ["CONV_ENV", "CONVS", "Unavailable", "available", "choice", "conv2d", "conv_transpose2d", "use_for",
           "use_for_convolution"]

_warned = False


def choice() -> str:
    """``$FUNCTIONAL_GAN_CONV``: ``"onednn"``, ``"xla"``, or ``""`` (unset: oneDNN where it can be had)."""
    value = os.environ.get(CONV_ENV, "").strip().lower()
    if value and value not in CONVS:
        raise UserError(f"${CONV_ENV}={value!r}: choose one of {', '.join(CONVS)}")
    return value


_configured = False


def library():
    """The loaded handlers, configured from the environment at the first call (:class:`Unavailable` where they
    cannot be had)."""
    global _configured
    lib = _build.load()
    if not _configured:
        _configured = True
        threads = os.environ.get(THREADS_ENV, "").strip()
        configure(threads=int(threads) if threads.isdigit() else 0, serial=os.environ.get(SERIAL_ENV, "") == "1")
    return lib


def configure(threads: int | None = None, serial: bool | None = None) -> None:
    """Set, for the whole process and from the next call on, the OpenMP threads each oneDNN call runs on (0:
    OpenMP's default) and whether calls take turns (``serial``). The environment sets both at first use."""
    lib = _build.load()
    if threads is not None:
        lib.fg_onednn_set_threads(int(threads))
    if serial is not None:
        lib.fg_onednn_set_serial(int(bool(serial)))


def available() -> bool:
    """Whether oneDNN's handlers are built and registered in this process (builds them if the extra is there)."""
    try:
        library()
    except Unavailable:
        return False
    return True


# The smallest convolution (forward FLOPs, 2 per multiply-add) the default sends to oneDNN. Below it a call's fixed
# cost (the FFI call, an OpenMP team's wake-up, a weight reorder: 0.05-0.2 ms) outweighs oneDNN's faster arithmetic
# and XLA's own convolution, fused with its neighbours, is as fast or faster. Measured on a 2-core AMD EPYC, value and
# kernel gradient of a 4×4 stride-2 convolution, medians (XLA / oneDNN, ms): 2.1 MFLOP 0.06-0.10 / 0.09-0.25,
# 12.6 MFLOP 0.42-0.66 / 0.31-0.45, 8.6 GFLOP 47-69 / 31-35; the tiny nets' whole step (batch 4, 32×32) 2.6 ms with
# XLA's convolutions against 14 ms with oneDNN's for every one. $FUNCTIONAL_GAN_CONV=onednn takes every size.
MIN_FLOPS = 8e6


def conv_flops(x_shape, weight_shape, out_hw) -> float:
    """A convolution's forward FLOPs (padding's zeros counted): 2 · N · OH · OW · O · C · kH · kW, for the
    convolution from ``x_shape`` (N, H, W, C) to ``out_hw`` with an (O, C, kH, kW) kernel."""
    n, c = x_shape[0], x_shape[3]
    o, _, kh, kw = weight_shape
    return 2.0 * n * out_hw[0] * out_hw[1] * o * c * kh * kw


def use_for(*arrays, flops: float | None = None) -> bool:
    """Whether a convolution of these arrays takes oneDNN (decided when it is traced; see the module's docstring).
    ``flops``: its forward FLOPs; by default one below :data:`MIN_FLOPS` stays with XLA.

    Raises :class:`~functional_gan.errors.UserError` where ``$FUNCTIONAL_GAN_CONV=onednn`` asks for oneDNN and it
    cannot be had; where the variable is unset, an extra that is installed but cannot be built is one warning, and
    XLA's convolution runs."""
    global _warned
    wanted = choice()
    if wanted == "xla" or jax.default_backend() != "cpu" or jax.device_count() != 1:
        return False
    if any(jnp.dtype(a.dtype) != jnp.float32 for a in arrays):
        return False
    if wanted != "onednn" and flops is not None and flops < MIN_FLOPS:
        return False
    try:
        library()
    except Unavailable as error:
        if wanted == "onednn":
            raise UserError(f"${CONV_ENV}=onednn: {error}") from None
        if "not installed" not in str(error) and not _warned:
            _warned = True
            warnings.warn(f"oneDNN's convolutions are off, XLA's run instead: {error}", RuntimeWarning, stacklevel=2)
        return False
    return True


def padding_fits(in_hw, out_hw, kernel_hw, stride: int, padding: int) -> bool:
    """Whether a convolution from ``in_hw`` to ``out_hw`` pads by ``padding`` before and by no less than 0 after
    (oneDNN takes no negative padding: a convolution whose stride leaves input rows unread at the end, 3×3 stride 2
    over 6 rows, does not fit, nor a transposed convolution's ``output_padding`` larger than its ``padding``)."""
    return all((o - 1) * stride + k - i - padding >= 0 for i, o, k in zip(in_hw, out_hw, kernel_hw))


def use_for_convolution(x, weight_OIHW, in_hw, out_hw, stride: int, padding: int) -> bool:
    """:func:`use_for` of the convolution from ``in_hw`` to ``out_hw`` with this (out, in, kH, kW) kernel (a layer's
    own, or the one whose input gradient a transposed convolution is): where oneDNN can pad it so, judged by its
    FLOPs."""
    if not padding_fits(in_hw, out_hw, weight_OIHW.shape[2:], stride, padding):
        return False
    flops = conv_flops((x.shape[0], *in_hw, weight_OIHW.shape[1]), weight_OIHW.shape, out_hw)
    return use_for(x, weight_OIHW, flops=flops)


def _ffi(name: str, shape, a, b, stride: int, padding: int):
    try:
        library()  # registered before the first call is traced
    except Unavailable as error:
        raise UserError(f"oneDNN's convolution: {error}") from None
    out = jax.ShapeDtypeStruct(tuple(shape), jnp.float32)
    return jax.ffi.ffi_call(name, out, vmap_method="sequential")(a, b, stride=np.int64(stride), padding=np.int64(padding))


def _out_size(size: int, kernel: int, stride: int, padding: int) -> int:
    return (size + 2 * padding - kernel) // stride + 1


@partial(jax.custom_vjp, nondiff_argnums=(2, 3))
def conv2d(x_NHWC, weight_OIHW, stride: int, padding: int):
    """``torch.nn.functional.conv2d`` without bias in oneDNN: NHWC input, PyTorch's (out, in, kH, kW) kernel."""
    n, h, w, _ = x_NHWC.shape
    o, _, kh, kw = weight_OIHW.shape
    shape = (n, _out_size(h, kh, stride, padding), _out_size(w, kw, stride, padding), o)
    return _ffi("fg_onednn_conv_forward", shape, x_NHWC, weight_OIHW, stride, padding)


def _conv2d_fwd(x, w, stride, padding):
    return conv2d(x, w, stride, padding), (x, w)


def _conv2d_bwd(stride, padding, residuals, dy):
    x, w = residuals
    return backward_data(dy, w, stride, padding, x.shape[1:3]), backward_weights(x, dy, stride, padding, w.shape)


conv2d.defvjp(_conv2d_fwd, _conv2d_bwd)


@partial(jax.custom_vjp, nondiff_argnums=(2, 3, 4))
def backward_data(dy_NHWC, weight_OIHW, stride: int, padding: int, in_hw: tuple[int, int]):
    """``Fᵀ dy`` for ``F x = conv2d(x, weight)`` on inputs of spatial size ``in_hw``: the convolution's input
    gradient, and the transposed convolution. Linear in each argument: for a cotangent ``g`` of its output,
    ``⟨g, Fᵀ dy⟩ = ⟨F g, dy⟩``, so ``dy`` gets ``conv2d(g, weight)`` and ``weight`` gets
    ``backward_weights(g, dy)``."""
    shape = (dy_NHWC.shape[0], *in_hw, weight_OIHW.shape[1])
    return _ffi("fg_onednn_conv_backward_data", shape, dy_NHWC, weight_OIHW, stride, padding)


def _backward_data_fwd(dy, w, stride, padding, in_hw):
    return backward_data(dy, w, stride, padding, in_hw), (dy, w)


def _backward_data_bwd(stride, padding, in_hw, residuals, g):
    dy, w = residuals
    return conv2d(g, w, stride, padding), backward_weights(g, dy, stride, padding, w.shape)


backward_data.defvjp(_backward_data_fwd, _backward_data_bwd)


@partial(jax.custom_vjp, nondiff_argnums=(2, 3, 4))
def backward_weights(x_NHWC, dy_NHWC, stride: int, padding: int, weight_shape: tuple[int, int, int, int]):
    """``∂/∂w ⟨conv2d(x, w), dy⟩``: the kernel gradient, bilinear in ``(x, dy)``. For a cotangent ``G`` (a kernel),
    ``⟨G, result⟩ = ⟨conv2d(x, G), dy⟩``, so ``x`` gets ``backward_data(dy, G)`` and ``dy`` gets ``conv2d(x, G)``."""
    return _ffi("fg_onednn_conv_backward_weights", tuple(weight_shape), x_NHWC, dy_NHWC, stride, padding)


def _backward_weights_fwd(x, dy, stride, padding, weight_shape):
    return backward_weights(x, dy, stride, padding, weight_shape), (x, dy)


def _backward_weights_bwd(stride, padding, weight_shape, residuals, g):
    x, dy = residuals
    return backward_data(dy, g, stride, padding, x.shape[1:3]), conv2d(x, g, stride, padding)


backward_weights.defvjp(_backward_weights_fwd, _backward_weights_bwd)


def conv_transpose2d(x_NHWC, weight_IOHW, stride: int, padding: int, out_hw: tuple[int, int]):
    """``torch.nn.functional.conv_transpose2d`` without bias in oneDNN, output size ``out_hw``: the input gradient of
    the convolution from ``out_hw`` whose (out, in, kH, kW) kernel is this layer's (in, out, kH, kW) one."""
    return backward_data(x_NHWC, weight_IOHW, stride, padding, tuple(out_hw))
