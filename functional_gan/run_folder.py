"""The names of a training run's folder, in one place (the loop writes them; checkpoints, the supervisor and the
commands read them).

``out/`` holds ``config.json``, ``metrics.jsonl`` (one line per iteration), ``training_images.png``,
``samples/iter_NNNNNN.png`` (the fixed-noise grids), ``progress.gif``, ``loss.png``, ``real_vs_fake.png``,
``checkpoints/`` (orbax, sealed by manifests), ``unreadable_files.txt`` when image files could not be read,
``logs/`` in a multi-process run, and ``.train.lock`` while a ``train`` writes to it.
"""

from __future__ import annotations

import dataclasses
from pathlib import Path

CONFIG = "config.json"
METRICS = "metrics.jsonl"
SAMPLES = "samples"
CHECKPOINTS = "checkpoints"
LOCK = ".train.lock"
UNREADABLE = "unreadable_files.txt"
LOGS = "logs"
TRAINING_IMAGES = "training_images.png"
LOSS_PLOT = "loss.png"
PROGRESS_GIF = "progress.gif"
REAL_VS_FAKE = "real_vs_fake.png"


@dataclasses.dataclass(frozen=True)
class RunFolder:
    """The paths of one run folder: ``RunFolder(root)``."""

    root: Path
    config: Path = dataclasses.field(init=False)
    metrics: Path = dataclasses.field(init=False)
    samples: Path = dataclasses.field(init=False)
    checkpoints: Path = dataclasses.field(init=False)
    lock: Path = dataclasses.field(init=False)
    training_images: Path = dataclasses.field(init=False)
    loss_plot: Path = dataclasses.field(init=False)
    progress_gif: Path = dataclasses.field(init=False)
    real_vs_fake: Path = dataclasses.field(init=False)

    def __post_init__(self):
        for field, name in (("config", CONFIG), ("metrics", METRICS), ("samples", SAMPLES), ("checkpoints", CHECKPOINTS),
                            ("lock", LOCK), ("training_images", TRAINING_IMAGES), ("loss_plot", LOSS_PLOT),
                            ("progress_gif", PROGRESS_GIF), ("real_vs_fake", REAL_VS_FAKE)):
            object.__setattr__(self, field, Path(self.root) / name)

    def grid(self, step: int) -> Path:
        """The fixed-noise grid after iteration ``step``."""
        return self.samples / f"iter_{step:06d}.png"

    def grids(self) -> list[Path]:
        return sorted(self.samples.glob("iter_*.png"))

    @staticmethod
    def grid_step(path: Path) -> int:
        return int(path.stem.removeprefix("iter_"))

    def unreadable(self, process: int, processes: int) -> Path:
        """Image files that could not be read, one per line (one file per process in a multi-process run)."""
        return self.root / (UNREADABLE if processes == 1 else f"unreadable_files.process-{process}.txt")

    def input_log(self, process: int) -> Path:
        """What one process of a multi-process run read."""
        return self.root / LOGS / f"input-process-{process}.json"
