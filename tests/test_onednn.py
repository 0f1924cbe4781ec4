"""oneDNN's convolutions through JAX's FFI (functional_gan.onednn, the onednn extra): each pass at every shape of the
tutorial's G and D against XLA's convolution and against PyTorch, the derivatives of the derivatives, vmap, where it
steps aside (float64, $FUNCTIONAL_GAN_CONV=xla, several devices), a missing compiler or library, and a training run.

Tolerances (float32): each result is compared with PyTorch's float64 result, and its error must be within 4× of
XLA's own float32 error on the same pass plus 1e-6 of the result's scale: both libraries round sums of up to 8,192
products (512 channels × 4×4 taps) in float32, whose error is a few 1e-6 of the scale, measured ≤ 3.6e-6 for oneDNN
and ≤ 8.6e-6 for XLA at these shapes.
"""

import dataclasses
import os
import subprocess
import sys
import warnings

import jax
import jax.numpy as jnp
import numpy as np
import pytest
import torch

from functional_gan import layers, onednn
from functional_gan.benchmarks.workloads import network_layers
from functional_gan.config import TrainConfig
from functional_gan.errors import UserError
from functional_gan.onednn import _build
from tests.helpers import TINY

pytestmark = pytest.mark.skipif(jax.default_backend() != "cpu", reason="oneDNN's handlers are registered for the CPU")

# The extra is part of the test extra: CI installs it, so these tests run there (a missing extra is a failure).
LAYERS = network_layers(TrainConfig())[0]  # the tutorial's 64×64 nets: 5 transposed convolutions (G), 5 convolutions (D)
BATCH = 2


@pytest.fixture
def conv(monkeypatch):
    """Sets $FUNCTIONAL_GAN_CONV for the test (the choice is read when a function is traced)."""

    def choose(value):
        monkeypatch.setenv(onednn.CONV_ENV, value)

    return choose


def _passes(op, x, w, dy, stride, padding):
    """(forward, input gradient, kernel gradient) of ``op`` at output cotangent ``dy``, jitted."""

    @jax.jit
    def run(x, w, dy):
        y, pullback = jax.vjp(lambda a, b: op(a, b, stride, padding), x, w)
        return (y, *pullback(dy))

    return [np.asarray(a, np.float64) for a in run(x, w, dy)]


def _torch_passes(transposed, x_NHWC, w, dy_NHWC, stride, padding):
    """PyTorch's three passes in float64: the reference."""
    fn = torch.nn.functional.conv_transpose2d if transposed else torch.nn.functional.conv2d
    x = torch.tensor(np.asarray(x_NHWC, np.float64).transpose(0, 3, 1, 2), requires_grad=True)
    wt = torch.tensor(np.asarray(w, np.float64), requires_grad=True)
    y = fn(x, wt, stride=stride, padding=padding)
    y.backward(torch.tensor(np.asarray(dy_NHWC, np.float64).transpose(0, 3, 1, 2)))
    return [y.detach().numpy().transpose(0, 2, 3, 1), x.grad.numpy().transpose(0, 2, 3, 1), wt.grad.numpy()]


@pytest.mark.parametrize("layer", LAYERS, ids=[layer.name for layer in LAYERS])
def test_each_pass_at_every_shape_of_the_tutorial_agrees_with_pytorch_as_closely_as_xla(layer, conv):
    rng = np.random.default_rng(0)
    op = layers.conv_transpose2d if layer.transposed else layers.conv2d
    shape = (layer.cin, layer.cout, 4, 4) if layer.transposed else (layer.cout, layer.cin, 4, 4)
    x = jnp.asarray(rng.normal(size=(BATCH, layer.size, layer.size, layer.cin)), jnp.float32)
    w = jnp.asarray(0.02 * rng.normal(size=shape), jnp.float32)
    y_shape = jax.eval_shape(lambda a, b: op(a, b, layer.stride, layer.padding), x, w).shape
    dy = jnp.asarray(rng.normal(size=y_shape), jnp.float32)
    expected = _torch_passes(layer.transposed, x, w, dy, layer.stride, layer.padding)
    conv("onednn")
    ours = _passes(op, x, w, dy, layer.stride, layer.padding)
    conv("xla")
    xla = _passes(op, x, w, dy, layer.stride, layer.padding)
    for name, mine, theirs, truth in zip(("forward", "input gradient", "kernel gradient"), ours, xla, expected):
        scale = np.abs(truth).max()
        error, xla_error = np.abs(mine - truth).max() / scale, np.abs(theirs - truth).max() / scale
        assert error <= 4 * xla_error + 1e-6, (layer.name, name, error, xla_error)
        assert np.abs(mine - theirs).max() / scale <= 2e-5, (layer.name, name)


