"""Data loading: the image folder's bad inputs, conversions, the built-in digits."""

import numpy as np
import pytest
from PIL import Image

from functional_gan.data import DataError, load_digits, load_image_folder, resize_and_center_crop, to_unit_range


def _write_image(path, mode, size=(40, 30)):
    rng = np.random.default_rng(0)
    channels = {"L": 1, "RGB": 3, "RGBA": 4}[mode]
    array = rng.integers(0, 256, (size[1], size[0], channels), dtype=np.uint8)
    Image.fromarray(array[..., 0] if channels == 1 else array, mode=mode).save(path)


def test_missing_folder(tmp_path):
    with pytest.raises(DataError, match="does not exist"):
        load_image_folder(tmp_path / "absent", 32)


def test_empty_folder(tmp_path):
    with pytest.raises(DataError, match="is empty"):
        load_image_folder(tmp_path, 32)


def test_folder_without_images(tmp_path):
    (tmp_path / "notes.txt").write_text("no pictures here")
    with pytest.raises(DataError, match="no images"):
        load_image_folder(tmp_path, 32)


def test_a_corrupt_image_is_replaced_by_the_next_readable_file(tmp_path):
    (tmp_path / "class_a").mkdir()  # ImageFolder layout: one sub-folder per class
    _write_image(tmp_path / "class_a" / "good.png", "RGB")
    (tmp_path / "class_a" / "broken.jpg").write_bytes(b"\xff\xd8 not really a jpeg")
    (tmp_path / "truncated.png").write_bytes((tmp_path / "class_a" / "good.png").read_bytes()[:60])
    dataset = load_image_folder(tmp_path, 32)
    assert len(dataset) == 3  # listed, not decoded: files are met when a batch needs them
    assert [str(f, "utf-8") for f in dataset.files] == ["class_a/broken.jpg", "class_a/good.png", "truncated.png"]
    good, problems = dataset.read(1)
    assert problems == () and good.shape == (32, 32, 3)
    # broken.jpg (index 0) → the next readable file, good.png; truncated.png (2) wraps around past 0 to 1.
    image, problems = dataset.read(0)
    assert np.array_equal(image, good) and len(problems) == 1 and "broken.jpg" in problems[0]
    image, problems = dataset.read(2)
    assert np.array_equal(image, good) and len(problems) == 2
    assert "truncated.png" in problems[0] and "broken.jpg" in problems[1]


def test_only_corrupt_images_is_an_error(tmp_path):
    (tmp_path / "broken.png").write_bytes(b"garbage")
    with pytest.raises(DataError, match="none of the 1 image file"):
        load_image_folder(tmp_path, 32)


def test_grayscale_and_rgba_are_converted(tmp_path):
    _write_image(tmp_path / "gray.png", "L")
    _write_image(tmp_path / "alpha.png", "RGBA")
    rgb = load_image_folder(tmp_path, 32, nc=3)
    gray = load_image_folder(tmp_path, 32, nc=1)
    assert rgb.read_batch(np.arange(2))[0].shape == (2, 32, 32, 3)
    assert gray.read_batch(np.arange(2))[0].shape == (2, 32, 32, 1)
    by_name = dict(zip(["alpha", "gray"], rgb.read_batch(np.arange(2))[0]))  # files are listed in sorted order
    assert np.array_equal(by_name["gray"][..., 0], by_name["gray"][..., 2]), "gray → equal R, G, B"


def test_resize_then_center_crop_like_torchvision():
    image = Image.new("RGB", (100, 50))
    image.paste((255, 0, 0), (0, 0, 50, 50))  # left half red, right half black
    out = resize_and_center_crop(image, 20)
    assert out.size == (20, 20)
    # Shorter side 50 → 20, longer 100 → 40, centre crop keeps columns 10..30: half red, half black.
    pixels = np.asarray(out)
    assert pixels[10, 2, 0] == 255 and pixels[10, 17, 0] == 0


def test_unit_range_matches_torchvision_normalize():
    # ToTensor (x/255) then Normalize(0.5, 0.5) ((x-0.5)/0.5), computed independently.
    x = np.arange(256, dtype=np.uint8)
    np.testing.assert_allclose(to_unit_range(x), (x / 255.0 - 0.5) / 0.5, atol=1e-6)


def test_builtin_digits_work_offline_at_model_size():
    digits = load_digits(64, nc=3)
    assert digits.images_NHWC.shape == (1797, 64, 64, 3)
    assert digits.images_NHWC.dtype == np.uint8 and digits.images_NHWC.max() == 255 and digits.images_NHWC.min() == 0
