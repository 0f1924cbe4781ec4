"""Each layer against PyTorch: forward values and gradients, float64 (exact) and float32.

Tolerances: float64 1e-12 (both frameworks compute the same sums; only summation order differs,
measured ≤ 1e-14); float32 relative 1e-5 (rounding of ~1e3-term sums).
"""

import jax
import jax.numpy as jnp
import numpy as np
import pytest
import torch

from functional_gan import layers
from functional_gan.layers import (
    BatchNorm2d,
    bce_loss,
    conv2d,
    conv2d_reference,
    conv_transpose2d,
    conv_transpose2d_reference,
)
from tests.helpers import nchw_to_nhwc, nhwc_to_nchw

pytestmark = pytest.mark.usefixtures("strict_dtype_promotion")

CONV_CASES = [  # (in, out, kernel, stride, padding, input size): the tutorial's layer kinds
    (5, 3, 4, 1, 0, 1),  # G's first layer: 1×1 → 4×4, or D's last 4×4 → 1×1
    (4, 6, 4, 2, 1, 5),  # the stride-2 blocks
    (3, 2, 3, 2, 0, 6),  # odd kernel, no padding
]


def _torch_grads(fn, x, w, cotangent):
    tx = torch.tensor(x, requires_grad=True)
    tw = torch.tensor(w, requires_grad=True)
    ty = fn(tx, tw)
    ty.backward(torch.tensor(cotangent))
    return ty.detach().numpy(), tx.grad.numpy(), tw.grad.numpy()


def _jax_grads(fn, x_NHWC, w, cotangent_NHWC):
    y, vjp = jax.vjp(fn, jnp.asarray(x_NHWC), jnp.asarray(w))
    dx, dw = vjp(jnp.asarray(cotangent_NHWC))
    return np.asarray(y), np.asarray(dx), np.asarray(dw)


@pytest.mark.parametrize("dtype,rtol,atol", [(np.float64, 1e-12, 1e-12), (np.float32, 1e-5, 1e-5)])
@pytest.mark.parametrize("case", CONV_CASES)
@pytest.mark.parametrize(
    "transposed_impl",
    [
        conv_transpose2d,
        lambda x, w, s, p: conv_transpose2d_reference(x, w, s, p, form="dilated"),
        lambda x, w, s, p: conv_transpose2d_reference(x, w, s, p, form="subpixel"),
    ],
    ids=["custom-vjp", "dilated-autodiff", "subpixel-autodiff"],
)
def test_conv_transpose2d_matches_torch(case, dtype, rtol, atol, transposed_impl):
    cin, cout, k, s, p, size = case
    rng = np.random.default_rng(0)
    x = rng.normal(size=(2, cin, size, size)).astype(dtype)
    w = rng.normal(size=(cin, cout, k, k)).astype(dtype)  # PyTorch's ConvTranspose2d layout
    expected_shape = (2, cout, (size - 1) * s - 2 * p + k, (size - 1) * s - 2 * p + k)
    cotangent = rng.normal(size=expected_shape).astype(dtype)
    with jax.enable_x64(dtype == np.float64):
        y, dx, dw = _jax_grads(lambda a, b: transposed_impl(a, b, s, p), nchw_to_nhwc(x), w, nchw_to_nhwc(cotangent))
    ty, tdx, tdw = _torch_grads(lambda a, b: torch.nn.functional.conv_transpose2d(a, b, stride=s, padding=p), x, w, cotangent)
    assert y.dtype == dtype and ty.shape == expected_shape
    np.testing.assert_allclose(nhwc_to_nchw(y), ty, rtol=rtol, atol=atol)
    np.testing.assert_allclose(nhwc_to_nchw(dx), tdx, rtol=rtol, atol=atol)
    np.testing.assert_allclose(dw, tdw, rtol=rtol, atol=atol)


