"""check-port on ports written in Flax NNX, Equinox and plain JAX functions, the compiled program, bad specs, assert_port.

The MNIST ``Net`` of pytorch/examples is ported in NNX and Equinox (examples/port/) and must agree in float32
and float64 with a row per layer; a planted mistake in each is named where it first shows. The weight transfer
knows each API's layouts (checked by the forward outputs, float64, 1e-10). A difference that only the compiled
program shows is reported as a JAX/XLA matter; every spec it cannot use gets one line and exit status 2, a port
whose output has another shape exit status 1 with both shapes.
"""

import importlib.util
import json
import sys
import textwrap
from pathlib import Path

import equinox as eqx
import jax
import jax.numpy as jnp
import numpy as np
import pytest
import torch
from flax import nnx

from functional_gan import testing as port
from functional_gan.testing import tap
from functional_gan.main import main
from tests.helpers import assert_agrees, dtypes, one_torch_layer

EXAMPLES = Path(__file__).resolve().parents[1] / "examples" / "port"
PORTS = {"mnist_cnn_nnx": "Flax NNX", "mnist_cnn_equinox": "Equinox"}


def _example(name: str):
    sys.path.insert(0, str(EXAMPLES))  # the specs import mnist_cnn.py from their folder, as load_spec lets them
    try:
        spec = importlib.util.spec_from_file_location(f"example_{name}", EXAMPLES / f"{name}.py")
        module = importlib.util.module_from_spec(spec)
        spec.loader.exec_module(module)
    finally:
        sys.path.remove(str(EXAMPLES))
    return module


@pytest.mark.parametrize("dtype", dtypes("float32"))  # float64 NNX and Equinox: the corpus's MNIST and scan stack
@pytest.mark.parametrize("name", PORTS)
def test_nnx_and_equinox_ports_agree_with_a_row_per_layer(name, dtype):
    # float64 checks the compiled program and the op-by-op one (both must agree to 1e-10); float32 the compiled one.
    programs = port.PROGRAMS if dtype == "float64" else ("jit",)
    report = port.check_port(port.spec_from_module(_example(name)), dtype, programs=programs)
    assert report.passed, report.format()
    assert report.api == PORTS[name] and report.programs == programs
    assert [r.name for r in report.rows if r.stage == "forward"] == ["conv1", "conv2", "fc1", "fc2"]
    assert {r.stage for r in report.rows} == {"forward", "output", "loss", "gradient", "update"}
    if dtype == "float64":
        assert len(report.other_rows) == len(report.rows)  # the op-by-op program, compared too
        assert max(r.port_error for r in report.rows + report.other_rows) < 1e-10


@pytest.mark.parametrize("name,mistake", [(n, m) for n in PORTS for m in _example(n).MISTAKES])
def test_a_planted_mistake_in_an_nnx_or_equinox_port_is_named_where_it_shows(name, mistake):
    module = _example(name)
    module.MISTAKE = mistake
    first = port.check_port(port.spec_from_module(module), "float32", programs=("jit",)).first_divergence
    assert first is not None, f"{mistake} was not found"
    assert (first.stage, first.name) == module.MISTAKES[mistake]


# --- each API's layouts ----------------------------------------------------------------------------------


class _NNXOne(nnx.Module):
    def __init__(self, make):
        self.layer = make(nnx.Rngs(0))

    def __call__(self, x):
        return self.layer(x)


class _EqxOne(eqx.Module):
    layer: eqx.Module

    def __call__(self, x):
        return self.layer(x)


