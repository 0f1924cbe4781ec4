"""Multi-process runs that finish and fail cleanly: real processes on 127.0.0.1, 2 CPU devices each.

* 2 processes run past many checkpoints (and past orbax's deletions of old ones) to the end;
* SIGKILL of process 1 right after a sealed checkpoint: process 0 stops by itself within the peer
  timeout with one line naming process 1, the iteration and the checkpoint kept; both rerun and the
  run ends bit-identical to an uninterrupted 2-process run (metrics.jsonl, parameters, grids);
* start-up failures (different --num-processes, no coordinator): a clear error, nothing written.
"""

import json
import os
import subprocess
import sys
import time
from pathlib import Path

import pytest

from functional_gan import checkpoints
from tests.helpers import free_port, run_grids, tiny_flags, tree_allclose

ROOT = Path(__file__).resolve().parents[1]
PEER_TIMEOUT = 5  # seconds; short so that the tests are quick (the default is 60)
# 24 iterations, a checkpoint every 3: 8 checkpoints, 5 of them deleted along the way (3 are kept).
ARGS = [*tiny_flags(data_flags=False, steps=24, batch_size=8, checkpoint_every=3, sample_every=6, log_every=6),
        "--peer-timeout", str(PEER_TIMEOUT), "--join-timeout", "60"]


def _start(out: Path, port: int, process_id: int, num_processes: int = 2, fault: tuple[str, int] | None = None,
           extra: tuple[str, ...] = (), data: str = "fake") -> subprocess.Popen:
    program = ["tests/fault_runner.py", fault[0], str(fault[1])] if fault else ["-m", "functional_gan.main", "train"]
    return subprocess.Popen(
        [sys.executable, *program, "--data", data, *ARGS, *extra, "--out", str(out), "--coordinator", f"127.0.0.1:{port}",
         "--num-processes", str(num_processes), "--process-id", str(process_id)],
        cwd=ROOT, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
        env={**os.environ, "PYTHONPATH": str(ROOT), "JAX_PLATFORMS": "cpu", "XLA_FLAGS": "--xla_force_host_platform_device_count=2"},
    )


def _run_two(out: Path, data: Path, faults=(None, None)) -> list[tuple[int, str, float]]:
    """Both processes to their end: (exit status, output, time it ended) for each."""
    port = free_port()
    processes = [_start(out, port, i, fault=faults[i], data=str(data), extra=("--workers", "1")) for i in range(2)]
    results = [None, None]
    deadline = time.monotonic() + 600
    while None in results and time.monotonic() < deadline:
        for i, process in enumerate(processes):
            if results[i] is None and process.poll() is not None:
                results[i] = (process.returncode, process.stdout.read(), time.monotonic())
        time.sleep(0.05)
    for process in processes:
        process.kill()
    assert None not in results, "a process did not end within 10 minutes"
    return results



@pytest.fixture(scope="module")
def folder(tmp_path_factory):
    """40 CelebA-shaped JPEGs: 5 global batches of 8 an epoch."""
    from functional_gan.benchmarks.celeba_like import make_folder

    return make_folder(tmp_path_factory.mktemp("celeba") / "celeba", 40)


@pytest.fixture(scope="module")
def straight(tmp_path_factory, folder):
    """An uninterrupted 2-process run of 24 iterations on a folder: 8 checkpoints, the oldest 5 deleted on the way."""
    run = tmp_path_factory.mktemp("two-process") / "run"
    results = _run_two(run, folder)
    for code, output, _ in results:
        assert code == 0, output[-3000:]
    return run


def test_two_processes_run_past_every_checkpoint_deletion_to_the_end(straight):
    # Deleting old checkpoints is a collective in orbax: every process must take part (it hung at the 4th before).
    assert sorted(int(p.name) for p in (straight / "checkpoints").iterdir()) == [18, 21, 24]
    for step in (18, 21, 24):
        checkpoints.verify(straight / "checkpoints" / str(step), step)
    assert [json.loads(line)["step"] for line in (straight / "metrics.jsonl").read_text().splitlines()] == list(range(1, 25))
    assert sorted(run_grids(straight)) == [f"iter_{s:06d}.png" for s in (6, 12, 18, 24)]


