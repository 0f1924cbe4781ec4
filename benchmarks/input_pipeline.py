"""The input pipeline at the tutorial's scale: start-up, memory and throughput on CelebA-shaped folders.

    python -m functional_gan.benchmarks.input_pipeline --root /tmp/celeba --sizes 2000 20000 200000 \\
        --out benchmarks/results/input-pipeline

Generates (once) folders of 178×218 JPEGs shaped like CelebA's ``img_align_celeba`` (see
:mod:`functional_gan.benchmarks.celeba_like`), then measures, in one run, alone on the machine:

1. **start-up** for each folder size: ``functional-gan train --data FOLDER`` at the tutorial's
   settings (64×64, batch 128, ngf = ndf = 64), from the command's start to its first stats line
   (iteration 1), minus the compile time the command prints; and the peak RSS of the training
   process (``wait4``'s ``ru_maxrss``: the largest of it and its worker processes);
2. **the pipeline alone**: images/s of this project's Grain pipeline (``pipeline.Batches``) against
   PyTorch's ``DataLoader`` (``shuffle=True``, ``drop_last=True``, the same batch size and worker
   count) over a ``torch.utils.data.Dataset`` that decodes with PIL and resizes/crops with the very
   same function (``data.image_to_array``): both sides do the same per-image work, so the
   difference is the loaders' own; each run is a fresh process, the clock starts after 3 batches
   (workers started, steady state) and stops at the last batch timed (not at the stream's end);
   runs alternate (A B A B) and the best of each is kept;
3. **steps/s**: a folder run against a ``--data fake`` run (images in memory) at the tutorial's
   settings, from the time between the stats lines of iterations 2 and N.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import re
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import numpy as np

from functional_gan.benchmarks.celeba_like import make_folder
from functional_gan.config import TUTORIAL

TRAIN = ["--batch-size", str(TUTORIAL.batch_size), "--image-size", str(TUTORIAL.image_size), "--ngf", str(TUTORIAL.ngf),
         "--ndf", str(TUTORIAL.ndf), "--log-every", "1", "--no-progress", "--checkpoint-every", "100000",
         "--sample-every", "100000"]


WARMUP = 3  # batches read before a loader's clock starts


def run_train(data: str, steps: int, workers: int | None, cache: str) -> dict:
    """One ``functional-gan train`` in a new process: start-up, compile, per-iteration times, peak RSS."""
    out = tempfile.mkdtemp(prefix="bench-input-run-")
    command = [sys.executable, "-m", "functional_gan.main", "train", "--data", data, "--out", out, "--steps", str(steps),
               *TRAIN, *([] if workers is None else ["--workers", str(workers)])]
    env = {**os.environ, "JAX_COMPILATION_CACHE_DIR": cache}
    start = time.perf_counter()
    process = subprocess.Popen(command, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, env=env)
    compile_s, stats_times, lines = None, [], []
    for line in process.stdout:
        lines.append(line)
        if match := re.search(r"Compiled the training step in ([\d.]+) s", line):
            compile_s = float(match.group(1))
        if "Loss_D" in line:
            stats_times.append(time.perf_counter() - start)
    _, status, usage = os.wait4(process.pid, 0)
    if status != 0 or compile_s is None or not stats_times:
        raise RuntimeError(f"the run failed ({status}):\n{''.join(lines[-30:])}")
    subprocess.run(["rm", "-rf", out], check=False)
    return {"first_stats_s": stats_times[0], "compile_s": compile_s, "startup_s": stats_times[0] - compile_s,
            "seconds_per_step": (stats_times[-1] - stats_times[1]) / (len(stats_times) - 2) if len(stats_times) > 2 else None,
            "peak_rss_mb": usage.ru_maxrss / 1024}


def grain_images_per_s(folder: Path, workers: int, batches: int, batch_size: int = TUTORIAL.batch_size) -> float:
    from functional_gan.data import load_image_folder
    from functional_gan.pipeline import Batches

    dataset = load_image_folder(folder, TUTORIAL.image_size, 3)
    with Batches(dataset, seed=0, batch_size=batch_size, first_step=0, total_steps=batches + WARMUP, workers=workers) as stream:
        for _ in range(WARMUP):  # the workers have started and run in their steady state
            next(stream)
        start = time.perf_counter()
        for _ in range(batches):  # not to exhaustion: the end of the stream (workers stopping) is not reading
            next(stream)
        return batches * batch_size / (time.perf_counter() - start)


class _TorchFolder:
    """The same per-image work as the Grain side: PIL decode, ``image_to_array``, a float tensor in [−1, 1]."""

    def __init__(self, dataset):
        self.dataset = dataset

    def __len__(self):
        return len(self.dataset)

    def __getitem__(self, index):
        import torch

        image = torch.from_numpy(np.array(self.dataset._read(index)))  # PIL's arrays are read-only
        return image.permute(2, 0, 1).float().div_(127.5).sub_(1.0)


def torch_images_per_s(folder: Path, workers: int, batches: int, batch_size: int = TUTORIAL.batch_size) -> float:
    import torch
    from torch.utils.data import DataLoader

    from functional_gan.data import load_image_folder

    dataset = _TorchFolder(load_image_folder(folder, TUTORIAL.image_size, 3))
    loader = DataLoader(dataset, batch_size=batch_size, shuffle=True, drop_last=True, num_workers=workers,
                        generator=torch.Generator().manual_seed(0))
    iterator = iter(loader)
    for _ in range(WARMUP):
        next(iterator)
    start = time.perf_counter()
    for _ in range(batches):
        next(iterator)
    rate = batches * batch_size / (time.perf_counter() - start)
    del iterator
    return rate


def _data_only(folder: str) -> None:
    """Run in a new process by :func:`data_startup`: prints its timings and peak RSS as JSON."""
    import resource

    from functional_gan.data import list_image_files, load_image_folder
    from functional_gan.pipeline import Batches

    start = time.perf_counter()
    list_image_files(Path(folder))
    listed = time.perf_counter()
    dataset = load_image_folder(folder, 64, 3)
    with Batches(dataset, seed=0, batch_size=128, first_step=0, total_steps=4, workers=1) as batches:
        next(batches)
        first = time.perf_counter()
        for _ in batches:
            pass
    print(json.dumps({"listing_s": listed - start, "first_batch_s": first - listed,
                      "data_peak_rss_mb": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024}))


def data_startup(folder: Path) -> dict:
    """In a new process: listing the folder, then the first batch of 128 through the pipeline (1 worker); its peak RSS."""
    process = subprocess.run([sys.executable, "-m", "functional_gan.benchmarks.input_pipeline", "--data-only", str(folder)],
                             capture_output=True, text=True, check=True)
    return json.loads(process.stdout.strip().splitlines()[-1])


def _loader_in_new_process(name: str, workers: int, folder: Path, batches: int) -> float:
    """Images/s of one loader, measured in a fresh process (nothing of the other loader's run is left)."""
    process = subprocess.run([sys.executable, "-m", "functional_gan.benchmarks.input_pipeline", "--one-loader", name,
                              str(workers), str(folder), str(batches)], capture_output=True, text=True, check=True)
    return float(process.stdout.strip().splitlines()[-1])


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--root", default=os.path.join(tempfile.gettempdir(), "functional-gan-celeba"),
                        help="where the generated folders live (ROOT-N/img_align_celeba/)")
    parser.add_argument("--sizes", type=int, nargs="+", default=[2000, 20000, 200000], help="folder sizes")
    parser.add_argument("--workers", type=int, nargs="+", default=[1, 2], help="worker counts for the loader comparison")
    parser.add_argument("--loader-batches", type=int, default=30, help="batches timed per loader run")
    parser.add_argument("--steps", type=int, default=12, help="iterations of each steps/s run")
    parser.add_argument("--out", default="benchmarks/results/input-pipeline", help="writes OUT.json and OUT.md")
    parser.add_argument("--data-only", metavar="FOLDER", help=argparse.SUPPRESS)
    parser.add_argument("--one-loader", nargs=4, metavar=("LOADER", "WORKERS", "FOLDER", "BATCHES"), help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    if args.data_only:
        _data_only(args.data_only)
        return 0
    if args.one_loader:
        name, workers, folder, batches = args.one_loader
        rate = {"grain": grain_images_per_s, "torch": torch_images_per_s}[name](Path(folder), int(workers), int(batches))
        print(json.dumps(rate))
        return 0

    import torch

    folders = {n: make_folder(f"{args.root}-{n}", n) for n in args.sizes}
    cache = tempfile.mkdtemp(prefix="bench-input-cache-")
    result = {"machine": {"cpus": os.cpu_count(), "processor": platform.processor() or platform.machine(),
                          "python": platform.python_version(), "torch": torch.__version__},
              "startup": {}, "loaders": {}, "steps": {}}
    run_train("fake", 2, 0, cache)  # fills the compilation cache: compile is excluded from every figure below
    for n, folder in folders.items():
        data = data_startup(folder)
        measured = run_train(str(folder), 3, None, cache)
        result["startup"][n] = {**data, **measured}
        print(f"{n} files: listing {data['listing_s']:.2f} s, first batch {data['first_batch_s']:.2f} s after it "
              f"(pipeline alone: peak RSS {data['data_peak_rss_mb']:.0f} MB); train: first stats line "
              f"{measured['startup_s']:.2f} s after the start (compile {measured['compile_s']:.1f} s excluded), peak RSS "
              f"{measured['peak_rss_mb']:.0f} MB", flush=True)
    loader_folder = folders[sorted(folders)[len(folders) // 2]]
    for workers in args.workers:
        grain_rates, torch_rates = [], []
        for _ in range(2):
            grain_rates.append(_loader_in_new_process("grain", workers, loader_folder, args.loader_batches))
            torch_rates.append(_loader_in_new_process("torch", workers, loader_folder, args.loader_batches))
        result["loaders"][workers] = {"grain_images_per_s": max(grain_rates), "torch_images_per_s": max(torch_rates),
                                      "ratio_grain_over_torch": max(grain_rates) / max(torch_rates),
                                      "all_grain": grain_rates, "all_torch": torch_rates}
        print(f"{workers} worker(s): Grain {max(grain_rates):.0f} images/s, PyTorch DataLoader {max(torch_rates):.0f} "
              f"images/s, ratio {max(grain_rates) / max(torch_rates):.2f}", flush=True)
    steps_folder = folders[sorted(folders)[len(folders) // 2]]
    for name, data in (("fake", "fake"), ("folder", str(steps_folder))):
        result["steps"][name] = run_train(data, args.steps, None, cache)
    ratio = result["steps"]["fake"]["seconds_per_step"] / result["steps"]["folder"]["seconds_per_step"]
    result["steps"]["folder_over_fake_speed"] = ratio
    print(f"steps/s: folder run at {ratio:.3f}× the fake run's speed "
          f"({result['steps']['folder']['seconds_per_step']:.3f} vs {result['steps']['fake']['seconds_per_step']:.3f} s per step)")
    out = Path(args.out)
    out.parent.mkdir(parents=True, exist_ok=True)
    out.with_suffix(".json").write_text(json.dumps(result, indent=1) + "\n")
    out.with_suffix(".md").write_text(to_markdown(result, loader_folder, args))
    print(f"Wrote {out.with_suffix('.json')} and {out.with_suffix('.md')}")
    return 0


def to_markdown(result: dict, loader_folder: Path, args) -> str:
    m = result["machine"]
    lines = [f"# Input pipeline ({m['cpus']} CPUs, {m['processor']}, Python {m['python']}, PyTorch {m['torch']})", "",
             "Command: `python -m functional_gan.benchmarks.input_pipeline " + " ".join(sys.argv[1:]) + "`", "",
             "## Start-up and memory (the tutorial's settings: 64×64, batch 128, ngf = ndf = 64; default workers)", "",
             "Pipeline alone: a new process lists the folder and takes the first batch of 128 (1 worker). "
             "`train`: from the command's start to its first stats line (iteration 1 done), minus the compile time "
             "it prints (the compilation cache is warm); the peak RSS is the training process's (XLA's buffers "
             "included).", "",
             "| files | listing | first batch after listing | pipeline peak RSS | `train` start → iteration 1, compile excluded | compile | `train` peak RSS |",
             "|---:|---:|---:|---:|---:|---:|---:|"]
    for n, s in result["startup"].items():
        lines.append(f"| {int(n):,} | {s['listing_s']:.2f} s | {s['first_batch_s']:.2f} s | {s['data_peak_rss_mb']:.0f} MB | "
                     f"{s['startup_s']:.2f} s | {s['compile_s']:.1f} s | {s['peak_rss_mb']:.0f} MB |")
    lines += ["", f"## The pipeline alone ({loader_folder.name}, batch 128, 64×64; {args.loader_batches} batches after 3; best of 2 alternating runs)", "",
              "| workers | Grain (this project) | PyTorch DataLoader | Grain / PyTorch |", "|---:|---:|---:|---:|"]
    for w, r in result["loaders"].items():
        lines.append(f"| {w} | {r['grain_images_per_s']:.0f} images/s | {r['torch_images_per_s']:.0f} images/s | "
                     f"{r['ratio_grain_over_torch']:.2f} |")
    s = result["steps"]
    lines += ["", "## Training speed, folder against images in memory", "",
              f"Folder run: {s['folder']['seconds_per_step']:.3f} s per step; `--data fake`: "
              f"{s['fake']['seconds_per_step']:.3f} s per step; the folder run at "
              f"{s['folder_over_fake_speed']:.3f}× the in-memory speed.", ""]
    return "\n".join(lines)


if __name__ == "__main__":
    raise SystemExit(main())
