"""Training configuration: a frozen dataclass whose defaults are the DCGAN tutorial's values."""

from __future__ import annotations

import dataclasses
import math

from functional_gan.models import SUPPORTED_IMAGE_SIZES


class ConfigError(ValueError):
    """A configuration that cannot work; raised before any work is done."""


@dataclasses.dataclass(frozen=True)
class TrainConfig:
    """Hyper-parameters of a DCGAN run. Defaults: the PyTorch tutorial's.

    Variants are made with ``dataclasses.replace(config, ...)``.
    """

    data: str = "digits"  # "digits" (built in), "fake" (random, for benchmarks) or a folder of images
    batch_size: int = 128
    image_size: int = 64
    nc: int = 3
    nz: int = 100
    ngf: int = 64
    ndf: int = 64
    lr: float = 2e-4
    beta1: float = 0.5
    beta2: float = 0.999
    epochs: int = 5
    steps: int | None = None  # stop after this many iterations in total (counting resumed ones)
    seed: int = 999
    log_every: int = 50  # the tutorial's stats line
    sample_every: int = 500  # the tutorial's fixed-noise grid
    checkpoint_every: int = 500

    def validate(self) -> "TrainConfig":
        """Raise :class:`ConfigError` with a clear message if any value cannot work."""
        problems = []
        if self.image_size not in SUPPORTED_IMAGE_SIZES:
            problems.append(f"--image-size {self.image_size} is not supported; choose one of {SUPPORTED_IMAGE_SIZES}")
        for name in ("batch_size", "nc", "nz", "ngf", "ndf", "epochs", "log_every", "sample_every", "checkpoint_every"):
            value = getattr(self, name)
            if not isinstance(value, int) or value <= 0:
                problems.append(f"--{name.replace('_', '-')} must be a positive integer, got {value!r}")
        if self.steps is not None and (not isinstance(self.steps, int) or self.steps <= 0):
            problems.append(f"--steps must be a positive integer, got {self.steps!r}")
        if not (math.isfinite(self.lr) and self.lr > 0):
            problems.append(f"--lr must be a positive finite number, got {self.lr!r}")
        for name in ("beta1", "beta2"):
            value = getattr(self, name)
            if not (0.0 <= value < 1.0):
                problems.append(f"--{name} must lie in [0, 1), got {value!r}")
        if problems:
            raise ConfigError("invalid configuration:\n  " + "\n  ".join(problems))
        return self

    # Fields that may change when a run is resumed: how long to train and how often to report.
    RESUMABLE_CHANGES = ("epochs", "steps", "log_every", "sample_every", "checkpoint_every")

    def incompatibilities(self, saved: "TrainConfig") -> list[str]:
        """Fields that differ from ``saved`` in a way a resumed run cannot accept."""
        return [
            f"{field.name}: saved {getattr(saved, field.name)!r}, now {getattr(self, field.name)!r}"
            for field in dataclasses.fields(self)
            if field.name not in self.RESUMABLE_CHANGES and getattr(self, field.name) != getattr(saved, field.name)
        ]

    def to_dict(self) -> dict:
        return dataclasses.asdict(self)

    @classmethod
    def from_dict(cls, values: dict) -> "TrainConfig":
        known = {field.name for field in dataclasses.fields(cls)}
        return cls(**{k: v for k, v in values.items() if k in known})
