"""The functional GAN step: a real step, stop_gradient, running statistics, PyTorch agreement."""


import jax
import jax.numpy as jnp
import numpy as np
import pytest
import torch

from functional_gan.losses import bce_discriminator_loss
from functional_gan.pytorch import dcgan
from functional_gan.pytorch.precision import default_dtype
from functional_gan.train import init_state, make_gan_step, make_models, make_train_step
from tests.helpers import TINY, max_state_dict_difference, nchw_to_nhwc, state_from_torch



def test_one_real_step_on_a_tiny_config():
    state = init_state(TINY)
    before = jax.device_get(state.generator_params)  # on accelerators the step donates the state's buffers
    real = jnp.asarray(np.random.default_rng(0).uniform(-1, 1, (4, 32, 32, 3)), jnp.float32)
    new_state, metrics = make_train_step(TINY)(state, real)
    assert int(new_state.step) == 1
    values = {k: float(v) for k, v in metrics._asdict().items()}
    assert all(np.isfinite(list(values.values())))
    assert 0 < values["d_x"] < 1 and 0 < values["d_g_z1"] < 1 and 0 < values["d_g_z2"] < 1
    # At initialisation D outputs ~0.5 for everything: errD ≈ 2·ln 2 and errG ≈ ln 2.
    assert values["loss_d"] == pytest.approx(2 * np.log(2), abs=0.3)
    assert values["loss_g"] == pytest.approx(np.log(2), abs=0.3)
    changed = jax.tree_util.tree_map(lambda a, b: bool(np.any(a != b)), before, jax.device_get(new_state.generator_params))
    assert all(jax.tree_util.tree_leaves(changed)), "every G parameter moves after one Adam step"


def test_running_statistics_update_three_times_for_d_and_once_for_g():
    state = init_state(TINY)
    real = jnp.zeros((4, 32, 32, 3))
    new_state, _ = make_train_step(TINY)(state, real)
    assert int(new_state.discriminator_batch_stats["main_3"]["num_batches_tracked"]) == 3
    assert int(new_state.generator_batch_stats["main_1"]["num_batches_tracked"]) == 1


def _d_loss_as_function_of_generator(detach):
    config = TINY
    state = init_state(config)
    generator, discriminator = make_models(config)
    noise = jax.random.normal(jax.random.key(1), (4, config.nz))
    real = jax.random.uniform(jax.random.key(2), (4, 32, 32, 3), minval=-1, maxval=1)

    def loss(generator_params):
        fake, _ = generator.apply(
            {"params": generator_params, "batch_stats": state.generator_batch_stats}, noise, mutable=["batch_stats"]
        )
        err_d, _ = bce_discriminator_loss(
            discriminator, state.discriminator_params, state.discriminator_batch_stats, real, fake, detach=detach
        )
        return err_d

    return jax.grad(loss)(state.generator_params)


def test_stop_gradient_makes_the_d_loss_gradient_wrt_g_exactly_zero():
    leaves = jax.tree_util.tree_leaves(_d_loss_as_function_of_generator(detach=True))
    assert all(bool(jnp.all(leaf == 0.0)) for leaf in leaves)


def test_without_stop_gradient_the_d_loss_reaches_g():
    # The control for the test above: the same loss without the cut has a non-zero G gradient.
    leaves = jax.tree_util.tree_leaves(_d_loss_as_function_of_generator(detach=False))
    assert sum(float(jnp.sum(jnp.abs(leaf))) for leaf in leaves) > 0


def test_float64_steps_match_the_pytorch_tutorial_loop():
    """Ten iterations from the same weights, data and noise; tolerance 1e-10 (measured ~1e-15)."""
    config = TINY
    with default_dtype(torch.float64):
        net_g, net_d = dcgan.make_models(config, dtype=torch.float64)
        optimizer_g, optimizer_d = dcgan.make_optimizers(net_g, net_d, config)
        criterion = torch.nn.BCELoss()
        rng = np.random.default_rng(0)
        with jax.enable_x64(True):
            state = state_from_torch(config, net_g, net_d)
            step = make_gan_step(config)
            for _ in range(10):
                real = rng.uniform(-1, 1, (4, 3, 32, 32))
                noise = rng.normal(size=(4, 8, 1, 1))
                expected = dcgan.tutorial_iteration(
                    net_g, net_d, optimizer_g, optimizer_d, criterion, torch.tensor(real), torch.tensor(noise)
                )
                state, metrics = step(state, jnp.asarray(nchw_to_nhwc(real)), jnp.asarray(noise[:, :, 0, 0]))
                np.testing.assert_allclose(np.array(metrics), np.array(expected), rtol=0, atol=1e-10)
            assert max_state_dict_difference(state.generator_params, state.generator_batch_stats, net_g) < 1e-10
            assert max_state_dict_difference(state.discriminator_params, state.discriminator_batch_stats, net_d) < 1e-10


def test_the_step_compiles_once(caplog):
    # Counted as traces: the C++ dispatch cache's size (`_cache_size()`) read 0 once in CI after other tests
    # had run in the same process, although nothing was retraced.
    step = make_train_step(TINY)
    state = init_state(TINY)
    real = jnp.zeros((4, 32, 32, 3))
    with caplog.at_level("WARNING", logger="jax._src.dispatch"), jax.log_compiles():
        for _ in range(3):
            state, _ = step(state, real)
    traces = [r for r in caplog.records if r.getMessage().startswith("Finished tracing train_step")]
    assert len(traces) == 1, [r.getMessage() for r in caplog.records]


@pytest.mark.skipif(jax.default_backend() != "cpu", reason="a CPU-only property: XLA:CPU's slow path for lhs_dilate; "
                    "on GPUs the step keeps JAX's own (dilated) transposed convolutions on purpose")
def test_compiled_step_has_no_dilated_input_convolution_on_cpu(monkeypatch):
    """XLA:CPU runs convolutions with lhs_dilate on a slow path; the step must not contain any (with XLA's own
    convolutions; tests/test_onednn.py checks the step with oneDNN's)."""
    monkeypatch.setenv("FUNCTIONAL_GAN_CONV", "xla")
    state = init_state(TINY)
    hlo = make_train_step(TINY).lower(state, jnp.zeros((4, 32, 32, 3))).compile().as_text()
    assert " convolution(" in hlo or "__ynn_fusion" in hlo  # the step does contain convolutions
    assert "lhs_dilate" not in hlo
