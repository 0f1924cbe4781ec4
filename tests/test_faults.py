"""Faults injected into training and into its checkpoints; each must leave nothing lost.

* SIGKILL between checkpoints, while orbax writes one, and after orbax but before the checksum
  manifest seals it: the rerun resumes and ends bit-identical to an uninterrupted run, with the
  same metrics.jsonl and the same fixed-noise grids.
* A damaged newest checkpoint (truncated file, flipped byte in array data, missing file, garbage
  metadata): ``sample`` and ``train`` name the step and the file and use the previous one.
* No space left on device while writing a checkpoint: a clear error; the previous checkpoint and
  metrics.jsonl are intact, and the rerun resumes.
* Two ``train`` processes on one folder: the second refuses.
"""

import errno
import os
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path

import orbax.checkpoint as ocp
import pytest

from functional_gan import checkpoints
from functional_gan.main import main
from tests.helpers import run_grids, tiny, train_args, tree_allclose

ROOT = Path(__file__).resolve().parents[1]

# 8 iterations on random data; grids at 2, 4, 6, 8 and checkpoints at 4 and 8.
CONFIG = tiny(steps=8, log_every=2, sample_every=2, checkpoint_every=4)
ARGS = [*train_args(CONFIG), "--no-progress"]


def _train(out: Path, *extra: str) -> int:
    return main(["train", *ARGS, "--out", str(out), *extra])


def _state(run: Path):
    return checkpoints.load_newest_good(run)



@pytest.fixture(scope="module")
def straight(tmp_path_factory):
    """The uninterrupted run every faulty one must end up equal to (checkpoints at 4 and 8)."""
    run = tmp_path_factory.mktemp("straight") / "run"
    assert _train(run) == 0
    return run


def _assert_same_run(run: Path, straight: Path) -> None:
    restored, reference = _state(run), _state(straight)
    assert restored.step == reference.step == 8
    assert tree_allclose(restored.state, reference.state), "parameters differ from the uninterrupted run"
    # No duplicated or missing iterations, every value as in the uninterrupted run.
    assert (run / "metrics.jsonl").read_text() == (straight / "metrics.jsonl").read_text()
    assert run_grids(run) == run_grids(straight)


# --- SIGKILL -----------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    "moment,call,left_behind",
    [
        ("grid", 4, "metrics up to 6, checkpoint 4"),  # calls: training_images, grid 2, grid 4, grid 6 → killed
        ("orbax-write", 2, "checkpoint 8 half written"),
        ("seal", 2, "checkpoint 8 written, not sealed"),
    ],
)
def test_sigkill_then_rerun_equals_an_uninterrupted_run(tmp_path, straight, moment, call, left_behind):
    run = tmp_path / "run"
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    killed = subprocess.run([sys.executable, str(ROOT / "tests" / "fault_runner.py"), moment, str(call), *ARGS,
                             "--out", str(run)], env=env, capture_output=True, text=True, timeout=600)
    assert killed.returncode == -signal.SIGKILL, killed.stderr[-2000:]
    if moment == "grid":
        assert len((run / "metrics.jsonl").read_text().splitlines()) == 6  # iterations beyond checkpoint 4 were logged
    assert _train(run) == 0, left_behind
    _assert_same_run(run, straight)
    if moment == "seal":  # the unsealed checkpoint was moved aside, not deleted
        assert [p.name.split("-")[0] for p in (run / checkpoints.DAMAGED_FOLDER).iterdir()] == ["8"]


# --- damaged checkpoints -------------------------------------------------------------------------------


def _largest_array_file(step_folder: Path) -> Path:
    return max((step_folder / "state").rglob("ocdbt.process_0/d/*"), key=lambda p: p.stat().st_size)


