"""How accurately each framework sums BatchNorm's float64 statistics, against a long-double reference.

    python -m functional_gan.benchmarks.reduction_accuracy [--json FILE]

The comparison suite's noise floor runs PyTorch against itself in other summation orders. This
measures the one summation that differs by JAX version: the batch mean and variance over (N, H, W)
of D's activations (8 × 64 × 8 × 8 and the tutorial's 64 × 128 × 16 × 16, float64), computed by

* PyTorch's ``nn.BatchNorm2d`` (its fused CPU kernel; read from the running statistics with momentum 1),
* plain ``torch.sum`` (the comparison suite's ``SummedBatchNorm2d``),
* this project's JAX BatchNorm (``jnp.mean`` of the NHWC activations, then of the squared deviations),
  jitted as training runs it,

each as max |result − exact| / max |exact|, where "exact" is NumPy in long double (x86's 80-bit format,
64-bit mantissa: 2⁻⁶⁴ ≈ 5e-20, far below float64's 1.1e-16). On jax 0.10.2 and torch 2.13.0 the
fused kernel and JAX both err by about 1e-15; jax 0.12 sends the reduction to YNNPACK, which sums with
several accumulators and errs by about 3e-16, as plain sums do.
"""

from __future__ import annotations

import argparse
import json

import numpy as np

SHAPES = {"D main.6 at ndf 16, batch 8": (8, 64, 8, 8), "D main.3 at ndf 64, batch 64": (64, 128, 16, 16)}


def _error(result, exact) -> float:
    return float(np.max(np.abs(np.asarray(result, np.longdouble) - exact)) / np.max(np.abs(exact)))


def measure(seed: int = 0) -> dict:
    import jax
    import jax.numpy as jnp
    import torch

    from functional_gan import xla_guard

    rows = {}
    with jax.enable_x64(True):
        for name, shape in SHAPES.items():
            x = np.random.default_rng(seed).normal(3.0, 2.0, size=shape)
            exact = x.astype(np.longdouble)
            n = x.size // shape[1]
            mean = exact.mean(axis=(0, 2, 3))
            var = ((exact - mean[None, :, None, None]) ** 2).mean(axis=(0, 2, 3))
            bn = torch.nn.BatchNorm2d(shape[1], momentum=1.0).double()
            bn(torch.tensor(x))
            fused = (bn.running_mean.numpy(), bn.running_var.numpy() * (n - 1) / n)
            t = torch.tensor(x)
            summed_mean = t.sum(dim=(0, 2, 3)) / n
            summed = (summed_mean.numpy(), (((t - summed_mean[None, :, None, None]) ** 2).sum(dim=(0, 2, 3)) / n).numpy())

            @jax.jit
            def statistics(a):
                m = jnp.mean(a, axis=(0, 1, 2))
                return m, jnp.mean(jnp.square(a - m), axis=(0, 1, 2))

            ours = jax.device_get(statistics(jnp.asarray(x.transpose(0, 2, 3, 1))))
            rows[name] = {label: {"mean": _error(m, mean), "var": _error(v, var)}
                          for label, (m, v) in (("PyTorch BatchNorm2d", fused), ("torch.sum", summed), ("JAX", ours))}
    return {"jax": jax.__version__, "jaxlib": xla_guard.describe(), "torch": torch.__version__, "rows": rows}


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--json", metavar="FILE", help="also write the numbers as JSON")
    args = parser.parse_args(argv)
    result = measure()
    print(f"jax {result['jax']} ({result['jaxlib']}), torch {result['torch']}; error against long double, float64")
    for name, row in result["rows"].items():
        print(f"  {name}")
        for label, errors in row.items():
            print(f"    {label:<22} mean {errors['mean']:.2e}   variance {errors['var']:.2e}")
    if args.json:
        with open(args.json, "w") as f:
            json.dump(result, f, indent=1)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
