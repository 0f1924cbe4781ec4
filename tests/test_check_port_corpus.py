"""check-port on a corpus of correct ports nobody here wrote the checker for (tests/corpus/): each must agree (exit 0)
in float32 and float64, and a mistake planted in it must still be named at its layer, in both dtypes.

The corpus: a hand-written NNX port of pytorch/examples' MNIST Net (its float64 rows sat at 3.1–3.5× PyTorch's own
float64 error before the port's own error counted), a Linen GroupNorm net trained with optax.adam (optax's float32 bias
corrections: notes, not a failure), a forward-only port whose inner layer is laid out transposed (mapped, not a
divergence), an LSTM as PyTorch lays it out, whose layers both return tuples,
an NNX MobileNet block with BatchNorm of its own over 2 steps (each program's rows judged by the larger
of the two programs' float32 rounding), RMSNorms that compute in float32 inside a float64 model as transformers' do (on PyTorch's side, the port's,
or both: lower-precision islands), a linear layer scaled by a parameter of no axes (CLIP's ``logit_scale``), a
contrastive two-tower port whose logits have the batch on both axes, and Hugging Face's own Flax GPT-2 and Flax Llama against their PyTorch models (slow:
transformers 4.57.6)."""

import importlib.util
from pathlib import Path

import numpy as np
import pytest

from functional_gan import testing as port
from tests.helpers import dtypes

CORPUS = Path(__file__).resolve().parent / "corpus"