KEY = jax.random.key(0)
LAYERS = {  # PyTorch layer, its port as an author would write it, PyTorch's input shape
    "nnx.Conv": (lambda: torch.nn.Conv2d(4, 6, 3, stride=2, padding=1),
                 lambda: _NNXOne(lambda r: nnx.Conv(4, 6, (3, 3), strides=2, padding=[(1, 1)] * 2, rngs=r)), (2, 4, 5, 5)),
    "nnx.ConvTranspose": (lambda: torch.nn.ConvTranspose2d(4, 3, 4, stride=2, padding=1),
                          lambda: _NNXOne(lambda r: nnx.ConvTranspose(4, 3, (4, 4), strides=2, padding=[(2, 2)] * 2, rngs=r)),
                          (2, 4, 5, 5)),
    "nnx.Linear": (lambda: torch.nn.Linear(5, 3), lambda: _NNXOne(lambda r: nnx.Linear(5, 3, rngs=r)), (4, 5)),
    "nnx.LayerNorm": (lambda: torch.nn.LayerNorm(5), lambda: _NNXOne(lambda r: nnx.LayerNorm(5, epsilon=1e-5, rngs=r)), (4, 5)),
    "nnx.GroupNorm": (lambda: torch.nn.GroupNorm(2, 4),
                      lambda: _NNXOne(lambda r: nnx.GroupNorm(4, num_groups=2, epsilon=1e-5, rngs=r)), (2, 4, 3, 3)),
    "eqx.Conv1d": (lambda: torch.nn.Conv1d(4, 6, 3, stride=2, padding=1),
                   lambda: _EqxOne(eqx.nn.Conv1d(4, 6, 3, stride=2, padding=1, key=KEY)), (2, 4, 9)),
    "eqx.Conv2d groups": (lambda: torch.nn.Conv2d(4, 6, 3, padding=1, groups=2),
                          lambda: _EqxOne(eqx.nn.Conv2d(4, 6, 3, padding=1, groups=2, key=KEY)), (2, 4, 5, 5)),
    "eqx.ConvTranspose2d": (lambda: torch.nn.ConvTranspose2d(4, 3, 4, stride=2, padding=1),
                            lambda: _EqxOne(eqx.nn.ConvTranspose2d(4, 3, 4, stride=2, padding=1, key=KEY)), (2, 4, 5, 5)),
    "eqx.ConvTranspose2d square": (lambda: torch.nn.ConvTranspose2d(3, 3, 3, stride=2),  # in = out: the flip still shows
                                   lambda: _EqxOne(eqx.nn.ConvTranspose2d(3, 3, 3, stride=2, key=KEY)), (2, 3, 4, 4)),
    "eqx.Linear": (lambda: torch.nn.Linear(5, 3), lambda: _EqxOne(eqx.nn.Linear(5, 3, key=KEY)), (4, 5)),
    "eqx.LayerNorm": (lambda: torch.nn.LayerNorm(5), lambda: _EqxOne(eqx.nn.LayerNorm(5, eps=1e-5)), (4, 5)),
    "eqx.GroupNorm": (lambda: torch.nn.GroupNorm(2, 4), lambda: _EqxOne(eqx.nn.GroupNorm(2, 4, eps=1e-5)), (2, 4, 3, 3)),
}


@pytest.mark.parametrize("kind", LAYERS)
def test_the_weight_transfer_knows_each_apis_layouts(kind):
    make_torch, make_port, shape = LAYERS[kind]

    torch_model = one_torch_layer(make_torch)
    spec = port.Spec(torch_model, make_port, lambda: (np.random.default_rng(0).normal(size=shape).astype(np.float32),),
                     per_sample=kind.startswith("eqx"))
    report = port.check_port(spec, "float64", programs=("jit",))
    assert report.passed and max(r.port_error for r in report.rows) < 1e-10, report.format()


def test_embeddings_move_into_nnx_and_equinox():
    indices = np.array([1, 5, 9, 0, 2])
    for make_port, per_sample in ((lambda: _NNXOne(lambda r: nnx.Embed(10, 4, param_dtype=jnp.float64, rngs=r)), False),
                                  (lambda: _EqxOne(eqx.nn.Embedding(10, 4, key=KEY)), True)):
        spec = port.Spec(one_torch_layer(lambda: torch.nn.Embedding(10, 4)), make_port, lambda: (indices,), per_sample=per_sample)
        report = port.check_port(spec, "float64", programs=("jit",))
        assert report.passed and len(report.pairings) == 1, report.format()


