"""examples/port/llama.py: a Llama 3.2-shaped Flax NNX port (llama3-scaled RoPE, grouped-query attention, RMSNorm,
SwiGLU, tied head) against transformers' LlamaForCausalLM, at its tiny size, whole and block by block, with no hook
on PyTorch's model. Slow: it needs the hf extra (transformers 4.57.6), which CI installs for the slow tests."""

import importlib.util
from pathlib import Path

import pytest

from functional_gan import testing as port
from functional_gan.testing import blocks as by_block

pytestmark = pytest.mark.slow
EXAMPLE = Path(__file__).resolve().parent.parent / "examples" / "port" / "llama.py"


def _spec(mistake=None):
    spec = importlib.util.spec_from_file_location("llama_example", EXAMPLE)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    module.MISTAKE = mistake
    return port.spec_from_module(module)


@pytest.mark.parametrize("dtype", ["float32", "float64"])
def test_the_llama_port_agrees_whole_and_by_block_with_rows_outside_the_blocks(dtype):
    whole = port.check_port(_spec(), dtype, programs=("jit",))
    assert whole.exit_status() == 0, whole.format()
    report = by_block.check_by_block(_spec(), dtype, programs=("jit",))
    assert report.exit_status() == 0 and len(report.blocks) == 3, report.format()
    rows = {(row.stage, row.name) for row in report.outside_report.rows}
    for wanted in [("forward", "model.embed_tokens"), ("forward", "model.norm"), ("output", "output"),
                   ("loss", "loss"), ("gradient", "model.embed_tokens.weight"), ("gradient", "model.norm.weight"),
                   ("update", "model.embed_tokens.weight")]:
        assert wanted in rows, sorted(rows)


@pytest.mark.parametrize("mistake, row", [("rope-interleaved-in-layer-1", "model.layers.1.self_attn:rope[0]"),
                                          ("gqa-tiled", "model.layers.0.self_attn:repeat_kv[0]"),
                                          ("final-norm-eps", "model.norm")])
def test_each_planted_mistake_is_named_at_its_own_row_in_the_whole_check(mistake, row):
    report = port.check_port(_spec(mistake), "float32", programs=("jit",))
    assert report.exit_status() == 1 and report.first_divergence.name == row, report.format()


@pytest.mark.parametrize("mistake, row", [("final-norm-eps", "model.norm"),
                                          ("rope-unscaled", "model.layers.0:block input[2]")])
def test_a_mistake_outside_the_layers_is_named_by_block(mistake, row):
    """The final norm's epsilon, or rotary tables without Llama 3's scaling (computed once by the model, outside the
    layers): every block agrees, fed PyTorch's own arguments; the check of the rest of the model names the mistake."""
    report = by_block.check_by_block(_spec(mistake), "float32", programs=("jit",))
    assert all(block.exit_status() == 0 for _, block in report.blocks), report.format()
    name, failing = report.first_failing
    assert name == by_block.OUTSIDE and failing.first_divergence.name == row, report.format()
