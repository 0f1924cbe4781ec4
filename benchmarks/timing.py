"""The benchmark's measuring: interleaved timings, the run's context (versions, devices, the measured peak), memory
and FLOP counts, and the record each workload × framework × batch becomes."""

from __future__ import annotations

import dataclasses
import os
import platform
import statistics
import time
from pathlib import Path
from typing import Callable

import jax


@dataclasses.dataclass
class Record:
    """One workload × framework × batch."""

    workload: str
    framework: str
    backend: str
    device: str
    batch: int
    median_s: float | None
    min_s: float | None
    max_s: float | None
    compile_s: float | None
    flops: float | None
    xla_flops: float | None
    flops_per_s: float | None
    fraction_of_peak: float | None
    peak_memory_bytes: int | None
    repeats: int
    versions: dict
    note: str = ""


def interleaved_times(fns: dict[str, Callable[[], object]], repeats: int, warmup: int = 1) -> dict[str, list[float]]:
    """Seconds per call of each function, the functions called in turn, the order rotated each round (A B C, B C A,
    C A B, ...): the call after another framework's finds the caches cold, and each function takes that place as
    often as the others (in a fixed order the first of small BatchNorm calls measured 1.4 ms, the same program
    second 0.8 ms)."""
    for _ in range(warmup):
        for fn in fns.values():
            fn()
    times: dict[str, list[float]] = {name: [] for name in fns}
    names = list(fns)
    for round_ in range(repeats):
        shift = round_ % len(names)
        for name in names[shift:] + names[:shift]:
            start = time.perf_counter()
            fns[name]()
            times[name].append(time.perf_counter() - start)
    return times


def torch_sync(device: str):
    import torch

    if device.startswith("cuda"):
        torch.cuda.synchronize()


def blocking(fn):
    def run():
        return jax.block_until_ready(fn())

    return run


class Context:
    """What every workload shares: versions, devices, threads, the measured peak."""

    def __init__(self, repeats: int, with_torch_compile: bool, tf32: bool = False):
        import torch

        from functional_gan.pytorch.precision import full_float32_precision

        # Full float32 on both sides by default; --tf32 lets both round matmul/convolution inputs to TF32 on GPUs.
        jax.config.update("jax_default_matmul_precision", "tensorfloat32" if tf32 else "highest")
        full_float32_precision(allow_tf32=tf32)
        self.tf32 = tf32
        self.repeats = repeats
        self.with_torch_compile = with_torch_compile
        self.backend = jax.default_backend()
        self.jax_device = str(jax.devices()[0])
        self.torch_device = "cuda" if self.backend == "gpu" and torch.cuda.is_available() else "cpu"
        self.threads = int(os.environ.get("NPROC") or os.cpu_count() or 1)  # XLA's CPU client: all logical CPUs
        torch.set_num_threads(self.threads)
        self.versions = {
            "jax": jax.__version__, "jaxlib": jax.lib.__version__ if hasattr(jax.lib, "__version__") else jax.__version__,
            "torch": torch.__version__, "python": platform.python_version(), "machine": platform.processor() or platform.machine(),
            "cpu": _cpu_name(), "threads": self.threads, "xla_flags": os.environ.get("XLA_FLAGS", ""),
            "transposed_conv_form": _transposed_conv_form(), "batchnorm_form": _batchnorm_form(), "tf32": tf32,
            "convolutions": _convolutions(),
        }
        self.peak = {}  # per framework, its best GEMM rate in FLOP/s (matmul_peak)
        self.peak_at = {}  # per framework, the GEMM that gave it
        self.fma_peak: tuple[float, str] | None = None  # the CPU's measured FMA throughput and how (fma_peak.py)

    def record(self, workload, framework, batch, times=None, compile_s=None, flops=None, xla_flops=None,
               peak_memory_bytes=None, note="") -> Record:
        torch_side = framework.startswith("torch")
        median = statistics.median(times) if times else None
        flops_per_s = flops / median if (flops and median) else None
        return Record(
            workload, framework, "torch-" + self.torch_device if torch_side else self.backend,
            self.torch_device if torch_side else self.jax_device, batch, median,
            min(times) if times else None, max(times) if times else None, compile_s, flops, xla_flops, flops_per_s,
            None, peak_memory_bytes, len(times or ()), self.versions, note,
        )

    def machine_peak(self) -> float:
        """The machine's measured peak: the best rate of the run's GEMMs, of every shape in either framework, at its
        start and its end (:func:`.workloads.matmul_peak`), or the CPU's FMA throughput if that is higher."""
        return max([*self.peak.values(), self.fma_peak[0] if self.fma_peak else 0.0])

    def set_fractions_of_peak(self, records: list[Record]) -> None:
        """Achieved FLOP/s over the machine's measured peak (:meth:`machine_peak`)."""
        peak = self.machine_peak()
        for r in records:
            r.fraction_of_peak = r.flops_per_s / peak if r.flops_per_s else None


