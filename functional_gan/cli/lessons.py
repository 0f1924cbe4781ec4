"""The teaching commands: ``linreg``, ``lessons``, ``graph``, ``notebooks`` and ``docs``."""

from __future__ import annotations

from pathlib import Path

from functional_gan.cli.flags import command, names_argument
from functional_gan.errors import UserError


def add_linreg(subparsers) -> None:
    p = command(subparsers, run_linreg)
    p.add_argument("--float64", action="store_true", help="run in float64 (jax_enable_x64; torch.float64)")
    p.add_argument("--torch", action="store_true", help="also run the PyTorch variants (needs the torch extra)")


def run_linreg(args) -> int:
    """The book's linear regression: NumPy, jax.grad, optax.sgd, Flax nn.Dense (and PyTorch with --torch)."""
    import jax
    import jax.numpy as jnp

    from functional_gan import linreg

    print(linreg.describe_setup())
    with jax.enable_x64(args.float64):
        results = linreg.run_all(jnp.float64 if args.float64 else jnp.float32)
    if args.torch:
        import torch

        from functional_gan.pytorch import linreg as torch_linreg

        results += torch_linreg.run_all(torch.float64 if args.float64 else torch.float32)
    print(linreg.format_results(results))
    return 0


def add_lessons(subparsers) -> None:
    p = command(subparsers, run_lessons)
    from functional_gan.lessons import LESSONS

    p.description = "Runs every side of each lesson and prints what each computed. Lessons: " + ", ".join(LESSONS)
    names_argument(p, "names", LESSONS, "lesson", metavar="NAME", help=f"lessons to run (default: all): {', '.join(LESSONS)}")
    p.add_argument("--markdown", metavar="FILE", help="also write the lessons' documentation page (code, output, why)")
    p.add_argument("--full-size", action="store_true",
                   help="for 'compiled': the tutorial's 64x64 nets at batch 128 instead of tiny ones")


def run_lessons(args) -> int:
    """The autograd lessons, PyTorch, torch.func, JAX and Flax NNX side by side."""
    from functional_gan import lessons

    results = []
    for name in args.names or list(lessons.LESSONS):
        result = lessons.run_lesson(name, "full" if args.full_size else "small")
        results.append(result)
        print(lessons.format_result(result), end="\n\n", flush=True)
    if args.markdown:
        path = Path(args.markdown)
        path.parent.mkdir(parents=True, exist_ok=True)
        command = "functional-gan lessons" + (" --full-size" if args.full_size else "") + f" --markdown {args.markdown}"
        path.write_text(lessons.to_markdown(results, command))
        print(f"Wrote {path}")
    return 0


def add_graph(subparsers) -> None:
    p = command(subparsers, run_graph)
    from functional_gan.lessons.pictures import GRAPH_SETS

    names_argument(p, "which", GRAPH_SETS, "graph", metavar="WHICH", help=f"any of {', '.join(GRAPH_SETS)} (default: all)")
    p.add_argument("--out", default="runs/graphs", help="folder for the files")


def run_graph(args) -> int:
    """Draw computations as graphs: the jaxpr with its stop_gradient cut, and PyTorch's autograd graph.

    Writes DOT files (and SVG/PNG when Graphviz's dot is installed). 'dstep' is the DCGAN's D loss, with G's side
    visibly cut.
    """
    import shutil

    from functional_gan.graph import write_dot
    from functional_gan.lessons.pictures import GRAPH_SETS

    Path(args.out).mkdir(parents=True, exist_ok=True)  # an unusable folder fails now, before anything is traced
    for which in args.which or list(GRAPH_SETS):
        for name, source in GRAPH_SETS[which]().items():
            written = write_dot(source, Path(args.out) / f"{name}.dot")
            print("wrote " + ", ".join(str(p) for p in written))
    if not shutil.which("dot"):
        print("Graphviz's dot is not installed: only DOT files were written (apt-get install graphviz to render them)")
    return 0


def add_notebooks(subparsers) -> None:
    p = command(subparsers, run_notebooks)
    from functional_gan.lessons.registry import FAMILIES

    names_argument(p, "families", FAMILIES, "lesson family", metavar="FAMILY",
                   help=f"families to write (default: all): {', '.join(FAMILIES)}")
    p.add_argument("--out", default="docs/notebooks", help="folder for the notebooks")
    p.add_argument("--execute", action="store_true", help="run each notebook and keep its outputs in the .ipynb")
    p.add_argument("--no-ipynb", action="store_true", help="write the percent-format .py files only (no jupytext needed)")


def run_notebooks(args) -> int:
    """Write the lessons as notebooks (jupytext percent .py and .ipynb), one per family.

    Generates one notebook per lesson family from the lessons' registry: each side's own source, run and shown as a
    table, then the family's graph pictures. Writes FAMILY.py (jupytext's percent format) and FAMILY.ipynb built
    from it (needs the docs extra: pip install -e '.[docs]'). --execute also runs each .ipynb top to bottom in a
    fresh kernel and keeps its outputs.
    """
    from functional_gan.lessons import notebooks
    if args.execute and args.no_ipynb:
        raise UserError("--execute runs the .ipynb files, which --no-ipynb leaves out")
    try:
        written = notebooks.write_notebooks(Path(args.out), args.families or None, ipynb=not args.no_ipynb)
    except ImportError as error:
        raise UserError(str(error)) from None
    for path in written:
        print(f"wrote {path}", flush=True)
    if args.execute:
        try:
            notebooks.execute_notebooks(written, progress=lambda line: print(line, flush=True))
        except ImportError as error:
            raise UserError(str(error)) from None
    return 0


def add_docs(subparsers) -> None:
    p = command(subparsers, run_docs)
    p.add_argument("--out", default="site", help="folder for the built site")
    p.add_argument("--work", default="build/docs", help="staging folder (docs/ plus generated pages), replaced on each build")
    p.add_argument("--no-execute", action="store_true", help="show the notebooks without running them (faster; no outputs)")


def run_docs(args) -> int:
    """Build the documentation site: executed lesson notebooks, the pages, the API reference.

    From the repository's root: stages docs/ with the benchmark results and an API page, writes the lesson notebooks
    and executes each in a fresh kernel, builds the site with MkDocs (strict: a broken link or anchor is an error)
    and checks every internal link and picture of the built pages. Needs the docs extra (pip install -e
    '.[torch,docs]'); Graphviz's dot draws the lessons' graphs where it is installed.
    """
    from functional_gan import site

    result = site.build(Path(args.out), Path("."), Path(args.work), execute=not args.no_execute,
                        progress=lambda line: print(line, flush=True))
    executed = ", ".join(f"{name} {seconds:.0f} s" for name, seconds in result.notebooks.items()) or "none"
    print(f"built {result.pages} pages into {result.site} in {result.seconds:.0f} s "
          f"(notebooks executed: {executed}; {result.links_checked} internal links and pictures checked, none broken)")
    print(f"open {result.site / 'index.html'}, or serve it: python -m http.server -d {args.out}")
    return 0
