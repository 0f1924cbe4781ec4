"""Layers and losses that reproduce PyTorch's semantics exactly.

Everything that must agree numerically with ``torch.nn`` lives here:

* :func:`conv2d` / :class:`Conv2d` — ``nn.Conv2d`` (weight ``(out, in, kH, kW)``, symmetric padding).
* :func:`conv_transpose2d` / :class:`ConvTranspose2d` — ``nn.ConvTranspose2d`` (weight
  ``(in, out, kH, kW)``, PyTorch's meaning of ``padding``).

Both convolutions carry custom VJPs, and the transposed one a sub-pixel forward on CPU, so that
no convolution with input dilation (XLA:CPU's slow path) is left in a training step. On the CPU in
float32, with the ``onednn`` extra installed, both run in oneDNN instead (:mod:`functional_gan.onednn`).
* :class:`BatchNorm2d` — ``nn.BatchNorm2d`` in training and eval mode, running statistics included.
* :func:`bce_loss` — ``nn.BCELoss()`` with its clamp at −100 and its saturation-safe backward.

Parameters are stored in PyTorch's layouts so that a ``state_dict`` maps onto Flax variables by
renaming alone; activations are NHWC, the layout XLA prefers on every backend.
"""

from __future__ import annotations

import functools
import math
import os
from functools import partial

import flax.linen as nn
import jax
import jax.numpy as jnp
import numpy as np
from jax import lax

from functional_gan import onednn

_NHWC_HWIO = ("NHWC", "HWIO", "NHWC")

# Which form the transposed convolution (and every strided convolution's input gradient) takes:
# "subpixel" (no input dilation; see _subpixel_conv_transpose) or "dilated" (the textbook form).
# XLA:CPU runs convolutions with input dilation on a slow generic path, so the CPU default is
# "subpixel"; GPUs and TPUs run dilated convolutions in their libraries (cuDNN), so they keep it.
# Both forms are tested equal to each other and to PyTorch. Override with the environment variable.
TRANSPOSED_CONV_FORM_ENV = "FUNCTIONAL_GAN_TRANSPOSED_CONV"
TRANSPOSED_CONV_FORMS = ("subpixel", "dilated")


def _form(variable: str, forms: tuple[str, str]) -> str:
    """The form ``$variable`` names, or by default ``forms[0]`` on CPU and ``forms[1]`` elsewhere."""
    form = os.environ.get(variable) or (forms[0] if jax.default_backend() == "cpu" else forms[1])
    if form not in forms:
        raise ValueError(f"${variable}={form!r}: choose one of {forms}")
    return form


# Which form a strided convolution takes whose kernel the stride divides (D's 4×4 stride-2 layers):
# "space_to_depth" (the padded input's s×s blocks moved into channels: a stride-1 convolution with a (k/s)×(k/s)
# kernel and s²·C input channels, whose input gradient is a stride-1 transposed convolution with no dilation and
# whose kernel gradient is a stride-1 weight gradient) or "direct" (the strided convolution as it is). See
# _space_to_depth_conv2d.
STRIDED_CONV_FORM_ENV = "FUNCTIONAL_GAN_STRIDED_CONV"
STRIDED_CONV_FORMS = ("direct", "space_to_depth")


def strided_conv_form() -> str:
    """The strided convolution's form: ``$FUNCTIONAL_GAN_STRIDED_CONV``, else the default for this backend."""
    return _form(STRIDED_CONV_FORM_ENV, STRIDED_CONV_FORMS)


def transposed_conv_form() -> str:
    """``"subpixel"`` on CPU, ``"dilated"`` elsewhere, unless ``$FUNCTIONAL_GAN_TRANSPOSED_CONV`` says otherwise."""
    return _form(TRANSPOSED_CONV_FORM_ENV, TRANSPOSED_CONV_FORMS)


def _torch_conv_weight_to_hwio(weight_OIHW: jax.Array) -> jax.Array:
    """PyTorch's Conv2d weight (out, in, kH, kW) → lax's HWIO kernel."""
    return jnp.transpose(weight_OIHW, (2, 3, 1, 0))


# On CPU a strided convolution or a weight gradient whose activations overflow the cache slows
# down more than linearly with the batch. Splitting the batch into chunks whose input and output
# fit this budget keeps the cost near linear. Measure: `functional-gan bench --batch-sizes 64 128
# --no-torch-compile` with this budget and with it set very large (the step's scaling and the
# per-layer table).
# Every chunk is its own convolution in the compiled program, so the budget also sets the compile
# time. Same-run A/B on 2 cores (step medians, interleaved; compile of the step at batch 64/128/256):
# 4 MiB 1461/2928/6352 ms, compile 8.7/11.7/22.5 s; 8 MiB 1417/2861/6001 ms, compile 5.9/8.8/10.5 s;
# 16 MiB the same at batch 64 but +9% at 128; no split at all +14% at 64. Hence 8 MiB.
# Convolutions are per sample, so a split forward is exact; weight gradients become sums over
# chunks (a different summation order, float rounding only).
CPU_CONV_CHUNK_BYTES = 8 * 2**20
# The kernel gradients' own budget (a convolution's or a transposed convolution's, summed over the chunks).
CPU_CONV_GRADIENT_CHUNK_BYTES = 8 * 2**20


