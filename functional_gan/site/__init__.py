"""``functional-gan docs``: the documentation site, built from the repository in one command.

1. Stage ``docs/`` in a build folder, with the benchmark results beside it and the API page written from
   the package's export table (each public name, documented by mkdocstrings from its docstring).
2. Write the lesson notebooks from the registry and execute each top to bottom in a fresh kernel
   (nbclient); a cell that raises stops the build with the cell's error.
3. Build with MkDocs (Material theme, mkdocs-jupyter for the notebooks) in strict mode: a broken
   internal link or anchor, or a missing snippet, is an error.
4. Check the built site: every ``href`` and ``src`` that points inside it resolves to a file, and every
   ``#anchor`` to an element of that page.

Needs the ``docs`` extra (and the ``torch`` extra for the lessons' PyTorch sides).
"""

from __future__ import annotations

import dataclasses
import html.parser
import logging
import shutil
import time
import urllib.parse
from pathlib import Path

from functional_gan.errors import UserError

RESULTS = Path("benchmarks/results")


@dataclasses.dataclass
class SiteBuild:
    site: Path
    pages: int
    notebooks: dict[str, float]  # family -> seconds to execute
    links_checked: int
    seconds: float


def api_page() -> str:
    """The API reference page: the package's public names, grouped by the module that defines them."""
    from functional_gan import _WHERE

    parts = [
        "# API reference\n",
        "What `import functional_gan` exports, each name documented from its docstring (which names its PyTorch "
        "counterpart), grouped by the module that defines it. The lessons' registry and check-port are below.\n",
    ]
    for module, names in _WHERE.items():
        parts.append(f"## `functional_gan.{module}`\n")
        parts.extend(f"::: functional_gan.{module}.{name}\n" for name in names)
    parts.append("## `functional_gan.nnx_dcgan`: the DCGAN in Flax NNX\n")
    parts.extend(f"::: functional_gan.nnx_dcgan.{name}\n" for name in (
        "Generator", "Discriminator", "BatchNorm2d", "make_models", "make_optimizers", "nnx_step", "make_nnx_step",
        "step_function", "make_train_step", "to_objects", "to_state", "from_linen"))
    parts.append("## The lessons\n")
    parts.extend(f"::: functional_gan.lessons.registry.{name}\n" for name in ("Lesson", "Family", "run_lesson", "run_side"))
    parts.extend(f"::: functional_gan.lessons.notebooks.{name}\n" for name in ("notebook_source", "write_notebooks", "execute_notebook"))
    parts.append("## Check your own port\n")
    parts.extend(f"::: functional_gan.testing.{where}\n" for where in (  # the defining modules: the package's names load lazily
        "spec.Spec", "spec.load_spec", "check.check_port", "asserting.assert_port", "report.Report", "apis.tap",
        "convert.convert", "convert.load_converted", "blocks.check_by_block", "blocks.BlockReport",
        "memory.MemoryPolicy", "judge.Verdict", "judge.compare", "judge.Row"))
    return "\n".join(parts)


def stage(root: Path, work: Path, execute: bool = True, families=None, progress=print) -> dict[str, float]:
    """Copy docs/ into ``work`` with the executed notebooks, the results and the API page."""
    from functional_gan.lessons import notebooks

    if work.exists():
        shutil.rmtree(work)
    shutil.copytree(root / "docs", work, ignore=shutil.ignore_patterns("*.ipynb", "*.py", "__pycache__"))
    results = work / "results"
    results.mkdir()
    for path in sorted((root / RESULTS).glob("*")):
        if path.is_file() and path.suffix in (".md", ".png", ".json"):
            shutil.copy2(path, results / path.name)
    (work / "api.md").write_text(api_page())
    written = notebooks.write_notebooks(work / "notebooks", families)  # the .py files: left out by mkdocs.yml
    return notebooks.execute_notebooks(written, progress) if execute else {}


