"""The streaming input pipeline (Grain): folders and .npy arrays read lazily, in worker processes, resumable.

Expected values come from reading the same files directly in this process (``Dataset.batch``) and
from an uninterrupted run; nothing is hard-coded.
"""

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
import pytest

from functional_gan.benchmarks.celeba_like import make_folder
from functional_gan.data import DataError, Dataset, ImageDataset, load_array, load_dataset, load_image_folder
from functional_gan.main import main
from functional_gan.pipeline import Batches, InputPipelineError
from tests.helpers import run_grids, tiny_flags, tree_allclose

ROOT = Path(__file__).resolve().parents[1]
TINY_FLAGS = tiny_flags(data_flags=False, batch_size=8)  # each test names its data


@pytest.fixture(scope="module")
def folder(tmp_path_factory):
    """40 CelebA-shaped JPEGs (178×218) in CelebA's layout, root/img_align_celeba/000001.jpg ..."""
    return make_folder(tmp_path_factory.mktemp("celeba") / "celeba", 40)


def _with_bad_files(folder: Path, target: Path) -> Path:
    """A copy of ``folder`` in which 3 files are damaged (garbage, truncated, empty)."""
    import shutil

    shutil.copytree(folder, target)
    images = sorted((target / "img_align_celeba").iterdir())
    images[3].write_bytes(b"\xff\xd8 not a jpeg")
    images[10].write_bytes(images[10].read_bytes()[:100])
    images[25].write_bytes(b"")
    return target


@pytest.mark.parametrize("workers", [0, 2])
def test_batches_are_the_files_of_each_iteration_and_start_anywhere(folder, workers):
    dataset = load_image_folder(folder, 32)
    assert len(dataset) == 40 and dataset.files[0] == b"img_align_celeba/000001.jpg"
    with Batches(dataset, seed=5, batch_size=8, first_step=0, total_steps=12, workers=workers) as batches:
        streamed = list(batches)
        assert batches.files_read == 12 * 8  # each image of each batch once, nothing else
    # Independently: the same files read here, in the epoch order of (seed, epoch) (5 batches an epoch).
    assert len(streamed) == 12
    for step, batch in enumerate(streamed):
        np.testing.assert_array_equal(batch, dataset.batch(5, step, 8))
    assert not np.array_equal(streamed[0], streamed[5]), "a new epoch has a new order"
    # A run resumed at iteration 7 reads exactly what the uninterrupted run read from there on.
    with Batches(dataset, seed=5, batch_size=8, first_step=7, total_steps=12, workers=workers) as resumed:
        for batch, expected in zip(resumed, streamed[7:], strict=True):
            np.testing.assert_array_equal(batch, expected)


def test_a_process_reads_only_its_rows(folder):
    # What a process whose devices hold rows 4..8 of each global batch reads (the 2-process run: test_multiprocess).
    import functional_gan.pipeline as pipeline

    dataset = load_image_folder(folder, 32)
    reader = pipeline._ReadBatch(dataset, 0, 8, slice(4, 8))
    record = reader(2)
    assert record["files"] == 4 and record["images"].shape == (4, 32, 32, 3)
    np.testing.assert_array_equal(record["images"], dataset.read_batch(dataset.indices(0, 2, 8)[4:])[0])


def test_unreadable_files_met_mid_run_are_skipped_named_once_and_resume_exactly(tmp_path, folder):
    data = _with_bad_files(folder, tmp_path / "bad")
    run = tmp_path / "run"
    args = ["train", "--data", str(data), "--out", str(run), "--steps", "10", *TINY_FLAGS, "--workers", "1",
            "--checkpoint-every", "5", "--sample-every", "5"]
    process = subprocess.run([sys.executable, "-m", "functional_gan.main", *args], capture_output=True, text=True,
                             cwd=ROOT, env={**os.environ, "PYTHONPATH": str(ROOT)}, timeout=600)
    assert process.returncode == 0, process.stderr[-3000:]
    listed = (run / "unreadable_files.txt").read_text().splitlines()
    # 10 iterations of 8 = 2 epochs of the 40 files: every damaged file is met, and named once.
    assert sorted(line.split(":")[0].rsplit("/", 1)[1] for line in listed) == ["000004.jpg", "000011.jpg", "000026.jpg"]
    output = process.stdout + process.stderr
    for name in ("000004.jpg", "000011.jpg", "000026.jpg"):
        assert output.count(f"{name}:") == 1, output[-3000:]
    assert "3 unreadable image file(s) were skipped" in output
    logged = [json.loads(line) for line in (run / "metrics.jsonl").read_text().splitlines()]
    assert [r["step"] for r in logged] == list(range(1, 11)) and all(np.isfinite(r["loss_d"]) for r in logged)


def test_sigkill_then_resume_on_a_folder_run_is_bit_identical(tmp_path, folder):
    from functional_gan import checkpoints

    args = ["--data", str(folder), "--steps", "8", *TINY_FLAGS, "--workers", "1", "--checkpoint-every", "4",
            "--sample-every", "2", "--log-every", "2"]
    straight = tmp_path / "straight"
    assert main(["train", *args, "--out", str(straight)]) == 0
    run = tmp_path / "run"
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    # Killed at its 4th grid (iteration 6): checkpoint 4 and the log up to 6 are on disk.
    killed = subprocess.run([sys.executable, "tests/fault_runner.py", "grid", "4", *args, "--out", str(run)],
                            cwd=ROOT, env=env, capture_output=True, text=True, timeout=600)
    assert killed.returncode == -signal.SIGKILL, killed.stderr[-3000:]
    assert main(["train", *args, "--out", str(run)]) == 0
    assert (run / "metrics.jsonl").read_text() == (straight / "metrics.jsonl").read_text()
    assert run_grids(run) == run_grids(straight)
    assert tree_allclose(checkpoints.load_newest_good(run).state, checkpoints.load_newest_good(straight).state)


