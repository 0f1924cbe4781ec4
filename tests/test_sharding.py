"""Data parallelism with jax.sharding: 4 forced CPU devices give the 1-device result.

XLA_FLAGS must be set before jax starts, so the check runs in a fresh interpreter.
"""

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from functional_gan.config import ConfigError, TrainConfig
from functional_gan.distributed import data_parallel_mesh
from tests.helpers import free_port, tiny_flags

ROOT = Path(__file__).resolve().parents[1]

_SCRIPT = r"""
import json, jax, jax.numpy as jnp, numpy as np
jax.config.update("jax_enable_x64", True)
from functional_gan.config import TrainConfig
from functional_gan.distributed import batch_sharding, data_parallel_mesh, replicated
from functional_gan.train import init_state, make_train_step
assert len(jax.devices()) == 4, jax.devices()
config = TrainConfig(batch_size=8, image_size=32, nz=8, ngf=4, ndf=4, devices=4)
mesh = data_parallel_mesh(config)
rng = np.random.default_rng(0)
batches = [jnp.asarray(rng.uniform(-1, 1, (8, 32, 32, 3))) for _ in range(10)]
one = init_state(config, jnp.float64)
one = jax.tree_util.tree_map(lambda a: a.astype(jnp.float64) if jnp.issubdtype(a.dtype, jnp.floating) else a, one)
four = jax.device_put(one, replicated(mesh))
step_one, step_four = make_train_step(config), make_train_step(config, mesh)
worst_metric = 0.0
for real in batches:
    one, m1 = step_one(one, real)
    sharded = jax.device_put(real, batch_sharding(mesh))
    four, m4 = step_four(four, sharded)
    worst_metric = max(worst_metric, float(np.max(np.abs(np.array(m1) - np.array(m4)))))
worst_state = max(float(np.max(np.abs(np.asarray(a, np.float64) - np.asarray(b, np.float64))))
                  for a, b in zip(jax.tree_util.tree_leaves(one), jax.tree_util.tree_leaves(four)))
shard_shapes = sorted({tuple(s.data.shape) for s in sharded.addressable_shards})
param = jax.tree_util.tree_leaves(four.generator_params)[0]
from functional_gan.config import ConfigError
try:
    data_parallel_mesh(TrainConfig(batch_size=6, devices=4))
    uneven = "accepted"
except ConfigError as error:
    uneven = str(error)
print(json.dumps({"uneven": uneven, "metric": worst_metric, "state": worst_state, "shard_shapes": shard_shapes,
                  "devices_holding_batch": len(sharded.addressable_shards),
                  "param_replicated": param.sharding.is_fully_replicated, "dtype": str(param.dtype)}))
"""


def test_four_devices_equal_one_device_in_float64():
    env = {**os.environ, "JAX_PLATFORMS": "cpu", "XLA_FLAGS": "--xla_force_host_platform_device_count=4", "PYTHONPATH": str(ROOT)}
    out = subprocess.run([sys.executable, "-c", _SCRIPT], env=env, capture_output=True, text=True, timeout=600)
    assert out.returncode == 0, out.stderr[-3000:]
    result = json.loads(out.stdout.strip().splitlines()[-1])
    assert result["dtype"] == "float64"
    # The batch really is split: 4 devices hold 2 images each; the parameters are replicated.
    assert result["devices_holding_batch"] == 4 and result["shard_shapes"] == [[2, 32, 32, 3]]
    assert result["param_replicated"] is True
    assert "does not split evenly over 4 devices" in result["uneven"]
    # Same mathematics, BatchNorm over the global batch; only the summation order can differ.
    assert result["metric"] <= 1e-12 and result["state"] <= 1e-12, result


def test_a_batch_that_does_not_split_over_the_devices_is_refused():
    # One CPU device here, so ask for the check directly through the count it would use.
    with pytest.raises(ConfigError, match="only 1 local device"):
        data_parallel_mesh(TrainConfig(batch_size=8, devices=4))
    assert data_parallel_mesh(TrainConfig(batch_size=8)) is None  # one device: no mesh


def test_cli_refuses_more_devices_than_there_are(tmp_path, capsys):
    from functional_gan.main import main

    code = main(["train", *tiny_flags(steps=1, devices=3), "--out", str(tmp_path / "run")])
    assert code == 2 and "only 1 local device" in capsys.readouterr().err
    assert not (tmp_path / "run").exists()



