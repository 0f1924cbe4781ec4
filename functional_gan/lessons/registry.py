"""The lessons' registry: each lesson has any number of sides (PyTorch, torch.func, JAX ...).

A side is a function that runs the behaviour and returns what it computed, as a dict of labelled
values (numbers, lists, booleans, or the exception PyTorch raised, kept as :class:`Raised`).
:func:`run_lesson` runs every side and keeps its source, so the documentation page shows the code
that produced each value.
"""

from __future__ import annotations

import dataclasses
import inspect
import textwrap
from typing import Any, Callable

import numpy as np

from functional_gan.config import TrainConfig


@dataclasses.dataclass(frozen=True)
class Raised:
    """An exception a snippet raised, kept as data."""

    type: str
    message: str

    @classmethod
    def of(cls, error: BaseException) -> "Raised":
        return cls(type(error).__name__, str(error).strip().splitlines()[0])

    def __str__(self) -> str:
        return f"raises {self.type}: {self.message}"


@dataclasses.dataclass(frozen=True)
class Lesson:
    name: str
    title: str
    sides: dict[str, Callable[..., dict]]  # side name ("PyTorch", "JAX", ...) → the code that runs it
    why: str
    sizes: dict[str, TrainConfig] | None = None  # lessons whose sides take a config: "small" and "full"


@dataclasses.dataclass
class LessonResult:
    name: str
    title: str
    values: dict[str, dict[str, Any]]  # side → label → value
    code: dict[str, str]  # side → the source that produced the values
    why: str


LESSONS: dict[str, Lesson] = {}


def register(name: str, title: str, why: str, sides: dict[str, Callable[..., dict]], sizes=None) -> Lesson:
    lesson = Lesson(name, title, dict(sides), textwrap.dedent(why).strip(), sizes)
    LESSONS[name] = lesson
    return lesson


def value(x) -> Any:
    """Tensors and arrays as plain Python floats/lists for printing and comparing."""
    if hasattr(x, "detach"):
        x = x.detach().cpu().numpy()
    array = np.asarray(x)
    return array.item() if array.ndim == 0 else array.tolist()


def run_lesson(name: str, size: str = "small") -> LessonResult:
    """Run every side of one lesson (``size`` "full" gives configurable lessons the tutorial's sizes)."""
    if name not in LESSONS:
        raise KeyError(f"unknown lesson {name!r}; choose from {', '.join(LESSONS)}")
    lesson = LESSONS[name]
    args = (lesson.sizes[size],) if lesson.sizes else ()
    values = {}
    for side, fn in lesson.sides.items():
        try:
            values[side] = fn(*args)
        except ImportError as error:  # the PyTorch sides need the torch extra; the JAX side stands alone
            values[side] = {"unavailable": Raised(type(error).__name__, f"{error} (install the torch extra: pip install -e '.[torch]')")}
    code = {side: textwrap.dedent(inspect.getsource(fn)) for side, fn in lesson.sides.items()}
    return LessonResult(lesson.name, lesson.title, values, code, lesson.why)
