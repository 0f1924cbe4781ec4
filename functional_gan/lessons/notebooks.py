"""The lessons as notebooks: one per family, generated from the registry, executed by the docs build.

Each notebook holds the sides' own source (taken from the functions the CLI runs and the tests check, never
retyped), imports the helpers those functions use from where they live, runs every side with
:func:`~functional_gan.lessons.registry.run_side` and shows the values as a table, then draws the family's
graph pictures. The notebooks are written in jupytext's percent format (``docs/notebooks/<family>.py``, for
review) and as ``.ipynb`` built from that text (for Jupyter and Colab); ``functional-gan notebooks`` writes
both, ``functional-gan docs`` executes them for the site.
"""

from __future__ import annotations

import html
import importlib.metadata
import inspect
import re
import shutil
import subprocess
import tempfile
import textwrap
import time
import types
from pathlib import Path

from functional_gan.errors import UserError

from .registry import FAMILIES, LESSONS, Lesson, lessons_of
from .render import format_sides, format_value

NOTEBOOK_FOLDER = Path("docs/notebooks")


def repository_url() -> str:
    """The project's repository, as ``pyproject.toml``'s ``[project.urls]`` names it."""
    for entry in importlib.metadata.metadata("functional-gan").get_all("Project-URL") or []:
        label, _, url = entry.partition(",")
        if label.strip().lower() == "repository":
            return url.strip().rstrip("/")
    raise LookupError("the installed functional-gan names no Repository in [project.urls]")


def colab_url(family: str, branch: str = "main") -> str:
    path = repository_url().removeprefix("https://github.com/")
    return f"https://colab.research.google.com/github/{path}/blob/{branch}/{NOTEBOOK_FOLDER.as_posix()}/{family}.ipynb"


# ----------------------------------------------------------------------------------------------------------
# What a notebook shows
# ----------------------------------------------------------------------------------------------------------


class SideBySide:
    """The values of a lesson's sides; shown as one HTML table per side in a notebook, as text elsewhere."""

    def __init__(self, title: str, values: dict[str, dict]):
        self.title = title
        self.values = values

    def _repr_html_(self) -> str:
        # Inline styles: the same look in Jupyter, on Colab and on the documentation site.
        cell = 'style="border:1px solid #ccc;padding:3px 8px;text-align:left;vertical-align:top"'
        parts = [f'<div class="lesson-tables" data-lesson="{html.escape(self.title)}" '
                 'style="display:flex;flex-wrap:wrap;gap:12px;align-items:flex-start">']
        for side, values in self.values.items():
            rows = "".join(
                f"<tr><td {cell}>{html.escape(str(label))}</td><td {cell}><code>{html.escape(format_value(v))}</code></td></tr>"
                for label, v in values.items()
            )
            parts.append(f'<table class="lesson-table" style="border-collapse:collapse;margin:0">'
                         f'<thead><tr><th colspan="2" style="border:1px solid #ccc;background:#eef;padding:3px 8px;text-align:left">{html.escape(side)}</th></tr></thead>'
                         f"<tbody>{rows}</tbody></table>")
        return "".join(parts) + "</div>"

    def __repr__(self) -> str:
        return "\n".join(format_sides(self.values))


def show(title: str, values: dict[str, dict]) -> SideBySide:
    """The notebook's display of one lesson: ``show(title, {"PyTorch": {...}, "JAX": {...}})``."""
    return SideBySide(title, values)


def render_graph(source: str) -> bytes | None:
    """A DOT source as PNG bytes, through Graphviz's ``dot``; None where Graphviz is not installed."""
    dot = shutil.which("dot")
    if dot is None:
        return None
    return subprocess.run([dot, "-Tpng", "-Gdpi=80"], input=source.encode(), capture_output=True, check=True).stdout


def show_graphs(which: str) -> None:
    """Draw one picture set of ``functional-gan graph`` inline (PNG through Graphviz's dot)."""
    from IPython.display import Image, Markdown, display

    from .pictures import GRAPH_SETS

    graphs = GRAPH_SETS[which]()
    for name, source in graphs.items():
        png = render_graph(source)
        if png is None:
            display(Markdown(f"Graphviz's `dot` is not installed, so the {len(graphs)} pictures are not drawn here "
                             "(apt-get install graphviz, or `functional-gan graph` writes the DOT files)."))
            return
        display(Markdown(f"**{name}**"))
        display(Image(data=png, format="png"))