def test_an_nnx_embed_that_computes_in_its_param_dtype_is_named_before_any_comparison():
    """flax 0.12's nnx.Embed casts its table to param_dtype (float32 by default), whatever the table holds."""
    spec = port.Spec(one_torch_layer(lambda: torch.nn.Embedding(10, 4)), lambda: _NNXOne(lambda r: nnx.Embed(10, 4, rngs=r)),
                     lambda: (np.array([1, 5, 9]),))
    with pytest.raises(port.PortDtypeError, match="the port computes in float32, not float64 as asked: layer gives float32"):
        port.check_port(spec, "float64")
    assert port.check_port(spec, "float32").passed


# --- running statistics: NNX's BatchStat, Equinox's State, a plain function's state ---------------------------


class _ConvBN(torch.nn.Module):
    def __init__(self):
        super().__init__()
        torch.manual_seed(0)
        self.conv = torch.nn.Conv2d(3, 4, 3, padding=1, bias=False)
        self.bn = torch.nn.BatchNorm2d(4)

    def forward(self, x):
        return torch.relu(self.bn(self.conv(x)))


def _batch_stats(x, axes, running_mean, running_var, momentum=0.1):
    """PyTorch's training-mode BatchNorm: normalise with the biased variance, keep the unbiased one."""
    mean, var = x.mean(axis=axes), x.var(axis=axes)
    n = x.size / mean.size
    return mean, var, (1 - momentum) * running_mean + momentum * mean, (1 - momentum) * running_var + momentum * var * n / (n - 1)


class _NNXTorchBN(nnx.Module):
    def __init__(self, features):
        self.scale = nnx.Param(jnp.ones(features))
        self.bias = nnx.Param(jnp.zeros(features))
        self.mean = nnx.BatchStat(jnp.zeros(features))
        self.var = nnx.BatchStat(jnp.ones(features))

    def __call__(self, x):
        mean, var, self.mean[...], self.var[...] = _batch_stats(x, (0, 1, 2), self.mean[...], self.var[...])
        return (x - mean) / jnp.sqrt(var + 1e-5) * self.scale[...] + self.bias[...]


class _NNXConvBN(nnx.Module):
    def __init__(self, rngs):
        self.conv = nnx.Conv(3, 4, (3, 3), padding=[(1, 1)] * 2, use_bias=False, rngs=rngs)
        self.bn = _NNXTorchBN(4)

    def __call__(self, x):
        return nnx.relu(self.bn(self.conv(x)))


class _EqxTorchBN(eqx.Module):
    weight: jax.Array
    bias: jax.Array
    index: eqx.nn.StateIndex

    def __init__(self, features):
        self.weight, self.bias = jnp.ones((features, 1, 1)), jnp.zeros((features, 1, 1))
        self.index = eqx.nn.StateIndex((jnp.zeros(features), jnp.ones(features)))

    def __call__(self, x, state):  # the whole batch (N, C, H, W): statistics over N, H, W
        running_mean, running_var = state.get(self.index)
        mean, var, running_mean, running_var = _batch_stats(x, (0, 2, 3), running_mean, running_var)
        out = (x - mean[:, None, None]) / jnp.sqrt(var[:, None, None] + 1e-5) * self.weight + self.bias
        return out, state.set(self.index, (running_mean, running_var))


class _EqxConvBN(eqx.Module):
    conv: eqx.nn.Conv2d
    bn: _EqxTorchBN

    def __init__(self):
        self.conv = eqx.nn.Conv2d(3, 4, 3, padding=1, use_bias=False, key=KEY)
        self.bn = _EqxTorchBN(4)

    def __call__(self, x, state):
        x, state = self.bn(jax.vmap(self.conv)(x), state)
        return jax.nn.relu(x), state


def _conv_bn_spec(channels_last: bool = False, **port_pieces) -> port.Spec:
    """The targets are PyTorch's (N, C, H, W); a channels-last port's loss moves them to (N, H, W, C)."""
    def jax_loss(out, x, t):
        return jnp.mean((out - (t.transpose(0, 2, 3, 1) if channels_last else t)) ** 2)

    return port.Spec(_ConvBN, example_inputs=lambda: (np.random.default_rng(0).normal(size=(6, 3, 5, 5)).astype(np.float32),),
                     example_targets=lambda: (np.random.default_rng(1).normal(size=(6, 4, 5, 5)).astype(np.float32),),
                     torch_loss=lambda out, x, t: torch.mean((out - t) ** 2), jax_loss=jax_loss, **port_pieces)