@pytest.mark.parametrize("dtype,rtol,atol", [(np.float64, 1e-12, 1e-12), (np.float32, 1e-5, 1e-5)])
@pytest.mark.parametrize("case", CONV_CASES)
@pytest.mark.parametrize("conv_impl", [conv2d, conv2d_reference], ids=["custom-vjp", "autodiff"])
def test_conv2d_matches_torch(case, dtype, rtol, atol, conv_impl):
    cin, cout, k, s, p, size = case
    size = size + 6  # a regular conv needs room to shrink
    rng = np.random.default_rng(1)
    x = rng.normal(size=(2, cin, size, size)).astype(dtype)
    w = rng.normal(size=(cout, cin, k, k)).astype(dtype)  # PyTorch's Conv2d layout
    out = (size + 2 * p - k) // s + 1
    cotangent = rng.normal(size=(2, cout, out, out)).astype(dtype)
    with jax.enable_x64(dtype == np.float64):
        y, dx, dw = _jax_grads(lambda a, b: conv_impl(a, b, s, p), nchw_to_nhwc(x), w, nchw_to_nhwc(cotangent))
    ty, tdx, tdw = _torch_grads(lambda a, b: torch.nn.functional.conv2d(a, b, stride=s, padding=p), x, w, cotangent)
    np.testing.assert_allclose(nhwc_to_nchw(y), ty, rtol=rtol, atol=atol)
    np.testing.assert_allclose(nhwc_to_nchw(dx), tdx, rtol=rtol, atol=atol)
    np.testing.assert_allclose(dw, tdw, rtol=rtol, atol=atol)


def _float64_conv_case(case, seed: int, batch: int):
    """NCHW float64 input, OIHW kernel and output cotangent for a conv case (in, out, kernel, stride, padding, size)."""
    cin, cout, k, s, p, size = case
    rng = np.random.default_rng(seed)
    out = (size + 2 * p - k) // s + 1
    return (rng.normal(size=(batch, cin, size, size)), rng.normal(size=(cout, cin, k, k)),
            rng.normal(size=(batch, cout, out, out)))


# Choices this project makes for XLA:CPU alone (im2col, batch chunks): other backends keep the plain convolution.
CPU_CHOICE = pytest.mark.skipif(jax.default_backend() != "cpu", reason="a choice made for XLA:CPU only; other backends "
                                "run the plain convolution, which the other tests of this file check")


@CPU_CHOICE
@pytest.mark.parametrize("case,gemm", [
    ((3, 8, 4, 2, 1, 16), True),  # D's first layer: 3 input channels
    ((16, 32, 4, 2, 1, 8), True),  # D's last strided layer: an 8×8 input, a 4×4 output
    ((8, 16, 4, 2, 1, 16), False),  # the middle layers keep the convolution
])
def test_strided_convolutions_chosen_as_one_gemm_match_torch_and_the_convolution(case, gemm, monkeypatch):
    """im2col (the input's strided slices stacked, one matrix product; the kernel gradient patchesᵀ · dy) where the
    shape asks for it: forward and both gradients equal PyTorch's and the convolution's to float64 rounding."""
    cin, cout, k, s, p, size = case
    x, w, cotangent = _float64_conv_case(case, seed=3, batch=4)
    monkeypatch.setattr(layers, "IM2COL", True)  # opt-in (see layers.IM2COL)
    with jax.enable_x64(True):
        assert layers._use_im2col(jnp.zeros((4, size, size, cin)), jnp.asarray(w), s, p) is gemm
        ours = _jax_grads(lambda a, b: conv2d(a, b, s, p), nchw_to_nhwc(x), w, nchw_to_nhwc(cotangent))
        monkeypatch.setattr(layers, "IM2COL", False)
        convolution = _jax_grads(lambda a, b: conv2d(a, b, s, p), nchw_to_nhwc(x), w, nchw_to_nhwc(cotangent))
    theirs = _torch_grads(lambda a, b: torch.nn.functional.conv2d(a, b, stride=s, padding=p), x, w, cotangent)
    for mine, conv, torch_value in zip(ours, convolution, theirs):
        np.testing.assert_allclose(mine, conv, rtol=1e-12, atol=1e-12)
    np.testing.assert_allclose(nhwc_to_nchw(ours[0]), theirs[0], rtol=1e-12, atol=1e-12)
    np.testing.assert_allclose(nhwc_to_nchw(ours[1]), theirs[1], rtol=1e-12, atol=1e-12)
    np.testing.assert_allclose(ours[2], theirs[2], rtol=1e-12, atol=1e-12)


