"""The DCGAN step in Flax NNX: the same numbers as the Linen step and as PyTorch's tutorial loop."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest
import torch
from flax import nnx

from functional_gan import nnx_dcgan
from functional_gan.pytorch import dcgan
from functional_gan.pytorch.precision import default_dtype
from functional_gan.train import init_state, make_gan_step, make_train_step
from functional_gan.config import ConfigError
from functional_gan.main import main
from tests.helpers import TINY, max_state_dict_difference, nchw_to_nhwc, state_from_torch, tree_allclose, tiny


def _nnx_state_difference(state, generator, discriminator) -> float:
    """The largest |Linen − NNX| over both nets' parameters and running statistics."""
    ours = (*nnx_dcgan.linen_variables(generator), *nnx_dcgan.linen_variables(discriminator))
    theirs = (state.generator_params, state.generator_batch_stats, state.discriminator_params,
              state.discriminator_batch_stats)
    assert [jax.tree.structure(a) for a in ours] == [jax.tree.structure(b) for b in theirs]
    return max(float(jnp.max(jnp.abs(a - b))) for a, b in zip(jax.tree.leaves(ours), jax.tree.leaves(theirs)))


def test_float64_nnx_steps_match_the_pytorch_tutorial_loop_and_the_linen_step():
    """Ten float64 iterations from the same weights, data and noise, against PyTorch's tutorial loop and the Linen
    step: within 1e-12 (measured: metrics 4.4e-16 from PyTorch's, weights and statistics 1.7e-16; float64 rounding
    over ten Adam steps, three orders below the bound)."""
    config = TINY
    with default_dtype(torch.float64), jax.enable_x64(True):
        net_g, net_d = dcgan.make_models(config, dtype=torch.float64)
        optimizer_g, optimizer_d = dcgan.make_optimizers(net_g, net_d, config)
        criterion = torch.nn.BCELoss()
        state = state_from_torch(config, net_g, net_d)
        generator, discriminator = nnx_dcgan.from_linen(config, state)
        nnx_optimizer_g, nnx_optimizer_d = nnx_dcgan.make_optimizers(config, generator, discriminator)
        linen_step, nnx_step = make_gan_step(config), nnx.jit(nnx_dcgan.nnx_step)
        rng = np.random.default_rng(0)
        for _ in range(10):
            real = rng.uniform(-1, 1, (4, 3, 32, 32))
            noise = rng.normal(size=(4, 8, 1, 1))
            expected = dcgan.tutorial_iteration(net_g, net_d, optimizer_g, optimizer_d, criterion, torch.tensor(real),
                                                torch.tensor(noise))
            real_NHWC, noise_NZ = jnp.asarray(nchw_to_nhwc(real)), jnp.asarray(noise[:, :, 0, 0])
            state, linen_metrics = linen_step(state, real_NHWC, noise_NZ)
            metrics = nnx_step(generator, discriminator, nnx_optimizer_g, nnx_optimizer_d, real_NHWC, noise_NZ)
            np.testing.assert_allclose(np.array(metrics), np.array(expected), rtol=0, atol=1e-12)
            np.testing.assert_allclose(np.array(metrics), np.array(linen_metrics), rtol=0, atol=1e-12)
        assert _nnx_state_difference(state, generator, discriminator) < 1e-12
        g_params, g_stats = nnx_dcgan.linen_variables(generator)
        d_params, d_stats = nnx_dcgan.linen_variables(discriminator)
        assert max_state_dict_difference(g_params, g_stats, net_g) < 1e-12
        assert max_state_dict_difference(d_params, d_stats, net_d) < 1e-12


def test_the_jitted_nnx_step_draws_the_linen_steps_noise_and_counts_its_steps():
    """``make_nnx_step`` draws each iteration's noise from the optimizer's step counter, as the Linen training step
    draws it from ``state.step``: three float32 steps of each from one state agree within float32 rounding."""
    state = init_state(TINY)
    generator, discriminator = nnx_dcgan.from_linen(TINY, state)
    optimizers = nnx_dcgan.make_optimizers(TINY, generator, discriminator)
    nnx_step, linen_step = nnx_dcgan.make_nnx_step(TINY), make_train_step(TINY)
    real = jnp.asarray(np.random.default_rng(1).uniform(-1, 1, (4, 32, 32, 3)), jnp.float32)
    for _ in range(3):
        metrics = nnx_step(generator, discriminator, *optimizers, real)
        state, linen_metrics = linen_step(state, real)
    assert int(optimizers[0].step[...]) == int(optimizers[1].step[...]) == int(state.step) == 3
    # float32, three Adam steps: the two programs are compiled apart, so their roundings differ (~1e-7 relative).
    np.testing.assert_allclose(np.array(metrics), np.array(linen_metrics), rtol=1e-4, atol=1e-5)
    assert _nnx_state_difference(state, generator, discriminator) < 1e-3


def test_eval_mode_normalises_with_the_running_statistics_and_leaves_them():
    generator, _ = nnx_dcgan.make_models(TINY)
    noise = jax.random.normal(jax.random.key(0), (4, TINY.nz))
    generator(noise)  # one training-mode pass: the statistics move
    before = nnx.state(generator, nnx.BatchStat)
    generator.eval()
    first, second = generator(noise), generator(noise[:1])
    after = nnx.state(generator, nnx.BatchStat)
    assert all(bool(jnp.array_equal(a, b)) for a, b in zip(jax.tree.leaves(before), jax.tree.leaves(after)))
    np.testing.assert_allclose(np.asarray(second[0]), np.asarray(first[0]), rtol=0, atol=1e-6)  # per sample in eval


def test_the_functional_form_round_trips_the_state_and_steps_as_the_linen_step_does():
    """``train --api nnx`` runs the NNX step on a GANState (objects merged from it, split back). The round trip
    loses nothing (exact), and in float64 five steps of it equal five Linen steps to 1e-12 (the two trace the same
    operations in the same order: on this machine they agree exactly)."""
    from functional_gan import train

    with jax.enable_x64(True):
        state = jax.tree.map(lambda x: x.astype(jnp.float64) if x.dtype == jnp.float32 else x, init_state(TINY))
        assert tree_allclose(nnx_dcgan.to_state(nnx_dcgan.to_objects(TINY, state), state), state)
        nnx_step, linen_step = nnx_dcgan.make_train_step(TINY), train.make_train_step(TINY)
        real = jnp.asarray(np.random.default_rng(2).uniform(-1, 1, (4, 32, 32, 3)))
        ours = theirs = state
        for _ in range(5):
            ours, metrics = nnx_step(ours, real)
            theirs, linen_metrics = linen_step(theirs, real)
        assert int(ours.step) == 5
        np.testing.assert_allclose(np.array(metrics), np.array(linen_metrics), rtol=0, atol=1e-12)
        assert tree_allclose(ours, theirs, atol=1e-12)


@pytest.mark.parametrize("flags", [["--loss", "hinge"], ["--loss", "wgan-gp"], ["--n-critic", "2"]])
def test_the_nnx_api_refuses_what_it_does_not_port_before_any_work(tmp_path, capsys, flags):
    out = tmp_path / "run"
    assert main(["train", "--api", "nnx", *flags, "--out", str(out)]) == 2
    assert "--api nnx ports the tutorial's step" in capsys.readouterr().err
    assert not out.exists()
    with pytest.raises(ConfigError, match="--api nnx"):
        nnx_dcgan.check_config(tiny(loss="hinge"))