def test_each_process_decodes_only_its_rows_of_each_global_batch(straight):
    # Each process's 2 devices hold 4 of the 8 rows: 24 iterations × 4 files, not the whole folder nor whole batches.
    reads = [json.loads((straight / "logs" / f"input-process-{i}.json").read_text()) for i in range(2)]
    assert [r["rows"] for r in reads] == [[0, 4], [4, 8]]
    assert [r["files_read"] for r in reads] == [24 * 4, 24 * 4]


def test_a_killed_process_stops_the_other_cleanly_and_the_rerun_equals_an_uninterrupted_run(tmp_path, straight, folder):
    run = tmp_path / "run"
    # Process 1 kills itself (SIGKILL) right after its 4th checkpoint, iteration 12, was sealed.
    (code0, out0, end0), (code1, out1, end1) = _run_two(run, folder, faults=(None, ("sealed", 4)))
    assert code1 == 128 + 9, out1[-3000:]
    assert "process 1 was stopped by SIGKILL" in out1 and "the checkpoint of iteration 12" in out1
    # Process 0 ends by itself, soon after, with one clear line and a non-zero status.
    assert code0 == 3, out0[-3000:]
    assert end0 - end1 <= PEER_TIMEOUT + 15, (end0 - end1, out0[-3000:])
    last = out0.strip().splitlines()[-1]
    assert last.startswith("functional-gan train: error: process 1 stopped responding"), out0[-3000:]
    assert f"the checkpoint of iteration 12 in {run / 'checkpoints'} is kept" in last
    assert "run the same command on every host to resume" in last
    assert "at iteration 1" in last  # 12 or 13: the iteration process 0 had reached
    assert "Check failure" not in out0  # the C++ abort went to the log file named in the line
    log = Path(last.rsplit("(the processes' own log: ", 1)[1].rstrip(")"))
    assert log.is_file() and log.parent == run / "logs"
    checkpoints.verify(run / "checkpoints" / "12", 12)  # the last sealed checkpoint is intact

    resumed = _run_two(run, folder)  # the same command on both: resumes at 12 and ends
    for code, output, _ in resumed:
        assert code == 0, output[-3000:]
    assert "Resuming from the checkpoint at iteration 12" in resumed[0][1]
    assert (run / "metrics.jsonl").read_text() == (straight / "metrics.jsonl").read_text()
    assert run_grids(run) == run_grids(straight)
    assert tree_allclose(checkpoints.load_newest_good(run).state, checkpoints.load_newest_good(straight).state)


def test_different_num_processes_is_a_clear_error_and_writes_nothing(tmp_path):
    port = free_port()
    out = tmp_path / "run"
    processes = [_start(out, port, 0, num_processes=2), _start(out, port, 1, num_processes=3)]
    outputs = [p.communicate(timeout=300)[0] for p in processes]
    for process, output in zip(processes, outputs):
        assert process.returncode == 2, output[-3000:]
        assert "were started with different settings" in output
        assert "--num-processes: process" in output
    assert not out.exists()


def test_an_unreachable_coordinator_is_a_clear_error_within_the_join_timeout(tmp_path):
    out = tmp_path / "run"
    start = time.monotonic()
    process = _start(out, free_port(), 1, extra=("--join-timeout", "3"))
    output = process.communicate(timeout=300)[0]
    assert process.returncode == 3, output[-3000:]
    assert "process 1 could not join the run through the coordinator 127.0.0.1:" in output
    assert "within --join-timeout 3 s" in output and "Check failure" not in output
    assert time.monotonic() - start < 60
    assert not out.exists()