def _float64_inputs(rng, x_shape, w_shape):
    """Random float64 activations (NHWC) and kernel as JAX arrays (call under jax.enable_x64)."""
    return jnp.asarray(rng.normal(size=x_shape)), jnp.asarray(rng.normal(size=w_shape))


@pytest.mark.parametrize("case", CONV_CASES + [(3, 2, 4, 2, 1, 8), (2, 3, 5, 3, 2, 4)])
def test_subpixel_forward_equals_the_dilated_form(case):
    """The sub-pixel transposed convolution (no input dilation) computes the dilated form's values."""
    cin, cout, k, s, p, size = case
    with jax.enable_x64(True):
        x, w = _float64_inputs(np.random.default_rng(4), (2, size, size, cin), (cin, cout, k, k))
        subpixel = conv_transpose2d_reference(x, w, s, p, form="subpixel")
        dilated = conv_transpose2d_reference(x, w, s, p, form="dilated")
    np.testing.assert_allclose(subpixel, dilated, rtol=1e-12, atol=1e-12)  # float64: summation order only


def _odd_size_conv_cases():
    # (H + 2p - k) not divisible by the stride: the input gradient needs PyTorch's output_padding.
    return [(3, 4, 4, 2, 1, 9), (2, 3, 3, 2, 0, 8)]


@pytest.mark.parametrize("case", CONV_CASES + _odd_size_conv_cases())
def test_second_derivatives_equal_jax_autodiff(case):
    """Reverse over reverse (what a gradient penalty needs) through both custom VJPs, float64."""
    cin, cout, k, s, p, size = case
    rng = np.random.default_rng(5)
    with jax.enable_x64(True):
        x_t, w_t = _float64_inputs(rng, (2, size, size, cin), (cin, cout, k, k))
        x_c, w_c = _float64_inputs(rng, (2, size + 6, size + 6, cin), (cout, cin, k, k))
        for ours, reference, x, w in (
            (conv_transpose2d, lambda a, b, s_, p_: conv_transpose2d_reference(a, b, s_, p_, form="dilated"), x_t, w_t),
            (conv2d, conv2d_reference, x_c, w_c),
        ):
            def penalty(impl):
                # ‖∂L/∂x‖², differentiated again with respect to both x and the kernel.
                loss = lambda a, b: jnp.sum(jnp.sin(impl(a, b, s, p)))  # noqa: E731
                return lambda a, b: jnp.sum(jax.grad(loss, argnums=0)(a, b) ** 2)

            got = jax.grad(penalty(ours), argnums=(0, 1))(x, w)
            expected = jax.grad(penalty(reference), argnums=(0, 1))(x, w)
            for a, b in zip(got, expected):
                np.testing.assert_allclose(a, b, rtol=1e-10, atol=1e-10)


@pytest.mark.parametrize("case", _odd_size_conv_cases())
def test_conv2d_gradient_with_uncovered_input_rows_matches_torch(case):
    cin, cout, k, s, p, size = case
    x, w, cotangent = _float64_conv_case(case, seed=6, batch=2)
    with jax.enable_x64(True):
        y, dx, dw = _jax_grads(lambda a, b: conv2d(a, b, s, p), nchw_to_nhwc(x), w, nchw_to_nhwc(cotangent))
    ty, tdx, tdw = _torch_grads(lambda a, b: torch.nn.functional.conv2d(a, b, stride=s, padding=p), x, w, cotangent)
    np.testing.assert_allclose(nhwc_to_nchw(dx), tdx, rtol=1e-12, atol=1e-12)
    np.testing.assert_allclose(dw, tdw, rtol=1e-12, atol=1e-12)


