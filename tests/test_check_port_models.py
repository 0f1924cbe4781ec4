"""check-port at the size and shape of real models: what it holds while it checks, and what a transformer port needs
(output objects, near-zero gradients under Adam, a port that fixes its own dtype, broadcast-equal arrays, Linen's
``deterministic``, what the losses receive).

Each test builds a small PyTorch model and a port whose only difference (if any) is the one under test.
"""

import dataclasses
import mmap
import re
import tempfile

import flax.linen as fnn
import jax
import jax.numpy as jnp
import numpy as np
import optax
import pytest
import torch

from functional_gan import testing
from functional_gan.testing.memory import MemoryPolicy
from functional_gan.main import main
from tests.helpers import assert_agrees


class _Attention(torch.nn.Module):
    """One attention head without a mask: softmax ignores the key's bias (it shifts every logit of a row by the same
    amount), so that bias's gradient is zero but for rounding."""

    def __init__(self, width: int = 8):
        super().__init__()
        self.q, self.k, self.v = (torch.nn.Linear(width, width) for _ in range(3))

    def forward(self, x):
        att = torch.softmax(self.q(x) @ self.k(x).transpose(1, 2) / 8 ** 0.5, dim=-1)
        return att @ self.v(x)


class _LinenAttention(fnn.Module):
    dtype: object = None  # Flax's own default; jnp.float32 fixes the dtype the port computes in
    width: int = 8

    @fnn.compact
    def __call__(self, x):
        q, k, v = (fnn.Dense(self.width, dtype=self.dtype)(x) for _ in range(3))
        att = jax.nn.softmax(q @ jnp.swapaxes(k, 1, 2) / 8 ** 0.5, axis=-1)
        return att @ v


def _scale_update_of(leaf: str, factor: float) -> optax.GradientTransformation:
    """A planted mistake: one parameter's update ``factor`` times what Adam computed."""
    def update(updates, state, params=None):
        return jax.tree_util.tree_map_with_path(
            lambda path, u: u * factor if jax.tree_util.keystr(path) == leaf else u, updates), state

    return optax.GradientTransformation(lambda params: optax.EmptyState(), update)


def _attention_spec(factor: float = 1.0, **changes) -> testing.Spec:
    spec = testing.Spec(
        _Attention, jax_model=_LinenAttention,
        example_inputs=lambda: (np.random.default_rng(0).normal(size=(4, 6, 8)).astype(np.float32),),
        example_targets=lambda: (np.random.default_rng(1).normal(size=(4, 6, 8)).astype(np.float32),),
        to_jax=lambda *a: a, from_jax=np.asarray,  # (batch, tokens, features) on both sides
        torch_loss=lambda o, x, t: torch.mean((o - t) ** 2), jax_loss=lambda o, x, t: jnp.mean((o - t) ** 2),
        torch_optimizer=lambda p: torch.optim.Adam(p, lr=1e-3),
        jax_optimizer=lambda: optax.chain(optax.adam(1e-3), _scale_update_of("['Dense_1']['bias']", factor)))
    return dataclasses.replace(spec, **changes)


# --- what the check holds ------------------------------------------------------------------------------------------


@pytest.mark.parametrize("dtype", ["float32", pytest.param("float64", marks=pytest.mark.slow)])
def test_the_pytorch_side_builds_one_model_per_role_not_one_per_run(dtype):
    """Besides the pairing's first build: the float64 reference and a working model per dtype that every other run
    and every optimizer fed the port's gradients loads its start into (float32: one of each dtype; float64: one, and
    one in other memory layouts). Before, each run and each optimizer had a model of its own: 9 for a check of two
    programs, in either dtype."""
    built = []

    def counted():
        built.append(1)
        return _Attention()

    report = testing.check_port(_attention_spec(torch_model=counted), dtype, steps=2)
    assert report.exit_status() == 0, report.format()
    # (float32's float64 working model serves the update stage only, built at the first update; over 2 steps both
    # programs' optimizers keep it from step 1 on; float64 has a float32 working model too, whose error × 2⁻²⁹ is
    # part of PyTorch's own float64 error)
    assert len(built) == 1 + (3 if dtype == "float32" else 4)


@pytest.mark.parametrize("make", [lambda p: torch.optim.AdamW(p, lr=1e-3, weight_decay=0.1),
                                  lambda p: torch.optim.SGD(p, lr=0.1, momentum=0.9),
                                  lambda p: torch.optim.Adadelta(p, lr=1.0)], ids=["AdamW", "SGD", "Adadelta"])
def test_an_update_stepped_a_few_parameters_at_a_time_is_the_one_step_bit_for_bit(make):
    """check-port feeds PyTorch's optimizer the port's gradients a group of parameters at a time (what is held is then
    a group's gradients and state): over two steps, with the state carried, the same bits as one step over all."""
    from functional_gan.testing.pairing import transfer
    from functional_gan.testing.torch_side import fed_update

    torch.manual_seed(0)
    model = _Attention().double()
    pairings = transfer(model, {"params": {f"Dense_{i}": {"kernel": np.zeros((8, 8), np.float32),
                                                          "bias": np.zeros(8, np.float32)} for i in range(3)}})
    start = {k: v.clone() for k, v in model.state_dict().items()}
    rng = np.random.default_rng(0)
    grads = [{"params": {f"Dense_{i}": {"kernel": rng.normal(size=(8, 8)), "bias": rng.normal(size=8)}
                         for i in range(3)}} for _ in range(2)]
    results = {}
    for chunk in (1, 70, float("inf")):  # each tensor alone; a kernel and a bias; everything at once
        optimizer = make(model.parameters())
        for step, g in enumerate(grads):
            after = dict(fed_update(model, optimizer, start, pairings, g["params"], last=step == 1, chunk=chunk))
        results[chunk] = after
        assert not optimizer.state  # let go after the last step, group by group
    for key in results[1]:
        assert np.array_equal(results[1][key], results[float("inf")][key]), key
        assert np.array_equal(results[70][key], results[float("inf")][key]), key


