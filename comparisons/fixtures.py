"""Recorded PyTorch reference runs kept in the repository, so the JAX side is checked without torch.

``python -m functional_gan.comparisons.regenerate_fixtures`` (needs torch) rewrites them. Files are plain .npz
(no pickles): flat keys such as ``initial_generator/main.0.weight`` and a JSON ``spec``.
"""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np

from functional_gan.config import TrainConfig
from functional_gan.metrics import METRIC_NAMES

from .common import CheckResult, compare_trajectory, make_batches, teacher_forced_step, teacher_forcing_verdict

FIXTURE_DIR = Path(__file__).resolve().parent / "fixtures"
TRAJECTORY_FIXTURE = FIXTURE_DIR / "dcgan_float64_100_steps.npz"
TEACHER_FORCING_FIXTURE = FIXTURE_DIR / "dcgan_float32_teacher_forcing.npz"
LINREG_FIXTURE = FIXTURE_DIR / "linreg_torch.npz"
SNAPSHOT_STEPS = (0, 25, 49)  # teacher-forcing steps whose states are stored (with the state after each)


def _flatten(prefix: str, tree: dict, out: dict) -> None:
    for key, value in tree.items():
        if isinstance(value, dict):
            _flatten(f"{prefix}{key}/", value, out)
        else:
            out[f"{prefix}{key}"] = np.asarray(value)


def _unflatten(arrays: dict, prefix: str) -> dict:
    tree: dict = {}
    for key, value in arrays.items():
        if not key.startswith(prefix):
            continue
        parts = key[len(prefix):].split("/")
        node = tree
        for part in parts[:-1]:
            node = node.setdefault(part, {})
        node[parts[-1]] = value
    return tree


def save(path: Path, spec: TrainConfig, tree: dict) -> None:
    arrays: dict = {"spec": np.array(json.dumps(spec.to_dict()))}
    _flatten("", tree, arrays)
    path.parent.mkdir(parents=True, exist_ok=True)
    np.savez_compressed(path, **arrays)


def load(path: Path) -> tuple[TrainConfig, dict]:
    with np.load(path, allow_pickle=False) as data:
        arrays = {k: data[k] for k in data.files}
    spec = TrainConfig.from_dict(json.loads(str(arrays.pop("spec"))))
    return spec, _unflatten(arrays, "")


def check_trajectory_fixture(path: Path = TRAJECTORY_FIXTURE, tolerance: float = 1e-10) -> CheckResult:
    """The recorded float64 PyTorch run, replayed in JAX."""
    spec, run = load(path)
    return compare_trajectory(
        f"float64 trajectory vs recorded PyTorch run ({path.name})", spec,
        run["initial_generator"], run["initial_discriminator"], run["metrics"],
        run["final_generator"], run["final_discriminator"], tolerance,
    )


def _snapshot(tree: dict) -> dict:
    adam = {
        side: {name: {"step": int(v["step"]), "exp_avg": v["exp_avg"], "exp_avg_sq": v["exp_avg_sq"]} for name, v in tree.get(side, {}).items()}
        for side in ("generator_adam", "discriminator_adam")
    }
    return {"generator": tree["generator"], "discriminator": tree["discriminator"], **adam}


def check_teacher_forcing_fixture(path: Path = TEACHER_FORCING_FIXTURE) -> CheckResult:
    """Teacher-forced float32 steps from recorded PyTorch states."""
    from functional_gan.replay import config_from_state_dicts
    from functional_gan.train import make_gan_step

    spec, run = load(path)
    real, noise = make_batches(spec)
    first = _snapshot(run["snapshots"][str(SNAPSHOT_STEPS[0])])
    config = config_from_state_dicts(first["generator"], first["discriminator"], spec.batch_size, spec)
    step = make_gan_step(config)
    rows = []
    for t in SNAPSHOT_STEPS:
        rows.append(teacher_forced_step(
            config, step, _snapshot(run["snapshots"][str(t)]), _snapshot(run["snapshots"][str(t + 1)]),
            real[t], noise[t], [run["metrics"][k][t] for k in METRIC_NAMES],
        ))
    passed, tolerance, detail = teacher_forcing_verdict(rows, spec.lr)
    return CheckResult(
        f"float32 teacher forcing vs recorded PyTorch states at steps {SNAPSHOT_STEPS}",
        tolerance, max(r.metric_rel for r in rows), passed, detail,
    )


def check_linreg_fixture(path: Path = LINREG_FIXTURE) -> CheckResult:
    """The JAX trainers against PyTorch's recorded linear-regression results (float64 and float32)."""
    import jax
    import jax.numpy as jnp

    from functional_gan import linreg

    _, recorded = load(path)
    data = linreg.make_data()
    worst = 0.0
    for dtype_name, tolerance in (("float64", 1e-12), ("float32", 1e-5)):
        with jax.enable_x64(dtype_name == "float64"):
            results = [t(data, dtype=getattr(jnp, dtype_name)) for t in linreg.JAX_TRAINERS]
        for r in results:
            diff = max(abs(r.b - float(recorded[dtype_name]["b"])), abs(r.w - float(recorded[dtype_name]["w"])))
            worst = max(worst, diff / tolerance)  # in units of the tolerance
    return CheckResult(
        "linear regression vs recorded PyTorch results", "max |Δ| ≤ 1e-12 (float64), 1e-5 (float32); shown in units of the tolerance",
        worst, worst <= 1.0, f"recorded PyTorch float64 b = {float(recorded['float64']['b']):.8f}, w = {float(recorded['float64']['w']):.8f}",
    )