@CPU_CHOICE
def test_batch_chunking_on_cpu_gives_the_unchunked_values(monkeypatch):
    """Convolutions split along the batch (the CPU cache budget) equal the whole-batch ones."""
    monkeypatch.setattr(layers, "IM2COL", False)  # 4 input channels would otherwise be one GEMM, never split
    rng = np.random.default_rng(7)
    with jax.enable_x64(True):
        x = jnp.asarray(rng.normal(size=(8, 8, 8, 4)))
        w = jnp.asarray(rng.normal(size=(6, 4, 4, 4)))
        cot = jnp.asarray(rng.normal(size=(8, 4, 4, 6)))
        whole = jax.vjp(lambda a, b: conv2d(a, b, 2, 1), x, w)
        monkeypatch.setattr(layers, "CPU_CONV_CHUNK_BYTES", 1)  # every batch of 8 is split into 8 chunks
        monkeypatch.setattr(layers, "CPU_CONV_GRADIENT_CHUNK_BYTES", 1)  # and so are the kernel gradients'
        assert layers._batch_chunks(8, 100) == 8 and layers._batch_chunks(8, 100, layers.CPU_CONV_GRADIENT_CHUNK_BYTES) == 8
        chunked = jax.vjp(lambda a, b: conv2d(a, b, 2, 1), x, w)
        np.testing.assert_allclose(chunked[0], whole[0], rtol=0, atol=0)  # per-sample: exact
        for a, b in zip(chunked[1](cot), whole[1](cot)):
            np.testing.assert_allclose(a, b, rtol=1e-12, atol=1e-12)  # weight gradient: a sum in another order
        transposed_grads = jax.vjp(lambda a, b: conv_transpose2d(a, b, 2, 1), cot, w)[1](x)  # uses both split paths
    monkeypatch.setattr(layers, "CPU_CONV_CHUNK_BYTES", 2**40)  # no split
    monkeypatch.setattr(layers, "CPU_CONV_GRADIENT_CHUNK_BYTES", 2**40)
    with jax.enable_x64(True):
        for a, b in zip(transposed_grads, jax.vjp(lambda a, b: conv_transpose2d(a, b, 2, 1), cot, w)[1](x)):
            np.testing.assert_allclose(a, b, rtol=1e-12, atol=1e-12)


@pytest.mark.parametrize("case", [(2, 3, 8, 16, 1), (3, 8, 6, 8, 3), (2, 4, 4, 4, 1)])
def test_the_space_to_depth_form_matches_torch_in_float64(case, monkeypatch):
    """The strided convolution as a stride-1 convolution of its input's 2×2 blocks moved into the channels (the
    opt-in form FUNCTIONAL_GAN_STRIDED_CONV=space_to_depth): the output, both gradients and a second derivative
    equal PyTorch's conv2d (stride 2, padding 1, 4×4 kernel) and the direct form's, to float64 rounding."""
    batch, cin, cout, size, chunk_bytes = case
    monkeypatch.setenv(layers.STRIDED_CONV_FORM_ENV, "space_to_depth")
    monkeypatch.setattr(layers, "CPU_CONV_CHUNK_BYTES", chunk_bytes)  # split along the batch too where 1
    rng = np.random.default_rng(11)
    x, w = rng.normal(size=(batch, cin, size, size)), rng.normal(size=(cout, cin, 4, 4))
    x_t, w_t = torch.tensor(x, requires_grad=True), torch.tensor(w, requires_grad=True)
    y_t = torch.nn.functional.conv2d(x_t, w_t, stride=2, padding=1)
    g = rng.normal(size=tuple(y_t.shape))
    dx_t, dw_t = torch.autograd.grad(y_t, (x_t, w_t), torch.tensor(g))
    with jax.enable_x64(True):
        x_j, w_j, g_j = jnp.asarray(x.transpose(0, 2, 3, 1)), jnp.asarray(w), jnp.asarray(g.transpose(0, 2, 3, 1))
        assert layers._use_space_to_depth(x_j, w_j, 2, 1)
        y, pullback = jax.vjp(lambda a, b: conv2d(a, b, 2, 1), x_j, w_j)
        dx, dw = pullback(g_j)
        scale = max(1.0, float(np.abs(y_t.detach().numpy()).max()))
        np.testing.assert_allclose(np.asarray(y).transpose(0, 3, 1, 2), y_t.detach().numpy(), rtol=0, atol=1e-13 * scale)
        np.testing.assert_allclose(np.asarray(dx).transpose(0, 3, 1, 2), dx_t.numpy(), rtol=0, atol=1e-12)
        np.testing.assert_allclose(np.asarray(dw), dw_t.numpy(), rtol=0, atol=1e-12)
        second = jax.grad(lambda b: jnp.sum(jax.grad(lambda a: jnp.sum(conv2d(a, b, 2, 1) ** 2))(x_j) ** 2))(w_j)
        monkeypatch.setenv(layers.STRIDED_CONV_FORM_ENV, "direct")
        assert not layers._use_space_to_depth(x_j, w_j, 2, 1)
        direct = jax.grad(lambda b: jnp.sum(jax.grad(lambda a: jnp.sum(conv2d(a, b, 2, 1) ** 2))(x_j) ** 2))(w_j)
        np.testing.assert_allclose(second, direct, rtol=1e-10, atol=1e-10)


