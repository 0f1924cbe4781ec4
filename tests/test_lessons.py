"""Each lesson shows the behaviour its notes describe, in PyTorch and in JAX."""

import numpy as np
import pytest

from functional_gan.lessons import LESSONS, Raised, basics, gan, linear_regression, run_lesson
from functional_gan.main import main


def test_detach_raises_in_pytorch_and_gives_zero_in_jax():
    torch_side, jax_side = basics.torch_detach(), basics.jax_stop_gradient()
    raised = torch_side["grad through y_hat.detach()"]
    assert isinstance(raised, Raised) and raised.type == "RuntimeError" and "does not require grad" in raised.message
    assert jax_side["grad through stop_gradient(y_hat)"] == 0.0  # exactly zero, not an error
    assert torch_side["grad, connected"] == [-2.0] and jax_side["grad, connected"] == -2.0


def test_requires_grad_propagation_and_argnums():
    torch_side, jax_side = basics.torch_requires_grad(), basics.jax_argnums()
    assert torch_side["a = x + y: requires_grad"] is False and torch_side["b = a + z: requires_grad"] is True
    assert torch_side["x.grad"] is None
    assert jax_side["grad wrt z (argnums=2)"] == [1.0, 1.0] == jax_side["grad wrt z via a closure"]
    assert jax_side["grads wrt x and z (argnums=(0, 2))"] == 2
    assert jax_side["x has a requires_grad attribute"] is False


def test_grad_fn_names_and_jaxpr_equations():
    torch_side, jax_side = basics.torch_grad_fn(), basics.jax_jaxpr()
    assert "grad_fn=<MulBackward0>" in torch_side["y = x * 3"]
    assert torch_side["y_hat.grad_fn"] == "AddBackward0"
    assert torch_side["y_hat.grad_fn.next_functions"] == ["AccumulateGrad", "MulBackward0"]
    assert jax_side["jaxpr of y_hat: equations"] == ["mul", "add"]


def test_no_grad_block_and_stop_gradient_block():
    torch_side, jax_side = basics.torch_no_grad(), basics.jax_no_differentiation()
    assert torch_side["inside no_grad: y.requires_grad"] is False and torch_side["inside no_grad: y.grad_fn"] is None
    assert torch_side["outside: z.grad_fn"] == "MulBackward0"
    assert jax_side["d/dx x·stop_gradient(2x)"] == [4.0] and jax_side["d/dx x·2x"] == [8.0]


def test_accumulation_doubles_in_pytorch_and_multisteps_equals_the_big_batch():
    torch_side, jax_side = linear_regression.torch_accumulation(), linear_regression.jax_gradients_are_values()
    first = np.array(torch_side["after first backward(): b.grad, w.grad"])
    second = np.array(torch_side["after second backward(): b.grad, w.grad"])
    np.testing.assert_allclose(first, [-3.0448, -1.8338], atol=5e-5)  # the book's first gradients
    np.testing.assert_allclose(second, 2 * first, rtol=1e-6)  # float32 doubling is exact up to rounding
    assert torch_side["after zero_(): b.grad"] == 0.0
    assert jax_side["first jax.grad: b, w"] == jax_side["second jax.grad: b, w"]  # nothing accumulated
    np.testing.assert_allclose(jax_side["first jax.grad: b, w"], first, rtol=1e-6)
    np.testing.assert_allclose(jax_side["added on purpose: b, w"], second, rtol=1e-6)
    # Mean of 4 equal micro-batch gradients == full-batch gradient: equal up to float32 rounding.
    np.testing.assert_allclose(
        jax_side["MultiSteps(4 × 20 examples): b, w"], jax_side["one SGD step on all 80: b, w"], rtol=1e-6, atol=1e-7
    )


def test_update_pitfalls_raise_the_books_errors():
    torch_side, jax_side = linear_regression.torch_update_pitfalls(), linear_regression.jax_new_values()
    lost = torch_side["b = b - lr * b.grad, then b.grad.zero_()"]
    assert isinstance(lost, Raised) and lost.type == "AttributeError" and "zero_" in lost.message
    in_place = torch_side["b -= lr * b.grad"]
    assert isinstance(in_place, Raised) and in_place.type == "RuntimeError"
    assert "leaf Variable that requires grad" in in_place.message and "in-place operation" in in_place.message
    b, w = torch_side["under no_grad, 1000 epochs: b, w"]
    assert (round(b, 4), round(w, 4)) == (1.0235, 1.9690)
    b_jax, w_jax = jax_side["params = tree_map(p - lr * g), 1000 epochs: b, w"]
    assert b_jax == pytest.approx(b, abs=1e-5) and w_jax == pytest.approx(w, abs=1e-5)
    assert jax_side["b.at[()].set(0.0) returns"] == 0.0
    assert jax_side["b afterwards (unchanged: arrays are immutable)"] == pytest.approx(0.49671415, abs=1e-7)


