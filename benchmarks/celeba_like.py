"""Generate a folder shaped like CelebA's aligned images: ``ROOT/img_align_celeba/000001.jpg`` ..., 178×218 RGB JPEGs.

Nothing is downloaded: each image is 11×14 random pixels upscaled bicubically (smooth content,
so the JPEGs have CelebA's size on disk, ~10 KB) and saved at quality 90. About 1 ms per file.

    python -m functional_gan.benchmarks.celeba_like ROOT --count 20000
"""

from __future__ import annotations

import argparse
import multiprocessing
import os
from concurrent.futures import ProcessPoolExecutor
from pathlib import Path

import numpy as np
from PIL import Image

WIDTH, HEIGHT = 178, 218  # CelebA's aligned and cropped images
SUBFOLDER = "img_align_celeba"


def _write_range(folder: str, start: int, stop: int, seed: int) -> None:
    rng = np.random.default_rng([seed, start])
    for number in range(start, stop):
        small = Image.fromarray(rng.integers(0, 256, (14, 11, 3), dtype=np.uint8))
        small.resize((WIDTH, HEIGHT), Image.BICUBIC).save(os.path.join(folder, f"{number + 1:06d}.jpg"), quality=90)


def make_folder(root: str | os.PathLike, count: int, seed: int = 0, processes: int | None = None) -> Path:
    """Write ``count`` CelebA-shaped JPEGs below ``root`` (skipped if the folder already holds exactly that many)."""
    folder = Path(root) / SUBFOLDER
    folder.mkdir(parents=True, exist_ok=True)
    if sum(1 for _ in os.scandir(folder)) == count:
        return Path(root)
    if count <= 2000:  # seconds in this process; no worker processes forked from a process running JAX
        _write_range(str(folder), 0, count, seed)
        return Path(root)
    processes = processes or os.cpu_count() or 1
    chunk = max(1, -(-count // (processes * 8)))
    with ProcessPoolExecutor(processes, mp_context=multiprocessing.get_context("spawn")) as pool:
        for future in [pool.submit(_write_range, str(folder), s, min(s + chunk, count), seed) for s in range(0, count, chunk)]:
            future.result()
    return Path(root)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("root", help="folder to create (the images go into ROOT/img_align_celeba/)")
    parser.add_argument("--count", type=int, default=2000, help="number of images")
    parser.add_argument("--seed", type=int, default=0, help="seed of the random pixels")
    args = parser.parse_args(argv)
    print(make_folder(args.root, args.count, args.seed))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
