"""Datasets: a folder of images (the tutorial's ImageFolder), the built-in digits, random data.

Images are kept in memory as uint8 NHWC at the model's size and turned into float32 in [−1, 1]
one batch at a time (torchvision's ``ToTensor()`` then ``Normalize(0.5, 0.5)``: ``x / 127.5 − 1``).
"""

from __future__ import annotations

import dataclasses
import os
from pathlib import Path

import numpy as np
from PIL import Image, UnidentifiedImageError

from functional_gan.errors import UserError

IMAGE_EXTENSIONS = (".jpg", ".jpeg", ".png", ".ppm", ".bmp", ".pgm", ".tif", ".tiff", ".webp", ".gif")


class DataError(UserError):
    """The data cannot be used (missing, empty, unreadable); the message says why."""


@dataclasses.dataclass
class ImageDataset:
    """Images in memory, uint8 NHWC at the model's size."""

    images_NHWC: np.ndarray
    name: str
    skipped_files: tuple[str, ...] = ()

    def __len__(self) -> int:
        return self.images_NHWC.shape[0]

    def steps_per_epoch(self, batch_size: int) -> int:
        """Full batches per epoch (the last incomplete batch is dropped: one shape, one compilation)."""
        return len(self) // batch_size

    def epoch_order(self, seed: int, epoch: int) -> np.ndarray:
        """The shuffled order of one epoch: a function of (seed, epoch) only, so resuming is exact."""
        return np.random.default_rng([seed, epoch]).permutation(len(self))

    def batch(self, seed: int, step: int, batch_size: int, rows: slice = slice(None)) -> np.ndarray:
        """The float32 batch in [−1, 1] that global iteration ``step`` trains on (only ``rows`` of it if given)."""
        per_epoch = self.steps_per_epoch(batch_size)
        epoch, index = divmod(step, per_epoch)
        order = self.epoch_order(seed, epoch)
        chosen = order[index * batch_size : (index + 1) * batch_size][rows]
        return to_unit_range(self.images_NHWC[chosen])


def to_unit_range(images_uint8: np.ndarray) -> np.ndarray:
    """uint8 [0, 255] → float32 [−1, 1], as ``ToTensor()`` + ``Normalize((0.5,)*c, (0.5,)*c)``."""
    return images_uint8.astype(np.float32) / 127.5 - 1.0


def resize_and_center_crop(image: Image.Image, size: int) -> Image.Image:
    """torchvision's ``Resize(size)`` (shorter side → size, bilinear) then ``CenterCrop(size)``."""
    width, height = image.size
    if width <= height:
        new_width, new_height = size, int(size * height / width)
    else:
        new_width, new_height = int(size * width / height), size
    image = image.resize((new_width, new_height), Image.BILINEAR)
    left = int(round((new_width - size) / 2.0))
    top = int(round((new_height - size) / 2.0))
    return image.crop((left, top, left + size, top + size))


def _to_channels(image: Image.Image, nc: int) -> Image.Image:
    # Grayscale, palette, RGBA, CMYK ... all become what the model eats.
    if nc == 1:
        return image.convert("L")
    if nc == 3:
        return image.convert("RGB")
    raise DataError(f"image folders need nc 1 or 3, got nc={nc}")


def _image_array(image: Image.Image, nc: int) -> np.ndarray:
    array = np.asarray(image, dtype=np.uint8)
    return array[..., None] if nc == 1 else array


def load_image_folder(folder: str | os.PathLike, image_size: int, nc: int = 3, progress: bool = True) -> ImageDataset:
    """Every image below ``folder`` (recursively, like ImageFolder's class sub-folders), resized and cropped.

    Corrupt or unreadable files are skipped and counted; grayscale and RGBA images are converted.

    Raises:
      DataError: the folder is missing, empty, holds no image files, or none of them can be read.
    """
    root = Path(folder)
    if not root.exists():
        raise DataError(f"data folder {str(root)!r} does not exist")
    if not root.is_dir():
        raise DataError(f"--data {str(root)!r} is not a folder (expected a folder of images, 'digits' or 'fake')")
    all_files = sorted(p for p in root.rglob("*") if p.is_file())
    if not all_files:
        raise DataError(f"data folder {str(root)!r} is empty")
    image_files = [p for p in all_files if p.suffix.lower() in IMAGE_EXTENSIONS]
    if not image_files:
        raise DataError(
            f"data folder {str(root)!r} holds {len(all_files)} file(s) but no images "
            f"(looked for {', '.join(IMAGE_EXTENSIONS)})"
        )
    from tqdm.auto import tqdm

    arrays, skipped = [], []
    for path in tqdm(image_files, desc="loading images", unit="img", disable=not progress, leave=False):
        try:
            with Image.open(path) as image:
                image.load()
                image = _to_channels(image, nc)
                arrays.append(_image_array(resize_and_center_crop(image, image_size), nc))
        except (UnidentifiedImageError, OSError, SyntaxError, ValueError) as error:
            skipped.append(f"{path}: {type(error).__name__}: {error}")
    if not arrays:
        raise DataError(
            f"none of the {len(image_files)} image file(s) in {str(root)!r} could be read; first problem: {skipped[0]}"
        )
    return ImageDataset(np.stack(arrays), name=str(root), skipped_files=tuple(skipped))


def load_digits(image_size: int, nc: int = 3) -> ImageDataset:
    """The 1,797 handwritten digits that scikit-learn ships (8×8, 0–16), brought to ``image_size`` and ``nc``.

    Works offline: the data is inside the scikit-learn package.
    """
    from sklearn.datasets import load_digits as sklearn_digits

    digits_8x8 = sklearn_digits().images  # float64 in [0, 16]
    as_uint8 = np.clip(np.rint(digits_8x8 * (255.0 / 16.0)), 0, 255).astype(np.uint8)
    resized = np.stack(
        [np.asarray(Image.fromarray(d, mode="L").resize((image_size, image_size), Image.BILINEAR)) for d in as_uint8]
    )
    return ImageDataset(np.repeat(resized[..., None], nc, axis=-1), name="digits")


def make_fake(image_size: int, nc: int, num_images: int = 512, seed: int = 0) -> ImageDataset:
    """Uniform random images (pytorch/examples' ``--dataset fake``): for benchmarks and smoke tests."""
    rng = np.random.default_rng(seed)
    return ImageDataset(rng.integers(0, 256, (num_images, image_size, image_size, nc), dtype=np.uint8), name="fake")


def default_channels(data: str) -> int:
    """Image channels when ``--nc`` is not given: 1 for the grayscale built-in digits (as pytorch/examples
    does for MNIST), 3 (the tutorial's RGB) otherwise."""
    return 1 if data == "digits" else 3


def load_dataset(data: str, image_size: int, nc: int, progress: bool = True) -> ImageDataset:
    """``--data``: "digits", "fake", or a folder of images."""
    if data == "digits":
        return load_digits(image_size, nc)
    if data == "fake":
        return make_fake(image_size, nc)
    return load_image_folder(data, image_size, nc, progress=progress)