# ----------------------------------------------------------------------------------------------------------
# Generating the notebooks
# ----------------------------------------------------------------------------------------------------------


def _names_used(code: types.CodeType) -> set[str]:
    names = set(code.co_names)
    for const in code.co_consts:
        if isinstance(const, types.CodeType):
            names |= _names_used(const)
    return names


def _import_line(name: str, obj, module: types.ModuleType) -> str:
    if isinstance(obj, types.ModuleType):
        return f"import {obj.__name__}" if obj.__name__ == name else f"import {obj.__name__} as {name}"
    home, qualname = getattr(obj, "__module__", None), getattr(obj, "__qualname__", None)
    if isinstance(home, str) and qualname and "." not in qualname and getattr(importlib.import_module(home), qualname, None) is obj:
        return f"from {home} import {qualname}" + ("" if qualname == name else f" as {name}")
    return f"from {module.__name__} import {name}"  # a constant of the lesson's module


def imports_for(lessons: list[Lesson], extra=()) -> list[str]:
    """The import lines that give the sides' code every module-level name it uses, from where it is defined."""
    lines = set(extra)
    for lesson in lessons:
        for fn in lesson.sides.values():
            module = inspect.getmodule(fn)
            own = set(lesson.sides.values())
            annotations = " ".join(str(a) for a in fn.__annotations__.values())  # strings, under `from __future__`
            for name in sorted(_names_used(fn.__code__) | set(re.findall(r"[A-Za-z_]\w*", annotations))):
                if name in vars(module) and vars(module)[name] not in own and not name.startswith("__"):
                    lines.add(_import_line(name, vars(module)[name], module))
    return sorted(lines, key=lambda line: (not line.startswith("import "), line))


def _heading(text: str) -> str:
    # No code spans in headings: mkdocs-jupyter's table of contents drops them from its anchors, nbconvert keeps them.
    return text.replace("`", "")


def _markdown(text: str) -> str:
    return "".join(f"# {line}".rstrip() + "\n" for line in text.strip().splitlines())


def notebook_source(family: str) -> str:
    """One family's notebook in jupytext's percent format."""
    if family not in FAMILIES:
        raise KeyError(f"unknown lesson family {family!r}; choose from {', '.join(FAMILIES)}")
    info, lessons = FAMILIES[family], lessons_of(family)
    install = f"functional-gan @ git+{repository_url()}"
    cells = [
        "# ---\n# jupyter:\n#   kernelspec:\n#     display_name: Python 3\n#     language: python\n#     name: python3\n# ---\n",
        "# %% [markdown]\n" + _markdown(
            f"# {_heading(info.title)}\n\n{info.intro}\n\n"
            f"[![Open in Colab](https://colab.research.google.com/assets/colab-badge.svg)]({colab_url(family)})\n\n"
            f"Generated by `functional-gan notebooks` from the lessons' registry: each side below is the function "
            f"`functional-gan lessons` runs and the tests check. Change a line and run the cell again. Lessons: "
            + ", ".join(f"`{lesson.name}`" for lesson in lessons) + "."),
        "# %%\n# On Colab, install the package first (PyTorch is already there; locally: pip install -e '.[torch]').\n"
        "import subprocess\nimport sys\n\n"
        'if "google.colab" in sys.modules:\n'
        f'    subprocess.run([sys.executable, "-m", "pip", "install", "-q", "{install}"], check=True)\n',
        "# %%\n# What the sides below use, imported from where it is defined.\n"
        + "\n".join(imports_for(lessons, ["from functional_gan.lessons.notebooks import show, show_graphs",
                                            "from functional_gan.lessons.registry import LESSONS, run_side"])) + "\n",
    ]
    for lesson in lessons:
        cells.append("# %% [markdown]\n" + _markdown(f"## {_heading(lesson.title)}\n\n`functional-gan lessons {lesson.name}`"))
        for side, fn in lesson.sides.items():
            cells.append(f"# %% [markdown]\n# ### {lesson.name}: {side}\n")  # unique headings: unique anchors
            cells.append("# %%\n" + textwrap.dedent(inspect.getsource(fn)).rstrip() + "\n")
        args = ", config" if lesson.sizes else ""
        run = "".join(f"\n    {side!r}: run_side({fn.__name__}{args})," for side, fn in lesson.sides.items())
        setup = (f'config = LESSONS["{lesson.name}"].sizes["small"]  # "full": the tutorial\'s sizes, longer\n'
                 if lesson.sizes else "")
        cells.append(f"# %%\n{setup}show({lesson.title!r}, {{{run}\n}})\n")
        cells.append("# %% [markdown]\n" + _markdown(f"**Why.** {lesson.why}"))
    if info.graphs:
        cells.append("# %% [markdown]\n" + _markdown(
            f"## The pictures\n\n`functional-gan graph {info.graphs}` draws these: JAX's program (the jaxpr, with "
            "the `stop_gradient` cut marked) and PyTorch's autograd graph of the same computation."))
        cells.append(f'# %%\nshow_graphs("{info.graphs}")\n')
    return "\n".join(cells)


