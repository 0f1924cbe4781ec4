"""check-port block by block (``--by-block``, ``assert_port(by_block=True)``) and the GPT-2 example it is shown on.

The GPT-2 example runs at its tiny size here (``GPT2_SIZE=tiny``: the same code, 3 layers of 32); the 124M model's
check and its memory are measured by ``benchmarks/check_port_memory.py``.
"""

import copy
import gc
import importlib.util
import json
import sys
import weakref
from pathlib import Path

import numpy as np
import pytest
import torch

from functional_gan import testing
from functional_gan.main import main
from functional_gan.testing import blocks as by_block
from tests.helpers import dtypes

EXAMPLES = Path(__file__).resolve().parents[1] / "examples" / "port"


def _gpt2(monkeypatch, mistake: str | None = None):
    """examples/port/gpt2.py at its tiny size, as a spec module (loaded afresh: its size is read at import)."""
    monkeypatch.setenv("GPT2_SIZE", "tiny")
    if mistake:
        monkeypatch.setenv("GPT2_MISTAKE", mistake)
    else:
        monkeypatch.delenv("GPT2_MISTAKE", raising=False)
    monkeypatch.syspath_prepend(str(EXAMPLES))
    loader = importlib.util.spec_from_file_location("gpt2_tiny_spec", EXAMPLES / "gpt2.py")
    module = importlib.util.module_from_spec(loader)
    loader.loader.exec_module(module)
    return module


def test_the_gpt2_port_with_tied_embedding_and_scanned_layers_agrees_and_lists_the_tie(monkeypatch):
    report = testing.check_port(testing.spec_from_module(_gpt2(monkeypatch)), programs=("jit",))
    assert report.passed, report.format()
    assert report.tied == {"lm_head.weight": "transformer.wte.weight"}
    assert "lm_head.weight" not in {p.torch_key for p in report.pairings}
    assert [p.jax_name for p in report.pairings[:3]] == ["params/wte/embedding", "params/wpe/embedding",
                                                         "params/h/ln_1/scale[0]"]


# where each planted mistake is named block by block: GELU's tanh approximation where the whole check names it, a
# stopped residual gradient (which the whole check sees only in the parameters before it) at the block's input
BY_BLOCK = {"gelu-tanh-in-layer-1": ("forward", "transformer.h.1.mlp.c_proj"),
            "residual-detached-in-layer-1": ("gradient", "transformer.h.1 (input)")}


# the stopped residual among the slow tests (the default suite's time): the NNX stack's test below names one in the
# default suite
@pytest.mark.parametrize("mistake", [pytest.param(m, marks=pytest.mark.slow if m.startswith("residual") else ())
                                     for m in sorted(BY_BLOCK)])
def test_a_mistake_in_one_layer_is_named_in_that_block_whole_and_block_by_block(monkeypatch, mistake):
    module = _gpt2(monkeypatch, mistake)
    whole = testing.check_port(testing.spec_from_module(module), programs=("jit",))
    first = whole.first_divergence
    assert (first.stage, first.name) == module.MISTAKES[mistake], whole.format()

    blocks = by_block.check_by_block(testing.spec_from_module(module), programs=("jit",))
    assert blocks.exit_status() == 1
    assert [name for name, _ in blocks.blocks] == ["transformer.h.0", "transformer.h.1", "transformer.h.2"]
    verdicts = {name: report.exit_status() for name, report in blocks.blocks}
    assert verdicts == {"transformer.h.0": 0, "transformer.h.1": 1, "transformer.h.2": 0}, blocks.format()
    name, report = blocks.first_failing
    assert name == "transformer.h.1"
    assert (report.first_divergence.stage, report.first_divergence.name) == BY_BLOCK[mistake]  # named as in the model
    assert blocks.outside == ["transformer.wte.weight", "transformer.wpe.weight", "transformer.ln_f.weight",
                              "transformer.ln_f.bias"]
    text = blocks.format()  # the block's first divergence in full once (its report), then named in the closing line
    assert text.count(f"First divergence: {', '.join(BY_BLOCK[mistake])}: relative error") == 1, text
    assert text.endswith(f"Block transformer.h.1 diverges first: {', '.join(BY_BLOCK[mistake])} (its report above).")
    assert blocks.verdict().startswith(f"Block transformer.h.1: First divergence: {', '.join(BY_BLOCK[mistake])}")
    # each block's rows: its 6 layers, its output, 12 gradients and its input's, 12 updates; not the checker's own loss
    assert all(len(r.rows) == 32 and not any(row.stage == "loss" for row in r.rows) for _, r in blocks.blocks)
    if mistake == "residual-detached-in-layer-1":  # everything but the input's gradient agrees in layer 1
        assert [row.name for row in report.rows if row.diverged] == ["transformer.h.1 (input)"], blocks.format()


