"""check-port's verdicts on real, deep ports: precision findings, state carried between steps, float64 grounded in
PyTorch's own float64 error, Equinox as its users write it, and a report that starts with its summary.

Each test builds a small PyTorch model and a port whose only fault (if any) is the one under test, so that what the
report names can be compared with what was planted.
"""

import equinox as eqx
import flax.linen as fnn
import jax
import jax.numpy as jnp
import numpy as np
import pytest
import torch
from flax import nnx

from functional_gan import testing
from functional_gan.main import main
from tests.helpers import assert_agrees, dtypes

KEY = jax.random.key(0)


# --- 1. float32 precision: a finding of its own, never agreement -------------------------------------------------


class _BNConvFC(torch.nn.Module):
    """PyTorch's BatchNorm without running statistics (the batch statistics are all it computes) on the images, a
    convolution, a linear layer."""

    def __init__(self):
        super().__init__()
        self.bn = torch.nn.BatchNorm2d(3, track_running_stats=False)
        self.conv = torch.nn.Conv2d(3, 4, 3, padding=1)
        self.fc = torch.nn.Linear(4 * 5 * 5, 2)

    def forward(self, x):
        return self.fc(torch.relu(self.conv(self.bn(x))).flatten(1))


class _LinenBNConvFC(fnn.Module):
    fast_variance: bool = True

    @fnn.compact
    def __call__(self, x):  # NHWC
        x = fnn.BatchNorm(use_running_average=False, momentum=0.9, epsilon=1e-5, use_fast_variance=self.fast_variance)(x)
        x = fnn.Conv(4, (3, 3), padding=[(1, 1)] * 2)(x)
        x = jnp.transpose(fnn.relu(x), (0, 3, 1, 2)).reshape(x.shape[0], -1)  # flatten as PyTorch does
        return fnn.Dense(2)(x)


def _offset_spec(fast_variance: bool) -> testing.Spec:
    """Images far from zero (mean 40, spread 1), where E[x²] − E[x]² cancels: the variance loses about 40² × float32's
    epsilon of its value (3e-4, measured: 2.6e-6 in the two-pass form)."""
    return testing.Spec(
        _BNConvFC, jax_model=lambda: _LinenBNConvFC(fast_variance),
        example_inputs=lambda: (40 + np.random.default_rng(0).normal(size=(8, 3, 5, 5)).astype(np.float32),),
        example_targets=lambda: (np.random.default_rng(1).normal(size=(8, 2)).astype(np.float32),),
        torch_loss=lambda out, x, t: torch.mean((out - t) ** 2), jax_loss=lambda out, x, t: jnp.mean((out - t) ** 2),
        torch_optimizer=lambda p: torch.optim.SGD(p, lr=0.1), jax_optimizer=lambda: __import__("optax").sgd(0.1))


def test_a_fast_variance_batchnorm_is_a_precision_finding_named_at_its_layer_with_its_cause():
    report = testing.check_port(_offset_spec(fast_variance=True), "float32")
    assert report.first_divergence is None, report.format()
    assert report.precision_findings and not report.passed and report.exit_status() == 3, report.format()
    start = report.precision_start
    assert (start.stage, start.name) == ("forward", "bn"), report.format()  # where it starts, before the gradients
    assert start.ratio > 3 and start.twin_error <= start.allowed
    assert any("use_fast_variance=True" in c and "BatchNorm_0" in c for c in report.causes), report.causes
    text = report.format()
    assert text.startswith("Summary: precision findings (exit status 3)") and "Precision findings (" in text
    assert "≈" in text and "Likely cause: Flax's normalisation at BatchNorm_0" in text
    # The cause is named because switching it off was tried and the findings fell within their allowance.
    assert "verified: rerun with use_fast_variance=False" in text, text
    # In float64 the same cancellation costs 2²⁹ times less: beyond PyTorch's own float64 error, the cause verified
    # the same way, but within √eps (1.5e-8) of each scale: notes, never a failure.
    wide = testing.check_port(_offset_spec(fast_variance=True), "float64", programs=("jit",))
    assert wide.first_divergence is None and not wide.precision_findings and wide.exit_status() == 0, wide.format()
    assert wide.precision_notes, wide.format()
    assert all(r.explained_by == "use_fast_variance=True" for r in wide.precision_notes)
    assert max(r.port_error for r in wide.rows) < 1e-10 and any("verified: rerun with use_fast_variance=False" in c
                                                                for c in wide.causes), wide.causes
    assert testing.check_port(_offset_spec(fast_variance=False), "float64", programs=("jit",)).passed
    # Without the fast variance: no finding of that cause (any left are the platform's, and named so).
    fixed = testing.check_port(_offset_spec(fast_variance=False), "float32")
    assert_agrees(fixed)
    assert not any("use_fast_variance" in c for c in fixed.causes)