def _spec(name: str, extra_taps: dict | None = None, **settings):
    """The corpus spec ``name`` with ``settings`` replacing its module's names (and ``extra_taps`` added to its own
    TAPS: its functions are this module's copy's, each load being a module of its own)."""
    spec = importlib.util.spec_from_file_location(f"corpus_{name}", CORPUS / f"{name}.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    for key, value in settings.items():
        setattr(module, key, value)
    if extra_taps:
        module.TAPS = {**module.TAPS, **extra_taps}
    return port.spec_from_module(module)


def _agrees(report):
    assert report.exit_status() == 0 and report.first_divergence is None and not report.precision_findings, \
        report.format()


# Each port in one dtype in the default suite, the other among the slow tests: float64 where its history is (the MNIST
# port's float64 rows at 3.1-3.5x, the MobileNet block's float64 false alarm, the LSTM), float32 where the test asserts
# float32's notes (the GroupNorm net's Adam bias corrections); the small transposed projection in both.
CORRECT_PORTS = {"mnist_nnx_handwritten": (2, "float64"), "linen_adam_groupnorm": (2, "float32"),
                 "transposed_proj": (1, None), "mobilenet_nnx_block": (2, "float64"), "lstm_torch_layout": (1, "float64")}


@pytest.mark.parametrize("name,steps,dtype", [
    pytest.param(name, steps, d.values[0], marks=d.marks if default else ())
    for name, (steps, default) in CORRECT_PORTS.items() for d in dtypes(default or "float32")])
def test_a_correct_port_agrees_in_either_dtype(name, steps, dtype):
    report = port.check_port(_spec(name), dtype, steps=steps)
    _agrees(report)
    if name == "transposed_proj":  # mapped by its axes, and compared
        assert not report.not_compared and any("compared with the port's axes in the order (1, 0)" in n
                                               for n in report.notes), report.format()
    if name == "linen_adam_groupnorm" and dtype == "float32":  # optax's bias corrections: notes with a verified cause
        assert report.precision_notes and all(r.stage.endswith("update") for r in report.precision_notes)
        assert any("verified: rerun with 1 − βᵗ exact" in c for c in report.causes), report.causes


@pytest.mark.parametrize("dtype", dtypes("float32"))
def test_gates_in_another_order_in_the_lstm_port_are_named_at_the_lstm(dtype):
    """The LSTM's packed gates read as i, f, o, g (PyTorch's order is i, f, g, o): named at the LSTM's own row, the
    first array of the tuple both sides return."""
    report = port.check_port(_spec("lstm_torch_layout", GATES="ifog"), dtype, programs=("jit",))
    first = report.first_divergence
    assert first is not None and (first.stage, first.name) == ("forward", "lstm"), report.format()


def test_an_nnx_variable_updated_in_place_runs_op_by_op_in_float64():
    """The float64 check's float32 run of the port starts from JAX arrays, as its float64 runs do: an NNX BatchStat
    updated with ``[...] =`` held a NumPy array there, which cannot take a traced value (exit 2, blamed on the spec)."""
    _agrees(port.check_port(_spec("mobilenet_nnx_block"), "float64", programs=("eager",)))


@pytest.mark.parametrize("dtype,scaled", [("float32", 1e-3), ("float64", 1e-6)])
def test_a_scaled_activation_in_the_mnist_port_is_named_at_the_next_layer(dtype, scaled):
    """fc1's output scaled by 1 + ε after the layer (its recorded output unchanged): named at fc2, in float64 at
    ε = 1e-6 (a thousand times below the float32 check's reach here)."""
    report = port.check_port(_spec("mnist_nnx_handwritten", FC1_SCALED=scaled), dtype, programs=("jit",))
    first = report.first_divergence
    assert first is not None and (first.stage, first.name) == ("forward", "fc2"), report.format()


@pytest.mark.parametrize("dtype", dtypes("float64"))
def test_a_changed_eps_in_the_groupnorm_port_is_named_at_it(dtype):
    report = port.check_port(_spec("linen_adam_groupnorm", EPSILON=1e-3), dtype, programs=("jit",))
    first = report.first_divergence
    assert first is not None and (first.stage, first.name) == ("forward", "norm1"), report.format()


@pytest.mark.parametrize("island", ["both", "torch", "port"])
def test_a_float32_island_inside_a_float64_model_is_named_and_judged_at_its_precision(island):
    """transformers' RMSNorm casts to float32 inside a float64 model (PyTorch's own error there is a float32 one); the
    port's FlaxLlamaRMSNorm computes its variance in float32. Before islands were measured: exit 1 at 6.6e7–8.5e7×."""
    report = port.check_port(_spec("rmsnorm_island", ISLAND=island), "float64", steps=2)
    _agrees(report)
    torch_notes = [n for n in report.notes if n.startswith("PyTorch computes")]
    port_notes = [n for n in report.notes if n.startswith("the port computes")]
    assert [n.split(" in float32")[0] for n in torch_notes] == (
        ["PyTorch computes norm1", "PyTorch computes norm2"] if island != "port" else []), report.notes
    assert [n.split(" in float32")[0] for n in port_notes] == (
        ["the port computes its module norm1", "the port computes its module norm2"] if island != "torch" else []), \
        report.notes
    # judged against the island's precision: an allowance of float32's size where it shows, float64's before it
    rows = {r.key: r for r in report.rows if r.step == 2}
    assert rows["forward", "up"].allowed < 1e-14 and rows["forward", "norm2"].allowed > 1e-8


def test_the_island_port_agrees_in_float32_too():
    _agrees(port.check_port(_spec("rmsnorm_island"), "float32", steps=2))


@pytest.mark.parametrize("dtype", ["float32", "float64"])
def test_a_mistake_after_an_island_is_still_named(dtype):
    """The middle Linear's output scaled by 1 + 1e-5 in the port, between two float32 islands: named where it shows."""
    report = port.check_port(_spec("rmsnorm_island", OUT_SCALED=1e-5), dtype, programs=("jit",))
    first = report.first_divergence
    assert first is not None and (first.stage, first.name) == ("forward", "norm2"), report.format()


@pytest.mark.parametrize("mistake,row", [("rope-interleaved", "layers.1:rope[0]"), ("gqa-tiled", "layers.0:repeat_kv[0]")])
def test_attention_mistakes_are_named_at_the_tapped_functions_rows(mistake, row):
    """TAPS: each side's rotary embedding and key/value repeat recorded per call and paired in order: an interleaved
    RoPE and a tiled GQA, both first seen at o_proj without them, are named apart."""
    report = port.check_port(_spec("keyword_decoder", MISTAKE=mistake), "float32", programs=("jit",))
    assert (report.first_divergence.stage, report.first_divergence.name) == ("forward", row), report.format()


def test_a_correct_port_with_taps_agrees_with_a_row_per_tapped_tensor():
    report = port.check_port(_spec("keyword_decoder"), "float64", programs=("jit",))
    _agrees(report)
    names = [r.name for r in report.rows if r.stage == "forward"]
    assert names[5:9] == ["layers.0:rope[0]", "layers.0:rope[1]", "layers.0:repeat_kv[0]", "layers.0:repeat_kv[1]"], names


@pytest.mark.parametrize("dtype", ["float32", "float64"])
def test_a_mistake_in_the_transposed_layer_is_named_at_it(dtype):
    report = port.check_port(_spec("transposed_proj", MISTAKE="proj-without-bias"), dtype, programs=("jit",))
    first = report.first_divergence
    assert first is not None and (first.stage, first.name) == ("forward", "proj"), report.format()


def test_a_layer_whose_layout_cannot_be_mapped_is_not_compared_and_not_a_divergence():
    spec = _spec("transposed_proj")
    apply = spec.jax_apply

    def flattened(params, x):  # the port's proj output flattened: no order of axes gives PyTorch's (N, 3)
        out = apply(params, x)
        return out

    import jax.numpy as jnp

    from functional_gan.testing import tap

    def jax_apply(params, x):
        h = params["proj"]["weight"] @ x.T + params["proj"]["bias"][:, None]
        tap("proj", h.reshape(-1))
        return tap("head", jnp.tanh(h).T @ params["head"]["weight"].T + params["head"]["bias"])

    spec.jax_apply = jax_apply
    report = port.check_port(spec, "float32", programs=("jit",))
    assert report.exit_status() == 0 and [r.name for r in report.not_compared] == ["proj"], report.format()
    text = report.format()
    assert "Not compared" in text and "1 layer output not compared" in text

    def wrong_head(params, x):  # the same, and a divergence after it: the head's bias doubled
        h = params["proj"]["weight"] @ x.T + params["proj"]["bias"][:, None]
        tap("proj", h.reshape(-1))
        return tap("head", jnp.tanh(h).T @ params["head"]["weight"].T + 2 * params["head"]["bias"])

    spec.jax_apply = wrong_head
    report = port.check_port(spec, "float32", programs=("jit",))
    first = report.first_divergence  # the row that differs, never the one that could not be compared before it
    assert (first.stage, first.name) == ("forward", "head"), report.format()
    assert ("Before it, 1 layer output not compared (a layout the checker could not map): forward, proj; a divergence "
            "may start there unseen.") in report.format()


@pytest.mark.slow
@pytest.mark.parametrize("dtype", ["float32", "float64"])
def test_hugging_faces_flax_gpt2_agrees_with_its_pytorch_gpt2(dtype, monkeypatch):
    pytest.importorskip("transformers")
    monkeypatch.setenv("HF_GPT2_SIZE", "wide")
    report = port.check_port(_spec("hf_gpt2"), dtype)
    _agrees(report)


@pytest.mark.slow
@pytest.mark.parametrize("dtype", ["float32", "float64"])
def test_hugging_faces_flax_llama_agrees_with_its_pytorch_llama(dtype):
    """Both sides compute their RMSNorms (and PyTorch its softmax and rotary tables) in float32 inside float64."""
    pytest.importorskip("transformers")
    report = port.check_port(_spec("hf_llama"), dtype)
    _agrees(report)
    assert any(n.startswith("PyTorch computes model.layers.*.input_layernorm in float32") for n in report.notes)
    if dtype == "float64":
        assert any(n.startswith("the port computes its module model/layers/*/input_layernorm in float32")
                   for n in report.notes), report.notes


_CRASHING = '''
import numpy as np, torch, jax.numpy as jnp
CALLS = []
def torch_model(): return torch.nn.Linear(3, 2)
def example_inputs(): return (np.ones((4, 3), np.float32),)
def example_targets(): return (np.ones((4, 2), np.float32),)
def torch_loss(out, x, t): return ((out - t) ** 2).mean()
def jax_loss(out, x, cache, t): return ((out - t) ** 2).mean()
def jax_params(): return {"weight": jnp.zeros((2, 3)), "bias": jnp.zeros(2)}
def jax_apply(p, x, cache):
    CALLS.append(1)
    if len(CALLS) > 6:  # past the first steps: an exception in the port's code at a later step
        raise RuntimeError("the port broke")
    return x @ p["weight"].T + p["bias"]
def to_jax(x): return (x, None)  # the port takes an empty cache
'''


def test_an_exception_in_the_spec_exits_2_naming_its_function_never_1(tmp_path, capsys):
    from functional_gan.main import main

    spec = tmp_path / "crashing_spec.py"
    spec.write_text(_CRASHING)
    assert main(["check-port", str(spec), "--steps", "6", "--program", "eager"]) == 2
    err = capsys.readouterr().err
    assert "the spec's jax_apply() (crashing_spec.py:" in err and "RuntimeError: the port broke" in err, err
    assert len(err.strip().splitlines()) == 1  # one line, no traceback


def test_from_jax_is_applied_to_an_output_object_before_it_is_compared():
    """A port returning an object and a spec whose from_jax picks its field (no OUTPUT): compared at that field."""
    import dataclasses

    import jax
    import jax.numpy as jnp

    spec = _spec("transposed_proj")
    apply = spec.jax_apply

    @jax.tree_util.register_dataclass
    @dataclasses.dataclass
    class Out:
        logits: jax.Array

    spec.jax_apply = lambda params, x: Out(apply(params, x))
    spec.from_jax = lambda out: out.logits
    report = port.check_port(spec, "float32", programs=("jit",))
    _agrees(report)
    assert any(r.stage == "output" for r in report.rows)


def test_without_taps_a_rope_mistake_is_named_at_o_proj_and_the_lopsided_gradients_point_at_it():
    report = port.check_port(_spec("keyword_decoder", MISTAKE="rope-interleaved", TAPS=None), "float32",
                             programs=("jit",))
    assert report.first_divergence.name == "layers.1.o_proj", report.format()
    lopsided = [n for n in report.notes if n.startswith("among layers.1's weight gradients, q_proj.weight and "
                                                        "k_proj.weight are")]
    assert lopsided and "rotary embedding" in lopsided[0], report.notes


def test_the_first_pages_minimal_spec_agrees_and_its_gelu_mistake_is_named(capsys):
    """docs/check-port.md's first page: examples/port/minimal.py exits 0, minimal_mistake.py (Flax's tanh GELU) 1."""
    from functional_gan.main import main

    examples = Path(__file__).resolve().parents[1] / "examples" / "port"
    assert main(["check-port", str(examples / "minimal.py"), "--program", "jit"]) == 0
    assert main(["check-port", str(examples / "minimal_mistake.py"), "--program", "jit"]) == 1
    assert "First divergence: forward, 2:" in capsys.readouterr().out


@pytest.mark.parametrize("name,mistake,dtype", [  # one dtype each in the default suite, the other among the slow tests
    *(pytest.param("nnx_scan_stack", {"EPSILON": 1e-6}, d.values[0], marks=d.marks) for d in dtypes("float32")),
    *(pytest.param("equinox_scan_stack", {"EPS": 1e-6}, d.values[0], marks=d.marks) for d in dtypes("float64"))])
def test_layers_inside_a_scan_over_a_stack_get_their_rows_and_a_mistake_there_is_named(name, mistake, dtype, monkeypatch):
    """NNX (nnx.scan) and Equinox (lax.scan over eqx.combine) call fresh module objects inside the scan: each is known
    by its class (one stacked module of it), its submodules by their paths below it; before, those layers had no rows
    at all."""
    monkeypatch.syspath_prepend(str(CORPUS))
    report = port.check_port(_spec(name), dtype, programs=("jit",))
    _agrees(report)
    assert [r.name for r in report.rows if r.stage == "forward"][:4] == ["layers.0.fc", "layers.0.norm", "layers.0",
                                                                       "layers.1.fc"], report.format()
    wrong = port.check_port(_spec(name, **mistake), dtype, programs=("jit",))
    assert (wrong.first_divergence.stage, wrong.first_divergence.name) == ("forward", "layers.0.norm"), wrong.format()


@pytest.mark.parametrize("name", ["nnx_scan_stack", "equinox_scan_stack"])
def test_a_mistake_after_the_last_module_of_a_scanned_layer_is_named_at_that_layer(name, monkeypatch):
    """Each layer of a scanned stack has a row of its own (``layers.k``, the scan body's output at iteration k) beside
    its sublayers': a mistake in a function of PyTorch's layer 1 after its last parametrised module (its output 1%
    larger) is named at ``layers.1``, not one layer late at ``layers.2.fc``."""
    monkeypatch.syspath_prepend(str(CORPUS))
    spec = _spec(name)
    plain = spec.torch_model

    def planted():
        model = plain()
        model.layers[1].register_forward_hook(lambda module, args, out: out * 1.01)
        return model

    spec.torch_model = planted
    report = port.check_port(spec, "float32", programs=("jit",))
    first = report.first_divergence
    assert (first.stage, first.name) == ("forward", "layers.1"), report.format()


@pytest.mark.parametrize("dtype", dtypes("float64"))  # where the fault was
def test_a_port_with_a_parameter_of_no_axes_agrees(dtype):
    """CLIP's ``logit_scale``, ``nn.Parameter(torch.tensor(x))``: the float64 check moved it by one ulp as a NumPy
    scalar, which torch.from_numpy refused (exit 2, blamed on the spec)."""
    _agrees(port.check_port(_spec("scalar_parameter"), dtype, steps=2))


def test_an_exception_inside_pythons_own_modules_is_check_ports_fault_not_the_specs():
    """A TypeError raised through ``<frozen _collections_abc>`` (a ``name in mapping`` inside check-port) was blamed on
    the spec ("the check stopped on an exception raised in __contains__() (…/<frozen _collections_abc>:780)")."""
    import collections
    import os

    import functional_gan
    from functional_gan.cli.checks import _users_frame

    ours = os.path.join(os.path.dirname(functional_gan.__file__), "testing", "torch_side.py")
    namespace = {}
    exec(compile("def run(f):\n    try:\n        f()\n    except Exception as error:\n        return error\n", ours, "exec"),
         namespace)
    exec(compile("def inner():\n    raise TypeError('expected np.ndarray')\n", "<frozen _collections_abc>", "exec"),
         namespace)
    error = namespace["run"](namespace["inner"])  # caught in check-port's frame: the traceback holds it and the frozen one
    assert isinstance(error, TypeError)
    assert _users_frame(error, "spec.py") is None  # check-port's own fault: its traceback, not the spec's
    standard = collections.__file__  # the standard library's own files are nobody's port either
    exec(compile("def inner2():\n    raise TypeError('x')\n", standard, "exec"), namespace)
    assert _users_frame(namespace["run"](namespace["inner2"]), "spec.py") is None


@pytest.mark.parametrize("dtype", dtypes("float32"))  # where the allowance bought silence
def test_batch_by_batch_logits_are_put_back_on_both_axes_and_a_ten_percent_error_is_named_at_them(dtype):
    """A contrastive two-tower port's logits have the batch on both axes. The batch-permuted PyTorch runs were put back
    along the first axis only: PyTorch's "own error" on the output came out at 1.2 of its scale (float32), and the
    allowance let a 10% error on the logits pass. Every row's PyTorch error is now rounding's size."""
    report = port.check_port(_spec("two_tower"), dtype)
    _agrees(report)
    rounding = {"float32": 1e-5, "float64": 1e-13}[dtype]  # a few hundred ulps at most, against 1.2 before
    assert max(row.noise for row in report.rows if row.noise is not None) < rounding, report.format()
    planted = port.check_port(_spec("two_tower", MISTAKE="logits-10pct"), dtype)
    first = planted.first_divergence
    assert first is not None and (first.stage, first.name) == ("forward", "(model)"), planted.format()


def test_a_permuted_runs_error_beyond_rounding_is_left_out_with_a_note():
    """The guard behind the un-permutation: a batch-permuted run whose error no rounding explains (an axis it could
    not put back) does not widen the allowance; the quantity is judged against the runs in order, and a note says so."""
    from functional_gan.testing.judge import Measured
    from functional_gan.testing.torch_side import joined_noise, unpermuted_error

    class Run:
        dtype, notes = "float32", set()

    plain = {"layers": {"fc": Measured(2e-7)}, "grads": {}, "after": {}, "input_grads": {},
             "output": Measured(1e-7), "loss": Measured(5e-8)}
    permuted = {"layers": {"fc": Measured(3e-7)}, "grads": {}, "after": {}, "input_grads": {},
                "output": Measured(0.15), "loss": Measured(6e-8)}
    joined = joined_noise(Run, plain, permuted)
    assert joined["output"] == 1e-7 and joined["layers"]["fc"] == 3e-7 and joined["loss"] == 6e-8
    assert Run.notes == {"output: PyTorch's run with the batch in another order differs from its float64 result by "
                         "0.15 of the scale, more than rounding explains (the runs in order: 1e-07); judged against "
                         "the runs that keep the batch in order"}
    # the un-permutation itself: a (B, B) array permuted on both axes is put back on both
    rng = np.random.default_rng(0)
    reference, order = rng.normal(size=(5, 5)), rng.permutation(5)
    first_axis_put_back = reference[order][:, order][np.argsort(order)]  # what run_torch_step hands over
    assert unpermuted_error(first_axis_put_back, reference, order) == 0.0
    assert relative_error_of(first_axis_put_back, reference) > 0.1


def relative_error_of(values, reference):
    from functional_gan.testing.judge import relative_error

    return float(relative_error(values, reference))


def eager_attention_forward(*args):  # a tapped function neither side calls (transformers' Llama under SDPA)
    raise AssertionError("never called")


def port_attention(*args):
    raise AssertionError("never called")


def test_a_tap_never_called_on_a_side_is_reported_with_the_likely_reason():
    report = port.check_port(_spec("keyword_decoder", extra_taps={"attention": (eager_attention_forward, port_attention)}),
                             "float32", programs=("jit",))
    _agrees(report)
    silent = sorted(n for n in report.notes if n.startswith("TAPS["))
    assert [n.split(" was never called")[0] for n in silent] == [
        "TAPS['attention']: PyTorch's function eager_attention_forward", "TAPS['attention']: the port's function port_attention"]
    assert all("attn_implementation='eager'" in n for n in silent)