def _batch_chunks(batch: int, bytes_per_sample: int, budget: int | None = None) -> int:
    """How many equal chunks to split a batch into on CPU (1 elsewhere, or when it fits ``budget``, by default
    CPU_CONV_CHUNK_BYTES)."""
    if jax.default_backend() != "cpu":
        return 1
    budget = CPU_CONV_CHUNK_BYTES if budget is None else budget
    chunks = 1
    while batch % (2 * chunks) == 0 and (batch // chunks) * bytes_per_sample > budget:
        chunks *= 2
    return chunks


def _per_sample_bytes(*arrays_NHWC) -> int:
    return sum(math.prod(a.shape[1:]) * a.dtype.itemsize for a in arrays_NHWC)


def _map_batch(fn, x_NHWC, out_per_sample_bytes: int):
    """``fn(x)`` computed chunk by chunk along the batch (see CPU_CONV_CHUNK_BYTES)."""
    chunks = _batch_chunks(x_NHWC.shape[0], _per_sample_bytes(x_NHWC) + out_per_sample_bytes)
    if chunks == 1:
        return fn(x_NHWC)
    return jnp.concatenate([fn(part) for part in jnp.split(x_NHWC, chunks)], axis=0)


def _conv_output_size(size: int, kernel: int, stride: int, padding: int) -> int:
    return (size + 2 * padding - kernel) // stride + 1


# im2col on CPU: a strided convolution as one matrix product, its input's kH·kW strided slices stacked along the
# channels ("patches", (N, OH, OW, kH·kW·C)) times the kernel as a (kH·kW·C, out) matrix; its kernel gradient is
# patchesᵀ · dy. XLA:CPU runs a large GEMM near the matmul peak, where its convolution of these two shapes lags:
# the first layer (C = 3: a 48-wide patch, a thin convolution) and a small output (≤ 4×4: few positions, many
# channels). Per-layer prototype at batch 64 (forward / kernel gradient, ms): D's main.0 13.4 → 7.4 / 23.1 → 10.8,
# main.8 63.8 → 45.5 / 61.2 → 46.8; the middle layers lost (main.2 48 → 94 / 82 → 132), so they keep the
# convolution. Exact in float64 to rounding (tested against PyTorch, one device).
# Off by default: in a run of 2 processes × 2 CPU devices on jax 0.12 its kernel gradients differed from the same
# run in one process by ~1e-2 (Adam's first moments by 1.3e-3, against 4.5e-7 with it off; tests/test_sharding.py),
# and its gain on the step was small (same-run A/B: −0.7 to −7% at batch 64, −3.7% at 128). IM2COL = True for A/B
# runs on one process.
IM2COL = False
IM2COL_MAX_CHANNELS = 4  # input channels up to which a strided convolution is a GEMM (the image layer)
IM2COL_MAX_POSITIONS = 16  # output positions (OH·OW) up to which it is


def _use_im2col(x_NHWC, weight_OIHW, stride: int, padding: int) -> bool:
    if not IM2COL or stride == 1 or jax.default_backend() != "cpu":
        return False
    oh = _conv_output_size(x_NHWC.shape[1], weight_OIHW.shape[2], stride, padding)
    ow = _conv_output_size(x_NHWC.shape[2], weight_OIHW.shape[3], stride, padding)
    return weight_OIHW.shape[1] <= IM2COL_MAX_CHANNELS or oh * ow <= IM2COL_MAX_POSITIONS


def _patches(x_NHWC, kernel_hw, stride: int, padding: int):
    """(N·OH·OW, kH·kW·C): each output position's receptive field, ordered (kernel row, kernel column, channel)."""
    (kh, kw), (n, h, w, c) = kernel_hw, x_NHWC.shape
    oh, ow = _conv_output_size(h, kh, stride, padding), _conv_output_size(w, kw, stride, padding)
    x = jnp.pad(x_NHWC, ((0, 0), (padding, padding), (padding, padding), (0, 0)))
    cols = [lax.slice(x, (0, i, j, 0), (n, i + stride * (oh - 1) + 1, j + stride * (ow - 1) + 1, c), (1, stride, stride, 1))
            for i in range(kh) for j in range(kw)]
    return jnp.concatenate(cols, axis=-1).reshape(n * oh * ow, kh * kw * c), (n, oh, ow)


def _im2col_conv2d(x_NHWC, weight_OIHW, stride, padding):
    patches, (n, oh, ow) = _patches(x_NHWC, weight_OIHW.shape[2:], stride, padding)
    kernel = jnp.transpose(weight_OIHW, (2, 3, 1, 0)).reshape(-1, weight_OIHW.shape[0])  # (kH·kW·C, out)
    return (patches @ kernel).reshape(n, oh, ow, weight_OIHW.shape[0])


def _im2col_weight_gradient(x_NHWC, dy_NHWC, weight_OIHW, stride, padding):
    patches, _ = _patches(x_NHWC, weight_OIHW.shape[2:], stride, padding)
    grad = patches.T @ dy_NHWC.reshape(-1, weight_OIHW.shape[0])  # (kH·kW·C, out)
    o, i, kh, kw = weight_OIHW.shape
    return jnp.transpose(grad.reshape(kh, kw, i, o), (3, 2, 0, 1))


def _space_to_depth_fits(x_NHWC, weight_OIHW, stride: int, padding: int) -> bool:
    """Whether the strided convolution has a space-to-depth form: the stride divides the kernel and the padded
    input (a 4×4 stride-2 padding-1 convolution of an even-sized image)."""
    kh, kw = weight_OIHW.shape[2:]
    h, w = x_NHWC.shape[1] + 2 * padding, x_NHWC.shape[2] + 2 * padding
    return stride > 1 and kh % stride == 0 and kw % stride == 0 and h % stride == 0 and w % stride == 0


def _space_to_depth(x_NHWC, s: int):
    """(N, H, W, C) → (N, H/s, W/s, s·s·C): each s×s block of positions moved into the channels, ordered (row in the
    block, column in the block, channel)."""
    n, h, w, c = x_NHWC.shape
    x = x_NHWC.reshape(n, h // s, s, w // s, s, c).transpose(0, 1, 3, 2, 4, 5)
    return x.reshape(n, h // s, w // s, s * s * c)


def _space_to_depth_kernel(weight_OIHW, s: int):
    """PyTorch's (out, in, k, k) kernel as the HWIO kernel of the space-to-depth form: (k/s, k/s, s·s·in, out), its
    input channels ordered as :func:`_space_to_depth` orders them (tap (s·a + p, s·b + q) at block (a, b), (p, q))."""
    o, i, kh, kw = weight_OIHW.shape
    w = weight_OIHW.reshape(o, i, kh // s, s, kw // s, s).transpose(2, 4, 3, 5, 1, 0)
    return w.reshape(kh // s, kw // s, s * s * i, o)


def _space_to_depth_conv2d(x_NHWC, weight_OIHW, stride, padding):
    """The strided convolution as a stride-1 one: ``y[i, j] = Σ x_pad[s·i + u, s·j + v] · w[u, v]`` with
    ``u = s·a + p`` reads ``x_pad``'s block (i + a, j + b) at offset (p, q): a 1-strided (k/s)×(k/s) convolution of the
    space-to-depth input. The same products, summed in another order. Its derivatives, which JAX takes, are stride-1
    convolutions: no input dilation (XLA:CPU's slow path) and no strided kernel gradient."""
    x = jnp.pad(x_NHWC, ((0, 0), (padding, padding), (padding, padding), (0, 0)))
    return lax.conv_general_dilated(_space_to_depth(x, stride), _space_to_depth_kernel(weight_OIHW, stride),
                                    window_strides=(1, 1), padding="VALID", dimension_numbers=_NHWC_HWIO)


def _use_space_to_depth(x_NHWC, weight_OIHW, stride: int, padding: int) -> bool:
    return strided_conv_form() == "space_to_depth" and _space_to_depth_fits(x_NHWC, weight_OIHW, stride, padding)


def _one_chunk_conv2d(x_NHWC, weight_OIHW, stride: int, padding: int):
    """The convolution of one chunk in the form chosen for it: space-to-depth where asked and it fits, else direct."""
    return _space_to_depth_conv2d if _use_space_to_depth(x_NHWC, weight_OIHW, stride, padding) else _whole_batch_conv2d


def _whole_batch_conv2d(x_NHWC, weight_OIHW, stride, padding):
    return lax.conv_general_dilated(
        x_NHWC,
        _torch_conv_weight_to_hwio(weight_OIHW),
        window_strides=(stride, stride),
        padding=((padding, padding), (padding, padding)),
        dimension_numbers=_NHWC_HWIO,
    )


def _lax_conv2d(x_NHWC, weight_OIHW, stride, padding):
    if _use_im2col(x_NHWC, weight_OIHW, stride, padding):
        return _im2col_conv2d(x_NHWC, weight_OIHW, stride, padding)
    out_h = _conv_output_size(x_NHWC.shape[1], weight_OIHW.shape[2], stride, padding)
    out_w = _conv_output_size(x_NHWC.shape[2], weight_OIHW.shape[3], stride, padding)
    conv = _one_chunk_conv2d(x_NHWC, weight_OIHW, stride, padding)
    return _map_batch(
        lambda x: conv(x, weight_OIHW, stride, padding),
        x_NHWC,
        out_h * out_w * weight_OIHW.shape[0] * x_NHWC.dtype.itemsize,
    )


def _conv2d_weight_gradient(x_NHWC, dy_NHWC, weight_OIHW, stride, padding):
    """The kernel gradient of ``conv2d(x, ·)`` at output cotangent ``dy``: an ordinary weight-gradient convolution
    (or patchesᵀ · dy where the forward is a GEMM)."""
    if _use_im2col(x_NHWC, weight_OIHW, stride, padding):
        return _im2col_weight_gradient(x_NHWC, dy_NHWC, weight_OIHW, stride, padding)

    conv = _one_chunk_conv2d(x_NHWC, weight_OIHW, stride, padding)

    def gradient(x, dy):  # one chunk: the split is decided here, not again inside
        _, kernel_vjp = jax.vjp(lambda w: conv(x, w, stride, padding), weight_OIHW)
        return kernel_vjp(dy)[0]

    chunks = _batch_chunks(x_NHWC.shape[0], _per_sample_bytes(x_NHWC, dy_NHWC), CPU_CONV_GRADIENT_CHUNK_BYTES)
    if chunks == 1:
        return gradient(x_NHWC, dy_NHWC)
    parts = [gradient(x, dy) for x, dy in zip(jnp.split(x_NHWC, chunks), jnp.split(dy_NHWC, chunks))]
    return functools.reduce(jnp.add, parts)


def transposed_output_size(size: int, kernel: int, stride: int, padding: int, output_padding: int = 0) -> int:
    """PyTorch's ConvTranspose2d output size: ``(size - 1) * stride - 2 * padding + kernel + output_padding``."""
    return (size - 1) * stride - 2 * padding + kernel + output_padding


def _dilated_conv_transpose(x_NHWC, weight_IOHW, stride, padding, out_hw):
    # ConvTranspose2d is the input-gradient of Conv2d(out → in) with the same weight: a
    # stride-1 convolution of the input dilated by `stride`, padded by k-1-p (not p: PyTorch's p
    # removes rows from the *output*), with the kernel flipped and in/out swapped.
    kernel_h, kernel_w = weight_IOHW.shape[2:]
    extra_h = out_hw[0] - transposed_output_size(x_NHWC.shape[1], kernel_h, stride, padding)
    extra_w = out_hw[1] - transposed_output_size(x_NHWC.shape[2], kernel_w, stride, padding)
    kernel_HWIO = jnp.transpose(weight_IOHW[:, :, ::-1, ::-1], (2, 3, 0, 1))
    return lax.conv_general_dilated(
        x_NHWC,
        kernel_HWIO,
        window_strides=(1, 1),
        padding=(
            (kernel_h - 1 - padding, kernel_h - 1 - padding + extra_h),
            (kernel_w - 1 - padding, kernel_w - 1 - padding + extra_w),
        ),
        lhs_dilation=(stride, stride),
        dimension_numbers=_NHWC_HWIO,
    )


def _subpixel_plan(kernel: int, stride: int, padding: int):
    """How output phase ``r`` (rows ``stride·m + r``) of a transposed convolution reads the input.

    Output row ``i = s·m + r`` receives ``x[u]·w[a]`` for every ``a = i + p − s·u`` in ``[0, k)``:
    the taps ``a = a0_r + s·j`` (``a0_r = (r + p) mod s``) meet ``x[m + q_r − j]``
    (``q_r = (r + p) div s``). So each phase is a stride-1 correlation of the input with a
    ``ceil(k/s)``-tap sub-kernel, and all phases share one padded input, shifted by
    ``q_r − min q``. Returns (taps, kernel index per (phase, tap), shift per phase, low padding).
    """
    taps = -(-kernel // stride)
    q = [(r + padding) // stride for r in range(stride)]
    first_tap = [(r + padding) % stride for r in range(stride)]
    index = np.array([[first_tap[r] + stride * (taps - 1 - d) for d in range(taps)] for r in range(stride)])
    shift = [q[r] - min(q) for r in range(stride)]
    return taps, index, shift, taps - 1 - min(q)


def _padding_kept_apart(x_padded):
    """``x_padded`` as a value XLA may not fold into the convolution that reads it, in float64.

    XLA:CPU folds a ``pad`` into the padding of the convolution after it; a float64 2×2 convolution padded by
    one then runs 30–50× slower than the same convolution on the padded input (jaxlib 0.10.2, 4 × 8×8×256 → 512:
    about 450 ms against 11 ms; float32 runs both at 4 ms). An optimization barrier keeps the padded input a
    value of its own. float32 is left as it was (the copy costs it up to 2 ms at these shapes).
    """
    return lax.optimization_barrier(x_padded) if x_padded.dtype == jnp.float64 else x_padded


def _subpixel_conv_transpose(x_NHWC, weight_IOHW, stride, padding, out_hw):
    """The transposed convolution without input dilation (the "sub-pixel" form).

    The ``s²`` output phases are computed by ONE stride-1 VALID convolution of the padded input
    with ``s²·out`` output channels (the sub-kernels stacked), then interleaved. The sub-kernels
    are picked out of the kernel by indexing (no reverse op, which would keep XLA's convolution
    libraries away). For the DCGAN's 4×4 stride-2 padding-1 layers that is a 2×2 convolution;
    the phases cover a grid one row and column larger than needed (13% extra FLOPs at 16×16).
    """
    n, h, w, c_in = x_NHWC.shape
    _, c_out, kernel, _ = weight_IOHW.shape
    taps, index, shift, pad_low = _subpixel_plan(kernel, stride, padding)
    padded_kernel = taps * stride  # taps that fall beyond the kernel read zeros
    weight = jnp.pad(weight_IOHW, ((0, 0), (0, 0), (0, padded_kernel - kernel), (0, padded_kernel - kernel)))
    sub_kernels = weight[:, :, index[:, None, :, None], index[None, :, None, :]]  # (in, out, r, c, dh, dw)
    kernel_HWIO = jnp.transpose(sub_kernels, (4, 5, 0, 2, 3, 1)).reshape(taps, taps, c_in, stride * stride * c_out)
    rows, cols = -(-out_hw[0] // stride), -(-out_hw[1] // stride)  # outputs per phase
    pad_high_h = max(shift) + rows + taps - 1 - h - pad_low
    pad_high_w = max(shift) + cols + taps - 1 - w - pad_low
    x_padded = lax.pad(
        x_NHWC, jnp.zeros((), x_NHWC.dtype), ((0, 0, 0), (pad_low, pad_high_h, 0), (pad_low, pad_high_w, 0), (0, 0, 0))
    )
    # Not split along the batch (see CPU_CONV_CHUNK_BYTES): for this stride-1 convolution a split
    # measured slower (compare the `sampling` row of `functional-gan bench --quick` with a split here).
    z = lax.conv_general_dilated(_padding_kept_apart(x_padded), kernel_HWIO, (1, 1), "VALID", dimension_numbers=_NHWC_HWIO)
    z = z.reshape(n, z.shape[1], z.shape[2], stride, stride, c_out)
    phases = jnp.stack(
        [
            jnp.stack([z[:, shift[r] : shift[r] + rows, shift[c] : shift[c] + cols, r, c] for c in range(stride)], axis=3)
            for r in range(stride)
        ],
        axis=2,
    )  # (n, rows, r, cols, c, out): row s·m + r, column s·q + c
    y = phases.reshape(n, rows * stride, cols * stride, c_out)
    return y[:, : out_hw[0], : out_hw[1]]


def _conv_transpose_forward(x_NHWC, weight_IOHW, stride, padding, out_hw):
    if stride == 1 or transposed_conv_form() == "dilated":  # stride 1 has no dilation to remove
        return _dilated_conv_transpose(x_NHWC, weight_IOHW, stride, padding, out_hw)
    return _subpixel_conv_transpose(x_NHWC, weight_IOHW, stride, padding, out_hw)


def conv2d(x_NHWC: jax.Array, weight_OIHW: jax.Array, stride: int, padding: int) -> jax.Array:
    """``torch.nn.functional.conv2d`` without bias, on NHWC activations.

    On the CPU in float32 with the ``onednn`` extra installed, oneDNN's convolution through JAX's FFI
    (:mod:`functional_gan.onednn`, ``$FUNCTIONAL_GAN_CONV`` chooses); everywhere else XLA's (:func:`xla_conv2d`).

    Args:
      x_NHWC: input, channels last.
      weight_OIHW: kernel in PyTorch's layout ``(out_channels, in_channels, kH, kW)``.
      stride: the same stride along both spatial axes.
      padding: PyTorch's ``padding``: ``p`` zeros on every side.

    Returns:
      The output, NHWC.
    """
    out_hw = tuple(_conv_output_size(x_NHWC.shape[i], weight_OIHW.shape[i + 1], stride, padding) for i in (1, 2))
    if onednn.use_for_convolution(x_NHWC, weight_OIHW, x_NHWC.shape[1:3], out_hw, stride, padding):
        return onednn.conv2d(x_NHWC, weight_OIHW, stride, padding)
    return xla_conv2d(x_NHWC, weight_OIHW, stride, padding)


@partial(jax.custom_vjp, nondiff_argnums=(2, 3))
def xla_conv2d(x_NHWC: jax.Array, weight_OIHW: jax.Array, stride: int, padding: int) -> jax.Array:
    """``torch.nn.functional.conv2d`` without bias, on NHWC activations, in XLA's own convolutions.

    The gradient is written by hand (a custom VJP) so that no convolution with input dilation
    is left in the backward pass on CPU: the input cotangent is the transposed convolution of
    ``dy`` (:func:`conv_transpose2d`, in its sub-pixel form on CPU), the kernel cotangent is the
    ordinary weight-gradient convolution. JAX's own derivative (``conv2d_reference``) computes
    the input cotangent as a convolution of ``dy`` dilated by the stride, which XLA:CPU runs on
    a slow generic path. Both are tested equal to PyTorch, and differentiable again. Arguments and result as
    :func:`conv2d`'s.
    """
    return _lax_conv2d(x_NHWC, weight_OIHW, stride, padding)


def _conv2d_fwd(x_NHWC, weight_OIHW, stride, padding):
    return _lax_conv2d(x_NHWC, weight_OIHW, stride, padding), (x_NHWC, weight_OIHW)


def _conv2d_bwd(stride, padding, residuals, dy_NHWC):
    x_NHWC, weight_OIHW = residuals
    if _use_space_to_depth(x_NHWC, weight_OIHW, stride, padding):  # a stride-1 transposed convolution, chunked
        dx_NHWC = _space_to_depth_input_gradient(x_NHWC, weight_OIHW, dy_NHWC, stride, padding)
    else:
        # Conv2d's (out, in, kH, kW) weight read as a ConvTranspose2d weight (in'=out, out'=in) maps
        # the output channels back to the input channels: the input gradient is that transposed conv.
        dx_NHWC = _conv_transpose2d(dy_NHWC, weight_OIHW, stride, padding, x_NHWC.shape[1:3])
    return dx_NHWC, _conv2d_weight_gradient(x_NHWC, dy_NHWC, weight_OIHW, stride, padding)


def _space_to_depth_input_gradient(x_NHWC, weight_OIHW, dy_NHWC, stride, padding):
    """The input gradient of the space-to-depth form, chunk by chunk along the batch: JAX's transpose of a stride-1
    convolution (a stride-1 transposed convolution), moved back from depth to space and the padding cropped."""
    def gradient(dy):  # the convolution is linear in its input: its transpose is the input gradient
        shape = jax.ShapeDtypeStruct((dy.shape[0], *x_NHWC.shape[1:]), x_NHWC.dtype)
        transposed = jax.linear_transpose(lambda x: _space_to_depth_conv2d(x, weight_OIHW, stride, padding), shape)
        return transposed(dy)[0]

    return _map_batch(gradient, dy_NHWC, _per_sample_bytes(x_NHWC))


xla_conv2d.defvjp(_conv2d_fwd, _conv2d_bwd)


def conv2d_reference(x_NHWC, weight_OIHW, stride, padding):
    """The same convolution without the custom VJP: JAX differentiates ``lax.conv_general_dilated`` itself.

    Kept for tests and for the benchmark that shows why the custom VJP exists.
    """
    return _lax_conv2d(x_NHWC, weight_OIHW, stride, padding)


@partial(jax.custom_vjp, nondiff_argnums=(2, 3, 4))
def _conv_transpose2d(x_NHWC, weight_IOHW, stride, padding, out_hw):
    return _conv_transpose_forward(x_NHWC, weight_IOHW, stride, padding, out_hw)


def _conv_transpose2d_fwd(x_NHWC, weight_IOHW, stride, padding, out_hw):
    return _conv_transpose_forward(x_NHWC, weight_IOHW, stride, padding, out_hw), (x_NHWC, weight_IOHW)


def _conv_transpose2d_bwd(stride, padding, out_hw, residuals, dy_NHWC):
    x_NHWC, weight_IOHW = residuals
    # Writing F(z) = conv2d(z, weight, stride, padding) for the forward convolution whose
    # input-gradient this layer is (y = Fᵀx): the input cotangent is F(dy), a plain strided
    # convolution, and the kernel cotangent is F's kernel gradient at input dy with output
    # cotangent x (since <dy, F_w^T x> = <F_w dy, x>). Both are regular-convolution primitives.
    dx_NHWC = xla_conv2d(dy_NHWC, weight_IOHW, stride, padding)
    return dx_NHWC, _conv2d_weight_gradient(dy_NHWC, x_NHWC, weight_IOHW, stride, padding)


_conv_transpose2d.defvjp(_conv_transpose2d_fwd, _conv_transpose2d_bwd)


def conv_transpose2d(
    x_NHWC: jax.Array, weight_IOHW: jax.Array, stride: int, padding: int, output_padding: int = 0
) -> jax.Array:
    """``torch.nn.functional.conv_transpose2d`` without bias, on NHWC activations.

    Output size: ``(H - 1) * stride - 2 * padding + kH + output_padding``, as in PyTorch.

    The forward takes the sub-pixel form on CPU (one stride-1 convolution, no input dilation;
    see :func:`transposed_conv_form`) and the dilated form elsewhere. The gradient is written by
    hand (a custom VJP): the input cotangent is the strided convolution ``conv2d(dy, weight)``
    and the kernel cotangent is an ordinary weight-gradient convolution. JAX's own kernel
    gradient of the dilated form (``conv_transpose2d_reference``) takes a slow path on XLA:CPU:
    measured in ``benchmarks/`` (layer timings). The results are mathematically identical (tests
    compare all forms with PyTorch, first and second derivatives).

    Args:
      x_NHWC: input, channels last.
      weight_IOHW: kernel in PyTorch's ConvTranspose2d layout ``(in_channels, out_channels, kH, kW)``.
      stride: the same stride along both spatial axes.
      padding: PyTorch's ``padding`` (it removes ``padding`` rows and columns from each side of the output).
      output_padding: PyTorch's ``output_padding`` (extra rows and columns at the end of the output).
    """
    kernel_h, kernel_w = weight_IOHW.shape[2:]
    out_hw = (
        transposed_output_size(x_NHWC.shape[1], kernel_h, stride, padding, output_padding),
        transposed_output_size(x_NHWC.shape[2], kernel_w, stride, padding, output_padding),
    )
    # the convolution whose input gradient this layer is: from out_hw to x's size, its kernel this layer's
    if onednn.use_for_convolution(x_NHWC, weight_IOHW, out_hw, x_NHWC.shape[1:3], stride, padding):
        return onednn.conv_transpose2d(x_NHWC, weight_IOHW, stride, padding, out_hw)
    return _conv_transpose2d(x_NHWC, weight_IOHW, stride, padding, out_hw)


def conv_transpose2d_reference(x_NHWC, weight_IOHW, stride, padding, form: str = "dilated"):
    """The same layer without any custom VJP: JAX differentiates the chosen forward form itself.

    ``form="dilated"`` is the textbook dilated convolution (JAX's kernel gradient of it is XLA:CPU's
    slow path); ``form="subpixel"`` is the forward :func:`conv_transpose2d` uses on CPU. Kept for
    tests and for the benchmark's per-layer timings.
    """
    kernel_h, kernel_w = weight_IOHW.shape[2:]
    out_hw = (
        transposed_output_size(x_NHWC.shape[1], kernel_h, stride, padding),
        transposed_output_size(x_NHWC.shape[2], kernel_w, stride, padding),
    )
    forward = {"dilated": _dilated_conv_transpose, "subpixel": _subpixel_conv_transpose}[form]
    return forward(x_NHWC, weight_IOHW, stride, padding, out_hw)


def normal_init(mean: float, stddev: float):
    """``nn.init.normal_(w, mean, std)`` as a Flax initializer (the tutorial's ``weights_init``)."""

    def init(key, shape, dtype=jnp.float32):
        return mean + stddev * jax.random.normal(key, shape, dtype)

    return init


def uniform_init(bound: float):
    """U(−bound, bound): PyTorch's default initialisation of a convolution's bias, bound = 1/√fan_in."""

    def init(key, shape, dtype=jnp.float32):
        return jax.random.uniform(key, shape, dtype, -bound, bound)

    return init


class _BiasFreeConvolution(nn.Module):
    """A convolution module with a parameter ``weight``, initialised N(0, 0.02) (the tutorial's
    ``weights_init`` for every module named "Conv"), bias-free as in the DCGAN unless ``bias=True``.

    With ``bias=True`` (the WGAN-GP critic, which has no BatchNorm to absorb a bias) it adds the
    parameter ``bias`` (out,), initialised as PyTorch does, U(±1/√fan_in) (``weights_init`` leaves it).
    """

    in_channels: int
    out_channels: int
    kernel_size: int
    stride: int
    padding: int
    bias: bool = False

    def weight_shape(self) -> tuple[int, int, int, int]:
        raise NotImplementedError

    def convolve(self, x_NHWC, weight):
        raise NotImplementedError

    @nn.compact
    def __call__(self, x_NHWC):
        weight = self.param("weight", normal_init(0.0, 0.02), self.weight_shape(), x_NHWC.dtype)
        y = self.convolve(x_NHWC, weight)
        if self.bias:
            fan_in = self.weight_shape()[1] * self.kernel_size ** 2  # PyTorch: weight.size(1) · kH · kW
            y = y + self.param("bias", uniform_init(1 / math.sqrt(fan_in)), (self.out_channels,), x_NHWC.dtype)
        return y


class Conv2d(_BiasFreeConvolution):
    """``nn.Conv2d(in, out, kernel_size, stride, padding, bias=False)``; parameter ``weight`` (out, in, kH, kW).

    ``Conv2d(..., bias=True)`` is ``nn.Conv2d(...)`` with its default bias."""

    def weight_shape(self):
        return (self.out_channels, self.in_channels, self.kernel_size, self.kernel_size)

    def convolve(self, x_NHWC, weight):
        return conv2d(x_NHWC, weight, self.stride, self.padding)


class ConvTranspose2d(_BiasFreeConvolution):
    """``nn.ConvTranspose2d(in, out, kernel_size, stride, padding, bias=False)``; ``weight`` (in, out, kH, kW)."""

    def weight_shape(self):
        return (self.in_channels, self.out_channels, self.kernel_size, self.kernel_size)

    def convolve(self, x_NHWC, weight):
        return conv_transpose2d(x_NHWC, weight, self.stride, self.padding)


def running_variance(biased_var, n: int):
    """What enters ``running_var``: PyTorch tracks it with the *unbiased* batch variance (× n/(n−1))."""
    return biased_var * (n / max(n - 1, 1))


# Which form training-mode BatchNorm takes: "products" (sums over N·H·W as matrix products, the backward in closed
# form: batch_norm_train) or "reductions" (jnp.mean, differentiated by JAX). Measured on a 2-core CPU, batch 64, in one
# run each (benchmarks/results/batchnorm-round4-*): with jaxlib 0.10.2's workaround in effect (XLA's reductions kept
# out of YNNPACK's fusions) the products are 3-8× faster per BatchNorm + activation and the DCGAN step 7% faster;
# with jax 0.12 (no workaround) 0.5-0.85× PyTorch's time against 0.5-0.96×, the step 2% faster; jaxlib 0.10.2 without
# the workaround, the same. So "products" on CPUs; GPUs and TPUs keep "reductions" (not measured there). Both are
# tested equal to each other and to PyTorch. Override with the variable.
BATCHNORM_FORM_ENV = "FUNCTIONAL_GAN_BATCHNORM"
BATCHNORM_FORMS = ("products", "reductions")


def batchnorm_form() -> str:
    """``"products"`` on CPU, ``"reductions"`` elsewhere, unless ``$FUNCTIONAL_GAN_BATCHNORM`` says otherwise."""
    return _form(BATCHNORM_FORM_ENV, BATCHNORM_FORMS)


def batch_norm(x_NHWC, weight, bias, eps: float):
    """Training-mode BatchNorm, ``(y, mean, biased variance)``, in the form :func:`batchnorm_form` says (read when
    traced)."""
    if batchnorm_form() == "products":
        return batch_norm_train(x_NHWC, weight, bias, eps)
    mean = jnp.mean(x_NHWC, axis=(0, 1, 2))
    # Two-pass variance (not E[x²]−E[x]²) for PyTorch-level accuracy; biased, as PyTorch normalises with it.
    var = jnp.mean(jnp.square(x_NHWC - mean), axis=(0, 1, 2))
    return (x_NHWC - mean) * (lax.rsqrt(var + eps) * weight) + bias, mean, var


def _split(m: int) -> int:
    """The divisor of ``m`` nearest √m from below (1 for a prime)."""
    for b in range(math.isqrt(m), 0, -1):
        if m % b == 0:
            return b
    return 1


def _channel_sums(a_MC):
    """Σ over the rows of ``a_MC`` (M, C) as matrix products: XLA:CPU runs a (1, M) @ (M, C) product as a blocked,
    vectorised sum where its reduce emitter is 2-6× slower under jaxlib 0.10.2's workaround (which takes reductions
    out of YNNPACK's fusions). A product accumulates along M in turn, its float32 error growing with M (17× PyTorch's
    cascade at M = 65,536, measured); so two levels: M = B·K rows summed as K partial sums of B rows (one product
    over the contiguous (B, K·C) view), then the K partial sums (another), the error growing with B + K ≈ 2√M."""
    m, c = a_MC.shape
    b = _split(m)
    if b < 8:  # small or prime: one level
        return jnp.dot(jnp.ones((1, m), a_MC.dtype), a_MC, precision=lax.Precision.HIGHEST)[0]
    partial = jnp.dot(jnp.ones((1, b), a_MC.dtype), a_MC.reshape(b, (m // b) * c), precision=lax.Precision.HIGHEST)
    return jnp.dot(jnp.ones((1, m // b), a_MC.dtype), partial.reshape(m // b, c), precision=lax.Precision.HIGHEST)[0]


@partial(jax.custom_vjp, nondiff_argnums=(3,))
def batch_norm_train(x_NHWC, weight, bias, eps: float):
    """Training-mode BatchNorm as PyTorch computes it: ``(y, mean, biased variance)`` of the batch, ``y`` normalised
    with them. Its sums over N·H·W are matrix products (:func:`_channel_sums`), its backward the closed form

    ``dx = weight·inv_std/M · (M·dy − Σdy − x̂·Σ(dy·x̂))`` (M = N·H·W, x̂ the normalised input),

    with ``dweight = Σ(dy·x̂)``, ``dbias = Σdy`` (and the cotangents of the returned statistics, zero where they only
    feed the running averages under ``stop_gradient``)."""
    return _batch_norm_forward(x_NHWC, weight, bias, eps)[0]


def _batch_norm_forward(x_NHWC, weight, bias, eps):
    shape = x_NHWC.shape
    m = shape[0] * shape[1] * shape[2]
    x = x_NHWC.reshape(m, shape[3])
    mean = _channel_sums(x) / m
    centered = x - mean
    var = _channel_sums(jnp.square(centered)) / m  # two-pass, biased: what PyTorch normalises with
    inv_std = lax.rsqrt(var + eps)
    y = centered * (inv_std * weight) + bias
    return (y.reshape(shape), mean, var), (centered, inv_std, weight)


def _batch_norm_bwd(eps, residuals, cotangents):
    centered, inv_std, weight = residuals
    dy_NHWC, d_mean, d_var = cotangents
    shape = dy_NHWC.shape
    m, c = centered.shape
    dy = dy_NHWC.reshape(m, c)
    normalised = centered * inv_std
    sums = _channel_sums(jnp.concatenate([dy, dy * normalised], axis=1))  # one product for both sums
    sum_dy, sum_dy_normalised = sums[:c], sums[c:]
    dx = (weight * inv_std / m) * (m * dy - sum_dy - normalised * sum_dy_normalised)
    dx = dx + (d_mean + 2 * d_var * centered) / m  # the statistics' own cotangents (Σ centered = 0)
    return dx.reshape(shape), sum_dy_normalised, sum_dy


batch_norm_train.defvjp(_batch_norm_forward, _batch_norm_bwd)


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
            return (x_NHWC - mean) * (lax.rsqrt(var + self.eps) * weight) + bias
        y, mean, var = batch_norm(x_NHWC, weight, bias, self.eps)  # two-pass, biased, as PyTorch normalises
        if self.is_mutable_collection("batch_stats") and not self.is_initializing():
            n = x_NHWC.shape[0] * x_NHWC.shape[1] * x_NHWC.shape[2]
            unbiased_var = running_variance(var, n)
            m = self.momentum
            running_mean.value = (1 - m) * running_mean.value + m * lax.stop_gradient(mean)
            running_var.value = (1 - m) * running_var.value + m * lax.stop_gradient(unbiased_var)
            num_batches_tracked.value = num_batches_tracked.value + 1
        return y


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