def _truncate(step_folder: Path) -> str:
    f = _largest_array_file(step_folder)
    f.write_bytes(f.read_bytes()[: f.stat().st_size // 2])
    return str(f.relative_to(step_folder))


def _flip_byte(step_folder: Path, at: float = 0.5) -> str:
    f = _largest_array_file(step_folder)
    data = bytearray(f.read_bytes())
    data[int(len(data) * at)] ^= 0x01
    f.write_bytes(bytes(data))
    return str(f.relative_to(step_folder))


def _remove_file(step_folder: Path) -> str:
    f = step_folder / "state" / "_sharding"
    f.unlink()
    return "state/_sharding"


def _garbage_metadata(step_folder: Path) -> str:
    f = step_folder / "state" / "_METADATA"
    f.write_bytes(b"{ this is not json " + b"\x00" * (f.stat().st_size - 19))  # same size: only the checksum can tell
    return "state/_METADATA"


DAMAGE = {"truncated file": _truncate, "flipped byte in array data": _flip_byte, "missing file": _remove_file,
          "garbage metadata": _garbage_metadata}


@pytest.mark.parametrize("damage", list(DAMAGE))
def test_a_damaged_newest_checkpoint_is_reported_and_the_previous_one_used(tmp_path, straight, capsys, damage):
    run = tmp_path / "run"
    shutil.copytree(straight, run)
    damaged_file = DAMAGE[damage](run / "checkpoints" / "8")
    capsys.readouterr()

    # sample: warns with the step and the file, and draws from iteration 4 (nothing is moved).
    assert main(["sample", "--checkpoint", str(run), "--out", str(tmp_path / "grid.png")]) == 0
    captured = capsys.readouterr()
    assert "checkpoint at iteration 8" in captured.err and damaged_file in captured.err, captured.err
    assert "from the checkpoint at iteration 4" in captured.out
    assert (run / "checkpoints" / "8").is_dir()

    # train: the same fallback; the damaged checkpoint moves aside and the run is recomputed exactly.
    assert _train(run) == 0
    captured = capsys.readouterr()
    assert "Resuming from the checkpoint at iteration 4" in captured.out and damaged_file in captured.out
    _assert_same_run(run, straight)
    moved = list((run / checkpoints.DAMAGED_FOLDER).iterdir())
    assert len(moved) == 1 and moved[0].name.startswith("8-")
    assert (moved[0] / damaged_file).exists() == (damage != "missing file")  # kept for inspection


def test_when_no_checkpoint_is_good_both_commands_fail_clearly_and_delete_nothing(tmp_path, straight, capsys):
    run = tmp_path / "run"
    shutil.copytree(straight, run)
    _flip_byte(run / "checkpoints" / "8")
    _garbage_metadata(run / "checkpoints" / "4")
    capsys.readouterr()
    assert main(["sample", "--checkpoint", str(run), "--out", str(tmp_path / "grid.png")]) == 2
    error = capsys.readouterr().err
    assert "no good checkpoint" in error and "iteration 8" in error and "iteration 4" in error
    assert _train(run) == 2
    assert "no good checkpoint" in capsys.readouterr().err
    assert sorted(p.name for p in (run / "checkpoints").iterdir()) == ["4", "8"]
    assert not (run / checkpoints.DAMAGED_FOLDER).exists()


def test_orbax_alone_does_not_notice_a_flipped_byte(tmp_path, straight):
    """Why the manifest exists: orbax restores silently changed weights (checked, not assumed).

    orbax compresses the arrays' chunks (zstd) and the order of the chunks in its data file varies from run to run, so
    a flipped byte can land in a compressed stream's structure, which the decompressor refuses, or in its data, which
    decodes to other values without a word. Bytes across the file are tried, each in a fresh copy, until one restores
    changed weights; the manifest must refuse that one."""
    tried = []
    for i in range(1, 17):
        at = i / 17
        run = tmp_path / f"run-{i}"
        shutil.copytree(straight, run)
        _flip_byte(run / "checkpoints" / "8", at)
        manager = checkpoints.checkpoint_manager(run / "checkpoints", read_only=True)
        try:
            silent = checkpoints.restore(manager, CONFIG, 8)
        except checkpoints.DamagedCheckpoint as error:
            tried.append(f"{at:.2f}: {str(error)[:80]}")
            continue
        finally:
            manager.close()
        if tree_allclose(silent, _state(straight).state):
            tried.append(f"{at:.2f}: restored unchanged")
            continue
        with pytest.raises(checkpoints.DamagedCheckpoint, match="does not match its SHA-256"):
            checkpoints.verify(run / "checkpoints" / "8", 8)
        return
    pytest.fail("orbax refused or undid every flipped byte tried; this test's premise no longer holds:\n" + "\n".join(tried))


# --- a full disk -----------------------------------------------------------------------------------------


def _no_space(*_args, **_kwargs):
    raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))


