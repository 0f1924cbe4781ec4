"""Keep a port under test in your own suite: pytest's way into check-port.

    python -m pytest examples/port/test_mnist_ports.py

Each test is one line of ``assert_port``: it passes when the port agrees with PyTorch within
PyTorch's own rounding, and fails with the first divergence as its message otherwise (the stage,
the layer, both sides' values, then the whole report).
"""

from pathlib import Path

import pytest

from functional_gan.testing import assert_port

HERE = Path(__file__).resolve().parent


@pytest.mark.parametrize("spec", ["mnist_cnn.py", "mnist_cnn_nnx.py", "mnist_cnn_equinox.py"])
def test_the_mnist_ports_agree_with_pytorch(spec):
    assert_port(HERE / spec)


def test_the_nnx_port_agrees_in_float64_over_two_steps():
    assert_port(HERE / "mnist_cnn_nnx.py", dtype="float64", steps=2, programs=("jit",))


def test_a_port_that_flattens_channels_last_fails_at_fc1():
    import sys

    sys.path.insert(0, str(HERE))
    from mnist_cnn_nnx import NNXNet
    from flax import nnx

    with pytest.raises(AssertionError, match="First divergence: forward, fc1"):
        assert_port(HERE / "mnist_cnn_nnx.py", jax_model=lambda: NNXNet(nnx.Rngs(0), mistake="flatten-nhwc"))