def test_custom_vjp_equals_autodiff_of_the_dilated_convolution():
    """The hand-written VJP and JAX's own derivative of the same forward agree (float64)."""
    rng = np.random.default_rng(2)
    with jax.enable_x64(True):
        x = jnp.asarray(rng.normal(size=(3, 4, 4, 6)))
        w = jnp.asarray(rng.normal(size=(6, 5, 4, 4)))
        loss = lambda f: (lambda a, b: jnp.sum(jnp.sin(f(a, b, 2, 1))))  # noqa: E731
        ours = jax.grad(loss(conv_transpose2d), argnums=(0, 1))(x, w)
        autodiff = jax.grad(loss(conv_transpose2d_reference), argnums=(0, 1))(x, w)
    for a, b in zip(ours, autodiff):
        np.testing.assert_allclose(a, b, rtol=1e-12, atol=1e-12)


def _batchnorm_torch(x, weight, bias, running_mean, running_var, training):
    bn = torch.nn.BatchNorm2d(x.shape[1]).to(torch.float64)
    with torch.no_grad():
        bn.weight.copy_(torch.tensor(weight))
        bn.bias.copy_(torch.tensor(bias))
        bn.running_mean.copy_(torch.tensor(running_mean))
        bn.running_var.copy_(torch.tensor(running_var))
    bn.train(training)
    return bn


@pytest.mark.parametrize("form", ["products", "reductions"])
@pytest.mark.parametrize("forwards", [1, 3])
def test_batchnorm_training_mode_matches_torch(forwards, form, monkeypatch):
    """Both forms of training-mode BatchNorm (sums as matrix products with the closed-form backward, the CPU's
    default; JAX's reductions, differentiated by JAX) against PyTorch in float64."""
    monkeypatch.setenv("FUNCTIONAL_GAN_BATCHNORM", form)
    rng = np.random.default_rng(3)
    c = 4
    weight, bias = rng.normal(1, 0.1, c), rng.normal(0, 0.1, c)
    running_mean, running_var = rng.normal(size=c), rng.uniform(0.5, 2, c)
    bn_torch = _batchnorm_torch(np.zeros((1, c, 1, 1)), weight, bias, running_mean, running_var, training=True)
    module = BatchNorm2d(c)
    with jax.enable_x64(True):
        variables = {
            "params": {"weight": jnp.asarray(weight), "bias": jnp.asarray(bias)},
            "batch_stats": {
                "running_mean": jnp.asarray(running_mean),
                "running_var": jnp.asarray(running_var),
                "num_batches_tracked": jnp.zeros((), jnp.int32),
            },
        }
        for i in range(forwards):  # several forwards: running statistics compound as in PyTorch
            x = rng.normal(2.0, 3.0, size=(5, c, 3, 3))
            cotangent = rng.normal(size=x.shape)
            tx = torch.tensor(x, requires_grad=True)
            ty = bn_torch(tx)
            ty.backward(torch.tensor(cotangent))

            def forward(params, x_NHWC, stats=variables["batch_stats"]):
                return module.apply({"params": params, "batch_stats": stats}, x_NHWC, mutable=["batch_stats"])

            (y, updates), vjp = jax.vjp(lambda p, a: forward(p, a), variables["params"], jnp.asarray(nchw_to_nhwc(x)))
            zero_stats = jax.tree_util.tree_map(jnp.zeros_like, updates)
            dparams, dx = vjp((jnp.asarray(nchw_to_nhwc(cotangent)), zero_stats))
            variables["batch_stats"] = updates["batch_stats"]
            np.testing.assert_allclose(nhwc_to_nchw(y), ty.detach().numpy(), rtol=1e-12, atol=1e-12)
            np.testing.assert_allclose(nhwc_to_nchw(dx), tx.grad.numpy(), rtol=1e-12, atol=1e-12)
            np.testing.assert_allclose(dparams["weight"], bn_torch.weight.grad.numpy(), rtol=1e-11, atol=1e-12)
            np.testing.assert_allclose(dparams["bias"], bn_torch.bias.grad.numpy(), rtol=1e-11, atol=1e-12)
            bn_torch.zero_grad()
        stats = variables["batch_stats"]
        np.testing.assert_allclose(stats["running_mean"], bn_torch.running_mean.numpy(), rtol=1e-13, atol=1e-14)
        # PyTorch tracks the *unbiased* variance: a biased running_var would fail here by a factor n/(n-1).
        np.testing.assert_allclose(stats["running_var"], bn_torch.running_var.numpy(), rtol=1e-13, atol=1e-14)
        assert int(stats["num_batches_tracked"]) == int(bn_torch.num_batches_tracked) == forwards


