"""The book's linear regression: every trainer reproduces the book's numbers and PyTorch's."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest
import torch

from functional_gan.pytorch import linreg as torch_linreg
from functional_gan import linreg

# Published in the book (NumPy gradient descent, float64): b = 1.02354094, w = 1.96896411,
# first gradients -3.0448, -1.8338 from b = 0.49671415, w = -0.1382643; final loss ~0.00804466.
BOOK_B, BOOK_W = 1.02354094, 1.96896411


def test_data_and_starting_point_are_the_books():
    data = linreg.make_data()
    assert data.x_train.shape == (80, 1) and data.x_val.shape == (20, 1)
    b0, w0 = linreg.initial_parameters()
    assert (round(b0, 8), round(w0, 7)) == (0.49671415, -0.1382643)
    b_grad, w_grad = linreg.numpy_gradients(b0, w0, data.x_train, data.y_train)
    assert (round(b_grad, 4), round(w_grad, 4)) == (-3.0448, -1.8338)


def test_numpy_trainer_reproduces_the_book_to_its_printed_digits():
    result = linreg.train_numpy(linreg.make_data())
    assert result.b == pytest.approx(BOOK_B, abs=5e-9) and result.w == pytest.approx(BOOK_W, abs=5e-9)
    assert result.train_loss == pytest.approx(0.00804466, abs=5e-9)


@pytest.mark.parametrize("trainer", linreg.JAX_TRAINERS, ids=lambda t: t.__name__)
def test_jax_trainers_float64_equal_numpy(trainer):
    data = linreg.make_data()
    reference = linreg.train_numpy(data)
    with jax.enable_x64(True):
        result = trainer(data, dtype=jnp.float64)
    # Same arithmetic in float64; only operation order differs (measured ≤ 1e-15).
    assert result.b == pytest.approx(reference.b, abs=1e-12) and result.w == pytest.approx(reference.w, abs=1e-12)
    assert result.val_loss == pytest.approx(reference.val_loss, abs=1e-12)
    np.testing.assert_allclose(result.losses, reference.losses, rtol=1e-11)


@pytest.mark.parametrize("trainer", linreg.JAX_TRAINERS, ids=lambda t: t.__name__)
def test_jax_trainers_float32_give_the_books_pytorch_numbers(trainer):
    result = trainer(linreg.make_data())
    # The book prints PyTorch's float32 result to 4 decimals: b = 1.0235, w = 1.9690.
    assert round(result.b, 4) == 1.0235 and round(result.w, 4) == 1.9690
    # float32 drift over 1000 epochs from the float64 values: measured ~4e-6.
    assert result.b == pytest.approx(BOOK_B, abs=2e-5) and result.w == pytest.approx(BOOK_W, abs=2e-5)


@pytest.mark.parametrize("torch_trainer", torch_linreg.TORCH_TRAINERS, ids=lambda t: t.__name__)
def test_pytorch_counterparts_agree_with_the_jax_trainers(torch_trainer):
    data = linreg.make_data()
    theirs = torch_trainer(data, dtype=torch.float64)
    with jax.enable_x64(True):
        ours = linreg.train_jax_grad(data, dtype=jnp.float64)
    assert theirs.b == pytest.approx(ours.b, abs=1e-12) and theirs.w == pytest.approx(ours.w, abs=1e-12)
    np.testing.assert_allclose(theirs.losses, ours.losses, rtol=1e-11)
    theirs32 = torch_trainer(data)
    ours32 = linreg.train_jax_grad(data)
    # float32 in both: the same operations up to rounding; 1000 epochs keep them within 1e-5.
    assert theirs32.b == pytest.approx(ours32.b, abs=1e-5) and theirs32.w == pytest.approx(ours32.w, abs=1e-5)


def test_cli_prints_every_trainer(capsys):
    from functional_gan.main import main

    assert main(["linreg", "--float64", "--torch"]) == 0
    printed = capsys.readouterr().out.splitlines()
    lines = [line for line in printed if "1.02354094" in line and "1.96896411" in line and not line.startswith("The book")]
    assert len(lines) == 8, "NumPy, three JAX trainers and four PyTorch variants reach the book's float64 numbers"