@pytest.mark.slow  # the command-line test below checks the float32 agreement by block in the default suite
@pytest.mark.parametrize("dtype", ["float32", "float64"])
def test_the_correct_port_agrees_block_by_block(monkeypatch, dtype):
    blocks = testing.assert_port(_gpt2(monkeypatch), dtype=dtype, programs=("jit",), by_block=True)
    assert len(blocks.blocks) == 3 and all(len(report.rows) == 32 for _, report in blocks.blocks)


def test_a_blocks_loss_gives_the_models_own_gradients(monkeypatch):
    """The block's loss, sum(output · the model loss's gradient at the block's output), has the model's gradient for
    the block's parameters (the chain rule): checked in float64 against PyTorch's own backward of the whole model."""
    module = _gpt2(monkeypatch)
    spec = testing.spec_from_module(module)
    torch.manual_seed(0)
    model = module.GPT().double()
    names = ["transformer.h.0", "transformer.h.2"]
    records = by_block._record(spec, model, names, "float64")
    idx, targets = (torch.as_tensor(a) for a in (*module.example_inputs(), *module.example_targets()))
    model.zero_grad()
    module.torch_loss(model(idx)[0], idx, targets).backward()
    for name in names:
        block = model.get_submodule(name)
        copy = __import__("copy").deepcopy(block)
        copy.zero_grad()
        inputs = [torch.as_tensor(x) for x in records[name]["inputs"]]
        (copy(*inputs) * torch.as_tensor(records[name]["cotangent"])).sum().backward()
        for (key, own), (_, whole) in zip(copy.named_parameters(), block.named_parameters()):
            np.testing.assert_allclose(own.grad.numpy(), whole.grad.numpy(), rtol=1e-10, atol=1e-14, err_msg=key)



class _BatchNormStack(torch.nn.Module):
    """Convolutions with BatchNorm in training mode (running statistics written by the forward) and a stem whose weight
    the head reuses (tied), in a channels-last memory layout: what the recording must give back as it found it."""

    def __init__(self, lstm: bool = False, captured: bool = False):
        super().__init__()
        self.stem = torch.nn.Conv2d(3, 4, 3, padding=1)
        self.layers = torch.nn.Sequential(*[torch.nn.Sequential(torch.nn.Conv2d(4, 4, 3, padding=1),
                                                                torch.nn.BatchNorm2d(4), torch.nn.Tanh())
                                            for _ in range(2)])
        self.lstm = torch.nn.LSTM(4, 4, batch_first=True) if lstm else None
        self.captured = [self.stem.weight] if captured else None  # read past the module's attribute

    def forward(self, x):
        x = self.layers(self.stem(x))
        if self.lstm is not None:
            x = x + self.lstm(x.mean(-1).transpose(1, 2))[0].transpose(1, 2).unsqueeze(-1)
        weight = self.captured[0] if self.captured else self.stem.weight
        return torch.nn.functional.conv2d(x[:, :3], weight.transpose(0, 1)[:3, :3])