class _Links(html.parser.HTMLParser):
    def __init__(self):
        super().__init__()
        self.links: list[str] = []
        self.ids: set[str] = set()

    def handle_starttag(self, tag, attrs):
        attrs = dict(attrs)
        if attrs.get("id"):
            self.ids.add(attrs["id"])
        if tag == "a" and attrs.get("name"):
            self.ids.add(attrs["name"])
        for key in ("href", "src"):
            if attrs.get(key) and not (tag == "link" and attrs.get("rel") in ("canonical",)):
                self.links.append(attrs[key])


def check_links(site: Path) -> tuple[int, list[str]]:
    """Every internal link and picture of the built pages: (how many were checked, the broken ones)."""
    parsed = {}
    for page in site.resolve().rglob("*.html"):
        parser = _Links()
        parser.feed(page.read_text(errors="replace"))
        parsed[page] = parser
    site = site.resolve()
    checked, broken = 0, []
    for page, parser in parsed.items():
        for link in parser.links:
            url = urllib.parse.urlsplit(link)
            if url.scheme or link.startswith("//") or link.startswith("data:"):
                continue  # external (not reachable offline) or inline
            checked += 1
            if not url.path:
                target = page
            elif url.path.startswith("/"):  # root-relative (the 404 page's links): from the site's root
                target = (site / urllib.parse.unquote(url.path).lstrip("/")).resolve()
            else:
                target = (page.parent / urllib.parse.unquote(url.path)).resolve()
            if target.is_dir():
                target = target / "index.html"
            if not target.exists():
                broken.append(f"{page.relative_to(site)}: {link} (no such file)")
            elif url.fragment and target.suffix == ".html":
                ids = parsed[target].ids if target in parsed else _ids_of(target)
                if urllib.parse.unquote(url.fragment) not in ids:
                    broken.append(f"{page.relative_to(site)}: {link} (no #{url.fragment} there)")
    return checked, broken


def _ids_of(page: Path) -> set[str]:
    parser = _Links()
    parser.feed(page.read_text(errors="replace"))
    return parser.ids


def build(out: Path, root: Path = Path("."), work: Path | None = None, execute: bool = True, progress=print) -> SiteBuild:
    """Stage, execute, build and check the site; raises UserError with the reason when any step fails."""
    try:
        import mkdocs.commands.build
        import mkdocs.config
        import mkdocs.exceptions
    except ImportError:
        raise UserError("the documentation site needs the docs extra: pip install -e '.[docs]'") from None
    root = Path(root).resolve()
    config_file = root / "mkdocs.yml"
    if not config_file.is_file() or not (root / "docs").is_dir():
        raise UserError(f"no mkdocs.yml and docs/ in {root}: run `functional-gan docs` from the repository's root")
    start = time.perf_counter()
    work = Path(work or root / "build" / "docs").resolve()
    out = Path(out).resolve()
    timings = stage(root, work, execute=execute, progress=progress)
    progress("building the site with MkDocs (strict) ...")
    logger = logging.getLogger("mkdocs")  # MkDocs reports broken links as warnings on its logger: show them
    if not logger.handlers:
        handler = logging.StreamHandler()
        handler.setFormatter(logging.Formatter("%(levelname)s: %(message)s"))
        logger.addHandler(handler)
        logger.setLevel(logging.WARNING)
    try:
        from functional_gan.lessons.notebooks import repository_url

        config = mkdocs.config.load_config(str(config_file), docs_dir=str(work), site_dir=str(out), strict=True,
                                           repo_url=repository_url())  # pyproject.toml's, the one place it is written
        config.plugins.on_startup(command="build", dirty=False)
        try:
            mkdocs.commands.build.build(config)
        finally:
            config.plugins.on_shutdown()
    except (mkdocs.exceptions.MkDocsException, SystemExit) as error:
        raise UserError(f"MkDocs could not build the site: {error or 'see the warnings above'}") from None
    checked, broken = check_links(out)
    if broken:
        raise UserError(f"{len(broken)} broken link(s) in the built site:\n  " + "\n  ".join(broken[:30]))
    pages = sum(1 for _ in out.rglob("*.html"))
    return SiteBuild(out, pages, timings, checked, time.perf_counter() - start)
