"""Datasets: a folder of images (the tutorial's ImageFolder), an ``.npy`` array, the built-in digits, random data.

Every dataset is random access: ``dataset.read(i)`` gives image ``i`` as uint8 HWC at the model's
size. A folder is only *listed* up front (no file is opened); its images are decoded when a batch
needs them, by the Grain pipeline of :mod:`functional_gan.pipeline`, in worker processes. The
order of an epoch is a pure function of (seed, epoch), so the batch of iteration ``t`` is known
without reading anything before it and a resumed run reads exactly what the uninterrupted run read.
Images become float32 in [−1, 1] one batch at a time (torchvision's ``ToTensor()`` then
``Normalize(0.5, 0.5)``: ``x / 127.5 − 1``).

A file that cannot be decoded is met when a batch first needs it. Its place is taken by the next
readable file of the sorted list (wrapping around): a pure function of the index, so the batch
shape stays the same and a resumed run reads the same images. Each such file is named once.
"""

from __future__ import annotations

import functools
import os
from pathlib import Path

import numpy as np
from PIL import Image, UnidentifiedImageError

from functional_gan.errors import UserError

IMAGE_EXTENSIONS = (".jpg", ".jpeg", ".png", ".ppm", ".bmp", ".pgm", ".tif", ".tiff", ".webp", ".gif")
UNREADABLE = (UnidentifiedImageError, OSError, SyntaxError, ValueError, Image.DecompressionBombError)


class DataError(UserError):
    """The data cannot be used (missing, empty, unreadable); the message says why."""


class Dataset:
    """Random access to images at the model's size, and the batches of a run.

    Subclasses implement ``__len__``, ``_read(i) -> uint8 HWC`` (raising one of ``UNREADABLE`` for a bad
    item) and ``describe(i)`` (what item ``i`` is, for messages).
    """

    name: str
    image_shape: tuple[int, int, int]  # (H, W, C) of every image ``read`` returns

    def __len__(self) -> int:
        raise NotImplementedError

    def _read(self, index: int) -> np.ndarray:
        raise NotImplementedError

    def describe(self, index: int) -> str:
        return f"{self.name}[{index}]"

    def read(self, index: int) -> tuple[np.ndarray, tuple[str, ...]]:
        """Image ``index``, or the next readable one if it cannot be read; and the problems met on the way."""
        problems = []
        for offset in range(len(self)):
            i = (index + offset) % len(self)
            try:
                return self._read(i), tuple(problems)
            except UNREADABLE as error:
                problems.append(f"{self.describe(i)}: {type(error).__name__}: {error}")
        raise DataError(f"none of the {len(self)} image file(s) in {self.name!r} could be read; first problem: {problems[0]}")

    def steps_per_epoch(self, batch_size: int) -> int:
        """Full batches per epoch (the last incomplete batch is dropped: one shape, one compilation)."""
        return len(self) // batch_size

    def epoch_order(self, seed: int, epoch: int) -> np.ndarray:
        """The shuffled order of one epoch: a function of (seed, epoch) only, so resuming is exact."""
        return _permutation(len(self), seed, epoch)

    def indices(self, seed: int, step: int, batch_size: int, rows: slice = slice(None)) -> np.ndarray:
        """The dataset indices of global iteration ``step``'s batch (only ``rows`` of it if given)."""
        epoch, index = divmod(step, self.steps_per_epoch(batch_size))
        return self.epoch_order(seed, epoch)[index * batch_size : (index + 1) * batch_size][rows]

    def read_batch(self, indices: np.ndarray) -> tuple[np.ndarray, tuple[str, ...]]:
        """uint8 NHWC images at ``indices`` and the problems met reading them."""
        images, problems = [], []
        for i in indices:
            image, met = self.read(int(i))
            images.append(image)
            problems.extend(met)
        return np.stack(images), tuple(problems)

    def batch(self, seed: int, step: int, batch_size: int, rows: slice = slice(None)) -> np.ndarray:
        """The float32 batch in [−1, 1] that global iteration ``step`` trains on (read here, in this process)."""
        return to_unit_range(self.read_batch(self.indices(seed, step, batch_size, rows))[0])


@functools.lru_cache(maxsize=4)
def _permutation(n: int, seed: int, epoch: int) -> np.ndarray:
    order = np.random.default_rng([seed, epoch]).permutation(n)
    order.flags.writeable = False
    return order


class ImageDataset(Dataset):
    """Images already in memory, uint8 NHWC at the model's size (the built-in digits, random data)."""

    def __init__(self, images_NHWC: np.ndarray, name: str):
        self.images_NHWC, self.name = images_NHWC, name
        self.image_shape = tuple(images_NHWC.shape[1:])

    def __len__(self) -> int:
        return self.images_NHWC.shape[0]

    def _read(self, index: int) -> np.ndarray:
        return self.images_NHWC[index]

    def read_batch(self, indices: np.ndarray) -> tuple[np.ndarray, tuple[str, ...]]:
        return self.images_NHWC[indices], ()


class FolderDataset(Dataset):
    """Every image file below a folder (recursively, like ImageFolder's class sub-folders), in sorted order.

    Listing is the only work done up front; ``read`` decodes one file, converts it to ``nc``
    channels, resizes its shorter side and centre-crops (torchvision's ``Resize`` + ``CenterCrop``).
    """

    def __init__(self, root: Path, files: list[str], image_size: int, nc: int):
        self.root, self.name = root, str(root)
        # Relative paths as one bytes array: 200,000 CelebA names take 5 MB and pickle at once to the workers.
        self.files = np.array([os.fsencode(f) for f in files])
        self.image_size, self.nc = image_size, nc
        self.image_shape = (image_size, image_size, nc)

    def __len__(self) -> int:
        return len(self.files)

    def describe(self, index: int) -> str:
        return str(self.root / os.fsdecode(self.files[index]))

    def _read(self, index: int) -> np.ndarray:
        with Image.open(self.root / os.fsdecode(self.files[index])) as image:
            image.load()
            return image_to_array(image, self.image_size, self.nc)


