"""Training configuration: a frozen dataclass whose defaults are the DCGAN tutorial's values."""

from __future__ import annotations

import dataclasses
import math

from functional_gan.errors import UserError

# Kept free of JAX imports, so that the command line's --help answers without loading JAX.
SUPPORTED_IMAGE_SIZES = (32, 64, 128)  # the tutorial's 64 and the sizes one block fewer or more gives
DEFAULT_JOIN_TIMEOUT = 300  # seconds; JAX's own default for jax.distributed.initialize
DEFAULT_PEER_TIMEOUT = 60  # seconds without a heartbeat before a process counts as dead (JAX's default: 100)

APIS = ("linen", "nnx")  # the Flax API whose step trains: Linen modules (the default) or the NNX port

GRIDS_PER_RUN = 20  # fixed-noise grids of a run when --sample-every is not given


class ConfigError(UserError):
    """A configuration that cannot work; raised before any work is done."""


@dataclasses.dataclass(frozen=True)
class TrainConfig:
    """Hyper-parameters of a DCGAN run. Defaults: the PyTorch tutorial's.

    This is the one place the tutorial's settings are written down; every other setting in the
    project (the PyTorch reference runs, the comparisons, the benchmarks, the command line's
    defaults) is this config or a ``dataclasses.replace(config, ...)`` of it.
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
    beta2: float = 0.999  # PyTorch's Adam default; the tutorial sets only beta1
    epochs: int = 5
    steps: int | None = None  # stop after this many iterations in total (counting resumed ones)
    seed: int = 999
    log_every: int = 50  # the tutorial's stats line
    sample_every: int | None = None  # fixed-noise grid interval; None: about GRIDS_PER_RUN grids (the tutorial: 500)
    checkpoint_every: int = 500
    loss: str = "bce"  # the tutorial's BCELoss pair; an entry of functional_gan.losses.LOSSES (each with its own defaults)
    n_critic: int = 1  # D (critic) updates per G update; the tutorial alternates, 1
    gp_weight: float = 10.0  # WGAN-GP's λ (used by the wgan-gp loss only)
    devices: int | None = None  # data parallelism over this many local devices; None: all of them
    api: str = "linen"  # the step's Flax API (APIS); both write the same checkpoints

    def validate(self) -> "TrainConfig":
        """Raise :class:`ConfigError` with a clear message if any value cannot work.

        The loss's name is checked where the losses live (:func:`functional_gan.losses.loss_entry`): this
        module stays below them and free of JAX.
        """
        problems = []
        if self.image_size not in SUPPORTED_IMAGE_SIZES:
            problems.append(f"--image-size {self.image_size} is not supported; choose one of {SUPPORTED_IMAGE_SIZES}")
        for name in ("batch_size", "nc", "nz", "ngf", "ndf", "epochs", "log_every", "checkpoint_every", "n_critic"):
            value = getattr(self, name)
            if not isinstance(value, int) or value <= 0:
                problems.append(f"--{name.replace('_', '-')} must be a positive integer, got {value!r}")
        for name in ("steps", "sample_every", "devices"):
            value = getattr(self, name)
            if value is not None and (not isinstance(value, int) or value <= 0):
                problems.append(f"--{name.replace('_', '-')} must be a positive integer, got {value!r}")
        if not (math.isfinite(self.gp_weight) and self.gp_weight >= 0):
            problems.append(f"--gp-weight must be a finite number ≥ 0, got {self.gp_weight!r}")
        if not (math.isfinite(self.lr) and self.lr > 0):
            problems.append(f"--lr must be a positive finite number, got {self.lr!r}")
        for name in ("beta1", "beta2"):
            value = getattr(self, name)
            if not (0.0 <= value < 1.0):
                problems.append(f"--{name} must lie in [0, 1), got {value!r}")
        if self.api not in APIS:
            problems.append(f"--api {self.api!r} is not one of {', '.join(APIS)}")
        elif self.api == "nnx" and (self.loss != "bce" or self.n_critic != 1):
            problems.append(f"--api nnx ports the tutorial's step (--loss bce, --n-critic 1), not --loss {self.loss} "
                            f"--n-critic {self.n_critic}; --api linen runs every loss")
        if problems:
            raise ConfigError("invalid configuration:\n  " + "\n  ".join(problems))
        return self

    def grid_interval(self, total_steps: int) -> int:
        """Iterations between fixed-noise grids: ``sample_every``, or about GRIDS_PER_RUN grids over the run."""
        if self.sample_every is not None:
            return self.sample_every
        return max(1, -(-total_steps // GRIDS_PER_RUN))

    # Fields that may change when a run is resumed: how long to train and how often to report.
    # The API too: both steps read and write the same state and compute the same numbers.
    RESUMABLE_CHANGES = ("epochs", "steps", "log_every", "sample_every", "checkpoint_every", "devices", "api")

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


# The command line's flag for each TrainConfig field: its help, and whether its default is decided later
# ("later": the flag defaults to None and the value comes from the loss's entry, or from the data for --nc).
# ``functional-gan train`` builds its flags from this table (name, type and default from the field); the
# loss-dependent defaults are listed in the help from the losses' entries.
FLAGS: dict[str, tuple[str, str]] = {
    "data": ("'digits' (built in, offline), 'fake' (random), a folder of images (searched recursively, like "
             "ImageFolder), or a uint8 .npy array of images (NHWC or NCHW, memory-mapped)", "config"),
    "epochs": ("passes over the data", "config"),
    "steps": ("train this many iterations in total (overrides --epochs)", "config"),
    "batch_size": ("images per iteration", "config"),
    "image_size": (f"{', '.join(map(str, SUPPORTED_IMAGE_SIZES[:-1]))} or {SUPPORTED_IMAGE_SIZES[-1]}", "config"),
    "nc": ("image channels (default: 1 for the grayscale digits, else 3)", "later"),
    "nz": ("size of the latent vector", "config"),
    "ngf": ("generator width", "config"),
    "ndf": ("discriminator width", "config"),
    "lr": ("Adam's learning rate", "later"),
    "beta1": ("Adam's beta1", "later"),
    "beta2": ("Adam's beta2 (PyTorch's default; the tutorial keeps it)", "later"),
    "loss": ("the GAN losses", "config"),
    "n_critic": ("D (critic) updates per G update", "later"),
    "gp_weight": ("the gradient penalty's weight λ, for the losses that have one", "later"),
    "api": ("the Flax API of the training step: 'linen' (flax.linen modules) or 'nnx' (the same step ported to "
            "flax.nnx objects, BCE loss only); both write the same checkpoints", "config"),
    "seed": ("the run's one root seed (weights, noise, data order)", "config"),
    "devices": ("data parallelism: shard each batch over this many local devices (default: all of them; in a "
                "multi-process run, all devices of all processes)", "config"),
    "log_every": ("print the tutorial's stats line every N iterations", "config"),
    "sample_every": ("save a fixed-noise grid every N iterations (default: about 20 grids over the run)", "config"),
    "checkpoint_every": ("save a checkpoint every N iterations", "config"),
}


TUTORIAL = TrainConfig()
"""The PyTorch DCGAN tutorial's settings (64×64 images, batch 128, nz 100, ngf = ndf = 64, Adam 2e-4 / 0.5)."""
