"""check-port: any PyTorch model's Flax port against PyTorch, judged against PyTorch's own float32 noise.

Three models from public code (examples/port/) pass in float32 and float64; a classic porting
mistake planted in each is named at the right stage and layer; the weight transfer knows each
standard layer's layout (checked by the forward outputs it produces, float64, 1e-10); specs it
cannot use get exit status 2 and a message that names the problem.
"""

import importlib.util
import json
import sys
from pathlib import Path

import flax.linen as fnn
import numpy as np
import pytest
import torch

from functional_gan import testing as port
from functional_gan.main import main
from tests.helpers import assert_agrees, one_torch_layer

EXAMPLES = Path(__file__).resolve().parents[1] / "examples" / "port"
NAMES = ("mnist_cnn", "resnet_basic", "nanogpt_block", "nanogpt_scan")


def _example(name: str):
    if str(EXAMPLES) not in sys.path:  # as check-port loads a spec: its neighbours importable (nanogpt_scan's block)
        sys.path.insert(0, str(EXAMPLES))
    spec = importlib.util.spec_from_file_location(f"example_{name}", EXAMPLES / f"{name}.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


# float64 of the ResNet and both nanoGPT ports among the slow tests (the default suite's time): mnist_cnn's float64,
# torchvision's resnet18 (test_check_port_apis.py) and the examples' float32 checks stay in the default suite
SLOW_FLOAT64 = ("resnet_basic", "nanogpt_block", "nanogpt_scan")


@pytest.mark.parametrize("name,dtype", [
    pytest.param(name, dtype, marks=pytest.mark.slow if dtype == "float64" and name in SLOW_FLOAT64 else ())
    for name in NAMES for dtype in ("float32", "float64")])
def test_the_ported_models_agree_with_pytorch(name, dtype):
    # float64 checks the compiled program and the op-by-op one (both must agree to 1e-10); float32 the compiled one.
    programs = port.PROGRAMS if dtype == "float64" else ("jit",)
    report = port.check_port(port.spec_from_module(_example(name)), dtype, steps=2 if name == "resnet_basic" else 1,
                             programs=programs)
    assert_agrees(report)
    stages = {row.stage for row in report.rows}
    assert {"forward", "output", "loss", "gradient", "update"} <= stages
    if dtype == "float64":  # the port is exact up to float64 rounding, compiled and op by op
        assert max(row.port_error for row in report.rows + report.other_rows) < 1e-10
        assert all(row.port_error <= 3 * max(row.noise, 8 * np.finfo(np.float64).eps) for row in report.rows)
    else:  # and in float32 within PyTorch's own error, k = 3 times over
        assert all(row.port_error <= 3 * max(row.noise, 4 * np.finfo(np.float32).eps)
                   for row in report.rows if not row.precision)


@pytest.mark.parametrize("name,mistake", [(n, m) for n in NAMES for m in _example(n).MISTAKES])
def test_a_planted_porting_mistake_is_named_at_its_stage_and_layer(name, mistake):
    module = _example(name)
    module.MISTAKE = mistake
    report = port.check_port(port.spec_from_module(module), "float32", steps=1, programs=("jit",))
    first = report.first_divergence
    assert first is not None, f"{mistake} was not found:\n{report.format()}"
    assert (first.stage, first.name) == module.MISTAKES[mistake], report.format()


@pytest.mark.parametrize("name,corrected", [("adam", True), ("adamw", True), ("nadam", True), ("amsgrad", True),
                                            ("adabelief", True), ("lion", False), ("sgd", False)])
def test_the_bias_correction_counterfactual_is_for_the_optimizers_that_correct(name, corrected):
    """optax's optimizers whose update divides by 1 − βᵗ (optax.tree.bias_correction) get the rerun with it exact;
    Lion, whose state also holds a moment ``mu``, has no bias correction and no such rerun or sentence."""
    import jax
    import optax

    from functional_gan.testing.precision import uses_adam

    params = {"w": np.zeros(3, np.float32)}
    init = getattr(optax, name)(1e-3).init
    assert uses_adam(init(params)) is corrected and uses_adam(jax.eval_shape(init, params)) is corrected


def test_optax_float32_bias_correction_is_a_note_with_its_verified_cause():
    """optax.adamw's 1 − βᵗ in float32 costs 6.4e-6 of each update: beyond PyTorch's float32 error, so never called
    agreement; the same optax update in float64 is right, so not a divergence; and within √eps (3.5e-4) of each scale,
    so a note that fails nothing, its cause named because the update recomputed with 1 − βᵗ exact loses the excess."""
    module = _example("nanogpt_block")
    module.MISTAKE = "optax-bias-correction"
    report = port.check_port(port.spec_from_module(module), "float32", programs=("jit",))
    assert report.first_divergence is None and not report.precision_findings and report.precision_notes, report.format()
    assert report.exit_status() == 0
    first = report.precision_notes[0]
    assert (first.stage, first.name) == module.FLOAT32_ONLY["optax-bias-correction"]
    assert first.ratio > 10 and first.port_error < 1e-4  # ≈ 14× PyTorch's own error, 6.4e-6 of the scale
    assert all(r.stage == "update" for r in report.precision_notes)
    assert any("optax computes Adam's bias corrections" in cause and "verified: rerun with 1 − βᵗ exact" in cause
               for cause in report.causes), report.causes
    assert "Note: " in report.verdict() and "optax" in report.verdict()
    module.MISTAKE = None
    clean = port.check_port(port.spec_from_module(module), "float32", programs=("jit",))
    assert not clean.precision_findings and not clean.precision_notes


def test_buffers_are_compared_when_the_model_has_running_statistics():
    report = port.check_port(port.spec_from_module(_example("resnet_basic")), "float64", steps=1, programs=("jit",))
    buffers = [row.name for row in report.rows if row.stage == "buffer"]
    assert "bn1.running_mean" in buffers and "layer2.downsample.1.running_var" in buffers


class _FlaxOne(fnn.Module):
    make: object

    @fnn.compact
    def __call__(self, x):
        return self.make()(x)


LAYERS = {  # PyTorch layer, its Flax counterpart written as a port author would, an input (PyTorch's layout)
    "Conv1d": (lambda: torch.nn.Conv1d(4, 6, 3, stride=2, padding=1),
               lambda: fnn.Conv(6, (3,), strides=(2,), padding=[(1, 1)]), (2, 4, 9)),
    "Conv2d groups": (lambda: torch.nn.Conv2d(4, 6, 3, padding=1, groups=2),
                      lambda: fnn.Conv(6, (3, 3), padding=[(1, 1)] * 2, feature_group_count=2), (2, 4, 5, 5)),
    "Conv3d": (lambda: torch.nn.Conv3d(2, 3, 2), lambda: fnn.Conv(3, (2, 2, 2), padding="VALID"), (2, 2, 4, 4, 4)),
    # PyTorch's padding p on a transposed convolution is k − 1 − p on each side of the dilated input.
    "ConvTranspose2d": (lambda: torch.nn.ConvTranspose2d(4, 3, 4, stride=2, padding=1),
                        lambda: fnn.ConvTranspose(3, (4, 4), strides=(2, 2), padding=[(2, 2)] * 2), (2, 4, 5, 5)),
    "ConvTranspose1d": (lambda: torch.nn.ConvTranspose1d(3, 2, 3, stride=2),
                        lambda: fnn.ConvTranspose(2, (3,), strides=(2,), padding="VALID"), (2, 3, 6)),
    "Linear": (lambda: torch.nn.Linear(5, 3), lambda: fnn.Dense(3), (4, 5)),
    "LayerNorm": (lambda: torch.nn.LayerNorm(5), lambda: fnn.LayerNorm(epsilon=1e-5), (4, 5)),
    "GroupNorm": (lambda: torch.nn.GroupNorm(2, 4), lambda: fnn.GroupNorm(num_groups=2, epsilon=1e-5), (2, 4, 3, 3)),
}


@pytest.mark.parametrize("kind", LAYERS)
def test_the_weight_transfer_knows_each_layout(kind):
    make_torch, make_flax, shape = LAYERS[kind]

    torch_model = one_torch_layer(make_torch)
    spec = port.Spec(torch_model, lambda: _FlaxOne(make_flax),
                     lambda: (np.random.default_rng(0).normal(size=shape).astype(np.float32),))
    report = port.check_port(spec, "float64")
    assert report.passed and max(r.port_error for r in report.rows) < 1e-10, report.format()


def test_embedding_is_transferred():
    spec = port.Spec(one_torch_layer(lambda: torch.nn.Embedding(10, 4)), lambda: _FlaxOne(lambda: fnn.Embed(10, 4)),
                     lambda: (np.array([[1, 5, 9], [0, 2, 2]]),), to_jax=lambda x: (x,), from_jax=np.asarray)
    report = port.check_port(spec, "float64")
    assert report.passed, report.format()
    assert [(p.torch_key, p.jax_name) for p in report.pairings] == [("layer.weight", "params/Embed_0/embedding")]


def test_check_port_and_check_by_block_take_a_spec_files_path():
    """As assert_port does: a path (str or Path) is loaded with load_spec (it was an AttributeError on 'str')."""
    from functional_gan.testing.blocks import check_by_block

    assert port.check_port(str(EXAMPLES / "minimal.py"), programs=("jit",)).exit_status() == 0
    # loaded, then refused for what the model is (a Sequential at its root: no list of blocks below it)
    with pytest.raises(port.SpecError, match="PyTorch's model has no ModuleList or Sequential of two or more"):
        check_by_block(EXAMPLES / "minimal.py", programs=("jit",))


def test_a_fault_of_check_ports_own_exits_2_with_its_traceback_never_1(monkeypatch, capsys):
    """An exception raised in check-port's code, not the spec's or the port's, is not a verdict: exit 2 (the check
    could not run) with its traceback and a line saying whose it is; it exited 1, a divergence, before."""
    from functional_gan.testing import check, memory

    # check-port's own code failing: its report phase replaced by one of its functions that takes other arguments
    monkeypatch.setattr(check, "_report", memory.trim)
    assert main(["check-port", str(EXAMPLES / "minimal.py")]) == 2
    err = capsys.readouterr().err
    assert "Traceback (most recent call last)" in err and "TypeError" in err
    last = err.strip().splitlines()[-1]
    assert last.startswith("functional-gan check-port: error: check-port itself failed: TypeError: "), last
    assert last.endswith("(its traceback is above; not a verdict on the port: please report it with the spec)"), last


def test_cli_writes_the_report_and_exits_by_the_outcome(tmp_path, capsys):
    out = tmp_path / "report.json"
    assert main(["check-port", str(EXAMPLES / "nanogpt_block.py"), "--json", str(out), "--markdown",
                 str(tmp_path / "report.md")]) == 0
    printed = capsys.readouterr().out
    assert "ln_1.weight" in printed and "Agreement: all" in printed
    data = json.loads(out.read_text())
    assert data["passed"] and data["rows"][0]["stage"] == "forward"
    planted = tmp_path / "planted.py"
    planted.write_text(
        "import importlib.util\n"
        f"_s = importlib.util.spec_from_file_location('base', {str(EXAMPLES / 'nanogpt_block.py')!r})\n"
        "base = importlib.util.module_from_spec(_s); _s.loader.exec_module(base)\n"
        "base.MISTAKE = 'gelu-tanh'\n"
        "torch_model, jax_model, example_inputs, example_targets = base.torch_model, base.jax_model, base.example_inputs, base.example_targets\n"
        "to_jax, from_jax = base.to_jax, base.from_jax\n")
    assert main(["check-port", str(planted)]) == 1
    assert "First divergence: forward, mlp.c_proj" in capsys.readouterr().out


@pytest.mark.parametrize(
    "body,message",
    [
        ("def torch_model(): pass\ndef example_inputs(): pass\n", "defines no jax_model()"),
        ("from base import *\ntorch_loss = lambda out, *a: out.sum()\n", "defines torch_loss() but not jax_loss()"),
        ("from base import *\nimport flax.linen as fnn\n"
         "class Extra(fnn.Module):\n    @fnn.compact\n    def __call__(self, x):\n"
         "        return fnn.Dense(3)(fnn.Dense(3)(x))\n"
         "jax_model = Extra\n", "the port's module(s) Dense_0 received no PyTorch weights"),
        ("from base import *\nimport flax.linen as fnn\n"
         "class Wrong(fnn.Module):\n    @fnn.compact\n    def __call__(self, x):\n        return fnn.Dense(4)(x)\n"
         "jax_model = Wrong\n", "fc.weight has shape (3, 5)"),
        ("raise RuntimeError('broken spec')\n", "fails to import"),
    ],
)
def test_a_spec_it_cannot_use_exits_2_with_a_clear_message(tmp_path, capsys, monkeypatch, body, message):
    (tmp_path / "base.py").write_text(
        "import numpy as np, torch, flax.linen as fnn\n"
        "class Net(torch.nn.Module):\n    def __init__(self):\n        super().__init__()\n"
        "        self.fc = torch.nn.Linear(5, 3)\n    def forward(self, x):\n        return self.fc(x)\n"
        "def torch_model():\n    return Net()\n"
        "def jax_model():\n    return fnn.Dense(3)\n"
        "def example_inputs():\n    return (np.ones((2, 5), np.float32),)\n")
    monkeypatch.syspath_prepend(str(tmp_path))
    spec = tmp_path / "spec.py"
    spec.write_text(body)
    assert main(["check-port", str(spec)]) == 2
    assert message in capsys.readouterr().err
    assert main(["check-port", str(tmp_path / "absent.py")]) == 2