def theoretical_peak() -> tuple[float | None, str]:
    """The CPU's float32 FMA throughput from its description (Linux's /proc/cpuinfo): cores × clock × vector lanes ×
    2 FMA units × 2 FLOPs, in FLOP/s, and how it was reckoned; (None, why) where it cannot be read. The clock is the
    one the kernel reports (a virtual machine's nominal one; turbo may run above it), and 2 FMA units per core is
    an assumption (server cores with AVX-512 have two; some have one)."""
    try:
        text = Path("/proc/cpuinfo").read_text()
    except OSError:
        return None, "no /proc/cpuinfo"
    blocks = [b for b in text.split("\n\n") if b.strip()]
    fields = [dict(line.split(":", 1) for line in b.splitlines() if ":" in line) for b in blocks]
    fields = [{k.strip(): v.strip() for k, v in f.items()} for f in fields]
    if not fields or "cpu MHz" not in fields[0]:
        return None, "no clock in /proc/cpuinfo"
    flags = set(fields[0].get("flags", "").split())
    lanes = 16 if "avx512f" in flags else 8 if "avx2" in flags and "fma" in flags else 4
    cores = len({(f.get("physical id"), f.get("core id")) for f in fields}) or len(fields)
    ghz = float(fields[0]["cpu MHz"]) / 1e3
    peak = cores * ghz * 1e9 * lanes * 2 * 2
    vector = {16: "AVX-512", 8: "AVX2"}.get(lanes, "SSE")
    return peak, (f"{cores} cores × {ghz:.2f} GHz × {lanes} float32 lanes ({vector}) × 2 FMA units × 2 FLOPs = "
                  f"{peak / 1e9:.0f} GFLOP/s (2 FMA units per core assumed; the clock the kernel reports, a base clock the "
                  "cores may run above: a measured peak can exceed this figure)")


def _cpu_name() -> str:
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or "unknown"


def _transposed_conv_form() -> str:
    from functional_gan.layers import transposed_conv_form

    return transposed_conv_form()


def _convolutions() -> str:
    """Which library the JAX rows' convolutions run in by default ($FUNCTIONAL_GAN_CONV; see functional_gan.onednn)."""
    from functional_gan import onednn

    if jax.default_backend() != "cpu" or onednn.choice() == "xla":
        return "XLA's"
    return "oneDNN's (the onednn extra)" if onednn.available() else "XLA's (the onednn extra is not installed)"


def _batchnorm_form() -> str:
    from functional_gan.layers import batchnorm_form

    return batchnorm_form()


def jax_memory(compiled) -> int | None:
    """Bytes the compiled program holds at once: arguments + outputs + temporaries (minus aliased)."""
    try:
        m = compiled.memory_analysis()
        return int(m.argument_size_in_bytes + m.output_size_in_bytes + m.temp_size_in_bytes - m.alias_size_in_bytes)
    except Exception:  # not every backend reports it
        return None


def xla_flops(compiled) -> float | None:
    try:
        cost = compiled.cost_analysis()
        cost = cost[0] if isinstance(cost, (list, tuple)) else cost
        return float(cost["flops"])
    except Exception:
        return None


def torch_peak_memory(fn, device: str, baseline_tensors=()) -> int:
    """Peak bytes of live tensors while ``fn()`` runs (plus the tensors it starts from)."""
    import torch

    if device.startswith("cuda"):
        torch.cuda.reset_peak_memory_stats()
        fn()
        torch.cuda.synchronize()
        return int(torch.cuda.max_memory_allocated())
    return LiveTensorBytes.peak_of(fn, baseline_tensors)


class LiveTensorBytes:
    """A dispatch mode that tracks the bytes of tensor storages alive during a call (CPU peak memory)."""

    @staticmethod
    def peak_of(fn, baseline_tensors) -> int:
        import weakref

        from torch.utils._python_dispatch import TorchDispatchMode

        live: dict[int, int] = {}
        state = {"now": 0, "peak": 0}
        for tensor in baseline_tensors:
            storage = tensor.untyped_storage()
            if storage.data_ptr() not in live:
                live[storage.data_ptr()] = storage.nbytes()
                state["now"] += storage.nbytes()
        state["peak"] = state["now"]

        def release(key):
            state["now"] -= live.pop(key, 0)

        class Tracker(TorchDispatchMode):
            def __torch_dispatch__(self, func, types, args=(), kwargs=None):
                out = func(*args, **(kwargs or {}))
                for tensor in jax.tree_util.tree_leaves(out):
                    if hasattr(tensor, "untyped_storage"):
                        storage = tensor.untyped_storage()
                        key = storage.data_ptr()
                        if key and key not in live:
                            live[key] = storage.nbytes()
                            state["now"] += storage.nbytes()
                            state["peak"] = max(state["peak"], state["now"])
                            weakref.finalize(storage, release, key)
                return out

        with Tracker():
            fn()
        return state["peak"]