@pytest.mark.parametrize("model", ["gpt2", "batchnorm", "lstm", "captured"])
def test_the_blocks_recorded_with_parameters_widened_where_read_are_the_whole_widened_models(monkeypatch, model):
    """The float64 recording run reads each parameter widened where the forward reads it (no float64 copy of the model
    held): the same inputs and cotangents, bit for bit, as widening the whole model, the model given back as it was
    (its parameters the same objects in the same order, its running statistics those the whole widening leaves); a
    model it cannot run that way (a parameter read other than as its module's attribute) is widened whole."""
    if model == "gpt2":
        module = _gpt2(monkeypatch)
        spec, build = testing.spec_from_module(module), module.GPT
    else:
        spec = testing.Spec(lambda: _BatchNormStack(lstm=model == "lstm", captured=model == "captured"),
                            example_inputs=lambda: (np.random.default_rng(0).normal(size=(2, 3, 5, 5))
                                                    .astype(np.float32),),
                            torch_loss=lambda o, x: torch.sum(o ** 3))
        build = spec.torch_model
    torch.manual_seed(0)
    lazily = build().train()
    if model != "gpt2":
        lazily = lazily.to(memory_format=torch.channels_last)
    whole = copy.deepcopy(lazily)
    names = ["transformer.h.0", "transformer.h.2"] if model == "gpt2" else ["layers.0", "layers.1"]
    parameters = [(name, id(p)) for name, p in lazily.named_parameters(remove_duplicate=False)]

    records, how = by_block._recorded_in_float64(spec, lazily, names, "float32")
    assert how == ("the model widened whole" if model == "captured" else "parameters widened where read")
    whole.double()
    expected = by_block._record(spec, whole, names, "float32")
    whole.float()
    assert parameters == [(name, id(p)) for name, p in lazily.named_parameters(remove_duplicate=False)]
    assert type(lazily.get_submodule(names[0])) is type(whole.get_submodule(names[0]))  # no parametrization left
    for name in names:
        for got, want in zip(records[name]["inputs"], expected[name]["inputs"], strict=True):
            assert got.dtype == want.dtype == np.float32 and np.array_equal(got, want), name
        assert np.array_equal(records[name]["cotangent"], expected[name]["cotangent"]), name
        assert np.abs(records[name]["cotangent"]).max() > 0
    state, wanted = lazily.state_dict(), whole.state_dict()
    assert list(state) == list(wanted)
    for key in state:
        assert state[key].dtype == wanted[key].dtype and torch.equal(state[key], wanted[key]), key
        assert state[key].stride() == wanted[key].stride(), key
    if model in ("batchnorm", "captured"):  # the forward wrote the running statistics, once (a failed try undone)
        assert int(state["layers.0.1.num_batches_tracked"]) == 1
        assert not torch.equal(state["layers.0.1.running_mean"], torch.zeros(4))
    # nothing of the recording run holds the model: its parameters go with it
    first = weakref.ref(next(lazily.parameters()))
    del lazily, state
    gc.collect()
    assert first() is None

# --- the blocks found, or named -------------------------------------------------------------------------------------


