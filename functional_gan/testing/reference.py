"""check-port's reference tables, generated from the code that defines them: the verdicts and exit statuses
(:class:`.judge.Verdict`, :data:`.judge.EXIT_SPEC`) and a spec's entries (:class:`.spec.Spec`'s fields). The
documentation's tables are these (``docs/check-port.md``, between ``<!-- reference:NAME -->`` markers), and a test
holds them equal, so that the docs cannot say what the code does not.

    python -m functional_gan.testing.reference docs/check-port.md   # rewrite the tables in place
    python -m functional_gan.testing.reference --check docs/check-port.md
"""

from __future__ import annotations

import argparse
import dataclasses
import re
import sys
from pathlib import Path

from .judge import EXIT_SPEC, Verdict


def _cell(text: str) -> str:
    return text.replace("|", "\\|")


def verdicts() -> str:
    """Each verdict a row can get: its mark in the report's table, what it means, the exit status it gives."""
    lines = ["| verdict | mark | means | exit |", "|---|---|---|---|"]
    lines += [f"| {v.words} | `{v.mark}` | {_cell(v.meaning)} | {v.exit_status} |" for v in Verdict]
    return "\n".join(lines)


def exit_statuses() -> str:
    """The exit statuses of ``functional-gan check-port`` (and ``assert_port``'s pass or fail)."""
    worst = {}
    for v in Verdict:
        worst.setdefault(v.exit_status, []).append(v.words)
    passing = worst[Verdict.AGREEMENT.exit_status]
    rows = [(Verdict.AGREEMENT.exit_status, f"agreement: each row's verdict {', '.join(passing[:-1])} or {passing[-1]}; "
             "also precision findings alone with --allow-precision (assert_port(..., allow_precision=True))"),
            (Verdict.DIVERGENCE.exit_status, "a divergence: the first is named (stage, layer, both sides' values)"),
            (EXIT_SPEC, "the check could not run: a spec it cannot use (a missing entry, weights that do not pair, a "
                        "port computing in another dtype than asked, the spec's or the port's code raising), a check "
                        "estimated beyond the memory available, a command-line error, a fault of check-port's own "
                        "(its traceback printed); one line says which"),
            (Verdict.PRECISION_FINDING.exit_status, "precision findings and no divergence: the mathematics right, the "
                                                    "port's arithmetic keeping fewer digits than PyTorch's")]
    lines = ["| exit | means |", "|---|---|"] + [f"| {status} | {_cell(text)} |" for status, text in sorted(rows)]
    return "\n".join(lines)


def spec_entries() -> str:
    """A spec file's entries: how it writes each, whether it is needed, what it is."""
    from .spec import Spec

    lines = ["| entry | needed | what it is |", "|---|---|---|"]
    for field in dataclasses.fields(Spec):
        if "written" not in field.metadata:
            continue
        default = field.default
        shown = "" if default is None or default is dataclasses.MISSING else f" (default: `{default!r}`)"
        lines.append(f"| `{field.metadata['written']}` | {field.metadata['need']} | "
                     f"{_cell(field.metadata['doc'])}{shown} |")
    return "\n".join(lines)


TABLES = {"verdicts": verdicts, "exit-statuses": exit_statuses, "spec-entries": spec_entries}
# a marked table: its opening marker, its lines (none starts a marker), its closing marker
_MARKED = re.compile(r"(<!-- reference:(?P<name>[\w-]+) -->\n)(?P<body>(?:(?!<!-- ).*\n)*)(<!-- /reference -->)")


def rewritten(text: str) -> str:
    """``text`` with each marked table replaced by the one the code generates now.

    Args:
        text: a Markdown document with ``<!-- reference:NAME -->`` … ``<!-- /reference -->`` markers.

    Returns:
        The text, each marked table the one :data:`TABLES` generates.

    Raises:
        KeyError: a marker names a table that :data:`TABLES` does not have.
    """
    def table(match: re.Match) -> str:
        name = match.group("name")
        if name not in TABLES:
            raise KeyError(f"no reference table named {name!r} (known: {', '.join(TABLES)})")
        return match.group(1) + TABLES[name]() + "\n" + match.group(4)

    return _MARKED.sub(table, text)


def main(argv: list[str] | None = None) -> int:
    """The command line: each file's marked tables rewritten in place, or with ``--check`` the files whose tables are
    stale named.

    Args:
        argv: the arguments (default: the command line's).

    Returns:
        The exit status: 1 where ``--check`` finds stale tables, else 0.
    """
    parser = argparse.ArgumentParser(prog="python -m functional_gan.testing.reference", description=__doc__.split("\n\n")[0])
    parser.add_argument("files", nargs="+", type=Path, help="Markdown files with <!-- reference:NAME --> markers")
    parser.add_argument("--check", action="store_true", help="exit 1 where a file's tables differ from the code's")
    args = parser.parse_args(argv)
    stale = []
    for path in args.files:
        text = path.read_text()
        new = rewritten(text)
        if new != text:
            stale.append(str(path))
            if not args.check:
                path.write_text(new)
    if args.check and stale:
        print(f"stale reference tables in {', '.join(stale)}: run python -m functional_gan.testing.reference "
              f"{' '.join(stale)}", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