def test_precision_findings_exit_3_and_0_when_allowed(tmp_path, capsys, monkeypatch):
    spec = tmp_path / "fast_variance_spec.py"
    spec.write_text("from tests.test_check_port_verdicts import _offset_spec\n"
                    "globals().update({k: v for k, v in vars(_offset_spec(True)).items() if k != 'name'})\n"
                    "TRAIN = True\n")
    monkeypatch.syspath_prepend(str(__import__("pathlib").Path(__file__).resolve().parents[1]))
    assert main(["check-port", str(spec), "--program", "jit"]) == 3
    out = capsys.readouterr().out
    assert out.startswith("Summary: precision findings (exit status 3)") and "exit status 3; 0 with --allow-precision" in out
    assert main(["check-port", str(spec), "--program", "jit", "--allow-precision"]) == 0
    out = capsys.readouterr().out  # the report says what the exit status is, allowed
    assert out.startswith("Summary: precision findings, allowed (exit status 0)") and "precision findings allowed" in out
    with pytest.raises(AssertionError, match="Precision: "):
        testing.assert_port(_offset_spec(True), programs=("jit",))
    assert testing.assert_port(_offset_spec(True), programs=("jit",), allow_precision=True).precision_findings


def test_a_divergence_still_lists_the_precision_findings():
    class Wrong(_LinenBNConvFC):
        @fnn.compact
        def __call__(self, x):
            return super().__call__(x) * 1.01  # a planted mistake after the imprecise BatchNorm

    spec = _offset_spec(True)
    spec.jax_model = lambda: Wrong(True)
    report = testing.check_port(spec, "float32", programs=("jit",))
    assert (report.first_divergence.stage, report.first_divergence.name) == ("output", "output"), report.format()
    assert report.precision_findings and report.exit_status() == 1
    assert "Precision findings (" in report.format() and "Precision: " in report.verdict()


# --- 2. state carried between steps as training carries it --------------------------------------------------------


