"""The gradient-stopping idioms people port: PyTorch, torch.func and JAX agree in float64, and the cut matters."""

import numpy as np
import pytest

from functional_gan.lessons import LESSONS, idioms

# Three implementations of the same float64 arithmetic: only the order of a few sums can differ.
TOLERANCE = 1e-12


def _sides(name):
    return {side: fn() for side, fn in LESSONS[name].sides.items()}


def _assert_columns_equal(values, label, sides=None):
    """The columns agree on ``label``: by default PyTorch, torch.func, JAX and, where the lesson has one, NNX."""
    sides = sides or ("PyTorch", "torch.func", "JAX", *(("NNX",) if "NNX" in values else ()))
    reference = np.asarray(values[sides[0]][label])
    for side in sides[1:]:
        np.testing.assert_allclose(values[side][label], reference, rtol=0, atol=TOLERANCE, err_msg=f"{side}: {label}")
    return reference


def test_straight_through_passes_the_decoders_gradient_to_the_encoder():
    values = _sides("straight_through")
    gradient = _assert_columns_equal(values, "d loss / d x")
    data = idioms._inputs("straight_through")
    q = data["codebook"][idioms._nearest(data["x"], data["codebook"])]
    np.testing.assert_allclose(gradient, np.cos(q), rtol=0, atol=TOLERANCE)  # d/dx sin(x_st) at x_st = q: cos(q)
    assert values["PyTorch"]["max |forward value − q|"] < 1e-15 and values["JAX"]["max |forward value − q|"] < 1e-15
    assert values["NNX"]["the quantiser's gradient entries (its codebook is no nnx.Param)"] == 0


def test_truncated_bptt_is_the_same_truncation_and_differs_from_full_bptt():
    values = _sides("tbptt")
    truncated = _assert_columns_equal(values, "d loss / d W (truncated every 4 steps)")
    full = _assert_columns_equal(values, "d loss / d W (full BPTT)", sides=("torch.func", "JAX"))
    assert np.max(np.abs(truncated - full)) > 0.1  # the cut removes the paths back across chunks


def test_target_network_td_target_and_soft_update_match_numpy():
    values = _sides("target_network")
    gradient = _assert_columns_equal(values, "d loss / d online")
    updated = _assert_columns_equal(values, "target after the soft update")
    d = idioms._inputs("target_network")
    td_target = d["r"] + idioms.GAMMA * np.max(d["s_next"] @ d["target"], axis=1)
    expected_gradient = 2 * d["s"].T @ (d["s"] @ d["online"] - td_target) / len(d["r"])  # the TD target a constant
    np.testing.assert_allclose(gradient, expected_gradient, rtol=0, atol=TOLERANCE)
    np.testing.assert_allclose(updated, (1 - idioms.TAU) * d["target"] + idioms.TAU * d["online"], rtol=0, atol=TOLERANCE)


def test_ema_of_a_generator_matches_a_numpy_loop_and_pytorch_refuses_the_update_outside_no_grad():
    values = _sides("ema_generator")
    w1, w2 = _assert_columns_equal(values, "EMA W1"), _assert_columns_equal(values, "EMA W2")
    _assert_columns_equal(values, "the EMA generator's output, row 0")
    d = idioms._ema_inputs()  # the same loop by hand in NumPy: SGD with the gradient of mean((tanh(z W1) W2 − t)²)
    W1, W2 = d["W1"].copy(), d["W2"].copy()
    E1, E2 = W1.copy(), W2.copy()
    for _ in range(idioms.EMA_STEPS):
        h = np.tanh(d["z"] @ W1)
        residual = 2 * (h @ W2 - d["target"]) / d["target"].size
        g2 = h.T @ residual
        g1 = d["z"].T @ ((residual @ W2.T) * (1 - h ** 2))
        W1, W2 = W1 - idioms.EMA_LR * g1, W2 - idioms.EMA_LR * g2
        E1, E2 = idioms.EMA_DECAY * E1 + (1 - idioms.EMA_DECAY) * W1, idioms.EMA_DECAY * E2 + (1 - idioms.EMA_DECAY) * W2
    np.testing.assert_allclose(w1, E1, rtol=0, atol=TOLERANCE)
    np.testing.assert_allclose(w2, E2, rtol=0, atol=TOLERANCE)
    assert values["PyTorch"]["the EMA copy requires grad"] is False
    refused = values["PyTorch"]["in-place mul_ on a parameter outside no_grad"]
    assert refused.type == "RuntimeError" and "leaf Variable that requires grad" in refused.message
    assert values["NNX"]["in-place update of a parameter, outside any no_grad"] == f"no error; W1 scaled by {idioms.EMA_DECAY:g}"


def test_simsiam_stop_gradient_gives_the_same_gradients_and_changes_them():
    values = _sides("simsiam")
    encoder = _assert_columns_equal(values, "d loss / d encoder")
    _assert_columns_equal(values, "d loss / d predictor")
    without = _assert_columns_equal(values, "d loss / d encoder, without the stop-gradient", sides=("torch.func", "JAX"))
    assert np.max(np.abs(encoder - without)) > 1e-2


def test_gradient_penalty_second_order_through_this_projects_conv2d_matches_pytorch():
    values = _sides("gradient_penalty")
    _assert_columns_equal(values, "d penalty / d weight")
    assert values["JAX"]["penalty"] == pytest.approx(values["PyTorch"]["penalty"], abs=TOLERANCE)
    assert np.max(np.abs(values["JAX"]["d penalty / d weight"])) > 1e-3  # a real, non-zero second-order signal


def test_no_grad_keeps_nothing_and_jax_keeps_residuals_only_when_differentiating():
    torch_side, jax_side = LESSONS["no_grad_memory"].sides["PyTorch"](), LESSONS["no_grad_memory"].sides["JAX"]()
    batch, width, layers = idioms.MEMORY_BATCH, idioms.MEMORY_WIDTH, idioms.MEMORY_LAYERS
    activation_mb = batch * width * 4 / 2**20  # one float32 activation
    # Autograd keeps each layer's input (but the first, x itself) and each tanh output.
    assert torch_side["MB kept for backward, recording"] == pytest.approx((2 * layers - 1) * activation_mb)
    assert torch_side["MB kept for backward, under no_grad"] == 0
    # jax.vjp keeps at least those activations; jax.checkpoint keeps only the layers' inputs.
    assert jax_side["MB a jax.vjp pullback keeps"] >= (2 * layers - 1) * activation_mb
    assert jax_side["MB it keeps with jax.checkpoint on each layer"] == pytest.approx((layers - 1) * activation_mb)
    # Compiled, XLA reuses buffers: the gradient program's temporaries are far below the pullback's residuals, and
    # at least the forward's (equal on jax 0.10.2 with the miscompile's workaround, whose final sum takes a buffer).
    assert jax_side["MB of temporaries, compiled jax.grad"] >= jax_side["MB of temporaries, compiled forward only"]
    assert jax_side["MB of temporaries, compiled jax.grad"] <= jax_side["MB a jax.vjp pullback keeps"] / 4
