"""The JAX side against recorded PyTorch runs: runs without torch installed.

Regenerate the fixtures with ``python -m functional_gan.comparisons.regenerate_fixtures`` if the reference
setup changes (they were recorded with torch 2.13.0 on CPU).
"""

from functional_gan.comparisons import fixtures


def test_float64_trajectory_matches_the_recorded_pytorch_run():
    result = fixtures.check_trajectory_fixture()
    assert result.passed, result.detail


def test_teacher_forced_float32_steps_match_recorded_pytorch_states():
    result = fixtures.check_teacher_forcing_fixture()
    assert result.passed, result.detail


def test_linear_regression_matches_recorded_pytorch_results():
    result = fixtures.check_linreg_fixture()
    assert result.passed, result.detail