@pytest.mark.parametrize("donate_fresh_state", [True, False])
def test_the_compiled_step_donates_its_parameters_and_computes_what_jit_computes(donate_fresh_state):
    """The compiled step check-port runs: the parameters made for it are donated (written over by the new ones), the
    optimizer's state of a first step is made after compilation and, for a large model, donated too; a small model's
    first step keeps it, and its later steps run the first step's program; every variant gives jax.jit's numbers bit
    for bit."""
    from functional_gan.testing.jax_side import CompiledStep
    from functional_gan.testing.jax_side import jax_step_function

    spec = _attention_spec()
    adapter = testing.apis.adapter_for(spec, lambda channels_last: (jnp.asarray(spec.example_inputs()[0]),), 0)
    optimizer = spec.jax_optimizer()
    step = jax_step_function(adapter, spec, optimizer)
    inputs, targets = (jnp.asarray(spec.example_inputs()[0]),), (jnp.asarray(spec.example_targets()[0]),)
    params = jax.tree_util.tree_map(lambda s: jnp.asarray(np.random.default_rng(0).normal(size=s.shape), s.dtype),
                                    adapter.variables["params"])

    def variables():
        return {"params": jax.tree_util.tree_map(jnp.copy, params), "batch_stats": {}, "carry": adapter.carry}

    expected = jax.jit(step)(variables(), inputs, targets, optimizer.init(params))
    compiled = CompiledStep(step, optimizer, donate_fresh_state)
    made, states = [], []

    def make_state():
        made.append(len(compiled.compiled))  # compiled programs when the state is made (eval_shape's trace first)
        states.append(optimizer.init(params))
        return states[-1]

    for fresh in (True, False):
        given, state = variables(), None if fresh else optimizer.init(params)
        outcome = compiled.with_state(make_state if fresh else None)(given, inputs, targets, state)
        assert all(leaf.is_deleted() for leaf in jax.tree_util.tree_leaves(given["params"]))  # donated
        assert fresh or not any(leaf.is_deleted() for leaf in jax.tree_util.tree_leaves(state))  # given: kept
        if fresh:  # the state made for the first step: written over by the new one for a large model only
            assert all(leaf.is_deleted() == donate_fresh_state for leaf in jax.tree_util.tree_leaves(states[-1]))
        assert len(compiled.compiled) == (1 if fresh or not donate_fresh_state else 2)  # one program, or one each
        for key in ("output", "loss", "grads", "params", "opt_state"):
            assert jax.tree_util.tree_all(jax.tree_util.tree_map(
                lambda a, b: np.array_equal(np.asarray(a), np.asarray(b)), outcome[key], expected[key])), key
    assert made == [0, 1]  # the first step's state made once its program was compiled



def test_the_float64_twin_compiled_before_its_start_is_made_computes_what_jit_computes():
    """The float32 program's float64 twin, compiled from the shapes of a start made and let go before the start it
    runs on is made (the compilation not beside the start's float64 parameters): jax.jit's numbers bit for bit."""
    import types

    from functional_gan.testing.jax_side import float64_twin
    from functional_gan.testing.jax_side import jax_step_function

    spec = _attention_spec()
    adapter = testing.apis.adapter_for(spec, lambda channels_last: (jnp.asarray(spec.example_inputs()[0]),), 0)
    step = jax_step_function(adapter, spec, None)
    run = types.SimpleNamespace(jax_inputs=(jnp.asarray(spec.example_inputs()[0]),),
                                jax_targets=(jnp.asarray(spec.example_targets()[0]),), layer_shapes={}, layer_paths={})
    made = []

    def make_before():
        made.append(1)
        with jax.enable_x64(True):
            params = jax.tree_util.tree_map(
                lambda s: jnp.asarray(np.random.default_rng(0).normal(size=s.shape), jnp.float64),
                adapter.variables["params"])
        return {"params": params, "batch_stats": {}, "carry": adapter.carry}

    plain = float64_twin(run, jax.jit(step), make_before)
    assert len(made) == 1
    first = float64_twin(run, jax.jit(step), make_before, compile_first=True)
    assert len(made) == 3  # one start for its shapes, let go; one to run on
    assert np.asarray(first["loss"]).dtype == np.float64
    for key in ("output", "loss", "grads", "layers"):
        assert jax.tree_util.tree_all(jax.tree_util.tree_map(
            lambda a, b: np.array_equal(np.asarray(a), np.asarray(b)), first[key], plain[key])), key

def test_optimizer_runs_on_moved_values_read_lazily_are_the_moved_copies_bit_for_bit():
    """PyTorch's own float64 error at the update stage feeds its optimizer the start and the gradients moved by one ulp;
    the moves are drawn beforehand (int8) and applied as each tensor is read, the same numbers as moved copies."""
    from functional_gan.testing.torch_side import Moved, MovedState, one_ulp, ulp_signs

    rng = np.random.default_rng(5)
    tensor, array = torch.from_numpy(rng.normal(size=(4, 5, 6))), rng.normal(size=(3, 300, 7))
    draws = np.random.default_rng(9)
    copies = (one_ulp(tensor, draws), one_ulp(torch.from_numpy(np.array(array)), draws).numpy())
    draws = np.random.default_rng(9)
    signs = (ulp_signs(tensor.shape, draws), ulp_signs(array.shape, draws))
    state = MovedState({"w": tensor, "steps": torch.tensor([3])}, {"w": signs[0]})
    assert torch.equal(state["w"], copies[0]) and torch.equal(state["steps"], torch.tensor([3]))
    assert np.array_equal(np.asarray(Moved(array, signs[1]), np.float64), copies[1])
    assert np.array_equal(np.asarray(Moved(array, signs[1])[2]), copies[1][2])  # a stacked leaf's slice
    assert not np.array_equal(copies[1], array)


