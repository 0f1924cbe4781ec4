"""WGAN-GP as a training variant: the critic, the penalty's second-order gradient, n_critic, the CLI.

The PyTorch side is :mod:`functional_gan.pytorch.wgan_gp` (the penalty as reference implementations
write it, ``autograd.grad(..., create_graph=True)``); the 30-iteration float64 trajectory against it
is a check of the comparison suite (tests/test_comparison_suite.py).
"""

import dataclasses
import json

import jax
import jax.numpy as jnp
import numpy as np
import pytest
import torch

from functional_gan import state_dicts, losses
from functional_gan.config import ConfigError
from functional_gan.losses import config_for_loss
from functional_gan.data import make_fake
from functional_gan.loop import train
from functional_gan.main import main
from functional_gan.pytorch import dcgan, wgan_gp
from functional_gan.replay import ReplayInputError, replay, state_from_state_dicts
from functional_gan.train import init_state, make_gan_step, make_models

from .helpers import max_state_difference, nchw_to_nhwc, tiny, tiny_flags

SMALL = tiny(loss="wgan-gp", seed=3)


def _torch_models(config=SMALL):
    with torch.random.fork_rng():
        net_g, net_c = wgan_gp.make_models(config, dtype=torch.float64)
    return net_g, net_c


def _inputs(config=SMALL, seed=0):
    rng = np.random.default_rng(seed)
    real = rng.uniform(-1, 1, (config.batch_size, config.nc, config.image_size, config.image_size))
    fake = rng.uniform(-1, 1, real.shape)
    alpha = rng.uniform(size=config.batch_size)
    return real, fake, alpha


def test_defaults_are_gulrajani_et_al_and_flags_override():
    config = config_for_loss("wgan-gp")
    assert (config.lr, config.beta1, config.beta2, config.n_critic, config.gp_weight) == (1e-4, 0.0, 0.9, 5, 10.0)
    assert config_for_loss("wgan-gp", lr=3e-4, n_critic=2).lr == 3e-4
    assert config_for_loss("wgan-gp", lr=None).lr == 1e-4  # None: not given
    assert config_for_loss("bce").n_critic == 1 and config_for_loss("bce").lr == 2e-4  # the tutorial's
    with pytest.raises(ConfigError, match="--gp-weight"):
        config_for_loss("bce", gp_weight=5.0)
    with pytest.raises(ConfigError, match="--n-critic must be a positive integer"):
        config_for_loss("wgan-gp", n_critic=0).validate()


def test_critic_has_no_batchnorm_no_sigmoid_and_the_pytorch_critics_state_dict():
    state = init_state(SMALL)
    assert state.discriminator_batch_stats == {}
    net_g, net_c = _torch_models()
    assert not any(isinstance(m, (torch.nn.BatchNorm2d, torch.nn.Sigmoid)) for m in net_c.modules())
    expected = state_dicts.state_dict_shapes(state.discriminator_params, state.discriminator_batch_stats)
    assert {k: tuple(v.shape) for k, v in net_c.state_dict().items()} == expected
    # The same weights give the same scores (float64); scores, not probabilities (no sigmoid: negative ones occur).
    with jax.enable_x64():
        jstate = state_from_state_dicts(SMALL, dcgan.state_dict_numpy(net_g), dcgan.state_dict_numpy(net_c), jnp.float64)
        _, critic = make_models(SMALL)
        real, _, _ = _inputs()
        ours = critic.apply({"params": jstate.discriminator_params}, jnp.asarray(nchw_to_nhwc(real)))
        theirs = net_c(torch.as_tensor(real)).detach().numpy()
        np.testing.assert_allclose(np.asarray(ours), theirs, rtol=0, atol=1e-12 * np.abs(theirs).max())
        assert (theirs < 0).any()


def _critic_loss_and_grads(config, net_c_state_dict, real, fake, alpha, penalty_fn=None):
    with jax.enable_x64():
        state = state_from_state_dicts(config, None, net_c_state_dict, jnp.float64)
        _, critic = make_models(config)
        loss_fn = losses.wgan_gp_critic_loss
        (loss, _), grads = jax.value_and_grad(loss_fn, argnums=1, has_aux=True)(
            critic, state.discriminator_params, {}, jnp.asarray(nchw_to_nhwc(real)), jnp.asarray(nchw_to_nhwc(fake)),
            jnp.asarray(alpha), config.gp_weight,
        )
        return float(loss), state_dicts.variables_to_state_dict(jax.device_get(grads), {})


def _torch_critic_loss_and_grads(config, net_c, real, fake, alpha):
    net_c.zero_grad()
    real, fake, alpha = (torch.as_tensor(a) for a in (real, fake, alpha))
    penalty = wgan_gp.calc_gradient_penalty(net_c, real, fake, alpha)
    loss = net_c(fake).mean() - net_c(real).mean() + config.gp_weight * penalty
    loss.backward()
    return loss.item(), {name: p.grad.numpy().copy() for name, p in net_c.named_parameters()}


