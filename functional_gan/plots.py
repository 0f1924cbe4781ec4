"""Pictures of a run: image grids, the loss plot, the progress GIF and real-vs-fake."""

from __future__ import annotations

import os
from pathlib import Path

import numpy as np
from PIL import Image


def _pyplot():
    """matplotlib's pyplot on the file-only Agg backend, imported on first use (a grid needs only Pillow)."""
    import matplotlib

    matplotlib.use("Agg")  # files only, no screen needed
    import matplotlib.pyplot as plt

    return plt


def make_grid(images_NHWC: np.ndarray, nrow: int = 8, padding: int = 2, normalize: bool = True) -> np.ndarray:
    """torchvision's ``make_grid(..., padding=2, normalize=True)``: a uint8 (H, W, 3) mosaic.

    ``normalize`` rescales the whole batch's [min, max] to [0, 1] as torchvision does; without it
    images are taken to lie in [−1, 1].
    """
    images = np.asarray(images_NHWC, dtype=np.float32)
    if images.ndim != 4:
        raise ValueError(f"expected images (N, H, W, C), got shape {images.shape}")
    if normalize:
        low, high = float(images.min()), float(images.max())
        images = (images - low) / max(high - low, 1e-5)
    else:
        images = (images + 1.0) / 2.0
    images = np.clip(images, 0.0, 1.0)
    if images.shape[-1] == 1:
        images = np.repeat(images, 3, axis=-1)
    count, height, width, _ = images.shape
    columns = min(nrow, count)
    rows = int(np.ceil(count / columns))
    grid = np.zeros((rows * (height + padding) + padding, columns * (width + padding) + padding, 3), np.float32)
    for i, image in enumerate(images):
        r, c = divmod(i, columns)
        top, left = padding + r * (height + padding), padding + c * (width + padding)
        grid[top : top + height, left : left + width] = image
    return (grid * 255 + 0.5).astype(np.uint8)


def save_grid(images_NHWC: np.ndarray, path: str | os.PathLike, nrow: int = 8) -> Path:
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    Image.fromarray(make_grid(images_NHWC, nrow=nrow)).save(path)
    return path


def save_line_plot(series: dict[str, np.ndarray], path: str | os.PathLike, title: str, ylabel: str,
                   log: bool = False, figsize=(10, 5)) -> Path:
    """Curves over iterations (numbered from 1), one per entry of ``series``."""
    path = Path(path)
    plt = _pyplot()
    fig, ax = plt.subplots(figsize=figsize)
    for label, values in series.items():
        ax.plot(np.arange(1, len(values) + 1), values, label=label)
    ax.set_title(title)
    ax.set_xlabel("iterations")
    ax.set_ylabel(ylabel)
    if log:
        ax.set_yscale("log")
    ax.legend()
    fig.tight_layout()
    fig.savefig(path, dpi=100)
    plt.close(fig)
    return path


def save_loss_plot(loss_g: list[float], loss_d: list[float], path: str | os.PathLike,
                   derived: dict[str, list[float]] | None = None) -> Path:
    """The tutorial's "Generator and Discriminator Loss During Training" plot.

    ``derived``: the loss's own metrics per iteration, drawn too (WGAN-GP's estimate W ≈ C(x) − C(G(z)):
    a critic's losses drift with the unidentified level of its scores; the estimate is the curve to read).
    """
    series = {"G": loss_g, "D": loss_d, **(derived or {})}
    return save_line_plot(series, path, "Generator and Discriminator Loss During Training", "Loss")


def save_progress_gif(grid_paths: list[Path], path: str | os.PathLike, frame_ms: int = 600) -> Path | None:
    """An animated GIF of the fixed-noise grids (the tutorial's animation), or None without grids."""
    if not grid_paths:
        return None
    path = Path(path)
    frames = [Image.open(p).convert("P", palette=Image.ADAPTIVE) for p in grid_paths]
    frames[0].save(path, save_all=True, append_images=frames[1:], duration=frame_ms, loop=0)
    return path


def save_grids_side_by_side(panels: dict[str, np.ndarray], path: str | os.PathLike, padding: int = 2) -> Path:
    """One titled image grid per entry of ``panels`` (title → images NHWC), side by side."""
    path = Path(path)
    plt = _pyplot()
    fig, axes = plt.subplots(1, len(panels), figsize=(7.5 * len(panels), 8))
    for ax, (title, images) in zip(np.atleast_1d(axes), panels.items()):
        ax.axis("off")
        ax.set_title(title)
        ax.imshow(make_grid(images[:64], padding=padding))
    fig.tight_layout()
    fig.savefig(path, dpi=100)
    plt.close(fig)
    return path


def save_real_vs_fake(real_NHWC: np.ndarray, fake_NHWC: np.ndarray, path: str | os.PathLike) -> Path:
    """The tutorial's closing figure: "Real Images" beside "Fake Images"."""
    return save_grids_side_by_side({"Real Images": real_NHWC, "Fake Images": fake_NHWC}, path, padding=5)