def _function_port():
    def params():
        return {"conv": {"weight": jnp.asarray(np.zeros((4, 3, 3, 3)))}, "bn": {"weight": jnp.ones(4), "bias": jnp.zeros(4)}}

    def state():
        return {"bn": {"running_mean": jnp.zeros(4), "running_var": jnp.ones(4)}}

    def apply(params, state, x):  # NCHW, PyTorch's names and layouts
        y = tap("conv", jax.lax.conv_general_dilated(x, params["conv"]["weight"], (1, 1), [(1, 1), (1, 1)]))
        mean, var, rm, rv = _batch_stats(y, (0, 2, 3), state["bn"]["running_mean"], state["bn"]["running_var"])
        y = tap("bn", (y - mean[:, None, None]) / jnp.sqrt(var[:, None, None] + 1e-5) * params["bn"]["weight"][:, None, None]
                + params["bn"]["bias"][:, None, None])
        return jax.nn.relu(y), {"bn": {"running_mean": rm, "running_var": rv}}

    return {"jax_params": params, "jax_state": state, "jax_apply": apply}


@pytest.mark.parametrize("api", ["Flax NNX", "Equinox", "plain function"])
def test_running_statistics_are_compared_in_every_api(api):
    pieces = {"Flax NNX": {"jax_model": lambda: _NNXConvBN(nnx.Rngs(0))},
              "Equinox": {"jax_model": lambda: eqx.nn.make_with_state(_EqxConvBN)()},
              "plain function": _function_port()}[api]
    for dtype in ("float64", "float32"):
        report = port.check_port(_conv_bn_spec(api == "Flax NNX", **pieces), dtype)
        assert report.passed and report.api == api, report.format()
        # Equinox's conv runs inside the port's own jax.vmap: its output leaves through a callback, one per sample.
        assert [r.name for r in report.rows if r.stage == "forward"] == ["conv", "bn"]
        assert "Per-layer outputs: both paired layers." in report.format()
        assert [r.name for r in report.rows if r.stage == "buffer"] == ["bn.running_mean", "bn.running_var"]
        if dtype == "float64":
            assert max(r.port_error for r in report.rows) < 1e-10


def test_a_biased_running_variance_is_named_in_an_nnx_port():
    class Biased(_NNXTorchBN):
        def __call__(self, x):
            out = super().__call__(x)
            self.var[...] = 0.9 + 0.1 * x.var(axis=(0, 1, 2))  # the batch's biased variance, as flax's BatchNorm keeps it
            return out

    class Port(_NNXConvBN):
        def __init__(self, rngs):
            super().__init__(rngs)
            self.bn = Biased(4)

    first = port.check_port(_conv_bn_spec(True, jax_model=lambda: Port(nnx.Rngs(0))), "float32").first_divergence
    assert (first.stage, first.name) == ("buffer", "bn.running_var")


# --- the compiled program ------------------------------------------------------------------------------------