def test_critic_loss_and_its_second_order_gradient_match_autograd_create_graph():
    _, net_c = _torch_models()
    real, fake, alpha = _inputs()
    torch_loss, torch_grads = _torch_critic_loss_and_grads(SMALL, net_c, real, fake, alpha)
    loss, grads = _critic_loss_and_grads(SMALL, dcgan.state_dict_numpy(net_c), real, fake, alpha)
    assert abs(loss - torch_loss) <= 1e-12 * abs(torch_loss)
    for name, expected in torch_grads.items():  # float64: PyTorch and JAX differ by summation order only
        np.testing.assert_allclose(grads[name], expected, rtol=0, atol=1e-12 * max(np.abs(expected).max(), 1e-3), err_msg=name)


def test_without_the_second_order_path_the_gradient_differs(monkeypatch):
    """The check above can fail: a penalty whose input gradient is treated as a constant (PyTorch's
    ``autograd.grad`` without ``create_graph=True``) leaves the penalty out of the critic's gradient."""
    _, net_c = _torch_models()
    real, fake, alpha = _inputs()
    _, torch_grads = _torch_critic_loss_and_grads(SMALL, net_c, real, fake, alpha)

    def first_order_only(critic_fn, x_hat):
        gradients = jax.lax.stop_gradient(jax.grad(lambda x: jnp.sum(critic_fn(x)))(x_hat))
        return jnp.mean((jnp.linalg.norm(gradients.reshape(gradients.shape[0], -1), axis=1) - 1.0) ** 2)

    monkeypatch.setattr(losses, "gradient_penalty", first_order_only)
    _, grads = _critic_loss_and_grads(SMALL, dcgan.state_dict_numpy(net_c), real, fake, alpha)
    worst = max_state_difference(grads, torch_grads)
    assert worst > 1e-3, worst


def test_generator_updates_every_n_critic_th_iteration_and_nothing_of_g_moves_between():
    config = dataclasses.replace(SMALL, n_critic=3)
    state = init_state(config)
    step = make_gan_step(config)
    rng = np.random.default_rng(0)
    history = []
    for t in range(6):
        real = jnp.asarray(rng.uniform(-1, 1, (4, 32, 32, 3)), jnp.float32)
        noise = jnp.asarray(rng.normal(size=(4, 8)), jnp.float32)
        new, metrics = step(state, real, noise, jnp.asarray(rng.uniform(size=4), jnp.float32))
        g_moved = any(not np.array_equal(a, b) for a, b in zip(jax.tree_util.tree_leaves(state.generator_params),
                                                             jax.tree_util.tree_leaves(new.generator_params)))
        d_moved = any(not np.array_equal(a, b) for a, b in zip(jax.tree_util.tree_leaves(state.discriminator_params),
                                                             jax.tree_util.tree_leaves(new.discriminator_params)))
        history.append((g_moved, d_moved, int(new.generator_opt_state[0].count), int(new.discriminator_opt_state[0].count)))
        assert np.isclose(float(metrics.loss_g), -float(metrics.d_g_z2))  # errG = −C(G(z)), logged every iteration
        state = new
    assert history == [(False, True, 0, 1), (False, True, 0, 2), (True, True, 1, 3),
                       (False, True, 1, 4), (False, True, 1, 5), (True, True, 2, 6)]


def test_bce_with_n_critic_keeps_ds_running_statistics_of_the_skipped_g_pass_out():
    """n_critic applies to the tutorial's loss too: on an iteration without a G step, D sees real
    and fake once each (num_batches_tracked + 2, as a PyTorch loop that skips the G step), not 3."""
    config = tiny(loss="bce", n_critic=2)
    state = init_state(config)
    step = make_gan_step(config)
    counts = []
    for _ in range(4):
        state, _ = step(state, jnp.zeros((4, 32, 32, 3)), jnp.ones((4, 8)))
        counts.append(int(state.discriminator_batch_stats["main_3"]["num_batches_tracked"]))
    assert counts == [2, 5, 7, 10]


def test_replay_needs_the_interpolation_weights_for_wgan_gp_only():
    net_g, net_c = _torch_models()
    real = np.zeros((2, 4, 3, 32, 32))
    noise = np.zeros((2, 4, 8, 1, 1))
    g, c = dcgan.state_dict_numpy(net_g), dcgan.state_dict_numpy(net_c)
    with pytest.raises(ReplayInputError, match="'mix'"):
        replay(g, c, real, noise, "float64", SMALL)
    with pytest.raises(ReplayInputError, match=r"'mix' has shape \(2, 3\)"):
        replay(g, c, real, noise, "float64", SMALL, mix=np.zeros((2, 3)))