class _TorchConvBN(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.conv = torch.nn.Conv2d(3, 4, 3, padding=1, bias=False)
        self.bn = torch.nn.BatchNorm2d(4)

    def forward(self, x):
        return torch.relu(self.bn(self.conv(x)))


class _EqxFirstCallBN(eqx.Module):
    """PyTorch's BatchNorm, written with a first-call flag in its State. ``after_first`` plants the old EMA
    BatchNorm's behaviour: from its second call on it normalises with the running statistics."""

    weight: jax.Array
    bias: jax.Array
    stats: eqx.nn.StateIndex
    first: eqx.nn.StateIndex
    after_first: bool = eqx.field(static=True)

    def __init__(self, features, after_first: bool):
        self.weight, self.bias = jnp.ones((features, 1, 1)), jnp.zeros((features, 1, 1))
        self.stats = eqx.nn.StateIndex((jnp.zeros(features), jnp.ones(features)))
        self.first = eqx.nn.StateIndex(jnp.array(True))
        self.after_first = after_first

    def __call__(self, x, state):  # the whole batch (N, C, H, W)
        running_mean, running_var = state.get(self.stats)
        mean, var = x.mean(axis=(0, 2, 3)), x.var(axis=(0, 2, 3))
        n = x.size / mean.size
        new_stats = (0.9 * running_mean + 0.1 * mean, 0.9 * running_var + 0.1 * var * n / (n - 1))
        if self.after_first:
            first = state.get(self.first)
            mean, var = jnp.where(first, mean, running_mean), jnp.where(first, var, running_var)
        out = (x - mean[:, None, None]) / jnp.sqrt(var[:, None, None] + 1e-5) * self.weight + self.bias
        return out, state.set(self.stats, new_stats).set(self.first, jnp.array(False))


class _EqxConvBN(eqx.Module):
    conv: eqx.nn.Conv2d
    bn: _EqxFirstCallBN

    def __init__(self, after_first: bool = False):
        self.conv = eqx.nn.Conv2d(3, 4, 3, padding=1, use_bias=False, key=KEY)
        self.bn = _EqxFirstCallBN(4, after_first)

    def __call__(self, x, state, *, key):  # a key required, as models with dropout take one
        del key
        x, state = self.bn(jax.vmap(self.conv)(x), state)
        return jax.nn.relu(x), state


def _stateful_spec(after_first: bool) -> testing.Spec:
    return testing.Spec(
        _TorchConvBN, jax_model=lambda: eqx.nn.make_with_state(_EqxConvBN)(after_first),
        example_inputs=lambda: (np.random.default_rng(0).normal(size=(6, 3, 5, 5)).astype(np.float32),),
        example_targets=lambda: (np.random.default_rng(1).normal(size=(6, 4, 5, 5)).astype(np.float32),),
        torch_loss=lambda out, x, t: torch.mean((out - t) ** 2), jax_loss=lambda out, x, t: jnp.mean((out - t) ** 2),
        torch_optimizer=lambda p: torch.optim.SGD(p, lr=0.1, momentum=0.9),
        jax_optimizer=lambda: __import__("optax").sgd(0.1, momentum=0.9))


def test_a_batchnorm_that_changes_after_its_first_call_is_named_at_step_2s_forward():
    report = testing.check_port(_stateful_spec(after_first=True), "float32", steps=3, programs=("jit",))
    first = report.first_divergence
    assert first is not None and (first.step, first.stage, first.name) == (2, "forward", "bn"), report.format()
    assert first.label == "step 2: forward"
    assert all(r.passed for r in report.rows if r.step == 1)  # its first call is PyTorch's


@pytest.mark.parametrize("dtype", dtypes("float64"))
def test_a_correct_stateful_equinox_port_with_a_required_key_passes_three_steps(dtype):
    report = testing.check_port(_stateful_spec(after_first=False), dtype, steps=3)
    assert_agrees(report)
    assert report.api == "Equinox" and "eqx.nn.State" in report.carried
    assert "each starts from PyTorch's parameters (teacher forcing) and the port's own state (the eqx.nn.State" \
        in report.format()
    assert [r.name for r in report.rows if (r.step, r.stage) == (3, "buffer")] == ["bn.running_mean", "bn.running_var"]


# --- 3. float64 grounded in PyTorch's own float64 error ----------------------------------------------------------


class _TorchMLP(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.fc1, self.fc2 = torch.nn.Linear(64, 256), torch.nn.Linear(256, 8)

    def forward(self, x):
        return self.fc2(torch.tanh(self.fc1(x)))


class _LinenMLP(fnn.Module):
    mistake: float = 0.0

    @fnn.compact
    def __call__(self, x):
        h = fnn.Dense(256)(x)
        h = h * (1 + self.mistake)  # a planted mistake of ``mistake`` of fc1's scale
        return fnn.Dense(8)(jnp.tanh(h))


def _mlp_spec(mistake: float) -> testing.Spec:
    return testing.Spec(
        _TorchMLP, jax_model=lambda: _LinenMLP(mistake),
        example_inputs=lambda: (np.random.default_rng(0).normal(size=(16, 64)),),
        example_targets=lambda: (np.random.default_rng(1).normal(size=(16, 8)),),
        torch_loss=lambda out, x, t: torch.mean((out - t) ** 2), jax_loss=lambda out, x, t: jnp.mean((out - t) ** 2))


def test_float64_is_judged_against_pytorchs_own_float64_error_and_names_a_mistake_of_1e_minus_6():
    report = testing.check_port(_mlp_spec(0.0), "float64", programs=("jit",))
    assert report.passed, report.format()
    # PyTorch's own float64 error was measured for every row (other batch orders, layouts, one-ulp moves)...
    assert all(r.noise is not None for r in report.rows)
    assert "PyTorch64': PyTorch in float64 with the batch in two other orders" in report.format()
    # ... and the allowance is k times it (at least 8 ulps), far below the fixed 1e-10 it replaces
    assert max(r.allowed for r in report.rows) < 1e-12
    planted = testing.check_port(_mlp_spec(1e-6), "float64", programs=("jit",))
    # planted between fc1 and fc2: fc1's own output is right, fc2's input is not
    assert (planted.first_divergence.stage, planted.first_divergence.name) == ("forward", "fc2"), planted.format()
    assert planted.first_divergence.port_error < 2e-6


# --- 5. the summary first ---------------------------------------------------------------------------------------


def test_the_report_starts_with_a_summary_per_stage():
    report = testing.check_port(_stateful_spec(after_first=False), "float64", steps=2, programs=("jit",))
    lines = report.format().splitlines()
    assert lines[0].startswith("Summary: agreement (exit status 0); ")
    stages = [line.split()[0] for line in lines[2:8]]
    assert stages == ["forward", "output", "loss", "gradient", "update", "buffer"], lines[:10]
    counts = {line.split()[0]: int(line.split()[1]) for line in lines[2:8]}
    assert counts == {stage: sum(r.stage.endswith(stage) for r in report.rows)
                      for stage in ("forward", "output", "loss", "gradient", "update", "buffer")}
    assert lines.index("Weight transfer (PyTorch → port):") > 8  # the transfer and the table come after


# --- 4b. layers inside the port's own transformations ------------------------------------------------------------


class _TorchMLP4(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.fc1, self.fc2, self.fc3, self.fc4 = (torch.nn.Linear(8, 16), torch.nn.Linear(16, 16),
                                                  torch.nn.Linear(16, 16), torch.nn.Linear(16, 3))

    def forward(self, x):
        return self.fc4(torch.relu(self.fc3(torch.relu(self.fc2(torch.relu(self.fc1(x)))))))


class _EqxInnerVmap(eqx.Module):
    """Written as Equinox's documentation teaches: a per-sample method, vmapped over the batch inside ``__call__``."""

    fc1: eqx.nn.Linear
    fc2: eqx.nn.Linear
    fc3: eqx.nn.Linear
    fc4: eqx.nn.Linear
    gelu_after_fc1: bool = eqx.field(static=True)

    def __init__(self, gelu_after_fc1: bool = False):
        keys = jax.random.split(KEY, 4)
        self.fc1, self.fc2 = eqx.nn.Linear(8, 16, key=keys[0]), eqx.nn.Linear(16, 16, key=keys[1])
        self.fc3, self.fc4 = eqx.nn.Linear(16, 16, key=keys[2]), eqx.nn.Linear(16, 3, key=keys[3])
        self.gelu_after_fc1 = gelu_after_fc1

    def one(self, x):
        h = self.fc1(x)
        h = jax.nn.gelu(h) if self.gelu_after_fc1 else jax.nn.relu(h)  # the planted mistake: GELU for ReLU
        return self.fc4(jax.nn.relu(self.fc3(jax.nn.relu(self.fc2(h)))))

    def __call__(self, x):
        return jax.vmap(self.one)(x)


def _inner_vmap_spec(mistake: bool) -> testing.Spec:
    return testing.Spec(
        _TorchMLP4, jax_model=lambda: _EqxInnerVmap(mistake),
        example_inputs=lambda: (np.random.default_rng(0).normal(size=(5, 8)).astype(np.float32),),
        example_targets=lambda: (np.random.default_rng(1).normal(size=(5, 3)).astype(np.float32),),
        torch_loss=lambda out, x, t: torch.mean((out - t) ** 2), jax_loss=lambda out, x, t: jnp.mean((out - t) ** 2))


@pytest.mark.parametrize("dtype", dtypes("float64"))
def test_an_equinox_port_that_vmaps_inside_gets_a_row_per_layer_and_a_mistake_is_named_at_its_layer(dtype):
    report = testing.check_port(_inner_vmap_spec(False), dtype)
    assert_agrees(report)
    for rows in (report.rows, report.other_rows):  # compiled and op by op
        assert [r.name for r in rows if r.stage == "forward"] == ["fc1", "fc2", "fc3", "fc4"]
    assert "Per-layer outputs: all 4 paired layers." in report.format()
    planted = testing.check_port(_inner_vmap_spec(True), dtype)
    assert (planted.first_divergence.stage, planted.first_divergence.name) == ("forward", "fc2"), planted.format()


def test_a_scanned_transformer_stack_pairs_its_stacked_weights_and_gets_a_row_per_layer():
    from pathlib import Path

    path = Path(__file__).resolve().parents[1] / "examples" / "port" / "nanogpt_scan.py"
    report = testing.check_port(testing.load_spec(path), "float64", programs=("jit",))
    assert report.passed, report.format()
    assert [p.jax_name for p in report.pairings[:2]] == ["params/h/ln_1/scale[0]", "params/h/ln_1/bias[0]"]
    assert {p.index for p in report.pairings} == {0, 1, 2, 3}  # every tensor a slice of a stacked leaf
    forward = [r.name for r in report.rows if r.stage == "forward"]
    assert forward[:8] == ["h.0.ln_1", "h.0.attn.c_attn", "h.0.attn.c_proj", "h.0.attn", "h.0.ln_2", "h.0.mlp.c_fc",
                           "h.0.mlp.c_proj", "h.0"] and len(forward) == 32  # each layer's own output and its attention's


# --- 3 at depth: ResNet-152's layout ------------------------------------------------------------------------------


@pytest.mark.slow
def test_a_correct_150_layer_port_passes_float64_with_margin_and_a_mistake_of_1e_minus_6_is_named():
    import importlib.util
    import sys
    from pathlib import Path

    folder = Path(__file__).resolve().parents[1] / "examples" / "port"
    sys.path.insert(0, str(folder))  # the spec imports resnet_basic.py, as check-port lets it
    loader = importlib.util.spec_from_file_location("resnet_bottleneck_spec", folder / "resnet_bottleneck.py")
    module = importlib.util.module_from_spec(loader)
    loader.loader.exec_module(module)
    report = testing.check_port(testing.spec_from_module(module), "float64", programs=("jit",))
    # 155 convolutions (the stem, 150 in 50 Bottlenecks, 4 downsampling), 155 BatchNorms, the classifier
    assert report.passed and report.layers == 311, report.format()[:3000]
    # with margin: the worst row 1.82× PyTorch's own error with PyTorch on 2 threads, 2.07× on 1 (as the tests run it)
    assert max(r.ratio for r in report.rows) < 2.5, report.format()[:3000]
    # PyTorch's own float64 error grows with depth, and the allowance with it (no fixed tolerance to outgrow)
    assert max(r.port_error for r in report.rows) > 100 * np.finfo(np.float64).eps
    module.MISTAKE = "1e-6-in-layer3.20"
    planted = testing.check_port(testing.spec_from_module(module), "float64", programs=("jit",))
    first = planted.first_divergence
    assert (first.stage, first.name) == module.MISTAKES[module.MISTAKE], planted.format()[:3000]


def test_products_a_port_runs_below_full_float32_are_counted_from_its_jaxpr():
    # On a GPU or TPU these are a likely cause of precision findings (check-port asks for 'highest' by default, an
    # explicit setting in the port wins); the count is read off the step's jaxpr, here built on the CPU.
    from functional_gan.testing.precision import low_precision_products

    a = jnp.ones((4, 4))

    def port(x):
        full = jnp.dot(x, a)  # no explicit precision: the configured default
        default = jnp.dot(x, a, precision=jax.lax.Precision.DEFAULT)
        half = jnp.dot(x.astype(jnp.bfloat16), a.astype(jnp.bfloat16))
        highest = jnp.dot(x, a, precision=jax.lax.Precision.HIGHEST)
        scanned = jax.lax.scan(lambda c, _: (jnp.dot(c, a, precision="high"), None), x, None, length=2)[0]
        return full + default + half + highest + scanned

    assert low_precision_products(jax.make_jaxpr(port)(a).jaxpr) == 3  # DEFAULT, bfloat16, HIGH inside the scan


# --- what a new user met (a fresh-eyed trial of this turn) -------------------------------------------------------


class _TorchConvBNFC(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.conv = torch.nn.Conv2d(3, 4, 3, padding=1)  # its bias is mathematically inert before the BatchNorm
        self.bn = torch.nn.BatchNorm2d(4)
        self.fc = torch.nn.Linear(4 * 5 * 5, 2)

    def forward(self, x):
        return self.fc(torch.relu(self.bn(self.conv(x))).flatten(1))


class _NNXFlaxBN(nnx.Module):
    """Written as Flax's documentation teaches, with Flax's own BatchNorm (momentum 0.9 meaning PyTorch's 0.1)."""

    def __init__(self, rngs):
        self.conv = nnx.Conv(3, 4, (3, 3), padding=[(1, 1)] * 2, rngs=rngs)
        self.bn = nnx.BatchNorm(4, momentum=0.9, epsilon=1e-5, use_fast_variance=False, rngs=rngs)
        self.fc = nnx.Linear(4 * 5 * 5, 2, rngs=rngs)

    def __call__(self, x):  # NHWC
        x = nnx.relu(self.bn(self.conv(x)))
        return self.fc(jnp.transpose(x, (0, 3, 1, 2)).reshape(x.shape[0], -1))


def test_flaxs_own_batchnorm_is_named_with_its_known_cause_and_an_inert_bias_is_marked():
    spec = testing.Spec(
        _TorchConvBNFC, jax_model=lambda: _NNXFlaxBN(nnx.Rngs(0)),
        example_inputs=lambda: (np.random.default_rng(0).normal(size=(6, 3, 5, 5)).astype(np.float32),),
        example_targets=lambda: (np.random.default_rng(1).normal(size=(6, 2)).astype(np.float32),),
        torch_loss=lambda out, x, t: torch.mean((out - t) ** 2), jax_loss=lambda out, x, t: jnp.mean((out - t) ** 2))
    report = testing.check_port(spec, "float64")
    first = report.first_divergence
    assert (first.stage, first.name) == ("buffer", "bn.running_var"), report.format()
    assert "Known cause that fits: the port's module there is Flax's own BatchNorm" in report.verdict()
    text = report.format()
    # compiled and op by op both diverge there: listed once, under the judged program
    assert text.count("  buffer, bn.running_var: ") == 1, text[:2000]
    gradient = next(r for r in report.rows if (r.stage, r.name) == ("gradient", "conv.bias"))
    assert gradient.passed and gradient.noise > 0.01  # rounding on both sides of a zero gradient
    assert "✓°" in text and "° PyTorch's own error there is above 1% of the quantity's scale" in text


class _TorchLN(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.fc1, self.ln, self.fc2 = torch.nn.Linear(6, 8), torch.nn.LayerNorm(8), torch.nn.Linear(8, 3)

    def forward(self, x):
        return self.fc2(self.ln(self.fc1(x)))


class _EqxLN(eqx.Module):
    fc1: eqx.nn.Linear
    ln: eqx.nn.LayerNorm  # has a ``shape`` field: still a module, not an array
    fc2: eqx.nn.Linear

    def __init__(self):
        keys = jax.random.split(KEY, 2)
        self.fc1, self.ln, self.fc2 = eqx.nn.Linear(6, 8, key=keys[0]), eqx.nn.LayerNorm(8), eqx.nn.Linear(8, 3, key=keys[1])

    def __call__(self, x):  # one sample
        return self.fc2(self.ln(self.fc1(x)))


def test_an_equinox_layernorm_pairs_by_definition_order_and_has_its_row():
    spec = testing.Spec(_TorchLN, jax_model=_EqxLN, per_sample=True,
                        example_inputs=lambda: (np.random.default_rng(0).normal(size=(4, 6)).astype(np.float32),))
    report = testing.check_port(spec, "float64")
    assert report.passed and [p.jax_name for p in report.pairings][2:4] == ["params/ln/weight", "params/ln/bias"]
    assert [r.name for r in report.rows if r.stage == "forward"] == ["fc1", "ln", "fc2"], report.format()


def test_an_update_that_diverges_by_weight_decay_alone_is_told_so():
    """torch.optim.AdamW's default weight_decay is 0.01, optax.adamw's 1e-4: the gradients agree, the updates do not,
    and the report measures both decays (one step from zero gradients) and says so."""
    import optax

    class Port(fnn.Module):
        @fnn.compact
        def __call__(self, x):
            return fnn.Dense(2)(jnp.tanh(fnn.Dense(8)(x)))

    def spec(weight_decay):
        return testing.Spec(
            lambda: torch.nn.Sequential(torch.nn.Linear(5, 8), torch.nn.Tanh(), torch.nn.Linear(8, 2)), jax_model=Port,
            example_inputs=lambda: (np.random.default_rng(0).normal(size=(16, 5)).astype(np.float32),),
            example_targets=lambda: (np.random.default_rng(1).normal(size=(16, 2)).astype(np.float32),),
            torch_loss=lambda o, x, t: ((o - t) ** 2).mean(), jax_loss=lambda o, x, t: ((o - t) ** 2).mean(),
            torch_optimizer=lambda p: torch.optim.AdamW(p, lr=1e-3),
            jax_optimizer=lambda: optax.adamw(**{"learning_rate": 1e-3, **weight_decay}))

    report = testing.check_port(spec({}), "float32", programs=("jit",))
    assert report.first_divergence.stage == "update", report.format()
    assert "the optimizers' weight decays differ: with zero gradients PyTorch's shrinks each weight by 1e-05 of itself " \
           "a step and the port's by 1e-07" in report.format()
    assert_agrees(testing.check_port(spec({"weight_decay": 0.01}), "float32", programs=("jit",)))
    # the other hyperparameters, each told by its own probe and no other: the learning rate, Adam's eps, its betas
    # (which the first step does not feel: Adam's first update is lr · sign(g) whatever they are; two steps)
    for settings, steps, kind, said in [
            ({"learning_rate": 1e-4}, 1, "learning rates", "the optimizers' learning rates differ: with a gradient of 1 "
             "the first step moves a weight by -0.001 in PyTorch and -0.0001 in the port"),
            ({"eps": 1e-6}, 1, "epsilons", "the optimizers' epsilons differ"),
            ({"b2": 0.95}, 2, "momenta", "the optimizers' momenta differ")]:
        report = testing.check_port(spec({"weight_decay": 0.01, **settings}), "float32", steps=steps,
                                    programs=("jit",))
        text = report.format()
        assert report.first_divergence.stage.endswith("update") and said in text, text
        others = {"learning rates", "weight decays", "epsilons", "momenta"} - {kind}
        assert not any(f"the optimizers' {other} differ" in text for other in others), text
