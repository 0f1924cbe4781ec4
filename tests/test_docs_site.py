"""The documentation site, built as a user builds it: every notebook executed, MkDocs in strict mode, the link
check, and a lesson page opened in headless Chromium. Marked ``docs`` (about 2 minutes; needs the docs extra,
Debian's chromium and chromium-driver, and Graphviz): ``python -m pytest -m docs``; .ci/run installs them."""

import functools
import html
import http.server
import os
import re
import shutil
import threading
from pathlib import Path

import pytest

from functional_gan import site
from functional_gan.lessons import run_lesson
from functional_gan.lessons.registry import FAMILIES, lessons_of

pytestmark = pytest.mark.docs

ROOT = Path(__file__).resolve().parents[1]
# The screenshot the browser test takes (kept after the run): build/screenshots/, or $FUNCTIONAL_GAN_SCREENSHOTS.
SCREENSHOTS = Path(os.environ.get("FUNCTIONAL_GAN_SCREENSHOTS", ROOT / "build" / "screenshots"))


@pytest.fixture(scope="module")
def built(tmp_path_factory):
    tmp = tmp_path_factory.mktemp("docs")
    result = site.build(tmp / "site", ROOT, tmp / "work", execute=True)
    return result, tmp / "work"


def _outputs(notebook_path: Path):
    import nbformat

    notebook = nbformat.read(notebook_path, as_version=4)
    return [cell for cell in notebook.cells if cell.cell_type == "code"]


def test_every_notebook_ran_top_to_bottom_and_shows_every_lesson(built):
    result, work = built
    assert sorted(result.notebooks) == sorted(FAMILIES)
    for family in FAMILIES:
        cells = _outputs(work / "notebooks" / f"{family}.ipynb")
        assert all(cell.execution_count is not None for cell in cells), family
        outputs = [output for cell in cells for output in cell.outputs]
        assert not [o for o in outputs if o.output_type == "error"], family
        tables = [o for o in outputs if "text/html" in o.get("data", {}) and "lesson-table" in o.data["text/html"]]
        assert len(tables) == len(lessons_of(family)), family
        if FAMILIES[family].graphs:  # the graph pictures, drawn by Graphviz (which CI installs)
            assert any("image/png" in o.get("data", {}) for o in outputs), family


def test_the_notebook_shows_the_values_the_cli_computes(built):
    # The basics family is deterministic: its tables, as executed in the kernel, are the CLI's values.
    from functional_gan.lessons.notebooks import SideBySide

    _, work = built
    shown = [o.data["text/plain"] for cell in _outputs(work / "notebooks" / "basics.ipynb") for o in cell.outputs
             if o.output_type == "execute_result" and "lesson-table" in o.data.get("text/html", "")]
    expected = [repr(SideBySide(lesson.title, run_lesson(lesson.name).values)) for lesson in lessons_of("basics")]
    assert shown == expected


def test_the_site_has_every_page_and_no_broken_internal_link(built):
    result, _ = built
    for page in ("index.html", "dcgan/index.html", "check-port/index.html", "comparison/index.html", "api/index.html",
                 "benchmarks/index.html", "results/cpu-2core-amd-epyc/index.html", "lessons/index.html",
                 *(f"notebooks/{family}/index.html" for family in FAMILIES)):
        assert (result.site / page).is_file(), page
    checked, broken = site.check_links(result.site)
    assert broken == [] and checked == result.links_checked > 500
    home = html.unescape(re.sub(r"<[^>]+>", "", (result.site / "index.html").read_text()))
    assert "pip install -e '.[test]' && .venv/bin/python -m pytest" in home  # the README's two commands
    assert "functional-gan train --data digits" in home
    api = (result.site / "api" / "index.html").read_text()
    assert "make_train_step" in api and "PyTorch" in api and ":func:" not in api


class _QuietHandler(http.server.SimpleHTTPRequestHandler):
    def log_message(self, *args):
        pass


def _chromium():
    from selenium import webdriver
    from selenium.webdriver.chrome.service import Service

    chromium, driver = shutil.which("chromium") or "/usr/bin/chromium", shutil.which("chromedriver") or "/usr/bin/chromedriver"
    if not (Path(chromium).exists() and Path(driver).exists()):
        pytest.fail("the browser test needs Debian's chromium and chromium-driver: apt-get install chromium chromium-driver")
    options = webdriver.ChromeOptions()
    options.binary_location = chromium
    for flag in ("--headless", "--no-sandbox", "--disable-gpu", "--disable-quic", "--no-first-run",
                 "--disable-background-networking", "--disable-component-update", "--disable-sync",
                 "--window-size=1280,1600"):
        options.add_argument(flag)
    return webdriver.Chrome(service=Service(driver), options=options)


def test_a_lesson_page_shows_its_tables_and_pictures_in_chromium(built):
    result, _ = built
    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), functools.partial(_QuietHandler, directory=str(result.site)))
    threading.Thread(target=server.serve_forever, daemon=True).start()
    browser = _chromium()
    try:
        browser.get(f"http://127.0.0.1:{server.server_address[1]}/notebooks/basics/")
        browser.implicitly_wait(5)
        tables = browser.find_elements("css selector", "table.lesson-table")
        assert len(tables) == sum(len(lesson.sides) for lesson in lessons_of("basics"))
        first = tables[0].text
        assert "grad through y_hat.detach()" in first and "raises RuntimeError" in first  # PyTorch refuses ...
        assert "grad through stop_gradient(y_hat)" in tables[2].text  # ... where JAX gives 0
        assert tables[0].is_displayed() and tables[0].size["height"] > 20
        drawn = browser.execute_script(
            "return Array.from(document.images).filter(i => i.src.startsWith('data:image/png')"
            " && i.complete && i.naturalWidth > 50 && i.getBoundingClientRect().width > 50).length")
        from functional_gan.lessons.pictures import GRAPH_SETS

        assert drawn == len(GRAPH_SETS["detach"]())  # every picture of the family decoded and laid out
        SCREENSHOTS.mkdir(parents=True, exist_ok=True)
        browser.execute_script("window.scrollTo(0, arguments[0].getBoundingClientRect().top + window.scrollY - 420)", tables[0])
        shot = SCREENSHOTS / "lesson_page.png"
        assert browser.save_screenshot(str(shot)) and shot.stat().st_size > 10_000
        print(f"screenshot: {shot}")
    finally:
        browser.quit()
        server.shutdown()


def test_a_notebook_cell_that_raises_stops_the_build_with_the_cell_and_its_error(tmp_path):
    import nbformat

    from functional_gan.lessons.notebooks import NotebookFailed, execute_notebook

    notebook = nbformat.v4.new_notebook()
    notebook.cells = [nbformat.v4.new_code_cell("x = 1"), nbformat.v4.new_code_cell("x / 0")]
    nbformat.write(notebook, tmp_path / "broken.ipynb")
    with pytest.raises(NotebookFailed) as raised:
        execute_notebook(tmp_path / "broken.ipynb")
    message = str(raised.value)
    assert "x / 0" in message and "ZeroDivisionError" in message and "\x1b[" not in message


def test_the_committed_ipynb_files_are_built_from_the_committed_text():
    # What Colab opens is the .ipynb on the repository: it must be the percent-format text, converted by jupytext.
    from functional_gan.lessons import notebooks

    for family in FAMILIES:
        folder = ROOT / "docs" / "notebooks"
        assert (folder / f"{family}.ipynb").read_text() == notebooks.to_ipynb((folder / f"{family}.py").read_text()), (
            f"docs/notebooks/{family}.ipynb is stale: run `functional-gan notebooks`")