def _dataset():
    return make_fake(32, 3, num_images=16, seed=1)


def _quiet(_):
    pass


def test_training_resumes_bit_identically_and_exports_a_critic_pytorch_loads(tmp_path):
    config = dataclasses.replace(SMALL, data="fake", steps=6, log_every=2, sample_every=3, checkpoint_every=3)
    straight = train(config, tmp_path / "straight", dataset=_dataset(), progress=False, print_fn=_quiet)
    train(dataclasses.replace(config, steps=3), tmp_path / "resumed", dataset=_dataset(), progress=False, print_fn=_quiet)
    resumed = train(config, tmp_path / "resumed", dataset=_dataset(), progress=False, print_fn=_quiet)
    assert resumed.first_step == 3
    assert all(np.array_equal(a, b) for a, b in zip(jax.tree_util.tree_leaves(straight.state),
                                                     jax.tree_util.tree_leaves(resumed.state)))
    assert (tmp_path / "resumed" / "metrics.jsonl").read_text() == (tmp_path / "straight" / "metrics.jsonl").read_text()
    # The critic exports to a state_dict the PyTorch Critic loads strictly, and scores the same.
    out = tmp_path / "critic.pth"
    assert main(["export", "--checkpoint", str(tmp_path / "straight"), "--discriminator", str(out)]) == 0
    net_c = wgan_gp.Critic(SMALL.ndf, SMALL.nc, SMALL.image_size)
    net_c.load_state_dict(torch.load(out, weights_only=True), strict=True)
    images = np.random.default_rng(0).uniform(-1, 1, (2, 32, 32, 3)).astype(np.float32)
    _, critic = make_models(config)
    ours = critic.apply({"params": straight.state.discriminator_params}, jnp.asarray(images))
    np.testing.assert_allclose(np.asarray(ours), net_c(torch.as_tensor(images.transpose(0, 3, 1, 2))).detach().numpy(),
                               rtol=1e-5, atol=1e-6)


def test_cli_trains_wgan_gp_with_its_defaults_and_critic_stats_line(tmp_path, capsys):
    run = tmp_path / "run"
    code = main(["train", *tiny_flags(loss="wgan-gp", steps=5, log_every=5), "--out", str(run)])
    assert code == 0
    saved = json.loads((run / "config.json").read_text())
    assert (saved["loss"], saved["lr"], saved["beta1"], saved["beta2"], saved["n_critic"], saved["gp_weight"]) == (
        "wgan-gp", 1e-4, 0.0, 0.9, 5, 10.0)
    out = capsys.readouterr().out
    assert "Critic (wgan-gp)" in out and "C(x):" in out and "W:" in out
    assert main(["train", "--loss", "bce", "--gp-weight", "3", "--data", "fake", "--out", str(tmp_path / "x")]) == 2
    assert "--gp-weight" in capsys.readouterr().err and not (tmp_path / "x").exists()


def test_cli_replays_a_pytorch_wgan_gp_run_in_float64(tmp_path, capsys):
    from functional_gan.comparisons import reference_runs
    from functional_gan.comparisons.common import make_batches, make_mix

    spec = dataclasses.replace(SMALL, n_critic=3, steps=6, seed=0)  # two generator updates
    run = reference_runs.run_loss(spec, "float64")
    paths = {name: tmp_path / f"{name}.pt" for name in ("G", "C")}
    state_dicts.save_state_dict_file(run.initial_generator, paths["G"])
    state_dicts.save_state_dict_file(run.initial_discriminator, paths["C"])
    real, noise = make_batches(spec)
    np.savez(tmp_path / "batches.npz", real=real, noise=noise, mix=make_mix(spec))
    common = ["replay", "--generator", str(paths["G"]), "--discriminator", str(paths["C"]), "--dtype", "float64",
              "--loss", "wgan-gp", "--n-critic", "3", "--out", str(tmp_path / "metrics.npz")]
    assert main([*common, "--batches", str(tmp_path / "batches.npz"), "--out-discriminator", str(tmp_path / "C2.pt")]) == 0
    with np.load(tmp_path / "metrics.npz") as ours:
        for name, theirs in run.metrics.items():
            np.testing.assert_allclose(ours[name], theirs, rtol=0, atol=1e-10, err_msg=name)
    final = state_dicts.load_state_dict_file(tmp_path / "C2.pt")
    assert max_state_difference(final, run.final_discriminator) <= 1e-10
    np.savez(tmp_path / "no_mix.npz", real=real, noise=noise)
    capsys.readouterr()
    assert main([*common, "--batches", str(tmp_path / "no_mix.npz")]) == 2
    assert "lacks mix" in capsys.readouterr().err
