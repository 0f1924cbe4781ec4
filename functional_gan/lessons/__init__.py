"""The autograd lessons: each behaviour of the source notes run in PyTorch and in JAX side by side.

One module per family (:mod:`.basics`, :mod:`.linear_regression`, :mod:`.gan`, :mod:`.idioms`); the registry and
the runner in :mod:`.registry`, printing and the documentation page in :mod:`.render`, the
graph pictures in :mod:`.pictures`. ``functional-gan lessons`` runs them; ``--markdown`` writes
docs/lessons.md from the code that ran. The PyTorch sides need the ``torch`` extra.
"""

from . import basics, linear_regression, gan, idioms  # noqa: F401, I001  (registers the lessons, in this order)
from .registry import LESSONS, Lesson, LessonResult, Raised, run_lesson
from .render import format_result, to_markdown

__all__ = ["LESSONS", "Lesson", "LessonResult", "Raised", "run_lesson", "format_result", "to_markdown"]