class _Scale(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.weight = torch.nn.Parameter(torch.tensor([1.5, -2.0, 0.5]))

    def forward(self, x):
        return x * self.weight


class _TracedDiffers(nnx.Module):
    """Stands in for a compiler that computes otherwise: under jax.jit (a traced input) the result is off by 1e-3."""

    def __init__(self):
        self.weight = nnx.Param(jnp.array([1.5, -2.0, 0.5]))

    def __call__(self, x):
        y = x * self.weight[...]
        return y * (1 + 1e-3) if isinstance(x, jax.core.Tracer) else y


def test_a_difference_of_the_compiled_program_alone_is_named_as_jax_not_the_port():
    inputs = lambda: (np.arange(12.0).reshape(4, 3),)  # noqa: E731
    report = port.check_port(port.Spec(_Scale, _TracedDiffers, inputs), "float64")
    assert not report.passed and report.only_in == "jit"
    assert "Only the compiled program (jax.jit) departs" in report.verdict() and f"jax {jax.__version__}" in report.verdict()
    assert all(r.passed for r in report.other_rows)  # op by op it agrees
    assert port.check_port(port.Spec(_Scale, _TracedDiffers, inputs), "float64", programs=("eager",)).passed


# --- bad specs: one line each, the documented exit status ---------------------------------------------------------

BASE = """
import numpy as np, torch, jax.numpy as jnp, flax.linen as fnn
class Net(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.fc = torch.nn.Linear(5, 10)
    def forward(self, x):
        return self.fc(x)
def torch_model():
    torch.manual_seed(0)
    return Net()
def example_inputs():
    return (np.random.default_rng(0).normal(size=(4, 5)).astype(np.float32),)
"""


def _cli(tmp_path, body: str, *flags) -> tuple[int, str, str, object]:
    (tmp_path / "spec.py").write_text(BASE + textwrap.dedent(body))
    out = tmp_path / "report.json"
    code = main(["check-port", str(tmp_path / "spec.py"), "--json", str(out), *flags])
    return code, out


@pytest.mark.parametrize("body,message", [
    ("param_map = lambda: {'fc': 'Dense_0'}\ndef jax_model(): return fnn.Dense(10)\n",
     "param_map is a function; it must be a dict"),
    ("param_map = [('fc', 'Dense_0')]\ndef jax_model(): return fnn.Dense(10)\n", "param_map is a list; it must be a dict"),
    ("def jax_model(): return fnn.Dense(10, dtype=jnp.float32)\n",
     "the port computes in float32, not float64 as asked: fc gives float32"),
    ("def jax_model(): return object()\n", "jax_model() returned builtins.object; check-port takes a Flax Linen module"),
    ("import equinox as eqx, jax\nclass E(eqx.Module):\n    fc: eqx.nn.Linear\n"
     "    def __init__(self):\n        self.fc = eqx.nn.Linear(5, 10, key=jax.random.key(0))\n"
     "    def __call__(self, x):\n        return self.fc(x)\ndef jax_model(): return E()\n",
     "failed on the example inputs: TypeError: dot_general requires contracting dimensions to have the same shape"),
    ("class Two(torch.nn.Module):\n    def __init__(self):\n        super().__init__()\n"
     "        self.fc = torch.nn.Linear(5, 10)\n        self.head = torch.nn.Linear(10, 2)\n"
     "    def forward(self, x):\n        return self.head(self.fc(x))\n"
     "def torch_model(): return Two()\ndef jax_model(): return fnn.Dense(10)\n",
     "PyTorch's head (Linear: weight (2, 10), bias (2,)) has no counterpart in the port: every module of the port "
     "that holds weights (1) is paired already"),
])
def test_a_spec_it_cannot_use_gets_one_line_and_exit_2(tmp_path, capsys, body, message):
    code, _ = _cli(tmp_path, body, "--dtype", "float64")
    captured = capsys.readouterr()
    assert code == 2 and message in captured.err, captured.err
    assert "Traceback" not in captured.err and len(captured.err.strip().splitlines()) == 1


def test_an_output_of_another_shape_is_its_own_verdict_with_both_shapes(tmp_path, capsys):
    body = ("class Port(fnn.Module):\n    @fnn.compact\n    def __call__(self, x):\n"
            "        return fnn.Dense(10)(x).reshape(4, 5, 2)\n"
            "def jax_model(): return Port()\ndef from_jax(y): return np.asarray(y)\n")
    code, out = _cli(tmp_path, body)
    printed = capsys.readouterr().out
    assert code == 1
    assert "First divergence: output, output: the shapes differ: the port gives (4, 5, 2), PyTorch (4, 10)" in printed
    assert "inf" not in printed and "nan" not in printed
    assert json.loads(out.read_text())["first_divergence"]["shapes"] == [[4, 5, 2], [4, 10]]


def test_a_spec_imports_its_neighbours_and_a_plain_function_port_needs_no_model(tmp_path, capsys):
    (tmp_path / "my_port.py").write_text(
        "import jax.numpy as jnp\nfrom functional_gan.testing import tap\n"
        "def params(w, b): return {'fc': {'weight': jnp.asarray(w), 'bias': jnp.asarray(b)}}\n"
        "def apply(p, x): return tap('fc', x @ p['fc']['weight'].T + p['fc']['bias'])\n")
    body = ("import my_port\n"
            "def jax_params(): return my_port.params(np.zeros((10, 5)), np.zeros(10))\n"
            "jax_apply = my_port.apply\n")
    code, out = _cli(tmp_path, body, "--dtype", "float64")
    assert code == 0, capsys.readouterr()
    report = json.loads(out.read_text())
    assert report["api"] == "plain function" and [r["stage"] for r in report["rows"]] == ["forward", "output"]


def test_help_names_every_api_and_jax_apply(capsys):
    with pytest.raises(SystemExit):
        main(["check-port", "--help"])
    text = " ".join(capsys.readouterr().out.split())
    for words in ("Flax Linen", "Flax NNX", "Equinox", "jax_params() with jax_apply(params, *inputs)", "PER_SAMPLE",
                  "--program"):
        assert words in text


# --- the pytest API --------------------------------------------------------------------------------------------


def test_assert_port_returns_the_report_or_raises_with_the_first_divergence():
    module = _example("mnist_cnn_nnx")
    report = port.assert_port(module, programs=("jit",))
    assert report.passed and report.api == "Flax NNX"
    with pytest.raises(AssertionError, match=r"^First divergence: forward, fc1"):
        port.assert_port(module, programs=("jit",), jax_model=lambda: module.NNXNet(nnx.Rngs(0), mistake="flatten-nhwc"))
    with pytest.raises(port.SpecError, match="param_map is a function"):
        port.assert_port(torch_model=_Scale, jax_model=_TracedDiffers, example_inputs=lambda: (np.ones((2, 3)),),
                         param_map=lambda: {})


# --- torchvision's resnet18 and an NNX port -----------------------------------------------------------------


# resnet18's step compiles for about 10 s: float64 runs in the default suite, float32 and the planted mistakes are slow.
@pytest.mark.parametrize("dtype", [pytest.param("float32", marks=pytest.mark.slow), "float64"])
def test_torchvisions_resnet18_agrees_with_its_nnx_port_layer_by_layer(dtype):
    report = port.check_port(port.spec_from_module(_example("resnet18_nnx")), dtype, programs=("jit",))
    assert_agrees(report)  # float32 on jaxlib 0.10.2 with its workaround: 1 finding (a gradient at 3.4×), XLA's sums
    assert len(report.pairings) == 20 + 20 * 4 + 2  # 20 convolutions, 20 BatchNorms (weight, bias, running statistics), fc
    assert report.layers == 41 and not report.uncaptured  # every paired layer has a row
    assert {r.name for r in report.rows if r.stage == "buffer"} >= {"bn1.running_mean", "layer4.1.bn2.running_var"}
    if dtype == "float64":
        assert max(r.port_error for r in report.rows) < 1e-10


@pytest.mark.slow
@pytest.mark.parametrize("mistake", _example("resnet18_nnx").MISTAKES)
def test_a_planted_mistake_in_the_resnet18_port_is_named_where_it_shows(mistake):
    module = _example("resnet18_nnx")
    module.MISTAKE = mistake
    first = port.check_port(port.spec_from_module(module), "float32", programs=("jit",)).first_divergence
    assert first is not None and (first.stage, first.name) == module.MISTAKES[mistake]


@pytest.mark.slow
def test_the_example_test_file_fails_a_planted_mistake_with_its_message():
    """examples/port/test_mnist_ports.py, the documented way to keep a port under test, run as pytest would."""
    spec = importlib.util.spec_from_file_location("test_mnist_ports", EXAMPLES / "test_mnist_ports.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    module.test_a_port_that_flattens_channels_last_fails_at_fc1()
