"""``functional-gan`` and ``python -m functional_gan.main``: the command line, built in :mod:`functional_gan.cli`."""

import sys

from functional_gan.cli import build_parser, main

__all__ = ["build_parser", "main"]

if __name__ == "__main__":
    sys.exit(main())