class _CrashingDataset(Dataset):
    """Image 3 kills the process that reads it, as an out-of-memory kill would."""

    name, image_shape = "crashing", (32, 32, 3)

    def __len__(self):
        return 16

    def _read(self, index):
        if index == 3:
            os._exit(9)
        return np.zeros(self.image_shape, np.uint8)


def test_a_worker_that_dies_is_a_clear_error_not_a_hang():
    start = time.monotonic()
    with pytest.raises(InputPipelineError, match="a data worker process died while reading the batch of iteration"):
        with Batches(_CrashingDataset(), seed=0, batch_size=4, first_step=0, total_steps=8, workers=1) as batches:
            for _ in batches:
                pass
    assert time.monotonic() - start < 120


def _children(pid: int) -> set[int]:
    found = set()
    for task in Path(f"/proc/{pid}/task").iterdir():
        children = (task / "children").read_text().split()
        found |= {int(c) for c in children}
    return found


@pytest.mark.parametrize("stop", [signal.SIGTERM, signal.SIGINT, signal.SIGKILL])
def test_stopping_a_run_leaves_no_worker_process_behind(tmp_path, folder, stop):
    process = subprocess.Popen(
        [sys.executable, "-m", "functional_gan.main", "train", "--data", str(folder), "--out", str(tmp_path / "run"),
         "--steps", "100000", *TINY_FLAGS, "--workers", "2", "--log-every", "1"],
        cwd=ROOT, env={**os.environ, "PYTHONPATH": str(ROOT)}, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
    )
    for line in process.stdout:  # wait until training runs, with its workers started
        if "Loss_D" in line:
            break
    workers = _children(process.pid)
    assert len(workers) >= 2, workers  # Grain's two workers (and multiprocessing's resource tracker)
    process.send_signal(stop)
    rest = process.communicate(timeout=120)[0]
    if stop == signal.SIGKILL:  # no cleanup can run: the workers notice that their parent is gone
        assert process.returncode == -signal.SIGKILL
    else:
        assert process.returncode == 130, rest[-3000:]
        assert "interrupted; checkpoints already written are kept" in rest
    deadline = time.monotonic() + 15
    while time.monotonic() < deadline and any(Path(f"/proc/{w}").exists() for w in workers):
        time.sleep(0.2)
    alive = [w for w in workers if Path(f"/proc/{w}").exists() and "zombie" not in Path(f"/proc/{w}/status").read_text()]
    assert not alive, f"worker processes left behind: {alive}"


@pytest.mark.parametrize("layout", ["NHWC", "NCHW"])
def test_an_npy_array_is_memory_mapped_and_read_batch_by_batch(tmp_path, layout):
    images = np.random.default_rng(0).integers(0, 256, (24, 32, 32, 3), dtype=np.uint8)
    path = tmp_path / "images.npy"
    np.save(path, images if layout == "NHWC" else images.transpose(0, 3, 1, 2))
    dataset = load_dataset(str(path), 32, 3)
    assert isinstance(dataset.array, np.memmap)  # mapped, not read whole
    reference = ImageDataset(images, "in memory")
    with Batches(dataset, seed=1, batch_size=8, first_step=0, total_steps=6, workers=1) as batches:
        for step, batch in enumerate(batches):
            np.testing.assert_array_equal(batch, reference.batch(1, step, 8))


def test_an_npy_array_of_another_size_is_resized_like_a_folder(tmp_path):
    images = np.random.default_rng(0).integers(0, 256, (4, 40, 50, 3), dtype=np.uint8)
    np.save(tmp_path / "big.npy", images)
    from PIL import Image

    from functional_gan.data import image_to_array

    dataset = load_array(tmp_path / "big.npy", 32, 3)
    np.testing.assert_array_equal(dataset.read(2)[0], image_to_array(Image.fromarray(images[2]), 32, 3))


@pytest.mark.parametrize(
    "content,message",
    [
        (None, "does not exist"),
        (np.zeros((4, 32, 32, 3), np.float32), "must hold uint8 images"),
        (np.zeros((4, 32, 32), np.uint8), "must hold uint8 images"),
        (np.zeros((4, 32, 32, 5), np.uint8), "neither its last nor its second axis is nc = 3"),
        (np.zeros((0, 32, 32, 3), np.uint8), "holds no images"),
        (b"not an array", "is not a readable .npy array"),
    ],
)
def test_bad_npy_arrays_are_refused_with_a_clear_message(tmp_path, capsys, content, message):
    path = tmp_path / "images.npy"
    if isinstance(content, np.ndarray):
        np.save(path, content)
    elif content is not None:
        path.write_bytes(content)
    with pytest.raises(DataError, match=message):
        load_array(path, 32, 3)
    assert main(["train", "--data", str(path), "--out", str(tmp_path / "run"), *TINY_FLAGS]) == 2
    assert message in capsys.readouterr().err
    assert not (tmp_path / "run").exists()
