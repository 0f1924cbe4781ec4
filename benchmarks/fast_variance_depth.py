"""Flax's fast variance at ResNet-50 depth: still a failing precision finding in float32, its cause named and verified.

    python -m functional_gan.benchmarks.fast_variance_depth [--size 64] [--out benchmarks/results]

examples/port/resnet50_nnx.py (torchvision's ResNet-50 and an NNX port, SGD with momentum, training mode) with every
BatchNorm computing its batch statistics through Flax's own ``_compute_stats`` with ``use_fast_variance=True`` (Flax's
default: E[x²] − E[x]²), PyTorch's momentum and unbiased running variance kept (so that the buffers' semantics are
right and only the arithmetic differs); 4 images of ``--size``². Checked in float32 and float64; writes
``fast-variance-depth.md``.
"""

from __future__ import annotations

import argparse
import importlib.util
import os
import sys
import time
from pathlib import Path

EXAMPLES = Path(__file__).resolve().parents[1] / "examples" / "port"


def spec(size: int):
    import numpy as np
    from flax.nnx.nn import normalization

    from functional_gan import testing

    sys.path.insert(0, str(EXAMPLES))
    loader = importlib.util.spec_from_file_location("resnet50_fast_variance", EXAMPLES / "resnet50_nnx.py")
    module = importlib.util.module_from_spec(loader)
    loader.loader.exec_module(module)

    class FlaxStatsBatchNorm(module.TorchBatchNorm):
        """PyTorch's BatchNorm semantics, the batch statistics by Flax's ``_compute_stats`` (read at call time: the
        check's counterfactual replaces it)."""

        use_fast_variance = True

        def __call__(self, x):
            if self.use_running_average:
                return super().__call__(x)
            mean, var = normalization._compute_stats(x, (0, 1, 2), None, use_fast_variance=self.use_fast_variance)
            n = x.size / x.shape[-1]
            self.mean[...] = 0.9 * self.mean[...] + 0.1 * mean
            self.var[...] = 0.9 * self.var[...] + 0.1 * var * n / (n - 1)
            return (x - mean) / (var + 1e-5) ** 0.5 * self.scale[...] + self.bias[...]

    module.TorchBatchNorm = FlaxStatsBatchNorm
    module.example_inputs = lambda: (np.random.default_rng(0).normal(0.0, 1.0, (4, 3, size, size)).astype(np.float32),)
    return testing.spec_from_module(module)


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--size", type=int, default=64)
    parser.add_argument("--out", default="benchmarks/results")
    args = parser.parse_args(argv)
    from functional_gan import testing

    lines = ["# Flax's fast variance at ResNet-50 depth", "",
             f"`python -m functional_gan.benchmarks.fast_variance_depth --size {args.size}` ({os.cpu_count()} cores)", ""]
    for dtype in ("float32", "float64"):
        start = time.perf_counter()
        report = testing.check_port(spec(args.size), dtype, programs=("jit",))
        seconds = time.perf_counter() - start
        worst = max(report.precision_findings or report.precision_notes or report.rows, key=lambda r: r.port_error)
        lines += [f"## {dtype}: exit {report.exit_status()} ({seconds:.0f} s)", "",
                  f"{len(report.precision_findings)} precision findings, {len(report.precision_notes)} notes; the "
                  f"largest error {worst.port_error:.3g} of its scale at {worst.label}, {worst.name} "
                  f"({worst.ratio:.1f}× PyTorch's own {worst.noise:.3g})", ""]
        lines += [f"- {cause}" for cause in report.causes] + [""]
        print("\n".join(lines[-6:]), flush=True)
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    (out / "fast-variance-depth.md").write_text("\n".join(lines) + "\n")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
