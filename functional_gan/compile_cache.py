"""JAX's persistent compilation cache for the command line: a second run with the same shapes loads its programs."""

from __future__ import annotations

import os
import sys
from pathlib import Path


def folder() -> Path:
    """Where the CLI keeps JAX's compiled programs: ``$XDG_CACHE_HOME/functional-gan/jax`` (``~/.cache`` by default)."""
    return Path(os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache") / "functional-gan" / "jax"


def use() -> None:
    """Turn on JAX's persistent compilation cache for this process and the ones it starts (before JAX is imported).

    A second ``train`` or ``sample`` with the same shapes then loads its programs instead of compiling them.
    Settings already in the environment (``JAX_COMPILATION_CACHE_DIR``, the minimum compile time) are kept.
    """
    os.environ.setdefault("JAX_COMPILATION_CACHE_DIR", str(folder()))
    # Every program, however fast it compiled: the many small ones (eager operations, restoring a checkpoint) add
    # up. Measure: `time functional-gan sample --checkpoint RUN --out x.png`, run twice, with this and with 0.2.
    os.environ.setdefault("JAX_PERSISTENT_CACHE_MIN_COMPILE_TIME_SECS", "0")
    if "jax" in sys.modules:  # imported already (by the command's flags, or main() called from Python): JAX reads
        # the environment at import, so both settings are given to it here
        import jax

        if not jax.config.jax_compilation_cache_dir:
            jax.config.update("jax_compilation_cache_dir", os.environ["JAX_COMPILATION_CACHE_DIR"])
        jax.config.update("jax_persistent_cache_min_compile_time_secs",
                          float(os.environ["JAX_PERSISTENT_CACHE_MIN_COMPILE_TIME_SECS"]))


def wanted(no_compile_cache: bool) -> bool:
    """Whether to use the cache: not when ``--no-compile-cache`` or ``FUNCTIONAL_GAN_NO_COMPILE_CACHE=1`` says so."""
    return not no_compile_cache and os.environ.get("FUNCTIONAL_GAN_NO_COMPILE_CACHE") != "1"