@pytest.mark.parametrize("dtype", ["float32", pytest.param("float64", marks=pytest.mark.slow)])
def test_the_reference_stepped_in_place_gives_the_rows_a_working_copy_gives(dtype, monkeypatch):
    """In a check of one step, the last program's reference update steps PyTorch64's reference model itself (no
    working copy of the start): the rows are those of the working copy, number for number."""
    from functional_gan.testing import check

    report = testing.check_port(_attention_spec(), dtype)
    fed, asked = check.fed_updates, []

    def working_copy(*args, in_place=False, **kwargs):
        asked.append(in_place)
        return fed(*args, in_place=False, **kwargs)

    monkeypatch.setattr(check, "fed_updates", working_copy)
    again = testing.check_port(_attention_spec(), dtype)
    assert asked == [False, True]  # eager's start is jit's start too; jit, the last, would step the reference
    assert [row.__dict__ for row in report.rows + report.other_rows] == \
        [row.__dict__ for row in again.rows + again.other_rows]


@pytest.mark.parametrize("dtype", ["float32", pytest.param("float64", marks=pytest.mark.slow)])
def test_reference_gradients_computed_again_are_the_ones_held(dtype, monkeypatch):
    """A large model's PyTorch64 gradients are not held while the port runs: the last step computes them again for
    each program's rows (the same start, inputs and random state). Forced on a small model, over two steps and both
    programs: the same report, number for number."""
    from functional_gan.testing import check

    held = testing.check_port(_attention_spec(), dtype, steps=2)
    computed, calls = check.recomputed_gradients, []
    monkeypatch.setattr(check, "recomputed_gradients", lambda run: calls.append(1) or computed(run))
    again = testing.check_port(_attention_spec(), dtype, steps=2, memory=MemoryPolicy(recomputed_above=-1))
    assert len(calls) == 2  # at the last step, once for each program
    assert [row.__dict__ for row in held.rows + held.other_rows] == \
        [row.__dict__ for row in again.rows + again.other_rows]


def _wide_attention_spec() -> testing.Spec:
    """The attention spec 64 wide: its weights span whole pages of memory (what parking hands back)."""
    return _attention_spec(torch_model=lambda: _Attention(64), jax_model=lambda: _LinenAttention(width=64),
                           example_inputs=lambda: (np.random.default_rng(0).normal(size=(4, 6, 64)).astype(np.float32),),
                           example_targets=lambda: (np.random.default_rng(1).normal(size=(4, 6, 64)).astype(np.float32),))


@pytest.mark.parametrize("dtype", ["float32", pytest.param("float64", marks=pytest.mark.slow)])
def test_the_reference_parked_on_disk_while_the_port_runs_gives_the_same_report(dtype, monkeypatch):
    """A large model's PyTorch64 reference (and its optimizer's state) is parked on disk while each program of the port
    runs. Forced on a small model, over two steps and both programs: its weights and moments read as zeros while a program runs (their memory handed back), and the report
    is the same, number for number."""
    from functional_gan.testing import check

    held = testing.check_port(_wide_attention_spec(), dtype, steps=2)
    run_program, seen = check.run_program, []

    def spy(run, *args, **kwargs):
        model, optimizer = run.sides["ref"]
        moments = [v for s in optimizer.state.values() for v in s.values() if torch.is_tensor(v) and v.numel() > 1]
        # nothing but the parts of a page at each end of a tensor's memory still holds its values
        seen.append([int(t.count_nonzero()) <= 2 * mmap.PAGESIZE // t.element_size()
                     for t in [*model.parameters(), *moments] if t.numel() >= 4096])
        return run_program(run, *args, **kwargs)

    monkeypatch.setattr(check, "run_program", spy)
    again = testing.check_port(_wide_attention_spec(), dtype, steps=2, memory=MemoryPolicy(parked_above=-1))
    assert [len(sums) for sums in seen] == [9] * 4  # two steps of two programs: 3 weights, Adam's 6 moments of them
    assert all(all(sums) for sums in seen)
    assert [row.__dict__ for row in held.rows + held.other_rows] == \
        [row.__dict__ for row in again.rows + again.other_rows]


def test_parked_tensors_come_back_with_their_values_views_and_ties(monkeypatch):
    """Parked tensors' memory is handed back (whole pages of it read as zeros) and read back: the same objects,
    views, NumPy arrays of them and tied parameters see the same values; a failed write lets nothing go."""
    from functional_gan.testing.torch_side import Parked

    model = torch.nn.Sequential(torch.nn.Linear(256, 256), torch.nn.Linear(256, 256)).double()
    model[1].weight = model[0].weight  # tied
    view = model[0].weight.detach()[2:]  # a view of the same memory, as a step's start holds at the last step
    array = model[0].weight.detach().numpy()  # a NumPy array of it, as the conversions make
    before = {k: v.clone() for k, v in model.state_dict().items()}
    parked = Parked([*model.parameters(), view])
    assert len(parked.storages) == 1 and parked.nbytes == 256 * 256 * 8  # the biases span no whole page
    with parked:
        assert not model[0].weight.detach()[8:-8].any() and not array[8:-8].any()
        assert torch.equal(model[0].bias, before["0.bias"])
    assert all(torch.equal(before[k], v) for k, v in model.state_dict().items())
    assert torch.equal(view, before["0.weight"][2:]) and model[1].weight is model[0].weight
    assert np.array_equal(array, before["0.weight"].numpy())

    class FullDisk:
        def write(self, data):
            raise OSError(28, "No space left on device")

        def close(self):
            pass

    monkeypatch.setattr(tempfile, "TemporaryFile", lambda **kwargs: FullDisk())
    with pytest.raises(OSError, match="No space"):
        with Parked(list(model.parameters())):
            pass
    assert all(torch.equal(before[k], v) for k, v in model.state_dict().items())


def test_memory_phases_are_reported_on_request(capsys, tmp_path, monkeypatch):
    (tmp_path / "spec.py").write_text(
        "import numpy as np, torch, flax.linen as fnn\n"
        "torch_model = lambda: torch.nn.Linear(5, 3)\n"
        "jax_model = lambda: fnn.Dense(3)\n"
        "def example_inputs():\n    return (np.ones((2, 5), np.float32),)\n")
    assert main(["check-port", str(tmp_path / "spec.py"), "--memory"]) == 0
    out = capsys.readouterr().out
    assert "Memory (resident, GiB; the process's peak" in out
    for phase in ("PyTorch models built, port paired", "PyTorch's runs", "the port, eager",
                  "the port in float64 (eager)", "rows of jit"):
        assert phase in out
    report = testing.check_port(testing.load_spec(tmp_path / "spec.py"))
    assert report.memory.peak >= max(m.resident or 0 for m in report.memory.marks) > 0