def test_batchnorm_closed_form_backward_equals_autodiff_with_every_output_used(monkeypatch):
    """The closed form's backward against JAX's autodiff of the reductions, where the returned mean and variance
    are used too (their cotangents reach the input), in float64 at a DCGAN shape and at one of a single pixel."""
    from functional_gan.layers import batch_norm, batch_norm_train

    def loss(f):
        def value(x, w, b):
            y, mean, var = f(x, w, b, 1e-5)
            return jnp.sum(jax.nn.relu(y) * jnp.cos(y)) + 0.3 * jnp.sum(mean) + 0.7 * jnp.sum(var * var)
        return value

    rng = np.random.default_rng(5)
    with jax.enable_x64(True):
        for shape in [(8, 4, 4, 16), (3, 1, 1, 5)]:
            x, w, b = (jnp.asarray(a) for a in (rng.normal(3, 2, shape), rng.normal(1, 0.1, shape[-1]),
                                                 rng.normal(0, 0.1, shape[-1])))
            monkeypatch.setenv("FUNCTIONAL_GAN_BATCHNORM", "reductions")
            autodiff = jax.grad(loss(batch_norm), argnums=(0, 1, 2))(x, w, b)
            monkeypatch.delenv("FUNCTIONAL_GAN_BATCHNORM")
            closed = jax.grad(loss(batch_norm_train), argnums=(0, 1, 2))(x, w, b)
            for a, c in zip(closed, autodiff):
                np.testing.assert_allclose(a, c, rtol=1e-11, atol=1e-12 * float(jnp.max(jnp.abs(c))))


def test_batchnorm_as_products_is_within_pytorchs_own_float32_error_at_the_largest_dcgan_size():
    """Float32 at G's last BatchNorm (batch 64, 32 × 32, 64 channels: sums over 65,536 values): the output, the input
    gradient and the weight gradient within 3 × PyTorch's own float32 error (at least 4 ulps), both against PyTorch64.
    One matrix product summing all 65,536 rows in turn measured 15-17×; the two-level sums 0.7-1.0×."""
    import torch.nn.functional as F

    from functional_gan.layers import batch_norm_train

    rng = np.random.default_rng(6)
    x, w, g = rng.normal(0.5, 1.5, (64, 64, 32, 32)), rng.normal(1, 0.02, 64), rng.normal(size=(64, 64, 32, 32))

    def torch_run(dtype):
        xt, wt = torch.tensor(x, dtype=dtype, requires_grad=True), torch.tensor(w, dtype=dtype, requires_grad=True)
        y = F.batch_norm(xt, None, None, wt, torch.zeros(64, dtype=dtype), training=True, eps=1e-5)
        y.backward(torch.tensor(g, dtype=dtype))
        return [a.detach().double().numpy() for a in (y, xt.grad, wt.grad)]

    exact, single = torch_run(torch.float64), torch_run(torch.float32)
    xj = jnp.asarray(nchw_to_nhwc(x), jnp.float32)
    y, pullback = jax.vjp(lambda a, b: batch_norm_train(a, b, jnp.zeros(64, jnp.float32), 1e-5)[0], xj,
                          jnp.asarray(w, jnp.float32))
    dx, dw = pullback(jnp.asarray(nchw_to_nhwc(g), jnp.float32))
    ours = [nhwc_to_nchw(np.asarray(y, np.float64)), nhwc_to_nchw(np.asarray(dx, np.float64)), np.asarray(dw, np.float64)]
    for name, a, t, r in zip(("y", "dx", "dweight"), ours, single, exact):
        allowed = 3 * max(np.max(np.abs(t - r)), 4 * np.finfo(np.float32).eps * np.max(np.abs(r)))
        assert np.max(np.abs(a - r)) <= allowed, (name, np.max(np.abs(a - r)) / allowed * 3)


