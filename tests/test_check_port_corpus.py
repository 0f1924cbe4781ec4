"""check-port on a corpus of correct ports nobody here wrote the checker for (tests/corpus/): each must agree (exit 0)
in float32 and float64, and a mistake planted in it must still be named at its layer, in both dtypes.

The corpus: a hand-written NNX port of pytorch/examples' MNIST Net (its float64 rows sat at 3.1–3.5× PyTorch's own
float64 error before the port's own error counted), a Linen GroupNorm net trained with optax.adam (optax's float32 bias
corrections: notes, not a failure), a forward-only port whose inner layer is laid out transposed (mapped, not a
divergence), an LSTM as PyTorch lays it out, whose layers both return tuples,
an NNX MobileNet block with BatchNorm of its own over 2 steps (each program's rows judged by the larger
of the two programs' float32 rounding), RMSNorms that compute in float32 inside a float64 model as transformers' do (on PyTorch's side, the port's,
or both: lower-precision islands), and Hugging Face's own Flax GPT-2 and Flax Llama against their PyTorch models (slow:
transformers 4.57.6)."""

import importlib.util
from pathlib import Path

import pytest

from functional_gan import testing as port

CORPUS = Path(__file__).resolve().parent / "corpus"


def _spec(name: str, **settings):
    spec = importlib.util.spec_from_file_location(f"corpus_{name}", CORPUS / f"{name}.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    for key, value in settings.items():
        setattr(module, key, value)
    return port.spec_from_module(module)


def _agrees(report):
    assert report.exit_status() == 0 and report.first_divergence is None and not report.precision_findings, \
        report.format()


@pytest.mark.parametrize("dtype", ["float32", "float64"])
@pytest.mark.parametrize("name,steps", [("mnist_nnx_handwritten", 2), ("linen_adam_groupnorm", 2), ("transposed_proj", 1),
                                        ("mobilenet_nnx_block", 2), ("lstm_torch_layout", 1)])
def test_a_correct_port_agrees_in_either_dtype(name, steps, dtype):
    report = port.check_port(_spec(name), dtype, steps=steps)
    _agrees(report)
    if name == "transposed_proj":  # mapped by its axes, and compared
        assert not report.not_compared and any("compared with the port's axes in the order (1, 0)" in n
                                               for n in report.notes), report.format()
    if name == "linen_adam_groupnorm" and dtype == "float32":  # optax's bias corrections: notes with a verified cause
        assert report.precision_notes and all(r.stage.endswith("update") for r in report.precision_notes)
        assert any("verified: rerun with 1 − βᵗ exact" in c for c in report.causes), report.causes


@pytest.mark.parametrize("dtype", ["float32", "float64"])
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


@pytest.mark.parametrize("dtype", ["float32", "float64"])
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


@pytest.mark.parametrize("dtype", ["float32", "float64"])
@pytest.mark.parametrize("name,mistake", [("nnx_scan_stack", {"EPSILON": 1e-6}), ("equinox_scan_stack", {"EPS": 1e-6})])
def test_layers_inside_a_scan_over_a_stack_get_their_rows_and_a_mistake_there_is_named(name, mistake, dtype, monkeypatch):
    """NNX (nnx.scan) and Equinox (lax.scan over eqx.combine) call fresh module objects inside the scan: each is known
    by its class (one stacked module of it), its submodules by their paths below it; before, those layers had no rows
    at all."""
    monkeypatch.syspath_prepend(str(CORPUS))
    report = port.check_port(_spec(name), dtype, programs=("jit",))
    _agrees(report)
    assert [r.name for r in report.rows if r.stage == "forward"][:4] == ["layers.0.fc", "layers.0.norm", "layers.1.fc",
                                                                       "layers.1.norm"], report.format()
    wrong = port.check_port(_spec(name, **mistake), dtype, programs=("jit",))
    assert (wrong.first_divergence.stage, wrong.first_divergence.name) == ("forward", "layers.0.norm"), wrong.format()
