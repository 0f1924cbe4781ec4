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
    func_side = linear_regression.torch_func_accumulation()
    first = np.array(torch_side["after first backward(): b.grad, w.grad"])
    second = np.array(torch_side["after second backward(): b.grad, w.grad"])
    # The numbers the book and the source note print (4 decimals), from the book's starting point as printed
    # (4 decimals: b and w each within 5e-5 of the GPU's draw, which moves b.grad = 2·mean(e) by up to
    # 2·(5e-5 + mean(x)·5e-5) < 1.5e-4), plus the printed values' own rounding.
    np.testing.assert_allclose(first, [-3.3881, -1.9439], atol=2e-4)
    np.testing.assert_allclose(second, [-6.7762, -3.8878], atol=4e-4)
    np.testing.assert_allclose(second, 2 * first, rtol=1e-6)  # float32 doubling is exact up to rounding
    assert torch_side["after zero_(): b.grad"] == 0.0
    # PyTorch's CPU generator with the book's seed: other numbers than its GPU draw.
    assert torch_side["manual_seed(42) on the CPU: b, w"] == [0.3367, 0.1288]
    np.testing.assert_allclose(torch_side["its first backward(): b.grad"], -3.1125, atol=5e-5)
    # torch.func.grad and jax.grad: values, equal twice, nothing accumulated, no .grad filled.
    assert func_side["first torch.func.grad: b, w"] == func_side["second torch.func.grad: b, w"]
    assert func_side["params['b'].grad afterwards"] is None
    np.testing.assert_allclose(func_side["first torch.func.grad: b, w"], first, rtol=1e-6)
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
    with pytest.raises(SystemExit) as refused:  # a usage error, from argparse: exit status 2
        main(["lessons", "no_such_lesson"])
    assert refused.value.code == 2
    assert "unknown lesson" in capsys.readouterr().err


# --- the third column: PyTorch's functional API, torch.func ---------------------------------------


def test_torch_func_sides_with_jax_on_detach_argnums_and_no_grad():
    detach, jax_detach = basics.torch_func_detach(), basics.jax_stop_gradient()
    # Unlike torch.autograd.grad (an error), torch.func.grad through detach() gives 0, as JAX does.
    assert detach["torch.func.grad through y_hat.detach()"] == jax_detach["grad through stop_gradient(y_hat)"] == 0.0
    assert detach["torch.func.grad, connected"] == jax_detach["grad, connected"] == -2.0
    argnums = basics.torch_func_argnums()
    assert argnums["grad wrt z (argnums=2)"] == [1.0, 1.0] and argnums["grads wrt x and z (argnums=(0, 2))"] == 2
    assert argnums["z.requires_grad afterwards"] is False
    no_grad = basics.torch_func_no_grad()
    assert no_grad["grad of (no_grad: 3x) + 2x"] == 2.0  # a no_grad block inside: a constant, like stop_gradient
    assert no_grad["grad of 3x + 2x, called under no_grad"] == 5.0  # around the call: ignored (functorch#13)


def test_torch_func_traces_a_program_and_reuses_its_pullback():
    traced = basics.torch_func_make_fx()
    assert traced["make_fx of y_hat: aten ops"] == ["aten.mul.Tensor", "aten.add.Tensor"]
    assert len(traced["make_fx of its gradient: aten ops"]) > 0
    pullback, jax_side = basics.torch_func_vjp_reuse(), basics.jax_vjp_reuse()
    expected = np.exp(3.0) * 4.0  # d/dx x·e^x = e^x (1 + x)
    assert pullback["vjp(1.0), first"] == pullback["vjp(1.0), second"] == pytest.approx(expected, rel=1e-6)
    assert pullback["vjp(1.0), first"] == pytest.approx(jax_side["vjp(1.0), first"], rel=1e-6)


def test_torch_func_update_and_gan_step_agree_with_the_other_columns():
    update = linear_regression.torch_func_new_values()
    b, w = linear_regression.torch_update_pitfalls()["under no_grad, 1000 epochs: b, w"]
    assert update["params = p - lr * g, 1000 epochs: b, w"] == pytest.approx([b, w], abs=1e-5)
    func_side, torch_side = gan.torch_func_gan_step(), gan.torch_gan_step()
    assert func_side["grad wrt D only: its keys are D's parameters"] is True
    assert func_side["grad wrt D only: identical with and without detach()"] is True
    assert func_side["grad wrt G and D, with detach(): sum of |G's gradient|"] == 0.0
    # Same nets, data and noise as the autograd column: the same gradient reaches G without detach().
    assert func_side["grad wrt G and D, without detach(): sum of |G's gradient|"] == pytest.approx(
        torch_side[gan.TORCH_G_GRAD_SUM.format(cut="without detach()")], rel=1e-5)
    assert func_side["netG parameters with a .grad afterwards"] == 0


def test_every_lesson_has_a_torch_func_column_except_the_ones_about_cost():
    # `compiled`, `compiled_wgan_gp` (FLOPs of the compiled program) and `no_grad_memory` (what is kept for
    # backward) measure autograd and XLA themselves; torch.func runs on autograd and has no cost story of its own.
    assert [name for name, lesson in LESSONS.items() if "torch.func" not in lesson.sides] == [
        "compiled", "compiled_wgan_gp", "no_grad_memory"]