def test_batchnorm_eval_mode_uses_running_statistics_like_torch():
    rng = np.random.default_rng(4)
    c = 3
    weight, bias = rng.normal(1, 0.1, c), rng.normal(0, 0.1, c)
    running_mean, running_var = rng.normal(size=c), rng.uniform(0.5, 2, c)
    x = rng.normal(size=(2, c, 4, 4))
    bn_torch = _batchnorm_torch(x, weight, bias, running_mean, running_var, training=False)
    with jax.enable_x64(True):
        y = BatchNorm2d(c, use_running_average=True).apply(
            {
                "params": {"weight": weight, "bias": bias},
                "batch_stats": {"running_mean": running_mean, "running_var": running_var, "num_batches_tracked": 0},
            },
            jnp.asarray(nchw_to_nhwc(x)),
        )
    np.testing.assert_allclose(nhwc_to_nchw(y), bn_torch(torch.tensor(x)).detach().numpy(), rtol=1e-12, atol=1e-12)


# p values covering the interior, the -100 clamp (p exactly 0 or 1) and float32 saturation:
# sigmoid(20) == 1.0 and sigmoid(-104) == 0.0 in float32.
BCE_PROBABILITIES = [0.3, 0.9, 1e-3, 0.999, 0.0, 1.0]


@pytest.mark.parametrize("dtype", [np.float32, np.float64])
@pytest.mark.parametrize("label", [0.0, 1.0])
def test_bce_matches_torch_including_saturation(dtype, label):
    p = np.array(BCE_PROBABILITIES, dtype=dtype)
    y = np.full_like(p, label)
    tp = torch.tensor(p, requires_grad=True)
    loss_torch = torch.nn.BCELoss()(tp, torch.tensor(y))
    loss_torch.backward()
    with jax.enable_x64(dtype == np.float64):
        loss, grad = jax.value_and_grad(bce_loss)(jnp.asarray(p), jnp.asarray(y))
    assert np.all(np.isfinite(grad)), "the backward must stay finite when p is exactly 0 or 1"
    tol = 1e-12 if dtype == np.float64 else 1e-6
    np.testing.assert_allclose(float(loss), loss_torch.item(), rtol=tol)
    np.testing.assert_allclose(np.asarray(grad), tp.grad.numpy(), rtol=tol, atol=0)


def test_bce_gradient_through_saturated_sigmoid_is_finite_and_matches_torch():
    """The tutorial's Sigmoid → BCELoss chain with logits past float32 saturation (p == 1.0)."""
    logits = np.array([25.0, 18.0, -30.0, 0.5], np.float32)
    labels = np.array([0.0, 0.0, 1.0, 1.0], np.float32)
    t_logits = torch.tensor(logits, requires_grad=True)
    torch.nn.BCELoss()(torch.sigmoid(t_logits), torch.tensor(labels)).backward()
    grad = jax.grad(lambda z: bce_loss(jax.nn.sigmoid(z), jnp.asarray(labels)))(jnp.asarray(logits))
    assert np.all(np.isfinite(grad))
    np.testing.assert_allclose(np.asarray(grad), t_logits.grad.numpy(), rtol=1e-6, atol=1e-12)
