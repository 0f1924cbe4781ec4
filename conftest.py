"""Run from the repository root: the environment every test process starts with."""
import functional_gan  # noqa: F401  first: the JAX build's guard (functional_gan.xla_guard) runs before any test imports JAX
import os
import tempfile

os.environ.setdefault("XLA_PYTHON_CLIENT_PREALLOCATE", "false")
os.environ.setdefault("MPLBACKEND", "Agg")
# One persistent compilation cache for the test session and the processes it starts: many tests
# compile the same tiny training step; a fresh folder per session, so nothing stale carries over.
os.environ.setdefault("JAX_COMPILATION_CACHE_DIR", tempfile.mkdtemp(prefix="functional-gan-jax-cache-"))
# Cache every program, not only those that took a second to compile: the tests' processes (and the
# training subprocesses the fault tests start) compile the same small eager ops and steps (measure:
# `pytest tests/test_faults.py tests/test_loop.py --durations=0` with and without these two lines).
os.environ.setdefault("JAX_PERSISTENT_CACHE_MIN_COMPILE_TIME_SECS", "0")
os.environ.setdefault("JAX_PERSISTENT_CACHE_MIN_ENTRY_SIZE_BYTES", "0")
