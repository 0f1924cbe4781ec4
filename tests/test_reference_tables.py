"""check-port's reference tables in the docs are the ones the code generates (functional_gan.testing.reference), and
what they list is what the code does: each entry a spec file writes is read by the loader, each verdict's exit status
is a check's."""

import dataclasses
from pathlib import Path

import numpy as np
import pytest

from functional_gan.testing import reference
from functional_gan.testing.judge import EXIT_SPEC, Verdict, compare
from functional_gan.testing.report import Report
from functional_gan.testing.spec import CONSTANTS, Spec, spec_from_module

DOCS = Path(__file__).resolve().parent.parent / "docs" / "check-port.md"


def test_the_docs_tables_are_the_generated_ones():
    text = DOCS.read_text()
    for name in reference.TABLES:
        assert f"<!-- reference:{name} -->" in text, name
    assert reference.rewritten(text) == text, "run: python -m functional_gan.testing.reference docs/check-port.md"
    assert reference.main(["--check", str(DOCS)]) == 0


def test_a_stale_table_is_caught_and_rewritten(tmp_path):
    page = tmp_path / "page.md"
    page.write_text("before\n<!-- reference:verdicts -->\n| an old table |\n<!-- /reference -->\nafter\n")
    assert reference.main(["--check", str(page)]) == 1
    assert reference.main([str(page)]) == 0
    assert "| precision finding | `≈` |" in page.read_text() and "an old table" not in page.read_text()
    assert page.read_text().startswith("before\n") and page.read_text().endswith("after\n")


def test_every_entry_the_table_lists_is_read_by_the_loader():
    """Each constant (TRAIN, OUTPUT, ...) the table names is one the loader maps to its field, and each function
    entry is the field's own name: a spec written from the table loads."""
    for field in dataclasses.fields(Spec):
        written = field.metadata.get("written")
        if written is None:
            continue
        name = written.split("(")[0].split(" ")[0]
        if name.isupper():
            assert CONSTANTS.get(name) == field.name, name
        else:
            assert name == field.name, name
    values = {"torch_model": lambda: None, "example_inputs": lambda: (), "jax_model": lambda: None,
              "TRAIN": False, "OUTPUT": "logits", "PER_SAMPLE": True, "BATCH_AXIS": "b", "INPUT_GRADIENTS": True,
              "BLOCK_OUTPUT": 0, "TAPS": {}}
    spec = spec_from_module(values)
    assert (spec.train, spec.output, spec.per_sample, spec.batch_axis, spec.input_gradients, spec.block_output,
            spec.taps) == (False, "logits", True, "b", True, 0, {})


@pytest.mark.parametrize("port, expected", [
    (1.0, Verdict.AGREEMENT),  # the reference itself
    (1.5, Verdict.DIVERGENCE),  # 50% off, no twin to call it rounding
])
def test_a_reports_exit_status_is_its_worst_rows_verdicts(port, expected):
    row = compare("loss", "loss", np.float32(port), np.float64(1.0), [np.float32(1.0) + np.float32(1e-7)], "float32")
    assert row.verdict is expected
    report = Report(spec="s", dtype="float32", k=3.0, pairings=[], rows=[row])
    assert report.outcome is expected and report.exit_status() == expected.exit_status
    assert EXIT_SPEC not in {v.exit_status for v in Verdict}
    with pytest.raises(dataclasses.FrozenInstanceError):
        report.allow_precision = True


def test_a_float32_quantity_with_nothing_to_judge_it_against_is_a_clear_error():
    """compare in float32 needs PyTorch's own results (noisy) or a fixed tolerance (it failed on max() of nothing)."""
    with pytest.raises(ValueError, match="neither was given"):
        compare("loss", "loss", np.float32(1.0), np.float64(1.0), [], "float32")
    assert compare("loss", "loss", np.float32(1.0), np.float64(1.0), [], "float32", tolerance=1e-6).passed