# --- near-zero gradients under Adam ---------------------------------------------------------------------------------


def test_a_wrong_update_where_the_true_gradient_is_zero_is_a_divergence_not_rounding():
    """The key bias's gradient is 0 in exact arithmetic (PyTorch64: below 1e-17), rounding in float32 (about 1e-9); Adam
    makes steps of the learning rate's size of both. Its update stage's float32 error is measured from the same
    gradients (the port's optimizer in float64 fed the float32 gradients), so a 1% error in that one update is a
    divergence, named there; the same port without it agrees."""
    correct = testing.check_port(_attention_spec(), steps=2)
    assert_agrees(correct)
    gradient = next(r for r in correct.rows if (r.step, r.stage, r.name) == (1, "gradient", "k.bias"))
    assert gradient.scale < 1e-15 and abs(gradient.jax_value) > 1e-12  # zero but for rounding, and float32's is larger
    update = next(r for r in correct.rows if (r.step, r.stage, r.name) == (1, "update", "k.bias"))
    assert update.jax_noise < update.allowed  # the update's own float32 error, from the same gradients, is small

    wrong = testing.check_port(_attention_spec(1.01), steps=2)
    first = wrong.first_divergence
    assert (first.step, first.stage, first.name) == (1, "update", "k.bias"), wrong.format()
    assert first.twin_error > first.allowed  # the float64 twin from the same gradients is wrong too: the mathematics
    assert wrong.exit_status() == 1


# --- output objects -------------------------------------------------------------------------------------------------


@dataclasses.dataclass
class _TorchOutput:
    logits: torch.Tensor
    hidden: torch.Tensor


