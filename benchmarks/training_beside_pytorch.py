"""A training run in JAX beside PyTorch's own tutorial loop, on the same digits batches, noise and initial weights.

    python -m functional_gan.benchmarks.training_beside_pytorch [--steps 300] [--every 50]

Both frameworks start from the same weights (PyTorch's ``weights_init``) and see the same shuffled digits and the same
noise each iteration, in float32, at the comparison suite's quality size (32 × 32, widths 32, batch 64): PyTorch on
its CPU, JAX on its default device. Prints Loss_D, Loss_G, D(x) and D(G(z)) of both, every ``--every`` iterations and
at the end, so that a run where D wins early (as once on an H200) is read against what PyTorch does on the same data,
not against expectation. Float32 runs part ways within tens of iterations (chaotic dynamics: see the comparison
suite); what should agree is the kind of run, not the numbers.
"""

from __future__ import annotations

import argparse
import dataclasses
import sys


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--steps", type=int, default=300, help="training iterations of each framework")
    parser.add_argument("--every", type=int, default=50, help="print the metrics every this many iterations")
    parser.add_argument("--seed", type=int, default=1)
    args = parser.parse_args(argv)

    import jax
    import numpy as np

    from functional_gan.comparisons.quality import QUALITY_RUN, QualitySpec, digits_batches
    from functional_gan.comparisons.reference_runs import run_tutorial
    from functional_gan.replay import replay

    run = dataclasses.replace(QUALITY_RUN, steps=args.steps, seed=args.seed)
    real, noise = digits_batches(QualitySpec(run=run), args.seed)
    torch_run = run_tutorial(run, "float32", real=real, noise=noise)
    jax_run = replay(torch_run.initial_generator, torch_run.initial_discriminator, real, noise, "float32", run)
    names = ("loss_d", "loss_g", "d_x", "d_g_z1")
    print(f"{args.steps} iterations, {run.image_size}×{run.image_size} digits, batch {run.batch_size}, widths "
          f"{run.ngf}/{run.ndf}, float32; PyTorch on the CPU, JAX on {jax.devices()[0]}")
    print(f"{'iteration':>9}  " + "  ".join(f"{n + ' ' + side:>15}" for n in names for side in ("PyTorch", "JAX")))
    for step in sorted({*range(args.every - 1, args.steps, args.every), args.steps - 1}):
        values = []
        for name in names:
            values += [float(np.asarray(torch_run.metrics[name])[step]), float(np.asarray(jax_run.metrics[name])[step])]
        print(f"{step + 1:>9}  " + "  ".join(f"{v:>15.4f}" for v in values))
    last = slice(max(0, args.steps - args.every), args.steps)
    for name in names:
        ours, theirs = np.mean(np.asarray(jax_run.metrics[name])[last]), np.mean(np.asarray(torch_run.metrics[name])[last])
        print(f"mean {name} over the last {last.stop - last.start} iterations: PyTorch {theirs:.4f}, JAX {ours:.4f}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