def test_wgan_gp_compiled_cost_shows_the_penalty_and_the_cut():
    jax_rows, torch_rows = gan.jax_wgan_gp_cost(gan.LESSON_GAN), gan.torch_wgan_gp_cost(gan.LESSON_GAN)
    conv, flop = "convolutions in the optimised HLO", "GFLOP (XLA cost analysis)"
    plain = jax_rows["grad wrt the critic, without the penalty"]
    step = jax_rows["grad wrt the critic, with the penalty (the real step)"]
    assert step[conv] > plain[conv] and step[flop] > 1.3 * plain[flop]  # the gradient of a gradient costs
    assert jax_rows["grad wrt G and the critic, with the penalty, with stop_gradient"] == step  # G's backward removed
    uncut = jax_rows["grad wrt G and the critic, with the penalty, without stop_gradient"]
    assert uncut[conv] > step[conv] and uncut[flop] > step[flop]
    calls, tflop = "aten convolution calls", "GFLOP (FlopCounterMode)"
    no_penalty = torch_rows["critic step without the penalty, with detach()"]
    penalty = torch_rows["critic step with the penalty, with detach()"]
    no_detach = torch_rows["critic step with the penalty, without detach()"]
    assert penalty[calls] > no_penalty[calls] and penalty[tflop] > 1.3 * no_penalty[tflop]
    assert no_detach[calls] > penalty[calls] and no_detach[tflop] > penalty[tflop]


def test_the_nnx_columns_give_the_other_columns_numbers():
    """Flax NNX's column where its answer differs from JAX's: the same numbers as JAX (float32: 1e-6 relative, two
    traces of the same arithmetic) and PyTorch (the book's 1000 epochs: 1e-5, as the JAX column is checked)."""
    nnx_side, jax_side = basics.nnx_filters(), basics.jax_argnums()
    assert nnx_side["grad wrt z (nnx.grad: the module's nnx.Param)"] == jax_side["grad wrt z (argnums=2)"] == [1.0, 1.0]
    assert nnx_side["the gradient's entries (x, y are nnx.Variable, not Param)"] == ["z"]
    assert nnx_side["DiffState(0, head filter): the gradient's modules"] == ["head"]
    assert nnx_side["after optimizer.update: encoder unchanged"] is True
    assert nnx_side["after optimizer.update: head changed"] is True

    nnx_side, jax_side = linear_regression.nnx_gradients_are_values(), linear_regression.jax_gradients_are_values()
    np.testing.assert_allclose(nnx_side["first nnx.grad: b, w"], jax_side["first jax.grad: b, w"], rtol=1e-6)
    assert nnx_side["second nnx.grad: b, w"] == nnx_side["first nnx.grad: b, w"]  # nothing accumulated
    assert nnx_side["the model's parameters have a .grad"] is False
    np.testing.assert_allclose(nnx_side["MultiSteps(4 × 20 examples) in an nnx.Optimizer: b, w"],
                               nnx_side["one SGD step on all 80: b, w"], rtol=1e-6, atol=1e-7)
    np.testing.assert_allclose(nnx_side["one SGD step on all 80: b, w"], jax_side["one SGD step on all 80: b, w"], rtol=1e-6)

    nnx_side = linear_regression.nnx_in_place_updates()
    b, w = linear_regression.torch_update_pitfalls()["under no_grad, 1000 epochs: b, w"]
    assert nnx_side["nnx.Optimizer.update in place, 1000 epochs: b, w"] == pytest.approx([b, w], abs=1e-5)
    x, y, params = linear_regression.book_setup()  # one hand-written step on b: b − 0.1 · 2·mean(b + w·x − y)
    b0, w0 = float(params["b"]), float(params["w"])
    expected = b0 - 0.1 * 2 * np.mean(b0 + w0 * np.asarray(x, np.float64) - np.asarray(y, np.float64))
    assert nnx_side["model.b[...] -= lr * grad, outside no_grad: b"] == pytest.approx(expected, rel=1e-6)

    nnx_side, jax_side = gan.nnx_gan_step(), gan.jax_gan_step()
    for label in jax_side:
        assert nnx_side[label] == pytest.approx(jax_side[label], rel=1e-6), label
    assert nnx_side[gan.JAX_G_GRAD_SUM.format(cut="with stop_gradient")] == 0.0
    assert nnx_side["G step, nnx.grad(g_loss)(G, D): its keys are G's modules"] is True
    assert nnx_side["after a pass in G.eval(): running statistics unchanged"] is True
    assert nnx_side["after a pass in G.train(): running means moved"] is True


def test_nnx_columns_stand_where_nnx_answers_differently_from_jax():
    # Elsewhere (detach, grad_fn, no_grad, retain_graph, truncated BPTT, SimSiam, the gradient penalty, the
    # compiled costs) NNX code is the JAX column's code; the families' introductions say so.
    assert [name for name, lesson in LESSONS.items() if "NNX" in lesson.sides] == [
        "requires_grad", "accumulation", "update", "gan_step", "straight_through", "target_network", "ema_generator"]