def test_two_processes_equal_one_process_with_four_devices(tmp_path):
    """`train` over 2 processes × 2 CPU devices (gloo collectives on 127.0.0.1) = 1 process × 4 devices."""
    from functional_gan import checkpoints

    args = ["-m", "functional_gan.main", "train",
            *tiny_flags(steps=6, batch_size=8, checkpoint_every=3, sample_every=3, log_every=3)]
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    port = free_port()
    two = [subprocess.Popen([sys.executable, *args, "--out", str(tmp_path / "two"), "--coordinator", f"127.0.0.1:{port}",
                             "--num-processes", "2", "--process-id", str(i)], stdout=subprocess.PIPE,
                            stderr=subprocess.STDOUT, text=True,
                            env={**env, "JAX_PLATFORMS": "cpu", "XLA_FLAGS": "--xla_force_host_platform_device_count=2"}) for i in range(2)]
    one = subprocess.run([sys.executable, *args, "--out", str(tmp_path / "one"), "--devices", "4"], capture_output=True,
                         text=True, timeout=600, env={**env, "JAX_PLATFORMS": "cpu", "XLA_FLAGS": "--xla_force_host_platform_device_count=4"})
    outputs = [p.communicate(timeout=600)[0] for p in two]
    assert one.returncode == 0, one.stderr[-3000:]
    for process, output in zip(two, outputs):
        assert process.returncode == 0, output[-3000:]
    assert "Data parallel over 4 devices in 2 processes" in outputs[0]
    assert "Done" not in outputs[1] and "Loss_D" not in outputs[1]  # only process 0 reports

    # One run: one set of sealed checkpoints, one log with each iteration once, one set of grids.
    assert sorted(p.name for p in (tmp_path / "two" / "checkpoints").iterdir()) == ["3", "6"]
    for step in (3, 6):
        checkpoints.verify(tmp_path / "two" / "checkpoints" / str(step), step)
    logs = {name: [json.loads(line) for line in (tmp_path / name / "metrics.jsonl").read_text().splitlines()]
            for name in ("one", "two")}
    assert [r["step"] for r in logs["two"]] == [1, 2, 3, 4, 5, 6]
    assert sorted(p.name for p in (tmp_path / "two" / "samples").iterdir()) == ["iter_000003.png", "iter_000006.png"]

    # Same program, same data: only the order of the cross-device sums differs (gloo between processes), so
    # float32 rounding: metrics within 1e-5 relative; parameters within 2·lr, the most a rounding-level
    # difference can move one Adam update (a sign flip of m̂/√v̂ where a gradient is ~0).
    import numpy as np

    for a, b in zip(logs["one"], logs["two"]):
        for key in ("loss_d", "loss_g", "d_x", "d_g_z1", "d_g_z2"):
            assert abs(a[key] - b[key]) <= 1e-5 * abs(a[key]), (a, b)
    one_state = checkpoints.load_newest_good(tmp_path / "one").state
    two_state = checkpoints.load_newest_good(tmp_path / "two").state
    import jax

    worst = max(float(np.max(np.abs(np.asarray(x, np.float64) - np.asarray(y, np.float64))))
                for x, y in zip(jax.tree_util.tree_leaves(one_state), jax.tree_util.tree_leaves(two_state)))
    assert worst <= 2 * 2e-4, worst


@pytest.mark.parametrize(
    "argv,message",
    [
        (["--coordinator", "127.0.0.1:1234"], "missing --num-processes, --process-id"),
        (["--coordinator", "no-port", "--num-processes", "2", "--process-id", "0"], "must be HOST:PORT"),
        (["--coordinator", "127.0.0.1:1234", "--num-processes", "2", "--process-id", "2"], "must lie in [0, 2)"),
    ],
)
def test_bad_multi_process_settings_are_refused_before_anything_starts(tmp_path, capsys, argv, message):
    from functional_gan.main import main

    assert main(["train", "--data", "fake", "--out", str(tmp_path / "run"), *argv]) == 2
    assert message in capsys.readouterr().err
    assert not (tmp_path / "run").exists()
