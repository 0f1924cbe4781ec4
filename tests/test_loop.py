"""The training loop: outputs, exact resume, NaN handling, the sample command."""

import dataclasses
import json

import jax
import numpy as np
import pytest
from PIL import Image

from functional_gan import checkpoints
from functional_gan.config import ConfigError
from functional_gan.data import ImageDataset, make_fake
from functional_gan.loop import NonFiniteLossError, train
from functional_gan.main import main

from tests.helpers import tiny, tiny_flags

TINY = tiny(steps=6, log_every=2, sample_every=3, checkpoint_every=3)


def _dataset():
    return make_fake(32, 3, num_images=16, seed=1)


def _quiet(_):
    pass


def _trees_equal(a, b):
    return all(jax.tree_util.tree_leaves(jax.tree_util.tree_map(lambda x, y: bool(np.array_equal(x, y)), a, b)))


def test_run_writes_everything_the_tutorial_shows(tmp_path):
    result = train(TINY, tmp_path, dataset=_dataset(), progress=False, print_fn=_quiet)
    assert result.last_step == 6
    for name in ("loss.png", "progress.gif", "real_vs_fake.png", "training_images.png", "config.json", "metrics.jsonl"):
        assert (tmp_path / name).stat().st_size > 0, name
    assert sorted(p.name for p in (tmp_path / "samples").iterdir()) == ["iter_000003.png", "iter_000006.png"]
    records = [json.loads(line) for line in (tmp_path / "metrics.jsonl").read_text().splitlines()]
    assert [r["step"] for r in records] == [1, 2, 3, 4, 5, 6]
    assert set(records[0]) >= {"loss_d", "loss_g", "d_x", "d_g_z1", "d_g_z2"}
    assert Image.open(tmp_path / "progress.gif").n_frames == 2
    assert checkpoints.checkpoint_manager(tmp_path / "checkpoints").all_steps() == [3, 6]


def test_resume_equals_an_uninterrupted_run(tmp_path):
    straight = train(TINY, tmp_path / "straight", dataset=_dataset(), progress=False, print_fn=_quiet)
    # Interrupted after 3 iterations (an epoch is 4 iterations, so the resume crosses an epoch boundary).
    train(dataclasses.replace(TINY, steps=3), tmp_path / "resumed", dataset=_dataset(), progress=False, print_fn=_quiet)
    resumed = train(TINY, tmp_path / "resumed", dataset=_dataset(), progress=False, print_fn=_quiet)
    assert resumed.first_step == 3 and resumed.last_step == 6
    assert _trees_equal(straight.state, resumed.state)
    straight_log = (tmp_path / "straight" / "metrics.jsonl").read_text()
    assert (tmp_path / "resumed" / "metrics.jsonl").read_text() == straight_log


def test_resume_with_other_model_settings_is_refused(tmp_path):
    train(dataclasses.replace(TINY, steps=3), tmp_path, dataset=_dataset(), progress=False, print_fn=_quiet)
    with pytest.raises(ConfigError, match="ngf: saved 4, now 8"):
        train(dataclasses.replace(TINY, ngf=8), tmp_path, dataset=_dataset(), progress=False, print_fn=_quiet)


def test_nan_loss_stops_with_the_step_and_keeps_the_last_good_checkpoint(tmp_path):
    train(dataclasses.replace(TINY, steps=3), tmp_path, dataset=_dataset(), progress=False, print_fn=_quiet)
    manager = checkpoints.checkpoint_manager(tmp_path / "checkpoints")
    good_state = checkpoints.restore(manager, TINY, 3)
    poisoned = ImageDataset(np.full((16, 32, 32, 3), np.nan, np.float32), name="nan")  # NaN pixels → NaN losses
    with pytest.raises(NonFiniteLossError, match="non-finite loss at iteration 4.*iteration 3"):
        train(TINY, tmp_path, dataset=poisoned, progress=False, print_fn=_quiet)
    manager = checkpoints.checkpoint_manager(tmp_path / "checkpoints")
    assert manager.all_steps() == [3]
    assert _trees_equal(checkpoints.restore(manager, TINY, 3), good_state)


def test_cli_train_then_sample(tmp_path, capsys):
    run = tmp_path / "run"
    code = main(["train", *tiny_flags(steps=2, sample_every=2), "--out", str(run)])
    assert code == 0
    assert main(["sample", "--checkpoint", str(run), "--out", str(tmp_path / "grid.png"), "--num", "16"]) == 0
    grid = Image.open(tmp_path / "grid.png")
    assert grid.size == (8 * 34 + 2, 2 * 34 + 2)  # 16 images of 32 px, 8 per row, padding 2
    assert "Wrote 16 samples" in capsys.readouterr().out


@pytest.mark.parametrize(
    "argv,message",
    [
        (["--batch-size", "0"], "--batch-size must be a positive integer"),
        (["--lr", "-1"], "--lr must be a positive finite number"),
        (["--image-size", "48"], "--image-size 48 is not supported"),
    ],
)
def test_cli_rejects_bad_settings_before_any_work(tmp_path, capsys, argv, message):
    out = tmp_path / "run"
    assert main(["train", "--data", "fake", "--out", str(out), *argv]) == 2
    assert message in capsys.readouterr().err
    assert not out.exists(), "nothing is created for a run that cannot start"


def test_sample_from_missing_or_corrupt_checkpoint_is_a_clear_error(tmp_path, capsys):
    assert main(["sample", "--checkpoint", str(tmp_path / "nope"), "--out", str(tmp_path / "g.png")]) == 2
    assert "does not exist" in capsys.readouterr().err
    run = tmp_path / "run"
    train(dataclasses.replace(TINY, steps=3), run, dataset=_dataset(), progress=False, print_fn=_quiet)
    for f in (run / "checkpoints" / "3" / "state").rglob("*"):
        if f.is_file() and f.stat().st_size > 0:
            f.write_bytes(b"garbage")
    assert main(["sample", "--checkpoint", str(run), "--out", str(tmp_path / "g.png")]) == 2
    error = capsys.readouterr().err
    assert "no good checkpoint" in error and "checkpoint at iteration 3: file state/" in error
    assert not (tmp_path / "g.png").exists()


def test_progress_written_to_a_file_is_a_plain_line_every_five_percent(tmp_path, capsys):
    # capsys's stderr is not a terminal, as a CI log or `nohup`'s file: no tqdm frames joined by carriage returns.
    flags = [flag for flag in tiny_flags(steps=40, log_every=40) if flag != "--no-progress"]
    assert main(["train", *flags, "--out", str(tmp_path / "run")]) == 0
    err = capsys.readouterr().err
    lines = [line for line in err.splitlines() if line.startswith("training: ")]
    assert "\r" not in err
    assert [line.split()[1] for line in lines] == [f"{step}/40" for step in range(2, 41, 2)]  # 20 lines, every 2 of 40
    assert lines[-1].startswith("training: 40/40 it (100%), ") and "loss_d=" in lines[-1]


def test_line_progress_resumes_at_its_next_stride_and_closes_with_the_last_count():
    import io

    from functional_gan.progress import LineProgress

    out = io.StringIO()
    with LineProgress(total=100, desc="bench", unit="it", initial=12, file=out) as bar:
        for _ in range(30):
            bar.update(1)
    assert [line.split()[1] for line in out.getvalue().splitlines()] == ["15/100", "20/100", "25/100", "30/100",
                                                                           "35/100", "40/100", "42/100"]