def to_ipynb(source: str) -> str:
    """The ``.ipynb`` text of a percent-format notebook (outputs empty), built by jupytext."""
    try:
        import jupytext
    except ImportError as error:
        raise ImportError("building .ipynb files needs the docs extra: pip install -e '.[docs]'") from error
    notebook = jupytext.reads(source, fmt="py:percent")
    for index, cell in enumerate(notebook.cells):
        cell["id"] = f"cell-{index}"  # the same ids at every build (nbformat draws random ones), so the file diffs cleanly
    return jupytext.writes(notebook, fmt="ipynb")


def write_notebooks(folder: Path = NOTEBOOK_FOLDER, families=None, ipynb: bool = True) -> list[Path]:
    """Write ``<family>.py`` (and ``<family>.ipynb``) for each family; returns the paths written."""
    folder = Path(folder)
    folder.mkdir(parents=True, exist_ok=True)
    written = []
    for family in families or FAMILIES:
        source = notebook_source(family)
        (folder / f"{family}.py").write_text(source)
        written.append(folder / f"{family}.py")
        if ipynb:
            (folder / f"{family}.ipynb").write_text(to_ipynb(source))
            written.append(folder / f"{family}.ipynb")
    return written


class NotebookFailed(UserError):
    """A cell of a notebook raised; the message holds the cell and its traceback."""


def execute_notebook(path: Path, out: Path | None = None, timeout: int = 900) -> Path:
    """Run a notebook top to bottom in a fresh kernel (nbclient); raises on the first cell that fails."""
    try:
        import nbclient
        import nbformat
        from jupyter_client.manager import AsyncKernelManager
    except ImportError as error:
        raise ImportError("executing notebooks needs the docs extra: pip install -e '.[docs]'") from error
    path = Path(path)
    notebook = nbformat.read(path, as_version=4)
    with tempfile.TemporaryDirectory(prefix="functional-gan-kernel-") as sockets:
        # The kernel talks over local sockets in a private folder, not over TCP.
        manager = type("IpcKernelManager", (AsyncKernelManager,), {
            "__init__": lambda self, **kwargs: AsyncKernelManager.__init__(
                self, transport="ipc", ip=str(Path(sockets) / "kernel"), **kwargs)})
        # The client owns its kernel manager, so it shuts the kernel down when the notebook has run (or failed).
        client = nbclient.NotebookClient(notebook, kernel_manager_class=manager, kernel_name="python3", timeout=timeout,
                                         resources={"metadata": {"path": str(path.parent)}})
        try:
            client.execute()
        except nbclient.exceptions.CellExecutionError as error:  # the failing cell's source and traceback
            raise NotebookFailed(f"notebook {path} failed:\n" + re.sub(r"\x1b\[[0-9;]*m", "", str(error)).strip()) from None
    out = Path(out or path)
    nbformat.write(notebook, out)
    return out


def execute_notebooks(paths, progress=print) -> dict[str, float]:
    """Execute each ``.ipynb`` of ``paths`` in place (others are passed over); seconds per notebook, by stem."""
    timings = {}
    for path in (Path(p) for p in paths):
        if path.suffix != ".ipynb":
            continue
        start = time.perf_counter()
        progress(f"executing {path} ...")
        execute_notebook(path)  # NotebookFailed (a UserError) names the cell that raised
        timings[path.stem] = time.perf_counter() - start
        progress(f"  executed in {timings[path.stem]:.1f} s")
    return timings


__all__ = ["LESSONS", "FAMILIES", "NotebookFailed", "SideBySide", "show", "show_graphs", "render_graph", "notebook_source", "to_ipynb",
           "write_notebooks", "execute_notebook", "execute_notebooks", "imports_for", "colab_url", "repository_url"]
