"""The divergence finder names the layer and stage of a deliberately wrong port, and nothing for the right one."""

import dataclasses

import jax.numpy as jnp
import numpy as np
import optax
import pytest
import torch

from functional_gan import layers, losses, train
from functional_gan.comparisons import diverge
from functional_gan.comparisons.common import SMALL_WIDTHS, make_batches
from functional_gan.main import main
from functional_gan.pytorch import dcgan as torch_reference

SPEC = dataclasses.replace(SMALL_WIDTHS, steps=2, batch_size=4)


@pytest.fixture(scope="module")
def run_start():
    """A float64 run's start: the tutorial's initial weights, and its batches."""
    net_g, net_d = torch_reference.make_models(SPEC, dtype=torch.float64)
    real, noise = make_batches(SPEC)
    return torch_reference.state_dict_numpy(net_g), torch_reference.state_dict_numpy(net_d), real, noise


def _find(run_start, dtype="float64", **kwargs):
    generator_sd, discriminator_sd, real, noise = run_start
    return diverge.find_divergence(generator_sd, discriminator_sd, real, noise, dtype, settings=SPEC, **kwargs)


def test_the_port_as_it_is_does_not_diverge(run_start):
    divergence, history = _find(run_start)
    assert divergence is None, diverge.format_divergence(divergence, history, "float64")
    assert len(history) == SPEC.steps
    stages = [e.stage for e in history[0]]
    # Every stage was compared, in debugging order: forward before loss before gradient before update.
    assert stages.index("forward") < stages.index("loss") < stages.index("gradient") < stages.index("update")
    assert {e.stage for e in history[0]} == set(diverge.STAGES)
    assert max(e.difference for entries in history for e in entries) < 1e-12


def test_a_biased_running_variance_is_found_in_the_running_statistics(run_start, monkeypatch):
    monkeypatch.setattr(layers, "running_variance", lambda biased_var, n: biased_var)  # forgot n/(n−1)
    divergence, _ = _find(run_start)
    assert divergence is not None and divergence.step == 1
    assert divergence.entry.stage == "running statistics"
    assert divergence.entry.name.startswith("main.3.running_var")  # D's first BatchNorm, after the D step
    # Only the running mean of that layer was compared among the statistics before it, and it agreed.
    assert [e.name for e in divergence.before if e.stage == "running statistics"] == ["main.3.running_mean (after the D step)"]


def test_adam_with_eps_inside_the_square_root_is_found_at_the_first_update(run_start, monkeypatch):
    def adam_eps_inside(config):  # m̂ / √(v̂ + eps) instead of PyTorch's m̂ / (√v̂ + eps)
        return optax.chain(optax.scale_by_adam(b1=config.beta1, b2=config.beta2, eps=0.0, eps_root=1e-8),
                           optax.scale(-config.lr))

    monkeypatch.setattr(train, "make_optimizer", adam_eps_inside)
    divergence, _ = _find(run_start)
    assert divergence is not None and divergence.step == 1
    assert (divergence.entry.stage, divergence.entry.network, divergence.entry.name) == ("update", "D", "main.0.weight")
    assert {e.stage for e in divergence.before} == {"forward", "loss", "gradient"}


def test_bce_without_pytorchs_clamp_is_found_at_the_loss(run_start, monkeypatch):
    def bce_unclamped(p, y):
        return -jnp.mean(y * jnp.log(p) + (1 - y) * jnp.log1p(-p))

    monkeypatch.setattr(losses, "bce_loss", bce_unclamped)
    generator_sd, discriminator_sd, real, noise = run_start
    # A saturated D: its last convolution scaled up, so D(G(z)) is exactly 1.0 in float64 (log(1 − p) = −inf,
    # which PyTorch clamps at −100).
    last = max((k for k in discriminator_sd if k.endswith(".weight")), key=lambda k: int(k.split(".")[1]))
    saturated = dict(discriminator_sd, **{last: discriminator_sd[last] * 1e4})
    divergence, _ = diverge.find_divergence(generator_sd, saturated, real, noise, "float64", settings=SPEC)
    assert divergence is not None and divergence.step == 1
    assert divergence.entry.stage == "loss" and divergence.entry.name == "errD"
    assert {e.stage for e in divergence.before} == {"forward"}
    assert not np.isfinite(divergence.entry.jax_values) and np.isfinite(divergence.entry.torch_values)


