"""The lesson notebooks are generated from the registry, run the registry's own code, and stay in sync with it;
the documentation site's link rewriting and link check find what they should. (The site itself is built and
opened in Chromium by tests/test_docs_site.py, marked ``docs``.)"""

import inspect
import textwrap
from pathlib import Path

import pytest

from functional_gan import site
from functional_gan.site import hooks as site_hooks
from functional_gan.lessons import LESSONS, run_lesson
from functional_gan.lessons import notebooks
from functional_gan.lessons.registry import FAMILIES, lessons_of
from functional_gan.main import main

ROOT = Path(__file__).resolve().parents[1]


def test_every_lesson_is_in_exactly_one_notebook_with_its_own_source():
    seen = [lesson.name for family in FAMILIES for lesson in lessons_of(family)]
    assert sorted(seen) == sorted(LESSONS) and len(seen) == len(set(seen))
    for family in FAMILIES:
        source = notebooks.notebook_source(family)
        for lesson in lessons_of(family):
            assert f"functional-gan lessons {lesson.name}`" in source
            for fn in lesson.sides.values():  # the function itself, as the CLI runs it, not a retyped copy
                assert textwrap.dedent(inspect.getsource(fn)).rstrip() in source


def test_the_committed_notebooks_are_what_the_registry_generates():
    # A lesson changed without `functional-gan notebooks` fails here: the notebooks are never edited by hand.
    for family in FAMILIES:
        committed = ROOT / "docs" / "notebooks" / f"{family}.py"
        assert committed.read_text() == notebooks.notebook_source(family), (
            f"{committed} is stale: run `functional-gan notebooks` and commit the result")
        assert (ROOT / "docs" / "notebooks" / f"{family}.ipynb").is_file()


def _cells(source: str) -> list[str]:
    return [cell.split("\n", 1)[1] if "\n" in cell else "" for cell in source.split("# %%")[1:]
            if not cell.startswith(" [markdown]")]


def test_the_basics_notebook_run_as_code_shows_what_run_lesson_computes(monkeypatch):
    # The notebook's code cells, run in a fresh namespace (no kernel, no pictures), give every lesson's values
    # exactly as `functional-gan lessons` computes them: the imports cell supplies every name the sides use.
    shown = {}
    monkeypatch.setattr(notebooks, "show", lambda title, values: shown.setdefault(title, values))
    monkeypatch.setattr(notebooks, "show_graphs", lambda which: shown.setdefault("graphs", which))
    namespace = {}
    for cell in _cells(notebooks.notebook_source("basics")):
        exec(compile(cell, "<notebook cell>", "exec"), namespace)
    for lesson in lessons_of("basics"):
        assert shown[lesson.title] == run_lesson(lesson.name).values
    assert shown["graphs"] == FAMILIES["basics"].graphs


def test_the_imports_cell_gives_each_family_every_name_its_sides_use():
    for family in FAMILIES:
        namespace = {}
        cells = _cells(notebooks.notebook_source(family))
        exec(compile(cells[1], "<imports cell>", "exec"), namespace)  # cells[0] is Colab's install
        for lesson in lessons_of(family):
            for fn in lesson.sides.values():
                module_globals = vars(inspect.getmodule(fn))
                used = {n for n in notebooks._names_used(fn.__code__) & set(module_globals) if not n.startswith("__")}
                own = {f.__name__ for f in lesson.sides.values()}
                for name in used - own:
                    assert namespace[name] is module_globals[name], (family, lesson.name, name)


def test_the_side_tables_render_each_value(tmp_path):
    table = notebooks.show("detach", {"PyTorch": {"grad": [-2.0], "error": run_lesson("detach").values["PyTorch"]
                                                  ["grad through y_hat.detach()"]}, "JAX": {"grad": 0.0}})
    html = table._repr_html_()
    assert html.count('<table class="lesson-table"') == 2
    assert "<code>[-2]</code>" in html and "<code>0</code>" in html and "raises RuntimeError" in html
    assert "PyTorch:\n  grad: [-2]" in repr(table)


def test_cli_writes_the_notebooks_and_refuses_an_unknown_family(tmp_path, capsys):
    assert main(["notebooks", "--no-ipynb", "--out", str(tmp_path)]) == 0
    for family in FAMILIES:
        assert (tmp_path / f"{family}.py").read_text() == notebooks.notebook_source(family)
    with pytest.raises(SystemExit) as refused:  # a usage error, from argparse: exit status 2
        main(["notebooks", "physics"])
    assert refused.value.code == 2
    assert "unknown lesson family physics" in capsys.readouterr().err
    assert main(["notebooks", "--execute", "--no-ipynb", "--out", str(tmp_path)]) == 2


def test_colab_links_open_the_committed_notebook_from_the_repository():
    url = notebooks.colab_url("basics")
    assert url.startswith("https://colab.research.google.com/github/")
    assert url.endswith("/blob/main/docs/notebooks/basics.ipynb")
    assert notebooks.repository_url().removeprefix("https://github.com/") in url


def test_links_to_the_repository_are_rewritten_for_the_site():
    text = ("see [train.py](../functional_gan/train.py), [results](../benchmarks/results/cpu.md#results), "
            "[a page](dcgan.md#wgan), [web](https://jax.dev)")
    out = site_hooks.rewrite_links(text, "https://github.com/o/r")
    assert "[train.py](https://github.com/o/r/blob/main/functional_gan/train.py)" in out
    assert "[results](results/cpu.md#results)" in out
    assert "[a page](dcgan.md#wgan)" in out and "[web](https://jax.dev)" in out
    assert site_hooks._ROLE.sub("", "see :func:<code>gan_step</code>") == "see <code>gan_step</code>"


def test_the_link_check_finds_a_missing_page_a_missing_anchor_and_a_missing_picture(tmp_path):
    (tmp_path / "a").mkdir()
    (tmp_path / "index.html").write_text(
        '<a href="a/">ok</a><a href="a/#here">ok</a><a href="#top">ok</a><h1 id="top">t</h1>'
        '<a href="https://example.org/x">external, not checked</a><img src="data:image/png;base64,AAAA">'
        '<a href="b/">missing page</a><a href="a/#nowhere">missing anchor</a><img src="img/x.png">')
    (tmp_path / "a" / "index.html").write_text('<h2 id="here">here</h2><a href="../index.html#top">back</a><a href="/a/">root</a>')
    checked, broken = site.check_links(tmp_path)
    assert checked == 8
    assert sorted(broken) == sorted([
        "index.html: b/ (no such file)", "index.html: a/#nowhere (no #nowhere there)", "index.html: img/x.png (no such file)"])


def test_the_api_page_documents_every_exported_name():
    import functional_gan

    page = site.api_page()
    for name in functional_gan.__all__:
        assert f"::: functional_gan.{functional_gan._MODULE_OF[name]}.{name}\n" in page


def test_docs_outside_the_repository_says_where_to_run_it(tmp_path, monkeypatch, capsys):
    monkeypatch.chdir(tmp_path)
    assert main(["docs", "--out", str(tmp_path / "site")]) == 2
    err = capsys.readouterr().err
    assert "mkdocs.yml" in err or "docs extra" in err
    assert not (tmp_path / "site").exists()


@pytest.mark.parametrize("family", list(FAMILIES))
def test_each_notebook_parses_as_python(family):
    compile(notebooks.notebook_source(family), f"{family}.py", "exec")
