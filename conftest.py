"""Run from the repository root: the environment every test process starts with."""
import os
import tempfile

os.environ.setdefault("XLA_PYTHON_CLIENT_PREALLOCATE", "false")
os.environ.setdefault("MPLBACKEND", "Agg")
# One persistent compilation cache for the test session and the processes it starts: many tests
# compile the same tiny training step; a fresh folder per session, so nothing stale carries over.
os.environ.setdefault("JAX_COMPILATION_CACHE_DIR", tempfile.mkdtemp(prefix="functional-gan-jax-cache-"))