def test_float32_the_port_as_it_is_agrees_within_pytorchs_own_noise(run_start):
    divergence, history = _find(run_start, "float32")
    assert divergence is None, diverge.format_divergence(divergence, history, "float32")
    entries = [e for step in history for e in step]
    # Every float32 entry was judged against PyTorch's own float32 error (the updates against PyTorch's Adam
    # fed the same gradients), and was not only within k × that but within float32's reach of the reference.
    assert all(e.row.noise is not None for e in entries)
    assert max(e.difference for e in entries if not e.kinks) < 1e-4


def test_float32_still_finds_a_biased_running_variance(run_start, monkeypatch):
    monkeypatch.setattr(layers, "running_variance", lambda biased_var, n: biased_var)
    divergence, _ = _find(run_start, "float32")
    assert divergence is not None and divergence.step == 1
    # The n/(n−1) factor is 1 + 1/1023 at main.3 (4 × 16 × 16 values a channel): × momentum 0.1 it moves the
    # running variance by ~1e-4 × (var − 1), within float32 noise there; at main.6 (4 × 8 × 8) it is 4× larger.
    assert divergence.entry.stage == "running statistics"
    assert divergence.entry.name.endswith(".running_var (after the D step)")


def test_float32_still_finds_adams_eps_inside_the_root(run_start, monkeypatch):
    def adam_eps_inside(config):
        return optax.chain(optax.scale_by_adam(b1=config.beta1, b2=config.beta2, eps=0.0, eps_root=1e-8),
                           optax.scale(-config.lr))

    monkeypatch.setattr(train, "make_optimizer", adam_eps_inside)
    divergence, _ = _find(run_start, "float32")
    assert divergence is not None and divergence.step == 1
    assert (divergence.entry.stage, divergence.entry.network) == ("update", "D")


def test_the_g_step_starts_from_pytorchs_updated_d(run_start, monkeypatch):
    """A fault only in D's update must be named there, and must not leak into the G step's entries (teacher forcing)."""
    def adam_eps_inside(config):
        return optax.chain(optax.scale_by_adam(b1=config.beta1, b2=config.beta2, eps=0.0, eps_root=1e-8),
                           optax.scale(-config.lr))

    generator_sd, discriminator_sd, real, noise = run_start
    monkeypatch.setattr(train, "make_optimizer", adam_eps_inside)
    _, history = diverge.find_divergence(generator_sd, discriminator_sd, real, noise, "float64", tolerance=1.0, settings=SPEC)
    g_step = [e for e in history[0] if e.network == "G" and e.stage in ("gradient",) or e.name.startswith("D updated")]
    assert g_step and max(e.difference for e in g_step) < 1e-12
    assert max(e.difference for e in history[0] if e.stage == "update" and e.network == "D") > 1e-6


def test_the_command(tmp_path, run_start, capsys, monkeypatch):
    generator_sd, discriminator_sd, real, noise = run_start
    torch.save({k: torch.from_numpy(v) for k, v in generator_sd.items()}, tmp_path / "G.pt")
    torch.save({k: torch.from_numpy(v) for k, v in discriminator_sd.items()}, tmp_path / "D.pt")
    np.savez(tmp_path / "B.npz", real=real, noise=noise)
    args = ["diverge", "--generator", str(tmp_path / "G.pt"), "--discriminator", str(tmp_path / "D.pt"),
            "--batches", str(tmp_path / "B.npz"), "--lr", str(SPEC.lr)]
    assert main(args) == 0
    assert "No divergence in 2 iteration(s)" in capsys.readouterr().out
    monkeypatch.setattr(layers, "running_variance", lambda biased_var, n: biased_var)
    assert main(args) == 1
    out = capsys.readouterr().out
    assert "First divergence: iteration 1, stage 'running statistics', D main.3.running_var" in out
    assert "PyTorch: [" in out and "JAX:     [" in out