def _has_ffi_call(fn, *args) -> bool:
    """Whether tracing ``fn`` now calls a handler (a new function each time: a trace of the same one may be reused,
    made under another setting)."""
    return "fg_onednn_conv" in str(jax.make_jaxpr(lambda *a: fn(*a))(*args))


def test_the_layers_take_onednn_in_float32_on_one_cpu_device_and_xla_everywhere_else(conv, monkeypatch):
    x32, w32 = jnp.ones((2, 8, 8, 3), jnp.float32), jnp.ones((4, 3, 4, 4), jnp.float32)
    forward = lambda x, w: layers.conv2d(x, w, 2, 1)  # noqa: E731
    conv("onednn")
    assert _has_ffi_call(forward, x32, w32)
    assert _has_ffi_call(lambda x, w: layers.conv_transpose2d(x, w, 2, 1), x32, jnp.ones((3, 4, 4, 4)))
    with jax.enable_x64():  # float64 (the comparison suite, replays, check-port's references): XLA's
        x64, w64 = x32.astype(jnp.float64), w32.astype(jnp.float64)
        assert not _has_ffi_call(forward, x64, w64)
        assert not _has_ffi_call(lambda x, w: jax.grad(lambda a: jnp.sum(forward(a, w)))(x), x64, w64)
    monkeypatch.setattr(jax, "device_count", lambda: 2)  # a sharded or multi-process run: XLA's partitioner's
    assert not _has_ffi_call(forward, x32, w32)
    monkeypatch.undo()
    conv("xla")
    assert not _has_ffi_call(forward, x32, w32)
    conv("")  # unset: oneDNN where the extra is installed, for convolutions of MIN_FLOPS and more
    assert not _has_ffi_call(forward, x32, w32)  # 2·2·4·4·4·3·16 = 6,144 FLOPs: XLA's
    big_x, big_w = jnp.ones((8, 32, 32, 16), jnp.float32), jnp.ones((32, 16, 4, 4), jnp.float32)
    assert onednn.conv_flops(big_x.shape, big_w.shape, (16, 16)) == 2 * 8 * 16 * 16 * 32 * 16 * 16 >= onednn.MIN_FLOPS
    assert _has_ffi_call(forward, big_x, big_w)
    assert _has_ffi_call(lambda x, w: layers.conv_transpose2d(x, w, 2, 1), jnp.ones((8, 16, 16, 32)), big_w)
    conv("mkl")
    with pytest.raises(UserError, match="FUNCTIONAL_GAN_CONV='mkl': choose one of onednn, xla"):
        forward(x32, w32)


def test_the_compiled_step_runs_every_convolution_in_onednn(conv):
    from functional_gan.train import init_state, make_train_step

    conv("onednn")
    hlo = make_train_step(TINY).lower(init_state(TINY), jnp.zeros((4, 32, 32, 3))).compile().as_text()
    assert " convolution(" not in hlo and "__ynn" not in hlo or "convolution" not in hlo
    # G: 4 layers × (forward, input and kernel gradients); D: 4 layers on real and fake (3 passes each, G's step
    # asks D for input gradients only) ...: counted as what XLA keeps, at least one of each handler
    for name in _build.TARGETS:
        assert f'custom_call_target="{name}"' in hlo, name


def test_an_output_padding_beyond_the_padding_stays_with_xla(conv):
    conv("onednn")
    x, w = jnp.ones((1, 3, 3, 2), jnp.float32), jnp.ones((2, 3, 3, 3), jnp.float32)
    fn = lambda x, w: layers.conv_transpose2d(x, w, 2, 0, output_padding=1)  # noqa: E731
    assert not _has_ffi_call(fn, x, w)
    y = torch.nn.functional.conv_transpose2d(torch.ones(1, 2, 3, 3), torch.ones(2, 3, 3, 3), stride=2, output_padding=1)
    np.testing.assert_allclose(np.asarray(fn(x, w)), y.numpy().transpose(0, 2, 3, 1), rtol=1e-6)


