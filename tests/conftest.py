"""Shared test settings, as the JAX anchors write them: one compilation cache per session, strict dtype promotion and a key fixture."""

import os
import shutil
import sys
import tempfile

import jax
import pytest

_CACHE_FOLDER = pytest.StashKey[str]()


def _threads_per_worker(config) -> int | None:
    """The CPU threads each pytest-xdist worker's PyTorch gets: the cores shared out (None without workers)."""
    workers = getattr(config.option, "numprocesses", None)
    if not isinstance(workers, int) or workers < 2:
        return None
    return max(1, (os.cpu_count() or 1) // workers)


def pytest_configure(config):
    """One JAX compilation cache for the session, empty at its start and removed at its end.

    A program that several tests compile (an eager operation on the tiny models' shapes, the tiny step in each
    command a test starts) is compiled once and loaded by the others: pytest-xdist's workers and every subprocess
    inherit the folder through ``JAX_COMPILATION_CACHE_DIR`` (it also keeps the tests' commands out of the user's
    own cache). XLA's flags, the devices and the dtypes are part of a program's key: a test that changes one of
    them compiles its own program.
    """
    if not hasattr(config, "workerinput"):  # the controller, or a run without xdist
        # PyTorch's OpenMP threads, one set per worker: with 2 workers on 2 cores, each worker's 2 default threads
        # spin against the other worker's (the whole suite, same machine: user CPU 1244 → 1178 s, wall 11 min 37 s →
        # 10 min 58 s). The workers and the commands the tests start inherit it; a value the user set is kept.
        threads = _threads_per_worker(config)
        if threads is not None:
            os.environ.setdefault("OMP_NUM_THREADS", str(threads))
        config.stash[_CACHE_FOLDER] = tempfile.mkdtemp(prefix="functional-gan-tests-jax-cache-")
        os.environ["JAX_COMPILATION_CACHE_DIR"] = config.stash[_CACHE_FOLDER]
        os.environ["JAX_PERSISTENT_CACHE_MIN_COMPILE_TIME_SECS"] = "0"
    jax.config.update("jax_compilation_cache_dir", os.environ["JAX_COMPILATION_CACHE_DIR"])
    jax.config.update("jax_persistent_cache_min_compile_time_secs", 0.0)


# Test modules whose tests share one long computation, each run in one worker: the comparison suite (about 100 s, run
# once per session by tests.helpers.once_per_session: a second worker would sit waiting on its lock) and the
# uninterrupted two-process training run test_multiprocess.py compares with (a module fixture: about 40 s of both
# cores, once per worker that runs the module's tests).
_ONE_WORKER_MODULES = {"tests/test_comparison_suite.py", "tests/test_multiprocess.py"}


def pytest_xdist_make_scheduler(config, log):
    """pytest-xdist's load balancing (``-n``), test by test, but for the modules above, each sent to one worker whole.
    (pytest-xdist's own ``--dist loadgroup`` does this by a mark, but its mark is not seen under pytest 9.)"""
    if config.getvalue("dist") != "load":
        return None
    from xdist.scheduler import LoadScopeScheduling

    class OneWorkerForSharedModules(LoadScopeScheduling):
        def _split_scope(self, nodeid: str) -> str:
            module = nodeid.split("::", 1)[0]
            return module if module in _ONE_WORKER_MODULES else nodeid

    return OneWorkerForSharedModules(config, log)


def pytest_unconfigure(config):
    if _CACHE_FOLDER in config.stash:
        shutil.rmtree(config.stash[_CACHE_FOLDER], ignore_errors=True)


@pytest.fixture(autouse=True)
def torch_threads_as_the_session_set_them():
    """A test that sets PyTorch's thread count (the benchmark's timing context pins it to every core) leaves the
    next tests of its worker with the count the session started with."""
    yield
    torch = sys.modules.get("torch")
    wanted = os.environ.get("OMP_NUM_THREADS")
    if torch is not None and wanted and wanted.isdigit() and torch.get_num_threads() != int(wanted):
        torch.set_num_threads(int(wanted))


@pytest.fixture(autouse=True, scope="session")
def full_float32_on_accelerators():
    """On a GPU or TPU, float32 at full precision on both sides (no TF32 or bf16 passes), as ``compare`` runs: the
    tests' float32 tolerances are PyTorch's full-precision noise. Nothing changes on a CPU."""
    if jax.default_backend() != "cpu":
        from functional_gan.comparisons.report import set_parity_precision

        set_parity_precision()
    yield


@pytest.fixture
def strict_dtype_promotion():
    """Mixing dtypes implicitly (float32 with float64, ints with floats) is an error inside the test.

    Used by the modules that test this project's own numerics (layers, models), so that a silent
    upcast there shows up as a failure. Not global: optax 0.2.8's own adam and MultiSteps mix
    their int32 step counters with floats, which strict promotion rejects.
    """
    with jax.numpy_dtype_promotion("strict"):
        yield


@pytest.fixture
def key():
    """A fresh root PRNG key; tests derive what they need with split / fold_in."""
    return jax.random.key(0)