class _TorchStack(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.stem = torch.nn.Linear(6, 8)
        self.layers = torch.nn.ModuleList([_TorchBlock() for _ in range(3)])

    def forward(self, x):
        x = self.stem(x)
        for layer in self.layers:
            x = layer(x)
        return x


class _TorchBlock(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.fc = torch.nn.Linear(8, 8)

    def forward(self, x):
        return x + torch.tanh(self.fc(x))


def _nnx_stack(mistake_in: int = -1, mistake: str = "sin"):
    import jax
    import jax.numpy as jnp
    from flax import nnx

    class Block(nnx.Module):
        def __init__(self, mistake: str | None, rngs):
            self.fc, self.mistake = nnx.Linear(8, 8, rngs=rngs), mistake

        def __call__(self, x):
            residual = jax.lax.stop_gradient(x) if self.mistake == "detached" else x
            return residual + (jnp.sin if self.mistake == "sin" else jnp.tanh)(self.fc(x))

    class Stack(nnx.Module):
        def __init__(self, rngs):
            self.stem = nnx.Linear(6, 8, rngs=rngs)
            self.layers = nnx.List([Block(mistake if i == mistake_in else None, rngs) for i in range(3)])

        def __call__(self, x):
            x = self.stem(x)
            for layer in self.layers:
                x = layer(x)
            return x

    return Stack(nnx.Rngs(0))


def _stack_spec(mistake_in: int = -1, mistake: str = "sin", **changes) -> testing.Spec:
    import jax.numpy as jnp
    import optax

    spec = testing.Spec(
        _TorchStack, jax_model=lambda: _nnx_stack(mistake_in, mistake),
        example_inputs=lambda: (np.random.default_rng(0).normal(size=(5, 6)).astype(np.float32),),
        example_targets=lambda: (np.random.default_rng(1).normal(size=(5, 8)).astype(np.float32),),
        torch_loss=lambda o, x, t: torch.mean((o - t) ** 2), jax_loss=lambda o, x, t: jnp.mean((o - t) ** 2),
        torch_optimizer=lambda p: torch.optim.SGD(p, lr=0.1), jax_optimizer=lambda: optax.sgd(0.1))
    import dataclasses

    return dataclasses.replace(spec, **changes)


def test_the_default_blocks_pair_a_modulelist_with_the_nnx_ports_list(monkeypatch):
    report = by_block.check_by_block(_stack_spec(mistake_in=2), programs=("jit",))
    assert [name for name, _ in report.blocks] == ["layers.0", "layers.1", "layers.2"]
    assert report.outside == ["stem.weight", "stem.bias"]
    assert [r.exit_status() for _, r in report.blocks] == [0, 0, 1], report.format()
    first = report.first_failing[1].first_divergence  # fc agrees; sin for tanh after it: the block's output
    assert (first.stage, first.name) == ("output", "layers.2")


def test_a_residual_whose_gradient_stops_is_named_at_the_blocks_input_and_by_input_gradients():
    """A stop_gradient on a block's residual path changes no forward value and none of the block's own gradients: only
    the gradient it passes back. Block by block it is named at the block's input; the whole check names the parameters
    before it, and with INPUT_GRADIENTS also the model's input."""
    report = by_block.check_by_block(_stack_spec(mistake_in=1, mistake="detached"), programs=("jit",))
    assert [r.exit_status() for _, r in report.blocks] == [0, 1, 0], report.format()
    first = report.first_failing[1].first_divergence
    assert (first.stage, first.name) == ("gradient", "layers.1 (input)")
    assert [row.name for _, r in report.blocks for row in r.rows if row.diverged] == ["layers.1 (input)"]
    assert "Known cause that fits: a path that only the input's gradient takes is cut" in report.format()
    assert "stop_gradient (PyTorch's .detach()) on a residual stream" in report.first_failing[1].verdict()
    # the same in float64, where the input's gradient of a correct block agrees to within PyTorch's float64 error
    report = by_block.check_by_block(_stack_spec(), "float64", programs=("jit",))
    assert report.exit_status() == 0, report.format()
    assert all(any(row.name == f"{name} (input)" for row in r.rows) for name, r in report.blocks)

    whole = testing.check_port(_stack_spec(mistake_in=1, mistake="detached", input_gradients=True), programs=("jit",))
    diverged = [(row.stage, row.name) for row in whole.rows if row.diverged]
    assert diverged[0] == ("gradient", "stem.weight") and ("gradient", "(input)") in diverged, whole.format()
    assert ("gradient", "layers.0.fc.weight") in diverged and ("gradient", "layers.1.fc.weight") not in diverged


def test_input_gradients_of_an_image_compare_in_pytorchs_layout():
    """INPUT_GRADIENTS on a channels-last port (Linen, NHWC): the input's gradient is compared in PyTorch's NCHW, in
    float32 and float64 (PyTorch's own error measured over its batch orders, layouts and one-ulp moves as for every
    gradient); a spec without a floating-point input, or whose to_jax changes the inputs' count, is a clear error."""
    sys.path.insert(0, str(EXAMPLES))
    loader = importlib.util.spec_from_file_location("mnist_cnn_input_grads", EXAMPLES / "mnist_cnn.py")
    module = importlib.util.module_from_spec(loader)
    loader.loader.exec_module(module)
    spec = testing.spec_from_module({**vars(module), "INPUT_GRADIENTS": True})
    for dtype in ("float32", "float64"):
        report = testing.check_port(spec, dtype, programs=("jit",))
        row = next(row for row in report.rows if row.name == "(input)")
        assert row.stage == "gradient" and not row.diverged and not report.first_divergence, report.format()
    import dataclasses

    ints = dataclasses.replace(spec, example_inputs=lambda: (np.zeros((2, 3), np.int64),))
    with pytest.raises(testing.SpecError, match="INPUT_GRADIENTS needs a floating-point input"):
        testing.check_port(ints, programs=("jit",))
    two = dataclasses.replace(spec, to_jax=lambda x: (x, x))
    with pytest.raises(testing.SpecError, match="to_jax must give one array per input"):
        testing.check_port(two, programs=("jit",))


def test_blocks_that_cannot_be_found_or_are_misnamed_are_one_clear_error():
    import flax.linen as fnn

    class Linen(fnn.Module):
        @fnn.compact
        def __call__(self, x):
            return fnn.Dense(8)(x)

    with pytest.raises(testing.SpecError, match="layers.0 … layers.2; a Linen port.s blocks cannot be found"):
        by_block.check_by_block(_stack_spec(jax_model=Linen), programs=("jit",))
    with pytest.raises(testing.SpecError, match="names 'layers.7', which PyTorch's model has no module called"):
        by_block.check_by_block(_stack_spec(blocks=lambda: [("layers.7", None)]), programs=("jit",))
    with pytest.raises(testing.SpecError, match="no ModuleList or Sequential"):
        by_block.check_by_block(_stack_spec(torch_model=lambda: torch.nn.Linear(6, 8)), programs=("jit",))


def test_the_command_line_checks_block_by_block_and_writes_json(tmp_path, monkeypatch, capsys):
    monkeypatch.setenv("GPT2_SIZE", "tiny")
    monkeypatch.delenv("GPT2_MISTAKE", raising=False)
    out = tmp_path / "blocks.json"
    status = main(["check-port", str(EXAMPLES / "gpt2.py"), "--by-block", "--program", "jit", "--json", str(out),
                   "--memory"])
    printed = capsys.readouterr().out
    assert status == 0, printed
    assert "block by block: agreement (exit status 0); 3 blocks" in printed and "float64 run: blocks' inputs" in printed
    data = json.loads(out.read_text())
    assert data["by_block"] and [b["block"] for b in data["blocks"]] == ["transformer.h.0", "transformer.h.1",
                                                                        "transformer.h.2"]
    assert main(["check-port", str(EXAMPLES / "gpt2.py"), "--by-block", "--save", str(tmp_path / "w")]) == 2
    assert "cannot be used with --by-block" in capsys.readouterr().err
    assert not (tmp_path / "w").exists()
    sys.modules.pop("port_spec_gpt2", None)


def test_a_check_leaves_the_objects_it_found_out_of_the_collectors_passes_and_hands_them_back(monkeypatch):
    """Each phase's mark runs Python's garbage collector: the objects alive as the check began (the libraries' own)
    are frozen out of those passes while it runs, nested checks leave the outer one's freeze, and after the check the
    collector has them all again (CPython 3.12.1 starts with a few hundred objects frozen: the check hands those back
    too)."""
    from functional_gan.testing import memory

    frozen, release = [], memory.release

    def spy():
        frozen.append(gc.get_freeze_count())
        release()

    monkeypatch.setattr(memory, "release", spy)
    assert gc.get_freeze_count() < 1000
    testing.check_port(_stack_spec(), programs=("jit",))
    assert len(frozen) >= 5 and min(frozen) > 10_000 and gc.get_freeze_count() == 0
    with memory.old_objects_frozen():
        outer = gc.get_freeze_count()
        with memory.old_objects_frozen():
            assert gc.get_freeze_count() == outer
        assert gc.get_freeze_count() == outer > 10_000
    assert gc.get_freeze_count() == 0


def _keyword_decoder(**settings):
    loader = importlib.util.spec_from_file_location("keyword_decoder", Path(__file__).parent / "corpus" / "keyword_decoder.py")
    module = importlib.util.module_from_spec(loader)
    loader.loader.exec_module(module)
    for key, value in settings.items():
        setattr(module, key, value)
    return testing.spec_from_module(module)


@pytest.mark.parametrize("dtype", dtypes("float32"))
def test_layers_called_with_keyword_arguments_are_checked_as_the_model_calls_them(dtype):
    """transformers' decoder layers take attention_mask and position_embeddings by keyword: each block is called with
    them (PyTorch's) and block_to_jax gets them (the port's); before, the layer ran without them and failed."""
    report = by_block.check_by_block(_keyword_decoder(), dtype, programs=("jit",))
    assert report.exit_status() == 0 and len(report.blocks) == 3, report.format()
    assert all(any(r.name.endswith("(input)") for r in block.rows) for _, block in report.blocks)  # hidden states only
    # the parts outside the blocks are compared too: the embedding, the final norm, the head, the loss, their
    # gradients and each block's four arguments as the model gives them (hidden states, mask, cos, sin)
    rows = {(row.stage, row.name) for row in report.outside_report.rows}
    for wanted in [("forward", "embed_tokens"), ("forward", "norm"), ("forward", "lm_head"), ("loss", "loss"),
                   ("gradient", "embed_tokens.weight"), ("gradient", "norm.weight"), ("gradient", "lm_head.weight")]:
        assert wanted in rows, sorted(rows)
    assert {f"layers.{i}:block input[{j}]" for i in range(3) for j in range(4)} <= {name for _, name in rows}
    assert "parts outside them" in report.verdict()


@pytest.mark.parametrize("mistake, row", [("final-norm-eps", "norm"), ("wiring", "layers.2:block input[0]")])
def test_a_mistake_outside_the_blocks_is_named_by_block(mistake, row):
    """Every block agrees (each is fed PyTorch's own inputs); the final norm's epsilon, or layer 2 fed layer 0's output,
    is named in the check of the model with its blocks replaced by stand-ins."""
    report = by_block.check_by_block(_keyword_decoder(MISTAKE=mistake), "float32", programs=("jit",))
    assert all(block.exit_status() == 0 for _, block in report.blocks), report.format()
    name, failing = report.first_failing
    assert report.exit_status() == 1 and name == by_block.OUTSIDE, report.format()
    assert failing.first_divergence.name == row, report.format()
    assert report.verdict().startswith("Outside the blocks: First divergence: forward, " + row)


def test_a_rope_mistake_in_one_layer_is_named_in_its_block_at_the_rope_tap():
    report = by_block.check_by_block(_keyword_decoder(MISTAKE="rope-interleaved"), "float32", programs=("jit",))
    name, block = report.first_failing
    assert name == "layers.1" and block.first_divergence.name == "layers.1:rope[0]", report.format()
    # without the taps, the first row it shows in is the attention's output projection
    report = by_block.check_by_block(_keyword_decoder(MISTAKE="rope-interleaved", TAPS=None), "float32",
                                     programs=("jit",))
    assert report.first_failing[1].first_divergence.name == "layers.1.o_proj", report.format()


def test_a_block_mode_failure_names_the_block_and_the_side():
    spec = _keyword_decoder()
    spec.block_to_jax = lambda hidden_states: (hidden_states,)  # takes no keyword arguments
    with pytest.raises(testing.SpecError, match=r"--by-block, block layers\.0: the spec's block_to_jax failed on block "
                                                r"layers\.0's recorded inputs: TypeError"):
        by_block.check_by_block(spec, "float32", programs=("jit",))


def test_a_check_larger_than_the_memory_available_stops_before_it_builds_anything(tmp_path, capsys):
    """A model of 7.5B parameters (a list of three 50,000² linear layers): built on the meta device for its size,
    refused in one line with the estimate and --by-block's (exit 2), before a byte of it is made; the API refuses the
    same way."""
    spec = tmp_path / "huge.py"
    spec.write_text("import numpy as np, torch\n"
                    "class Huge(torch.nn.Module):\n"
                    "    def __init__(self):\n"
                    "        super().__init__()\n"
                    "        self.layers = torch.nn.ModuleList([torch.nn.Linear(50_000, 50_000, bias=False)\n"
                    "                                           for _ in range(3)])\n"
                    "    def forward(self, x):\n"
                    "        for layer in self.layers:\n"
                    "            x = layer(x)\n"
                    "        return x\n"
                    "def torch_model():\n"
                    "    return Huge()\n"
                    "def jax_params():\n"
                    "    raise AssertionError('the port is never built')\n"
                    "def jax_apply(params, x):\n"
                    "    return x\n"
                    "def example_inputs():\n"
                    "    return (np.zeros((1, 50_000), np.float32),)\n")
    assert main(["check-port", str(spec)]) == 2
    err = capsys.readouterr().err
    assert "the whole-model check of this model (7.50B parameters, float32) needs about" in err, err
    assert "it was not started. --by-block checks it a block at a time in about" in err and "--no-memory-estimate" in err
    estimated = float(err.split("needs about ")[1].split(" GiB")[0])
    assert estimated > 7.5e9 * 4 / 2 ** 30 * 10  # more than ten copies of its float32 parameters
    with pytest.raises(testing.SpecError, match="--by-block: this model .* needs about .* GiB block by block"):
        by_block.check_by_block(testing.load_spec(spec), memory_limit=2 ** 30)


def test_by_block_leaves_out_the_rest_of_the_model_where_it_alone_does_not_fit(capsys):
    """The keyword decoder with a vocabulary of 20,000: its embedding and head (1.3M parameters) estimated at 0.90 GiB
    checked whole, its blocks at 0.81 GiB. With 0.85 GiB the blocks are checked and the rest is not, and the report
    says why and lists what was not compared."""
    report = by_block.check_by_block(_keyword_decoder(VOCAB=20_000), "float32", programs=("jit",),
                                     memory_limit=0.85 * 2 ** 30)
    text = report.format()
    assert report.exit_status() == 0 and report.outside_report is None and len(report.blocks) == 3, text
    assert "Not in any block, and not compared here (checked whole, the 1M parameters outside the blocks need about " \
           "0.9 GiB (estimated), and 0.8 GiB are available" in text and "embed_tokens.weight" in text, text
    assert main(["check-port", str(Path(__file__).parent / "corpus" / "keyword_decoder.py"), "--memory-limit", "0"]) == 2
    assert "--memory-limit must be a positive number of GiB" in capsys.readouterr().err


def test_the_estimate_offers_by_block_only_for_the_blocks_by_block_checks():
    """The memory estimate and --by-block find the list of blocks by one rule: the model's largest list below itself.
    A model that is itself a Sequential of one class has no list --by-block can check (it says so), and its estimate
    offers no --by-block figure (it offered one); a list inside a model is found by both, the same list."""
    from functional_gan.testing import memory

    flat = torch.nn.Sequential(*[torch.nn.Linear(8, 8) for _ in range(3)])
    assert memory.estimate(flat, "float32").by_block is None
    with pytest.raises(testing.SpecError, match="has no ModuleList or Sequential of two or more modules of one class"):
        by_block._block_list(testing.Spec(lambda: flat), flat)

    class Nested(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.small = torch.nn.ModuleList([torch.nn.Linear(2, 2) for _ in range(4)])
            self.layers = torch.nn.ModuleList([torch.nn.Linear(8, 8) for _ in range(3)])

    nested = Nested()
    assert [name for name, _ in memory.block_lists(nested)] == ["layers", "small"]
    size = memory.estimate(nested, "float32")
    assert size.by_block is not None and size.outside == memory.outside_estimate(4 * 6)  # the small list is outside


def test_the_estimate_counts_a_tied_tensor_once_and_finds_the_blocks():
    from functional_gan.testing import memory

    spec = _keyword_decoder()
    model = spec.torch_model()
    model.lm_head.weight = model.embed_tokens.weight  # tied: one tensor
    size = memory.estimate(model, "float32")
    distinct = {id(p): p.numel() for p in model.parameters()}
    assert size.parameters == sum(distinct.values()) == sum(p.numel() for p in model.parameters())
    assert size.whole > size.by_block > memory.BASELINE
