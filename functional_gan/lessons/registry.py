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
    family: str  # the notebook it belongs to (a key of FAMILIES)
    sizes: dict[str, TrainConfig] | None = None  # lessons whose sides take a config: "small" and "full"


@dataclasses.dataclass(frozen=True)
class Family:
    """A group of lessons shown together: one notebook, one page of the documentation site."""

    name: str
    title: str
    intro: str
    graphs: str | None = None  # the picture set of ``functional-gan graph`` drawn at its end


FAMILIES: dict[str, Family] = {
    family.name: family
    for family in (
        Family("basics", "Autograd basics: detach, requires_grad, grad_fn, no_grad, retain_graph",
               "The first behaviours every PyTorch user meets, each run in PyTorch, in torch.func (PyTorch's "
               "functional API) and in JAX. Flax NNX has a column where its answer differs from plain JAX's "
               "(`requires_grad`: parameters by type, freezing by filter); `detach`, `grad_fn`, `no_grad` and "
               "`retain_graph` are about values and traced programs, where NNX code is the JAX column's code.",
               "detach"),
        Family("linear_regression", "Linear regression: accumulated gradients and parameter updates",
               "The linear regression of *Deep Learning with PyTorch Step by Step*: `.grad` that accumulates, "
               "`zero_()`, and the two errors of a hand-written update, against gradients as return values; "
               "Flax NNX (modules that own their parameters, an optimizer that updates them in place) beside them.",
               "linreg"),
        Family("gan_step", "The GAN step: `netD(fake.detach())` against differentiating only D",
               "The DCGAN tutorial's D step, where `detach()` stops the gradient at G's output, and what JAX does "
               "instead: differentiate the D loss with respect to D's parameters only; and Flax NNX, where G and D "
               "are objects again and the D step differentiates D because D is the argument.", "dstep"),
        Family("idioms", "Gradient-stopping idioms: straight-through, truncated BPTT, target networks, EMA, SimSiam, WGAN-GP",
               "The other places where PyTorch code calls `detach()` or `no_grad()`, ported one by one. Flax NNX "
               "has a column where a module is involved (straight-through's codebook, the target network, the EMA "
               "copy); truncated BPTT, SimSiam, the gradient penalty and no_grad's memory cut values, and NNX "
               "code does it with JAX's `stop_gradient`, as in the JAX column.", "idioms"),
        Family("compiled", "Proofs at the compiled level: what a step costs with and without the cut",
               "The D step (and WGAN-GP's critic step) compiled: convolutions and FLOPs counted in XLA's optimised "
               "program and by PyTorch's FlopCounterMode. The Flax NNX port of the step compiles to the same "
               "program: `functional-gan bench` reports its XLA FLOP count equal to the Linen step's."),
    )
}


@dataclasses.dataclass
class LessonResult:
    name: str
    title: str
    values: dict[str, dict[str, Any]]  # side → label → value
    code: dict[str, str]  # side → the source that produced the values
    why: str


LESSONS: dict[str, Lesson] = {}


def register(name: str, title: str, why: str, sides: dict[str, Callable[..., dict]], sizes=None, *, family: str) -> Lesson:
    if family not in FAMILIES:
        raise ValueError(f"lesson {name!r}: unknown family {family!r}; choose from {', '.join(FAMILIES)}")
    lesson = Lesson(name, title, dict(sides), textwrap.dedent(why).strip(), family, sizes)
    LESSONS[name] = lesson
    return lesson


def value(x) -> Any:
    """Tensors and arrays as plain Python floats/lists for printing and comparing."""
    if hasattr(x, "detach"):
        x = x.detach().cpu().numpy()
    array = np.asarray(x)
    return array.item() if array.ndim == 0 else array.tolist()


def run_side(fn: Callable[..., dict], *args) -> dict:
    """Run one side of a lesson; a side whose framework is not installed says so instead of failing."""
    try:
        return fn(*args)
    except ImportError as error:  # the PyTorch sides need the torch extra; the JAX side stands alone
        return {"unavailable": Raised(type(error).__name__, f"{error} (install the torch extra: pip install -e '.[torch]')")}


def lessons_of(family: str) -> list[Lesson]:
    """The lessons of one family, in the order they were registered."""
    return [lesson for lesson in LESSONS.values() if lesson.family == family]


def run_lesson(name: str, size: str = "small") -> LessonResult:
    """Run every side of one lesson (``size`` "full" gives configurable lessons the tutorial's sizes)."""
    if name not in LESSONS:
        raise KeyError(f"unknown lesson {name!r}; choose from {', '.join(LESSONS)}")
    lesson = LESSONS[name]
    args = (lesson.sizes[size],) if lesson.sizes else ()
    values = {side: run_side(fn, *args) for side, fn in lesson.sides.items()}
    code = {side: textwrap.dedent(inspect.getsource(fn)) for side, fn in lesson.sides.items()}
    return LessonResult(lesson.name, lesson.title, values, code, lesson.why)