def test_a_convolution_leaving_input_rows_unread_stays_with_xla(conv):
    """3×3 stride 2 over 6 rows reads rows 0-4 only: the padding after the image would be -1, which oneDNN does not
    take (the handler refused it at run time before the layer checked the geometry)."""
    conv("onednn")
    rng = np.random.default_rng(4)
    x = jnp.asarray(rng.normal(size=(2, 6, 6, 3)), jnp.float32)
    w = jnp.asarray(rng.normal(size=(4, 3, 3, 3)), jnp.float32)
    fn = lambda x, w: layers.conv2d(x, w, 2, 0)  # noqa: E731
    assert not _has_ffi_call(fn, x, w)
    y = torch.nn.functional.conv2d(torch.tensor(np.asarray(x).transpose(0, 3, 1, 2)), torch.tensor(np.asarray(w)),
                                   stride=2)
    np.testing.assert_allclose(np.asarray(fn(x, w)), y.numpy().transpose(0, 2, 3, 1), rtol=1e-5, atol=1e-5)


def test_second_derivatives_stay_in_onednn_and_equal_xlas(conv):
    """WGAN-GP's penalty differentiates the critic's input gradient again: the handlers' derivatives are each other."""
    rng = np.random.default_rng(1)
    x = jnp.asarray(rng.normal(size=(2, 8, 8, 3)), jnp.float32)
    w1 = jnp.asarray(0.3 * rng.normal(size=(4, 3, 4, 4)), jnp.float32)
    w2 = jnp.asarray(0.3 * rng.normal(size=(4, 5, 4, 4)), jnp.float32)  # a transposed layer: (in, out, kH, kW)

    def penalty(w1, w2):
        def critic(x):
            h = jnp.tanh(layers.conv2d(x, w1, 2, 1))
            return jnp.sum(jnp.tanh(layers.conv_transpose2d(h, w2, 2, 1)) ** 2)

        g = jax.grad(critic)(x)
        return jnp.sum((jnp.sqrt(jnp.sum(g**2, axis=(1, 2, 3))) - 1.0) ** 2)

    conv("onednn")
    assert "fg_onednn_conv_backward_weights" in str(jax.make_jaxpr(jax.grad(penalty, (0, 1)))(w1, w2))
    ours = jax.jit(jax.grad(penalty, (0, 1)))(w1, w2)
    conv("xla")
    theirs = jax.jit(jax.grad(penalty, (0, 1)))(w1, w2)
    for a, b in zip(ours, theirs):
        np.testing.assert_allclose(np.asarray(a), np.asarray(b), rtol=0, atol=2e-5 * float(jnp.abs(b).max()))


def test_vmap_runs_the_handlers_once_per_element_and_agrees(conv):
    rng = np.random.default_rng(2)
    xs = jnp.asarray(rng.normal(size=(3, 2, 8, 8, 3)), jnp.float32)
    ws = jnp.asarray(rng.normal(size=(3, 4, 3, 4, 4)), jnp.float32)  # a kernel per element too
    fn = jax.vmap(lambda x, w: jnp.sum(jax.grad(lambda w_: jnp.sum(layers.conv2d(x, w_, 2, 1) ** 2))(w)))
    conv("onednn")
    ours = fn(xs, ws)
    conv("xla")
    np.testing.assert_allclose(np.asarray(ours), np.asarray(fn(xs, ws)), rtol=2e-5)


