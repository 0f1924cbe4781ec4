"""Makes the repository root importable (for `comparisons`) and sets tests' shared fixtures."""
import os

os.environ.setdefault("XLA_PYTHON_CLIENT_PREALLOCATE", "false")
os.environ.setdefault("MPLBACKEND", "Agg")