@pytest.mark.parametrize("where", ["orbax's write", "the manifest's fsync"])
def test_no_space_left_stops_clearly_and_keeps_what_was_saved(tmp_path, straight, capsys, monkeypatch, where):
    run = tmp_path / "run"
    original_save, original_fsync = ocp.CheckpointManager.save, os.fsync

    def save_then_fail(self, step, *args, **kwargs):  # the checkpoint at 4 is written, the one at 8 hits a full disk
        if step == 8:
            _no_space()
        return original_save(self, step, *args, **kwargs)

    def fsync_then_fail(fd):
        if (run / "checkpoints" / "4" / checkpoints.MANIFEST_NAME).exists():
            _no_space()
        return original_fsync(fd)

    if where == "orbax's write":
        monkeypatch.setattr(ocp.CheckpointManager, "save", save_then_fail)
    else:
        monkeypatch.setattr(os, "fsync", fsync_then_fail)
    assert _train(run) == 2
    error = capsys.readouterr().err
    assert "No space left on device" in error and "the checkpoint of iteration 4 is kept" in error, error
    monkeypatch.undo()

    checkpoints.verify(run / "checkpoints" / "4", 4)
    lines = (run / "metrics.jsonl").read_text().splitlines()
    assert lines == (straight / "metrics.jsonl").read_text().splitlines()  # all 8 iterations were logged intact
    assert not (run / "checkpoints" / "8" / checkpoints.MANIFEST_NAME).exists()
    assert _train(run) == 0  # space is back: resume from 4
    _assert_same_run(run, straight)


# --- two processes on one folder -------------------------------------------------------------------------

_HOLD_LOCK = """
import sys, time
from pathlib import Path
from functional_gan.loop import run_lock
with run_lock(Path(sys.argv[1])):
    print("locked", flush=True)
    time.sleep(600)
"""


def test_a_second_train_on_the_same_folder_refuses(tmp_path, capsys):
    run = tmp_path / "run"
    run.mkdir()
    holder = subprocess.Popen([sys.executable, "-c", _HOLD_LOCK, str(run)], stdout=subprocess.PIPE, text=True,
                              env={**os.environ, "PYTHONPATH": str(ROOT)})
    try:
        assert holder.stdout.readline().strip() == "locked"
        assert _train(run, "--steps", "2") == 2
        error = capsys.readouterr().err
        assert f"another `functional-gan train` (pid {holder.pid}) is writing to {run}" in error
        assert not (run / "metrics.jsonl").exists() and not (run / "checkpoints").exists()
    finally:
        holder.send_signal(signal.SIGKILL)
        holder.wait()
    # The kernel dropped the lock with the killed holder: no stale lock.
    time.sleep(0.1)
    assert _train(run, "--steps", "2") == 0


# --- the NNX port's run ------------------------------------------------------------------------------


def test_an_nnx_run_killed_while_writing_resumes_bit_identical_and_its_checkpoints_sample_and_export(tmp_path):
    """``train --api nnx`` writes the same checkpoints as the Linen step: killed while orbax writes its second
    checkpoint, the rerun ends equal to an uninterrupted NNX run (parameters, Adam states, metrics.jsonl, grids),
    and ``sample`` and ``export`` read what it saved."""
    straight, run = tmp_path / "straight", tmp_path / "run"
    assert _train(straight, "--api", "nnx") == 0
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    killed = subprocess.run([sys.executable, str(ROOT / "tests" / "fault_runner.py"), "orbax-write", "2", *ARGS,
                             "--api", "nnx", "--out", str(run)], env=env, capture_output=True, text=True, timeout=600)
    assert killed.returncode == -signal.SIGKILL, killed.stderr[-2000:]
    assert _train(run, "--api", "nnx") == 0
    _assert_same_run(run, straight)
    assert main(["sample", "--checkpoint", str(run), "--num", "4", "--out", str(tmp_path / "grid.png")]) == 0
    assert main(["export", "--checkpoint", str(run), "--generator", str(tmp_path / "G.pth")]) == 0
    assert (tmp_path / "grid.png").stat().st_size > 0 and (tmp_path / "G.pth").stat().st_size > 0


def test_a_linen_run_resumes_under_nnx_and_ends_as_the_linen_run(tmp_path, straight):
    """--api may change on resume: both steps read and write the same state. Four Linen iterations, then the NNX step
    to the end: the same iterations as the uninterrupted Linen run (float32, two compiled programs: 1e-6; on the
    machine this was written on they agree exactly)."""
    import json

    run = tmp_path / "run"
    assert _train(run, "--steps", "4") == 0
    assert _train(run, "--api", "nnx") == 0
    restored, reference = _state(run), _state(straight)
    assert restored.step == reference.step == 8
    assert tree_allclose(restored.state, reference.state, atol=1e-6)
    ours, theirs = ([json.loads(line) for line in (path / "metrics.jsonl").read_text().splitlines()]
                    for path in (run, straight))
    assert [row["step"] for row in ours] == [row["step"] for row in theirs] == list(range(1, 9))
    for mine, expected in zip(ours, theirs):
        assert all(abs(mine[key] - expected[key]) <= 1e-6 for key in ("loss_d", "loss_g", "d_x", "d_g_z1", "d_g_z2"))
