"""MkDocs hooks of the documentation site (named in ``mkdocs.yml``; MkDocs loads this file by its path).

The pages in ``docs/`` are also read on the repository's web view, so they link to the code the way a
reader of the repository sees it: ``../functional_gan/train.py``. On the site those files do not exist;
this hook turns such links into links to the file in the repository, and links to
``../benchmarks/results/...`` into the copies ``functional-gan docs`` stages under ``results/``.
"""

from __future__ import annotations

import re

_LINK = re.compile(r"(\]\()\.\./([^)#\s]+)((?:#[^)\s]*)?\))")


def rewrite_links(markdown: str, repo_url: str, branch: str = "main") -> str:
    """``](../path)`` → ``](results/...)`` for staged benchmark results, else ``](<repo>/blob/<branch>/path)``."""

    def replace(match: re.Match) -> str:
        path = match.group(2)
        if path.startswith("benchmarks/results/"):
            return f"{match.group(1)}results/{path.removeprefix('benchmarks/results/')}{match.group(3)}"
        return f"{match.group(1)}{repo_url.rstrip('/')}/blob/{branch}/{path}{match.group(3)}"

    return _LINK.sub(replace, markdown)


def on_page_markdown(markdown, page, config, files):  # MkDocs event
    if page.file.src_uri.count("/") > 0:  # pages in sub-folders (results/, notebooks/) have no ../ links of this kind
        return markdown
    return rewrite_links(markdown, config["repo_url"])


_ROLE = re.compile(r":(?:class|func|data|mod|meth|attr|obj):(?=<code>)")


def on_page_content(html, page, config, files):  # MkDocs event
    # The docstrings use Sphinx's roles (:func:`name`); mkdocstrings renders the name as code and leaves the role.
    return _ROLE.sub("", html)
