"""Regenerate the recorded PyTorch runs in comparisons/fixtures/ (needs torch 2.13.0).

    python -m functional_gan.comparisons.regenerate_fixtures
"""

from __future__ import annotations

import torch

from functional_gan import linreg
from functional_gan.pytorch import linreg as torch_linreg

from . import fixtures, reference_runs
from .common import SMALL_WIDTHS, TEACHER_FORCING


def main() -> None:
    run = reference_runs.run_tutorial(SMALL_WIDTHS, "float64")
    fixtures.save(fixtures.TRAJECTORY_FIXTURE, SMALL_WIDTHS, {
        "initial_generator": run.initial_generator, "initial_discriminator": run.initial_discriminator,
        "metrics": run.metrics, "final_generator": run.final_generator, "final_discriminator": run.final_discriminator,
    })
    run = reference_runs.run_tutorial(TEACHER_FORCING, "float32", record_snapshots=True)
    keep = sorted({t for s in fixtures.SNAPSHOT_STEPS for t in (s, s + 1)})
    fixtures.save(fixtures.TEACHER_FORCING_FIXTURE, TEACHER_FORCING, {
        "metrics": run.metrics, "snapshots": {str(t): run.snapshots[t] for t in keep},
    })
    data = linreg.make_data()
    recorded = {}
    for name, dtype in (("float64", torch.float64), ("float32", torch.float32)):
        result = torch_linreg.train_backward(data, dtype=dtype)
        recorded[name] = {"b": result.b, "w": result.w, "losses": result.losses}
    fixtures.save(fixtures.LINREG_FIXTURE, SMALL_WIDTHS, recorded)
    for path in (fixtures.TRAJECTORY_FIXTURE, fixtures.TEACHER_FORCING_FIXTURE, fixtures.LINREG_FIXTURE):
        print(f"wrote {path} ({path.stat().st_size / 1e3:.0f} kB)")


if __name__ == "__main__":
    main()