def test_retain_graph_error_and_reusable_vjp():
    torch_side, jax_side = basics.torch_retain_graph(), basics.jax_vjp_reuse()
    second = torch_side["second backward()"]
    assert isinstance(second, Raised) and "backward through the graph a second time" in second.message
    expected = np.exp(3.0) * 4.0  # d/dx x·e^x = e^x (1 + x), computed independently
    assert torch_side["first backward(): x.grad"] == pytest.approx(expected, rel=1e-6)
    assert torch_side["twice with retain_graph=True: x.grad (accumulated)"] == pytest.approx(2 * expected, rel=1e-6)
    assert jax_side["vjp(1.0), first"] == jax_side["vjp(1.0), second"] == pytest.approx(expected, rel=1e-6)
    assert jax_side["vjp(2.0)"] == pytest.approx(2 * expected, rel=1e-6)


def test_gan_step_detach_and_stop_gradient():
    torch_side, jax_side = gan.torch_gan_step(), gan.jax_gan_step()
    assert torch_side[gan.TORCH_G_GRADS_NONE.format(cut="with detach()")] == torch_side["netG parameters"] > 0
    assert torch_side[gan.TORCH_G_GRADS_NONE.format(cut="without detach()")] == 0
    assert torch_side[gan.TORCH_G_GRAD_SUM.format(cut="without detach()")] > 0.0
    assert torch_side["without detach(): D-step FLOPs"] > torch_side["with detach(): D-step FLOPs"]
    assert jax_side["grad wrt D only: its top-level keys are D's modules"] is True
    assert jax_side["grad wrt D only: identical with and without stop_gradient"] is True
    assert jax_side[gan.JAX_G_GRAD_SUM.format(cut="with stop_gradient")] == 0.0
    assert jax_side[gan.JAX_G_GRAD_SUM.format(cut="without stop_gradient")] > 0.0


def test_compiled_program_drops_g_backward_unless_asked():
    jax_rows, torch_rows = gan.jax_compiled_cost(gan.LESSON_GAN), gan.torch_compiled_cost(gan.LESSON_GAN)
    d_only = jax_rows["grad wrt D, with stop_gradient"]
    assert jax_rows["grad wrt D, without stop_gradient"] == d_only  # XLA builds the same program
    assert jax_rows["grad wrt G and D, with stop_gradient"]["convolutions in the optimised HLO"] == d_only[
        "convolutions in the optimised HLO"]
    both = jax_rows["grad wrt G and D, without stop_gradient"]
    assert both["convolutions in the optimised HLO"] > d_only["convolutions in the optimised HLO"]
    assert both["GFLOP (XLA cost analysis)"] > d_only["GFLOP (XLA cost analysis)"]
    with_detach, without = torch_rows["D step with detach()"], torch_rows["D step without detach()"]
    assert without["GFLOP (FlopCounterMode)"] > with_detach["GFLOP (FlopCounterMode)"]
    assert without["aten convolution calls (a backward call computes both gradients)"] > with_detach[
        "aten convolution calls (a backward call computes both gradients)"]


def test_the_compiled_lesson_shows_the_code_that_produced_its_values():
    result = run_lesson("compiled")
    assert result.values["JAX"] == gan.jax_compiled_cost(gan.LESSON_GAN)
    assert "def jax_compiled_cost(config" in result.code["JAX"] and "cost_analysis()" in result.code["JAX"]
    assert "def torch_compiled_cost(config" in result.code["PyTorch"]
    assert LESSONS["compiled"].sizes["full"].image_size == 64 and LESSONS["compiled"].sizes["full"].batch_size == 128


def test_cli_runs_a_lesson_and_writes_markdown(tmp_path, capsys):
    out = tmp_path / "lessons.md"
    assert main(["lessons", "detach", "retain_graph", "--markdown", str(out)]) == 0
    printed = capsys.readouterr().out
    assert "== detach: detach() vs stop_gradient ==" in printed and "PyTorch:" in printed and "JAX:" in printed
    page = out.read_text()
    assert "y_hat.detach()" in page and "jax.lax.stop_gradient(y_hat)" in page and "### Why" in page


def test_cli_rejects_an_unknown_lesson(capsys):
    assert main(["lessons", "no_such_lesson"]) == 2
    assert "unknown lesson" in capsys.readouterr().err
