"""Shared test helpers: the one tiny configuration, NCHW↔NHWC, PyTorch model ↔ GANState, one tree_allclose,
one state-difference helper, a free port, a run's grids."""

from __future__ import annotations

import os
import socket
from pathlib import Path

import jax
import jax.numpy as jnp
import numpy as np

import dataclasses

from functional_gan import state_dicts
from functional_gan.comparisons.common import max_state_difference  # noqa: F401  (the one state-difference helper)
from functional_gan.config import TrainConfig
from functional_gan.replay import state_from_state_dicts
from functional_gan.train import GANState


# The tiny configuration every test trains or steps with unless it needs something else: random data, 32×32,
# widths 4, batch 4 (the smallest the models take; `pytest tests/test_train_step.py --durations=0` times a step).
TINY_SIZES = dict(data="fake", batch_size=4, image_size=32, nz=8, ngf=4, ndf=4, nc=3)
TINY = TrainConfig(**TINY_SIZES)


def tiny(**changes) -> TrainConfig:
    """:data:`TINY` with ``changes``; with ``loss=``, that loss's own defaults (its optimizer, n_critic) at TINY's sizes."""
    from functional_gan.losses import config_for_loss

    loss = changes.pop("loss", None)
    base = TINY if loss is None else dataclasses.replace(config_for_loss(loss), **TINY_SIZES)
    return dataclasses.replace(base, **changes)


def tiny_flags(data_flags: bool = True, **changes) -> list[str]:
    """The ``functional-gan train`` flags of ``tiny(**changes)`` (see :func:`train_args`), then ``--no-progress``.

    ``data_flags=False`` leaves ``--data`` and ``--nc`` out, for a test that names its own data (``--nc`` then
    follows the data, as for a user)."""
    flags = train_args(tiny(**changes))
    if not data_flags:
        pairs = [flags[i:i + 2] for i in range(0, len(flags), 2)]
        flags = [word for pair in pairs if pair[0] not in ("--data", "--nc") for word in pair]
    return [*flags, "--no-progress"]


def train_args(config: TrainConfig) -> list[str]:
    """The ``functional-gan train`` flags that describe ``config`` (every field that differs from the CLI's default)."""
    from functional_gan.losses import config_for_loss
    from functional_gan.main import build_parser

    cli = build_parser("train").parse_args(["train"])
    loss_defaults = config_for_loss(config.loss)  # what a flag left out resolves to, for the loss-dependent ones
    args = []
    for field in dataclasses.fields(TrainConfig):
        value = getattr(config, field.name)
        default = getattr(cli, field.name, None)
        if default is None:
            default = getattr(loss_defaults, field.name)
        if field.name == "nc" or (value is not None and default != value):
            args += ["--" + field.name.replace("_", "-"), str(value)]
    return args


def nchw_to_nhwc(x):
    return np.asarray(x).transpose(0, 2, 3, 1)


def nhwc_to_nchw(x):
    return np.asarray(x).transpose(0, 3, 1, 2)


def tree_allclose(a, b, rtol: float = 0.0, atol: float = 0.0) -> bool:
    """Same structure, and every leaf equal within the tolerances (exact by default)."""
    if jax.tree_util.tree_structure(a) != jax.tree_util.tree_structure(b):
        return False
    return all(
        np.allclose(np.asarray(x), np.asarray(y), rtol=rtol, atol=atol)
        for x, y in zip(jax.tree_util.tree_leaves(a), jax.tree_util.tree_leaves(b))
    )


def state_from_torch(config, net_g, net_d) -> GANState:
    """A fresh GANState (fresh Adam) holding the PyTorch models' exact weights and running statistics."""
    from functional_gan.pytorch.dcgan import state_dict_numpy

    dtype = jnp.float64 if next(net_g.parameters()).dtype.itemsize == 8 else jnp.float32
    return state_from_state_dicts(config, state_dict_numpy(net_g), state_dict_numpy(net_d), dtype)


def max_state_dict_difference(jax_params, jax_batch_stats, torch_module) -> float:
    from functional_gan.pytorch.dcgan import state_dict_numpy

    return max_state_difference(state_dicts.variables_to_state_dict(jax_params, jax_batch_stats), state_dict_numpy(torch_module))


def free_port() -> int:
    """A TCP port free on 127.0.0.1 now (for a test's coordinator)."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def run_grids(run: Path) -> dict[str, bytes]:
    """A run folder's fixed-noise grids, by file name: two runs that trained alike drew the same bytes."""
    return {p.name: p.read_bytes() for p in sorted((run / "samples").glob("iter_*.png"))}


def one_torch_layer(make_layer):
    """check-port's layout tests: a PyTorch model of the one layer ``make_layer()`` builds (seed 0), its parameters
    moved off their initial values (a norm's scale off 1 and bias off 0), so that a wrong layout cannot pass."""
    import torch

    class One(torch.nn.Module):
        def __init__(self, layer):
            super().__init__()
            self.layer = layer

        def forward(self, x):
            return self.layer(x)

    def torch_model():
        torch.manual_seed(0)
        layer = make_layer()
        with torch.no_grad():
            for p in layer.parameters():
                p.add_(torch.randn_like(p) * 0.5)
        return One(layer)

    return torch_model


def assert_agrees(report) -> None:
    """A check-port report of a correct port: no divergence; and no precision finding, except those XLA:CPU's float32
    reductions explain, which the report must then name as the cause, measured on the port's own layers (XLA sums
    float32 less accurately than PyTorch's cascade: 3.2× PyTorch's error on a sum of 200 values near 40, on jax
    0.10.2 and 0.12 alike; a port with BatchNorm gets a few such rows)."""
    assert report.first_divergence is None, report.format()
    if report.precision_findings:
        assert jax.default_backend() == "cpu", report.format()
        assert any(cause.startswith("XLA:CPU's float32 reductions") for cause in report.causes), report.format()


def once_per_session(tmp_path_factory, name: str, compute):
    """``compute(folder)``, run once for the whole test session however many pytest-xdist workers ask for it: the first
    runs it under a file lock and pickles its result beside the workers' temporary folders, the others wait for the lock
    and read it (a module-scoped fixture would run once per worker that runs the module's tests)."""
    import pickle

    from filelock import FileLock

    shared = tmp_path_factory.getbasetemp()
    if os.environ.get("PYTEST_XDIST_WORKER"):
        shared = shared.parent  # the session's folder, above each worker's
    result = shared / f"{name}.pickle"
    with FileLock(str(result) + ".lock"):
        if result.exists():
            return pickle.loads(result.read_bytes())
        value = compute(shared / name)
        result.write_bytes(pickle.dumps(value))
    return value


def dtypes(default: str):
    """``float32`` and ``float64`` as test parameters, the one besides ``default`` marked ``slow``: a check repeated
    in the second dtype of a behaviour the default suite checks in one (the suite's ten-minute budget; CI runs both)."""
    import pytest

    return [pytest.param(d, marks=() if d == default else pytest.mark.slow) for d in ("float32", "float64")]