def test_without_the_library_or_a_compiler_xla_runs_and_a_demand_for_onednn_says_why(conv, monkeypatch, tmp_path):
    monkeypatch.setattr(_build, "_loaded", None)
    monkeypatch.setattr(_build, "_failure", None)
    monkeypatch.setenv(_build.CACHE_ENV, str(tmp_path))  # an empty cache: the build is needed
    monkeypatch.setenv("CXX", "no-such-compiler")
    monkeypatch.setattr(onednn, "_warned", False)
    x, w = jnp.ones((8, 32, 32, 16), jnp.float32), jnp.ones((32, 16, 4, 4), jnp.float32)  # above MIN_FLOPS
    conv("")
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        assert not _has_ffi_call(lambda x, w: layers.conv2d(x, w, 2, 1), x, w)
    assert [str(c.message) for c in caught] == [
        "oneDNN's convolutions are off, XLA's run instead: no C++ compiler to build oneDNN's handlers "
        "(no-such-compiler not found; set $CXX or install g++)"]
    conv("onednn")
    with pytest.raises(UserError, match=r"^\$FUNCTIONAL_GAN_CONV=onednn: no C\+\+ compiler"):
        layers.conv2d(x, w, 2, 1)
    monkeypatch.setattr(_build, "_failure", None)
    monkeypatch.setattr(_build, "locate", lambda: (_ for _ in ()).throw(
        _build.Unavailable("onednn-cpu-gomp not installed: pip install 'functional-gan[onednn]'")))
    conv("")
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # not installed: no word, XLA's convolution (nothing changes without the extra)
        assert not _has_ffi_call(lambda x, w: layers.conv2d(x, w, 2, 1), x, w)


def test_a_failed_build_names_its_log_and_a_later_good_compiler_builds_into_the_cache(monkeypatch, tmp_path):
    monkeypatch.setenv(_build.CACHE_ENV, str(tmp_path))
    broken = tmp_path / "broken-cxx"
    broken.write_text("#!/bin/sh\necho 'conv.cc:1: error: this compiler is broken' >&2\nexit 1\n")
    broken.chmod(0o755)
    monkeypatch.setenv("CXX", str(broken))
    with pytest.raises(_build.Unavailable, match=r"building oneDNN's handlers failed \(conv.cc:1: error: this "
                       r"compiler is broken\); the whole log: .*build.log"):
        _build.build()
    monkeypatch.delenv("CXX")
    library = _build.build()
    assert library.is_file() and library.parent.parent == tmp_path / "onednn"


def test_a_fresh_process_builds_once_and_concurrent_first_uses_share_the_build(tmp_path):
    """Two processes start on an empty cache at once: one builds, the other waits on the lock and loads it."""
    code = ("import jax.numpy as jnp; from functional_gan import layers, onednn; "
            "y = layers.conv2d(jnp.ones((1, 8, 8, 3)), jnp.ones((4, 3, 4, 4)), 2, 1); "
            "print(onednn.available(), float(y.sum()))")
    env = {**os.environ, _build.CACHE_ENV: str(tmp_path), onednn.CONV_ENV: "onednn"}
    runs = [subprocess.Popen([sys.executable, "-c", code], env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                             text=True) for _ in range(2)]
    outputs = [run.communicate(timeout=240) for run in runs]
    for run, (out, err) in zip(runs, outputs):
        assert run.returncode == 0, err
        assert out.split()[0] == "True"
    # every output of a 4×4 stride-2 padding-1 convolution of ones sums the taps inside the image: 3 channels × taps
    taps = sum(1 for o in range(4) for t in range(4) if 0 <= 2 * o + t - 1 < 8)
    assert {float(out.split()[1]) for out, _ in outputs} == {4.0 * 3 * taps * taps}
    assert len(list((tmp_path / "onednn").glob("*/fg_onednn.so"))) == 1


def test_a_training_run_with_onednn_learns_as_one_with_xla(conv):
    """The same tiny run both ways: the first step's losses within float32 rounding, and after 20 steps on the same
    batches both runs' losses within a few percent (GAN training amplifies rounding differences step by step)."""
    from functional_gan.train import init_state, make_train_step

    config = dataclasses.replace(TINY, batch_size=8)
    data = jnp.asarray(np.random.default_rng(3).uniform(-1, 1, (20, 8, 32, 32, 3)), jnp.float32)
    histories = {}
    for choice in ("onednn", "xla"):
        conv(choice)
        state, step, losses = init_state(config), make_train_step(config), []
        for batch in data:
            state, metrics = step(state, batch)
            losses.append((float(metrics.loss_d), float(metrics.loss_g)))
        histories[choice] = np.array(losses)
    ours, theirs = histories["onednn"], histories["xla"]
    np.testing.assert_allclose(ours[0], theirs[0], rtol=1e-5)
    assert np.all(np.isfinite(ours))
    np.testing.assert_allclose(ours[-5:].mean(axis=0), theirs[-5:].mean(axis=0), rtol=0.05)
