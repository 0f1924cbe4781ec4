"""The ``functional-gan`` command line: the only place that parses flags, one module per group of commands.

Each command is a pair: ``add_NAME(subparsers)`` declares its flags, ``run_NAME(args)`` turns them into a config
and calls one library function. Errors the user caused (:class:`functional_gan.errors.UserError`) print one line
and exit with status 2; any other exception is a bug and keeps its traceback.

* :mod:`~functional_gan.cli.flags`: the flags every command shares (one per TrainConfig field);
* :mod:`~functional_gan.cli.train`: ``train``; :mod:`~functional_gan.cli.startup`: its multi-process start-up;
* :mod:`~functional_gan.cli.runs`: ``sample``, ``export``;
* :mod:`~functional_gan.cli.lessons`: ``linreg``, ``lessons``, ``notebooks``, ``graph``, ``docs``;
* :mod:`~functional_gan.cli.checks`: ``replay``, ``diverge``, ``check-port``, ``compare``;
* :mod:`~functional_gan.cli.bench`: ``bench``.

Building the parser imports no JAX: a command's flags are declared only when that command is named
(``functional-gan sample --help`` answers at once).
"""

from __future__ import annotations

import argparse
import sys

from functional_gan import compile_cache
from functional_gan.cli import bench, checks, lessons, runs, train
from functional_gan.errors import EXIT_USER_ERROR, UserError

# In the order --help lists them.
COMMANDS = (train.add_train, runs.add_sample, runs.add_export, lessons.add_linreg, lessons.add_lessons,
            lessons.add_notebooks, lessons.add_graph, checks.add_replay, checks.add_diverge, checks.add_check_port,
            checks.add_convert, checks.add_compare, bench.add_bench, lessons.add_docs)

# Commands that compile JAX programs and gain from the persistent compilation cache (``bench`` measures
# compilation, so it compiles afresh).
CACHED_COMMANDS = ("train", "sample", "export", "linreg", "lessons", "notebooks", "graph", "replay", "diverge", "check-port",
                   "convert", "compare", "docs")


def build_parser(command: str | None = None) -> argparse.ArgumentParser:
    """The whole command line; with ``command``, that command's flags and the other commands' names only."""
    parser = argparse.ArgumentParser(
        prog="functional-gan",
        description="PyTorch's autograd examples in JAX's functional autodiff, checked against PyTorch.",
    )
    parser.add_argument("--no-compile-cache", action="store_true",
                        help="compile every JAX program afresh instead of reusing compiled programs from the persistent "
                        "cache (default: on, in $XDG_CACHE_HOME/functional-gan/jax or ~/.cache/functional-gan/jax; "
                        "environment: FUNCTIONAL_GAN_NO_COMPILE_CACHE=1, or JAX_COMPILATION_CACHE_DIR for another folder)")
    subparsers = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")
    for add in COMMANDS:
        try:
            add(subparsers if command is None else _NamesOnly(subparsers, command))
        except _NamesOnly.Stop:
            pass
    return parser


class _NamesOnly:
    """Stands in for argparse's subparsers while the parser is built for one command: every other command
    gets its name and one-line help only, so that building it imports nothing (``--help`` answers without JAX)."""

    class Stop(Exception):
        pass

    def __init__(self, subparsers, command: str):
        self.subparsers, self.command = subparsers, command

    def add_parser(self, name, **kwargs):
        if name == self.command:
            return self.subparsers.add_parser(name, **kwargs)
        self.subparsers.add_parser(name, help=kwargs.get("help"))
        raise _NamesOnly.Stop


def _command_of(argv: list[str]) -> str:
    """The command argv names (its first word), or "" when it names none (then only the commands' list is built)."""
    return next((a for a in argv if not a.startswith("-")), "")


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else list(argv)
    parser = build_parser(_command_of(argv))
    args = parser.parse_args(argv)
    if args.command in CACHED_COMMANDS and compile_cache.wanted(args.no_compile_cache):
        compile_cache.use()
    args.argv = argv
    try:
        return args.handler(args)
    except UserError as error:
        print(f"functional-gan {args.command}: error: {error}", file=sys.stderr)
        return EXIT_USER_ERROR
    except OSError as error:
        if error.filename is None:  # not about a path: a bug or a system failure, with its traceback
            raise
        # A path from the command line that cannot be read or written (missing, a file where a folder should be,
        # no permission, disk full): one line, and what was written before stays.
        paths = " → ".join(str(p) for p in (error.filename, error.filename2) if p is not None)
        print(f"functional-gan {args.command}: error: {paths}: {error.strerror or error}", file=sys.stderr)
        return EXIT_USER_ERROR
    except KeyboardInterrupt:
        print("interrupted; checkpoints already written are kept", file=sys.stderr)
        return 130
