"""The CPU's float32 FMA throughput, measured (``fma_peak.c``): the machine's peak that no kernel can exceed.

A GEMM's rate is not the machine's peak on every CPU: on a 2-core AMD EPYC (Zen 5, AVX-512) the best GEMM of either
framework ran at 363 GFLOP/s while oneDNN's convolutions reached 434, and register-only FMAs at 445. So the benchmark
divides by the larger of its best GEMM and this figure. Built at first use with the machine's C compiler (``$CC``,
else ``cc``) into the project's cache; where no compiler is found the figure is left out and said so.
"""

from __future__ import annotations

import ctypes
import hashlib
import os
import shlex
import shutil
import statistics
import subprocess
import time
from pathlib import Path

SOURCE = Path(__file__).with_name("fma_peak.c")
FLAGS = ["-O2", "-march=native", "-fopenmp", "-shared", "-fPIC"]


def _library() -> ctypes.CDLL:
    from functional_gan.onednn._build import cache_root

    compiler = shlex.split(os.environ.get("CC", "")) or ["cc"]
    if shutil.which(compiler[0]) is None:
        raise OSError(f"no C compiler ({compiler[0]} not found; set $CC)")
    key = hashlib.sha256(SOURCE.read_bytes() + " ".join(compiler + FLAGS).encode()).hexdigest()[:16]
    target = cache_root() / "fma_peak" / key / "fma_peak.so"
    if not target.exists():
        target.parent.mkdir(parents=True, exist_ok=True)
        partial = target.with_name(f".fma_peak.{os.getpid()}.so")
        result = subprocess.run([*compiler, *FLAGS, str(SOURCE), "-o", str(partial)], capture_output=True, text=True)
        if result.returncode != 0:
            raise OSError(f"building {SOURCE.name} failed: {result.stderr.strip().splitlines()[-1:]}")
        os.replace(partial, target)
    library = ctypes.CDLL(str(target))
    library.fg_peak_run.restype = ctypes.c_double
    library.fg_peak_run.argtypes = [ctypes.c_int, ctypes.c_long, ctypes.c_float]
    return library


def measure(threads: int | None = None, seconds: float = 0.3, repeats: int = 3) -> tuple[float, str]:
    """(FLOP/s, how): the best of ``repeats`` runs of about ``seconds`` each on ``threads`` threads (default: the
    cores this process may use, as XLA:CPU's pool). Raises OSError where it cannot be built."""
    library = _library()
    threads = threads or len(os.sched_getaffinity(0))
    iterations = 200_000
    start = time.perf_counter()
    library.fg_peak_run(threads, iterations, 1.0)  # also starts the OpenMP threads
    iterations = max(iterations, int(iterations * seconds / max(time.perf_counter() - start, 1e-6)))
    rates = []
    for _ in range(repeats):
        start = time.perf_counter()
        flops = library.fg_peak_run(threads, iterations, 1.0)
        rates.append(flops / (time.perf_counter() - start))
    return max(rates), (f"float32 FMAs on registers alone, {library.fg_peak_lanes()} lanes, {threads} threads, "
                        f"best of {repeats} (median "
                        f"{statistics.median(rates) / 1e9:.0f} GFLOP/s)")
