"""The tutorial's Generator and Discriminator: sizes, parameter counts, forward against PyTorch."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest
import torch

from comparisons import torch_reference
from functional_gan import convert
from functional_gan.models import Discriminator, Generator, count_params
from tests.helpers import nhwc_to_nchw


def test_default_parameter_counts_equal_the_tutorials():
    # Published in the tutorial's model printout and recomputed from PyTorch below.
    g_vars = Generator().init(jax.random.key(0), jnp.zeros((1, 100)))
    d_vars = Discriminator().init(jax.random.key(0), jnp.zeros((1, 64, 64, 3)))
    net_g, net_d = torch_reference.Generator(), torch_reference.Discriminator()
    assert count_params(g_vars["params"]) == sum(p.numel() for p in net_g.parameters()) == 3_576_704
    assert count_params(d_vars["params"]) == sum(p.numel() for p in net_d.parameters()) == 2_765_568


@pytest.mark.parametrize("image_size", [32, 64, 128])
def test_state_dict_keys_and_shapes_match_pytorch(image_size):
    g_vars = Generator(ngf=8, image_size=image_size).init(jax.random.key(0), jnp.zeros((1, 100)))
    d_vars = Discriminator(ndf=8, image_size=image_size).init(jax.random.key(0), jnp.zeros((1, image_size, image_size, 3)))
    for variables, module in (
        (g_vars, torch_reference.Generator(ngf=8, image_size=image_size)),
        (d_vars, torch_reference.Discriminator(ndf=8, image_size=image_size)),
    ):
        ours = convert.variables_to_state_dict(variables["params"], variables["batch_stats"])
        theirs = module.state_dict()
        assert list(ours) == list(theirs)
        assert {k: v.shape for k, v in ours.items()} == {k: tuple(v.shape) for k, v in theirs.items()}


@pytest.mark.parametrize("image_size", [32, 64, 128])
def test_generator_and_discriminator_forward_match_pytorch(image_size):
    net_g, net_d = torch_reference.make_models(nz=10, ngf=4, ndf=4, image_size=image_size, dtype=torch.float64)
    g_vars = convert.state_dict_to_variables(torch_reference.state_dict_numpy(net_g))
    d_vars = convert.state_dict_to_variables(torch_reference.state_dict_numpy(net_d))
    z = np.random.default_rng(0).normal(size=(3, 10, 1, 1))
    with jax.enable_x64(True):
        fake, _ = Generator(nz=10, ngf=4, image_size=image_size).apply(g_vars, jnp.asarray(z[:, :, 0, 0]), mutable=["batch_stats"])
        prob, _ = Discriminator(ndf=4, image_size=image_size).apply(d_vars, fake, mutable=["batch_stats"])
    torch_fake = net_g(torch.tensor(z))
    assert fake.shape == (3, image_size, image_size, 3)
    np.testing.assert_allclose(nhwc_to_nchw(fake), torch_fake.detach().numpy(), rtol=1e-11, atol=1e-12)
    np.testing.assert_allclose(prob, net_d(torch_fake).view(-1).detach().numpy(), rtol=1e-11, atol=1e-12)


def test_weights_init_distribution():
    """Conv weights N(0, 0.02), BN weight N(1, 0.02), BN bias 0: the tutorial's weights_init."""
    params = Generator().init(jax.random.key(1), jnp.zeros((1, 100)))["params"]
    conv = np.asarray(params["main_3"]["weight"])  # 512·256·16 ≈ 2.1M samples: the std is known to ~1e-3
    assert abs(conv.mean()) < 1e-3 and abs(conv.std() - 0.02) < 1e-3
    bn = params["main_1"]
    assert abs(float(np.mean(bn["weight"])) - 1.0) < 0.01 and np.all(np.asarray(bn["bias"]) == 0)


def test_unsupported_image_size_is_rejected():
    with pytest.raises(ValueError, match="image size 48 is not supported"):
        Generator(image_size=48).init(jax.random.key(0), jnp.zeros((1, 100)))
