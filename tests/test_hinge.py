"""The hinge loss, added as one entry of LOSSES: its float64 trajectory against its PyTorch reference loop."""

import dataclasses

import numpy as np
import pytest

from functional_gan.comparisons import reference_runs
from functional_gan.comparisons.common import compare_trajectory
from functional_gan.config import ConfigError
from functional_gan.losses import config_for_loss
from functional_gan.losses import LOSSES
from functional_gan.main import main
from tests.helpers import tiny, tiny_flags

SMALL = tiny(loss="hinge", steps=8, seed=1)


@pytest.mark.parametrize("n_critic", [1, 2])
def test_float64_trajectory_matches_the_pytorch_reference_loop(n_critic):
    spec = dataclasses.replace(SMALL, n_critic=n_critic)
    run = reference_runs.run_loss(spec, "float64")
    result = compare_trajectory("hinge", spec, run.initial_generator, run.initial_discriminator, run.metrics,
                                run.final_generator, run.final_discriminator, 1e-10)
    assert result.passed, result.detail
    # The run is not trivial: D's hinge is active (loss above 0, below its value 2 at zero scores would be
    # a coincidence) and G's loss moves.
    assert np.all(run.metrics["loss_d"] > 0) and np.ptp(run.metrics["loss_g"]) > 0


def test_the_entry_is_what_the_step_and_the_command_line_read(tmp_path, capsys):
    entry = LOSSES["hinge"]
    assert entry.critic and not entry.mix and entry.torch_reference.endswith(".hinge")
    with pytest.raises(ConfigError, match="--gp-weight"):
        config_for_loss("hinge", gp_weight=3.0)
    run = tmp_path / "run"
    assert main(["train", *tiny_flags(loss="hinge", data="digits", nc=1, steps=4, batch_size=8, log_every=2),
                 "--out", str(run)]) == 0
    out = capsys.readouterr().out
    assert "Critic (hinge)" in out and "D(x):" in out
    assert (run / "loss.png").exists() and len((run / "metrics.jsonl").read_text().splitlines()) == 4