class _ReturnsObject(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.fc = torch.nn.Linear(5, 3)

    def forward(self, x):
        return _TorchOutput(logits=self.fc(x), hidden=x)


class _LinenReturnsDict(fnn.Module):
    @fnn.compact
    def __call__(self, x):
        return {"hidden": x, "logits": fnn.Dense(3)(x)}


def _object_spec(**changes) -> testing.Spec:
    spec = testing.Spec(
        _ReturnsObject, jax_model=_LinenReturnsDict,
        example_inputs=lambda: (np.random.default_rng(0).normal(size=(4, 5)).astype(np.float32),),
        example_targets=lambda: (np.random.default_rng(1).normal(size=(4, 3)).astype(np.float32),),
        torch_loss=lambda o, x, t: torch.mean((o - t) ** 2), jax_loss=lambda o, x, t: jnp.mean((o - t) ** 2),
        torch_optimizer=lambda p: torch.optim.SGD(p, lr=0.1), jax_optimizer=lambda: optax.sgd(0.1))
    return dataclasses.replace(spec, **changes)


def test_output_names_the_field_of_both_sides_output_objects():
    """PyTorch's model returns a dataclass (as Hugging Face's ModelOutput), the port a dict: OUTPUT = "logits" picks
    the field compared on both sides, and the losses receive it."""
    assert_agrees(testing.check_port(_object_spec(output="logits")))
    assert_agrees(testing.assert_port(torch_model=_ReturnsObject, jax_model=_LinenReturnsDict, OUTPUT="logits",
                                      example_inputs=lambda: (np.ones((2, 5), np.float32),)))


def test_an_output_object_without_output_is_one_line_naming_its_fields(tmp_path, capsys):
    with pytest.raises(testing.SpecError, match=r"PyTorch's model returns a _TorchOutput, not an array: name the field "
                                                r"compared, in the spec, OUTPUT = 'logits' .*its fields: logits, hidden"):
        testing.check_port(_object_spec())
    with pytest.raises(testing.SpecError, match=r"has no field 'scores' \(OUTPUT\); its fields: logits, hidden"):
        testing.check_port(_object_spec(output="scores"))
    (tmp_path / "spec.py").write_text(
        "import numpy as np\nfrom tests.test_check_port_models import _ReturnsObject as torch_model, "
        "_LinenReturnsDict as jax_model\n"
        "def example_inputs():\n    return (np.ones((2, 5), np.float32),)\n")
    assert main(["check-port", str(tmp_path / "spec.py")]) == 2
    err = capsys.readouterr().err
    assert "OUTPUT = 'logits'" in err and "Traceback" not in err and len(err.strip().splitlines()) == 1


# --- the port's dtype -----------------------------------------------------------------------------------------------


def test_the_dtype_check_reads_the_ports_own_output_not_what_from_jax_makes_of_it():
    assert_agrees(testing.check_port(_attention_spec(from_jax=lambda y: np.asarray(y, np.float64))))


def test_a_port_that_fixes_its_dtype_to_float32_is_said_to_have_no_float64_twin():
    """Flax's Dense(dtype=jnp.float32) computes in float32 whatever its inputs: run "in float64" it is still float32,
    and JAX's own float32 error would read 0. The report says so, and no row is called precision."""
    report = testing.check_port(_attention_spec(jax_model=lambda: _LinenAttention(dtype=jnp.float32)))
    assert any("the port run in float64 computes in float32" in note for note in report.notes), report.notes
    assert "Note: the port run in float64 computes in float32" in report.format()
    assert all(r.jax_noise is None for r in report.rows if r.stage != "update")
    assert not report.precision_findings


# --- arrays that broadcast to each other ----------------------------------------------------------------------------


class _Positions(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.wpe = torch.nn.Embedding(6, 4)
        self.fc = torch.nn.Linear(4, 2)

    def forward(self, x):  # (batch, tokens, 4)
        return self.fc(x + self.wpe(torch.arange(x.shape[1])[None]))  # positions (1, tokens), as nanoGPT's


class _LinenPositions(fnn.Module):
    mistake: bool = False  # a planted mistake: the second sample's positions reversed

    @fnn.compact
    def __call__(self, x):
        positions = jnp.broadcast_to(jnp.arange(x.shape[1])[None], x.shape[:2])  # (batch, tokens), as HF's Flax GPT-2
        if self.mistake:
            positions = positions.at[1].set(positions[1, ::-1])
        return fnn.Dense(2)(x + fnn.Embed(6, 4)(positions))


def test_layer_outputs_that_differ_by_a_broadcast_axis_are_compared_broadcast_with_a_note():
    def spec(mistake):
        return testing.Spec(_Positions, jax_model=lambda: _LinenPositions(mistake),
                            example_inputs=lambda: (np.random.default_rng(0).normal(size=(3, 6, 4)).astype(np.float32),),
                            to_jax=lambda *a: a, from_jax=np.asarray)

    report = testing.check_port(spec(False))
    assert_agrees(report)
    assert any(r.stage == "forward" and r.name == "wpe" for r in report.rows)
    assert ("forward, wpe: the port's (3, 6, 4) and PyTorch's (1, 6, 4) differ by axes of length 1; compared broadcast "
            "to (3, 6, 4)") in report.notes
    wrong = testing.check_port(spec(True))  # one sample's positions differ: broadcast, it is seen
    assert (wrong.first_divergence.stage, wrong.first_divergence.name) == ("forward", "wpe")


# --- TRAIN reaches a Linen module's mode ----------------------------------------------------------------------------


class _DropoutNet(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.fc = torch.nn.Linear(5, 3)
        self.drop = torch.nn.Dropout(0.5)

    def forward(self, x):
        return self.drop(self.fc(x))


class _LinenDropoutArgument(fnn.Module):
    @fnn.compact
    def __call__(self, x, deterministic: bool):  # required: Flax's own examples pass it at each call
        return fnn.Dropout(0.5)(fnn.Dense(3)(x), deterministic=deterministic)


class _LinenDropoutField(fnn.Module):
    train: bool = True

    @fnn.compact
    def __call__(self, x):
        return fnn.Dropout(0.5, deterministic=not self.train)(fnn.Dense(3)(x))


@pytest.mark.parametrize("port", [_LinenDropoutArgument, _LinenDropoutField])
def test_train_false_reaches_a_linen_modules_deterministic_argument_or_train_field(port):
    assert_agrees(testing.check_port(testing.Spec(
        _DropoutNet, jax_model=port, train=False,
        example_inputs=lambda: (np.random.default_rng(0).normal(size=(4, 5)).astype(np.float32),),
        example_targets=lambda: (np.random.default_rng(1).normal(size=(4, 3)).astype(np.float32),),
        torch_loss=lambda o, x, t: torch.mean((o - t) ** 2), jax_loss=lambda o, x, t: jnp.mean((o - t) ** 2))))


# --- what the losses receive ----------------------------------------------------------------------------------------


def test_a_loss_that_fails_says_what_check_port_passed_it():
    with pytest.raises(testing.SpecError, match=re_escape(
            "<lambda>() takes 2 positional arguments but 3 were given; check-port called "
            "jax_loss(output, *inputs, *targets) with output (4, 6, 8) float32, inputs [(4, 6, 8) float32], "
            "targets [(4, 6, 8) float32]") + "$"):
        testing.check_port(_attention_spec(jax_loss=lambda o, t: jnp.mean((o - t) ** 2)))
    with pytest.raises(testing.SpecError, match=re_escape("torch_loss returned (4, 6, 8) torch.float64, not one number")):
        testing.check_port(_attention_spec(torch_loss=lambda o, x, t: (o - t) ** 2))


def test_a_loss_of_one_number_in_any_shape_is_taken_and_more_than_one_is_refused():
    """A loss kept as (1, 1) (``loss.view(1, 1)``, a mean taken with keepdim) is one number to PyTorch's backward() and
    to check-port alike; a loss of two numbers is refused on either side."""
    def spec(torch_shape, jax_shape):
        return testing.Spec(
            _DropoutNet, jax_model=_LinenDropoutField, train=False,
            example_inputs=lambda: (np.random.default_rng(0).normal(size=(4, 5)).astype(np.float32),),
            example_targets=lambda: (np.random.default_rng(1).normal(size=(4, 3)).astype(np.float32),),
            torch_loss=lambda o, x, t: torch.mean((o - t) ** 2) * torch.ones(torch_shape, dtype=o.dtype),
            jax_loss=lambda o, x, t: jnp.mean((o - t) ** 2) * jnp.ones(jax_shape, o.dtype))

    assert_agrees(testing.check_port(spec((1, 1), (1, 1))))
    assert_agrees(testing.check_port(spec((), (1, 1, 1))))
    with pytest.raises(testing.SpecError, match=re_escape("torch_loss returned (1, 2) torch.float64, not one number")):
        testing.check_port(spec((1, 2), ()))
    with pytest.raises(testing.SpecError, match="jax_loss returned .*2.*, not one number"):
        testing.check_port(spec((), (2,)))


class _TorchMHA(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.attn = torch.nn.MultiheadAttention(8, 2, batch_first=True)

    def forward(self, x):
        return self.attn(x, x, x)[0]


class _FlaxMHA(fnn.Module):
    @fnn.compact
    def __call__(self, x):
        return fnn.MultiHeadDotProductAttention(num_heads=2, name="attn")(x)


def test_a_packed_pytorch_tensor_the_port_keeps_in_pieces_is_refused_saying_so():
    """nn.MultiheadAttention's in_proj_weight holds query, key and value; Flax's attention has three kernels: no
    tensor to pair it with, and param_map cannot split it: exit 2 with a line saying what PyTorch packs."""
    with pytest.raises(testing.SpecError, match=re_escape(
            "PyTorch's MultiheadAttention keeps the query, key and value projections (in_proj_weight, in_proj_bias) "
            "in one tensor, which check-port moves whole")):
        testing.check_port(testing.Spec(_TorchMHA, jax_model=_FlaxMHA, to_jax=lambda x: (x,),
                                        example_inputs=lambda: (np.zeros((2, 5, 8), np.float32),)))


def re_escape(text: str) -> str:
    import re

    return re.escape(text)


# --- tied weights ---------------------------------------------------------------------------------------------------


class _TiedLM(torch.nn.Module):
    """GPT-2's tying: the output layer's weight is the token embedding (nanoGPT: ``self.transformer.wte.weight =
    self.lm_head.weight``); the model returns an object, as Hugging Face's models do."""

    def __init__(self):
        super().__init__()
        self.wte = torch.nn.Embedding(11, 8)
        self.mix = torch.nn.Linear(8, 8)
        self.lm_head = torch.nn.Linear(8, 11, bias=False)
        self.lm_head.weight = self.wte.weight

    def forward(self, idx):
        return {"logits": self.lm_head(torch.tanh(self.mix(self.wte(idx))))}


class _LinenTiedLM(fnn.Module):
    @fnn.compact
    def __call__(self, idx):
        wte = fnn.Embed(11, 8)
        return _JaxOutput(logits=wte.attend(jnp.tanh(fnn.Dense(8)(wte(idx)))))  # the embedding's transpose, as HF's


@jax.tree_util.register_dataclass
@dataclasses.dataclass
class _JaxOutput:
    logits: jax.Array


def _cross_entropy_torch(logits, idx, targets):
    return torch.nn.functional.cross_entropy(logits.reshape(-1, 11), targets.reshape(-1))


def _cross_entropy_jax(logits, idx, targets):
    return optax.softmax_cross_entropy_with_integer_labels(logits.reshape(-1, 11), targets.reshape(-1)).mean()


def _tied_spec(jax_model) -> testing.Spec:
    """PyTorch's tied LM against ``jax_model``, with a cross-entropy loss and SGD."""
    return testing.Spec(
        _TiedLM, jax_model=jax_model, output="logits",
        example_inputs=lambda: (np.random.default_rng(0).integers(0, 11, (3, 5)),),
        example_targets=lambda: (np.random.default_rng(1).integers(0, 11, (3, 5)),),
        to_jax=lambda *a: a, from_jax=np.asarray, torch_loss=_cross_entropy_torch, jax_loss=_cross_entropy_jax,
        torch_optimizer=lambda p: torch.optim.SGD(p, lr=0.5), jax_optimizer=lambda: optax.sgd(0.5))


@pytest.mark.parametrize("dtype", ["float32", pytest.param("float64", marks=pytest.mark.slow)])
def test_a_tied_embedding_pairs_once_and_its_gradient_sums_over_its_uses(dtype):
    spec = _tied_spec(_LinenTiedLM)
    report = testing.check_port(spec, dtype, steps=2)
    assert_agrees(report)
    assert report.tied == {"lm_head.weight": "wte.weight"}
    assert re.search(r"lm_head\.weight  =  wte\.weight +\(tied: one tensor, paired once", report.format())
    assert [p.torch_key for p in report.pairings] == ["wte.weight", "mix.weight", "mix.bias"]
    gradient = next(r for r in report.rows if (r.step, r.stage, r.name) == (1, "gradient", "wte.weight"))
    assert gradient.passed  # the sum over both uses: the embedding's and the output layer's


class _LinenUntiedLM(fnn.Module):
    """A port that keeps its own output layer beside the embedding, where PyTorch ties the two (``tie``: its output
    layer uses the embedding's array instead, through ``attend``)."""

    tie: bool = False

    @fnn.compact
    def __call__(self, idx):
        wte = fnn.Embed(11, 8, name="wte")
        hidden = jnp.tanh(fnn.Dense(8, name="mix")(wte(idx)))
        return _JaxOutput(logits=wte.attend(hidden) if self.tie else fnn.Dense(11, use_bias=False, name="lm_head")(hidden))


def test_a_port_that_keeps_its_own_copy_of_a_tied_tensor_gets_pytorchs_values_and_is_named_at_its_gradient():
    spec = _tied_spec(_LinenUntiedLM)
    report = testing.check_port(spec, "float32", programs=("jit",))
    # Both of the port's arrays hold PyTorch's one tensor (the embedding's, transposed for the Dense kernel)...
    assert [(p.torch_key, p.jax_name) for p in report.pairings] == [
        ("wte.weight", "params/wte/embedding"), ("mix.weight", "params/mix/kernel"), ("mix.bias", "params/mix/bias"),
        ("lm_head.weight", "params/lm_head/kernel")]
    # ...so everything up to the loss agrees; each copy's gradient is its own use's, PyTorch's the sum over both.
    assert all(r.passed for r in report.rows if r.stage in ("forward", "output", "loss"))
    failing = {r.name for r in report.rows if r.stage == "gradient" and not r.passed}
    assert failing == {"wte.weight", "lm_head.weight"}
    assert report.exit_status() == 1 and report.first_divergence.stage == "gradient"
    text = report.format()
    assert re.search(r"lm_head\.weight  =  wte\.weight +\(tied in PyTorch: one tensor; the port holds a copy of its own",
                     text)
    assert ("PyTorch's lm_head.weight is wte.weight: one tensor, whose gradient is the sum over both its uses" in text
            and "(wte/embedding and lm_head/kernel)" in text)
    # The port that ties (one array, through attend) agrees: the copy's gradient was the difference.
    assert_agrees(testing.check_port(dataclasses.replace(spec, jax_model=lambda: _LinenUntiedLM(tie=True)), "float32",
                                     programs=("jit",)))


# --- what a program run op by op holds ------------------------------------------------------------------------------

_COMPILED = "/jax/core/compile/backend_compile_duration"


def _op_by_op_loss(w):
    """An op-by-op computation at 5 slice shapes: each operation at each shape is a program of its own."""
    return sum(jnp.tanh(w[:n] * 1.5).sum() * jnp.sin(w[n]) for n in range(1, 6))


def _compilations(call):
    """(call's result, how many XLA programs JAX compiled while it ran), counted with jax.monitoring."""
    count = []
    listener = lambda event, duration, **_: count.append(event) if event == _COMPILED else None  # noqa: E731
    jax.monitoring.register_event_duration_secs_listener(listener)
    try:
        return call(), len(count)
    finally:
        jax.monitoring.unregister_event_duration_listener(listener)


def test_programs_compiled_op_by_op_are_let_go_past_the_bound_with_the_same_numbers():
    from functional_gan.testing.memory import op_programs_bounded

    w = jnp.linspace(-1.0, 1.0, 7)
    grad = jax.grad(_op_by_op_loss)
    jax.clear_caches()
    unbounded, first = _compilations(lambda: np.asarray(grad(w)))
    _, again = _compilations(lambda: np.asarray(grad(w)))
    assert first > 20 and again == 0  # JAX keeps every program it compiled op by op: the second run compiles none
    jax.clear_caches()
    with op_programs_bounded(held=4):
        bounded, first_bounded = _compilations(lambda: np.asarray(grad(w)))
        repeated, again_bounded = _compilations(lambda: np.asarray(grad(w)))
    # At most 4 held: the second run compiles again nearly all the first did (the programs were let go)...
    assert first_bounded >= first and again_bounded > first - 4
    # ...and they are the same programs: the same numbers, bit for bit.
    np.testing.assert_array_equal(bounded, unbounded)
    np.testing.assert_array_equal(repeated, unbounded)
    # Outside the block, JAX keeps its programs again.
    _compilations(lambda: np.asarray(grad(w)))
    _, after = _compilations(lambda: np.asarray(grad(w)))
    assert after == 0


def test_the_policy_keeps_a_small_models_programs_and_lets_a_large_ones_go():
    """JAX's per-operation programs are let go after an op-by-op program only on a model past the policy's size."""
    policy = MemoryPolicy()
    w = jnp.linspace(-1.0, 1.0, 7)
    grad = jax.grad(_op_by_op_loss)
    small, large = policy.programs_let_go_above, policy.programs_let_go_above + 1
    for parameter_bytes, compiled_again in ((small, False), (large, True)):
        jax.clear_caches()
        with policy.programs_held("eager", parameter_bytes):
            _, first = _compilations(lambda: np.asarray(grad(w)))
        policy.let_go_of_programs("eager", parameter_bytes)
        _, again = _compilations(lambda: np.asarray(grad(w)))
        assert first > 20 and (again >= first if compiled_again else again == 0), (parameter_bytes, first, again)
    policy.let_go_of_programs("jit", large)  # after a compiled program JAX's caches are not touched
    _, after = _compilations(lambda: np.asarray(grad(w)))
    assert after == 0


def test_where_jax_dispatches_elsewhere_the_bound_is_a_no_op(monkeypatch):
    from jax._src import dispatch

    from functional_gan.testing.memory import op_programs_bounded

    monkeypatch.delattr(dispatch, "xla_primitive_callable")
    with op_programs_bounded(held=1):
        pass
    assert not hasattr(dispatch, "xla_primitive_callable")


@pytest.mark.parametrize("api", ["nnx", "equinox"])
def test_the_adapter_does_not_hold_the_ports_initial_parameters_once_paired(api):
    """Every step's variables come from PyTorch's tensors (the pairing): the port's own initial values of the paired
    leaves are held nowhere once the checker keeps their shapes (a second copy of a ResNet-50's parameters)."""
    import gc
    import weakref

    from functional_gan.testing import apis
    from functional_gan.testing.pairing import shapes_of_paired, transfer

    torch.manual_seed(0)
    torch_model = torch.nn.Sequential(torch.nn.Linear(3, 4), torch.nn.Linear(4, 2))
    if api == "nnx":
        from flax import nnx

        made = nnx.Sequential(nnx.Linear(3, 4, rngs=nnx.Rngs(0)), nnx.Linear(4, 2, rngs=nnx.Rngs(1)))
        initial = [made.layers[0].kernel.get_value(), made.layers[1].bias.get_value()]
    else:
        import equinox as eqx

        keys = jax.random.split(jax.random.key(0))
        made = eqx.nn.Sequential([eqx.nn.Linear(3, 4, key=keys[0]), eqx.nn.Linear(4, 2, key=keys[1])])
        initial = [made.layers[0].weight, made.layers[1].bias]
    held = [weakref.ref(a) for a in initial]
    x = jnp.ones((2, 3) if api == "nnx" else (3,))  # an Equinox layer takes one sample
    spec = testing.Spec(lambda: torch_model, jax_model=[made].pop, example_inputs=lambda: (np.asarray(x),))
    del made
    adapter = apis.adapter_for(spec, lambda channels_last: (x,), 0, abstract=False)  # built as the spec builds it
    adapter.variables = shapes_of_paired(adapter.variables, transfer(torch_model, adapter.variables, None, adapter.kinds))
    del initial
    gc.collect()
    assert [ref() for ref in held] == [None, None]
    # The port still runs, from variables that hold PyTorch's values (as each step's do).
    values = jax.tree_util.tree_map(lambda s: jnp.full(s.shape, 0.5, s.dtype), adapter.variables)
    output, _, _, _ = adapter.apply(values, (x,), False)
    np.testing.assert_allclose(np.asarray(output), np.full(x.shape[:-1] + (2,), 0.5 + 0.5 * 4 * (0.5 + 0.5 * 3)))


# --- the benchmark of check-port's size -----------------------------------------------------------------------------


@pytest.mark.slow
def test_the_memory_benchmark_measures_a_check_in_a_process_of_its_own(tmp_path):
    from functional_gan.benchmarks import check_port_memory

    assert check_port_memory.main(["--quick", "--out", str(tmp_path)]) == 0
    results = __import__("json").loads((tmp_path / "check-port-memory.json").read_text())["results"]
    (result,) = results
    assert result["exit_status"] == 0 and result["quantities"] == 22
    assert 0.3 < result["peak_gib"] < 8  # imports alone are 0.4 GiB; the MNIST check measured 1.0
    assert "rows of jit" in result["phases"]
    assert "| mnist_cnn_nnx.py | both programs | 22 | 0 |" in (tmp_path / "check-port-memory.md").read_text()


def _compiled_names(call):
    """(call's result, the names of the programs JAX compiled while it ran), read off JAX's compile log."""
    import logging

    names = []

    class Names(logging.Handler):
        def emit(self, record):
            found = re.search(r"Finished XLA compilation of jit\((.+?)\)", record.getMessage())
            if found:
                names.append(found.group(1))

    handler, logger = Names(), logging.getLogger("jax")
    logger.addHandler(handler)
    try:
        with jax.log_compiles(True):
            return call(), names
    finally:
        logger.removeHandler(handler)


def _port_with_a_bias_pytorch_lacks(api):
    """A port of Linear(3, 4, bias=False) → Linear(4, 2) whose first layer has a bias: a leaf no tensor pairs with."""
    if api == "linen":
        class Port(fnn.Module):
            @fnn.compact
            def __call__(self, x):
                hidden = fnn.Dense(4, bias_init=fnn.initializers.normal(1.0))(x)
                return fnn.Dense(2)(hidden)

        return Port()
    if api == "nnx":
        from flax import nnx

        return nnx.Sequential(nnx.Linear(3, 4, bias_init=nnx.initializers.normal(1.0), rngs=nnx.Rngs(0)),
                              nnx.Linear(4, 2, rngs=nnx.Rngs(1)))
    import equinox as eqx

    keys = jax.random.split(jax.random.key(0))
    return eqx.nn.Sequential([eqx.nn.Linear(3, 4, key=keys[0]), eqx.nn.Linear(4, 2, key=keys[1])])


@pytest.mark.parametrize("api", ["linen", "nnx", "equinox"])
def test_the_port_is_built_as_shapes_and_draws_its_own_values_only_for_a_leaf_left_unpaired(api):
    """check-port builds the port abstractly (Linen: eval_shape of init; nnx.eval_shape; eqx.filter_eval_shape): no
    program is compiled and no random value drawn for weights PyTorch's replace. A leaf PyTorch has no tensor for (a
    bias the PyTorch layer lacks) keeps the port's own initial value, the same as the port built for real."""
    from functional_gan.testing import apis
    from functional_gan.testing.pairing import all_filled, leaf_at, transfer
    from functional_gan.testing.prepare import prepare

    x = jnp.ones((2, 3) if api != "equinox" else (3,))  # an Equinox layer takes one sample
    torch.manual_seed(0)
    paired = testing.Spec(lambda: torch.nn.Sequential(torch.nn.Linear(3, 4), torch.nn.Linear(4, 2)),
                          jax_model=lambda: _port_with_a_bias_pytorch_lacks(api), example_inputs=lambda: (np.asarray(x),))
    jax.clear_caches()
    adapter, compiled = _compiled_names(lambda: apis.adapter_for(paired, lambda channels_last: (x,), 0))
    leaves = jax.tree_util.tree_leaves(adapter.variables)
    assert len(leaves) == 4 and all(isinstance(leaf, jax.ShapeDtypeStruct) for leaf in leaves), adapter.variables
    assert set(compiled) <= {"stage", "_threefry_seed"}, compiled  # the seed's key (jax.random.key), no draw
    assert adapter.materialise is not None
    assert all_filled(adapter.variables, transfer(paired.torch_model(), adapter.variables, None, adapter.kinds))

    lacking = dataclasses.replace(paired, torch_model=lambda: torch.nn.Sequential(torch.nn.Linear(3, 4, bias=False),
                                                                                  torch.nn.Linear(4, 2)),
                                  jax_model=lambda: _port_with_a_bias_pytorch_lacks(api))
    run = prepare(lacking, "float32", 3.0, 0, ("jit",))
    real = apis.adapter_for(lacking, lambda channels_last: (x,), 0, abstract=False).variables
    bias = {"linen": ("Dense_0", "bias"), "nnx": ("layers", "0", "bias"), "equinox": ("layers", "0", "bias")}[api]
    kept = leaf_at(run.adapter.variables["params"], bias)
    assert not isinstance(kept, jax.ShapeDtypeStruct) and np.any(np.asarray(kept) != 0)
    np.testing.assert_array_equal(np.asarray(kept), np.asarray(leaf_at(real["params"], bias)))
    for key in [p.jax_path for p in run.pairings]:  # and every paired leaf is held as its shape alone
        assert isinstance(leaf_at(run.adapter.variables["params"], key), jax.ShapeDtypeStruct)


@pytest.mark.parametrize("target,words", [
    ("os:path.no_such_namespace.join", "'posixpath' has no attribute 'no_such_namespace'"),
    ("no_such_module_for_taps:f", "cannot import 'no_such_module_for_taps'"),
    ("os:path.no_such_function", "is not a function")])
def test_a_taps_target_that_is_not_there_is_a_spec_error_that_names_it(target, words):
    """Each way a TAPS target can be missing is one line naming it (a missing name on the way was an AttributeError)."""
    from functional_gan.testing import taps

    with pytest.raises(testing.SpecError, match=re.escape(words)):
        taps.validate({"rope": ("os.path:join", target)})


def test_a_float64_checks_float32_variant_narrows_integers_to_32_bits_keeping_their_sign():
    """The float32 run of a float64 check takes its inputs as JAX makes them without 64-bit types: int64 → int32,
    uint64 → uint32 (it made uint64 int32), floats → float32 clipped to its range."""
    from functional_gan.testing.jax_side import narrowed

    out = narrowed({"i": np.array([-3], np.int64), "u": np.array([2**32 - 1], np.uint64),
                    "f": np.array([np.finfo(np.float64).min, 0.5])})
    assert out["i"].dtype == np.int32 and out["i"][0] == -3
    assert out["u"].dtype == np.uint32 and out["u"][0] == 2**32 - 1
    assert out["f"].dtype == np.float32 and out["f"][0] == np.finfo(np.float32).min and out["f"][1] == 0.5