class ArrayDataset(Dataset):
    """A uint8 ``.npy`` array of images, NHWC or NCHW, memory-mapped: only the images a batch needs are read."""

    def __init__(self, path: Path, array: np.ndarray, channels_first: bool, image_size: int, nc: int):
        self.path, self.array, self.channels_first = path, array, channels_first
        self.name = str(path)
        self.image_size, self.nc = image_size, nc
        self.image_shape = (image_size, image_size, nc)

    def __len__(self) -> int:
        return self.array.shape[0]

    def __getstate__(self):  # worker processes map the file again instead of receiving its contents
        return {**self.__dict__, "array": None}

    def __setstate__(self, state):
        self.__dict__.update(state)
        self.array = np.load(self.path, mmap_mode="r")

    def _read(self, index: int) -> np.ndarray:
        item = np.asarray(self.array[index])
        if self.channels_first:
            item = item.transpose(1, 2, 0)
        if item.shape == self.image_shape:
            return np.ascontiguousarray(item)
        image = Image.fromarray(item[..., 0] if item.shape[-1] == 1 else item)
        return image_to_array(image, self.image_size, self.nc)


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
    raise DataError(f"image folders and arrays need nc 1 or 3, got nc={nc}")


def image_to_array(image: Image.Image, image_size: int, nc: int) -> np.ndarray:
    """A PIL image → uint8 HWC with ``nc`` channels, resized and centre-cropped to ``image_size``."""
    array = np.asarray(resize_and_center_crop(_to_channels(image, nc), image_size), dtype=np.uint8)
    return array[..., None] if nc == 1 else array


def list_image_files(root: Path) -> tuple[list[str], int]:
    """Image files below ``root`` (relative, sorted) and how many files there are in all; no file is opened.

    ``os.scandir`` reads each folder once and knows which entries are files without a ``stat``:
    about 0.2 s for 200,000 files.
    """
    found, total = [], 0
    stack = [""]
    while stack:
        relative = stack.pop()
        with os.scandir(root / relative) as entries:
            for entry in entries:
                name = f"{relative}/{entry.name}" if relative else entry.name
                if entry.is_dir():
                    stack.append(name)
                elif entry.is_file():
                    total += 1
                    if os.path.splitext(entry.name)[1].lower() in IMAGE_EXTENSIONS:
                        found.append(name)
    found.sort()
    return found, total


def load_image_folder(folder: str | os.PathLike, image_size: int, nc: int = 3) -> FolderDataset:
    """The images below ``folder``, listed (not decoded); the first readable one is decoded as a check.

    Raises:
      DataError: the folder is missing, empty, holds no image files, or none of them can be read.
    """
    if nc not in (1, 3):
        raise DataError(f"image folders need nc 1 or 3, got nc={nc}")
    root = Path(folder)
    if not root.exists():
        raise DataError(f"data folder {str(root)!r} does not exist")
    if not root.is_dir():
        raise DataError(f"--data {str(root)!r} is not a folder (expected a folder of images, an .npy array, 'digits' or 'fake')")
    files, total = list_image_files(root)
    if total == 0:
        raise DataError(f"data folder {str(root)!r} is empty")
    if not files:
        raise DataError(
            f"data folder {str(root)!r} holds {total} file(s) but no images (looked for {', '.join(IMAGE_EXTENSIONS)})"
        )
    dataset = FolderDataset(root, files, image_size, nc)
    dataset.read(0)  # a folder of nothing but unreadable files fails here, before training
    return dataset


def load_array(path: str | os.PathLike, image_size: int, nc: int = 3) -> ArrayDataset:
    """A uint8 ``.npy`` array of images, (N, H, W, C) or (N, C, H, W) with C = ``nc``, memory-mapped.

    Raises:
      DataError: the file is missing, not an ``.npy`` array, of another dtype, rank or channel count, or empty.
    """
    path = Path(path)
    if not path.exists():
        raise DataError(f"data file {str(path)!r} does not exist")
    try:
        array = np.load(path, mmap_mode="r")
    except (ValueError, OSError, EOFError) as error:
        raise DataError(f"{str(path)!r} is not a readable .npy array: {error}") from error
    if not isinstance(array, np.ndarray) or array.dtype != np.uint8 or array.ndim != 4:
        what = f"dtype {array.dtype}, shape {array.shape}" if isinstance(array, np.ndarray) else type(array).__name__
        raise DataError(f"{str(path)!r} must hold uint8 images of shape (N, H, W, C) or (N, C, H, W); it holds {what}")
    if array.shape[-1] == nc:
        channels_first = False
    elif array.shape[1] == nc:
        channels_first = True
    else:
        raise DataError(f"{str(path)!r} has shape {array.shape}: neither its last nor its second axis is nc = {nc} "
                        "(NHWC or NCHW); set --nc to its number of channels")
    if array.shape[0] == 0:
        raise DataError(f"{str(path)!r} holds no images (shape {array.shape})")
    return ArrayDataset(path, array, channels_first, image_size, nc)


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


def load_dataset(data: str, image_size: int, nc: int) -> Dataset:
    """``--data``: "digits", "fake", a ``.npy`` file, or a folder of images."""
    if data == "digits":
        return load_digits(image_size, nc)
    if data == "fake":
        return make_fake(image_size, nc)
    if data.lower().endswith(".npy"):
        return load_array(data, image_size, nc)
    return load_image_folder(data, image_size, nc)
