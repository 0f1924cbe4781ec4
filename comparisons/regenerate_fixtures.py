"""Regenerate the recorded PyTorch runs in comparisons/fixtures/ (needs torch 2.13.0).

    python -m comparisons.regenerate_fixtures
"""

from __future__ import annotations

import torch

from comparisons import fixtures, reference_runs, torch_linreg
from comparisons.checks import SMALL_WIDTHS_100, TEACHER_FORCING_50
from functional_gan import linreg


def main() -> None:
    run = reference_runs.run_tutorial(SMALL_WIDTHS_100, "float64")
    fixtures.save(fixtures.TRAJECTORY_FIXTURE, SMALL_WIDTHS_100, {
        "initial_generator": run.initial_generator, "initial_discriminator": run.initial_discriminator,
        "metrics": run.metrics, "final_generator": run.final_generator, "final_discriminator": run.final_discriminator,
    })
    run = reference_runs.run_tutorial(TEACHER_FORCING_50, "float32", record_snapshots=True)
    keep = sorted({t for s in fixtures.SNAPSHOT_STEPS for t in (s, s + 1)})
    fixtures.save(fixtures.TEACHER_FORCING_FIXTURE, TEACHER_FORCING_50, {
        "metrics": run.metrics, "snapshots": {str(t): run.snapshots[t] for t in keep},
    })
    data = linreg.make_data()
    recorded = {}
    for name, dtype in (("float64", torch.float64), ("float32", torch.float32)):
        result = torch_linreg.train_backward(data, dtype=dtype)
        recorded[name] = {"b": result.b, "w": result.w, "losses": result.losses}
    fixtures.save(fixtures.LINREG_FIXTURE, reference_runs.RunSpec(), recorded)
    for path in (fixtures.TRAJECTORY_FIXTURE, fixtures.TEACHER_FORCING_FIXTURE, fixtures.LINREG_FIXTURE):
        print(f"wrote {path} ({path.stat().st_size / 1e3:.0f} kB)")


if __name__ == "__main__":
    main()
