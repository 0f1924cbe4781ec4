"""The tutorial's Generator and Discriminator: sizes, parameter counts, forward against PyTorch."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest
import torch

import dataclasses

from functional_gan import state_dicts
from functional_gan.config import TUTORIAL
from functional_gan.models import count_params
from functional_gan.pytorch import dcgan
from functional_gan.train import make_models
from tests.helpers import nhwc_to_nchw

pytestmark = pytest.mark.usefixtures("strict_dtype_promotion")


def _models(**changes):
    return make_models(dataclasses.replace(TUTORIAL, **changes))


def _abstract_init(module, key, example):
    """Variables as zero arrays of the right shapes and dtypes, without running the init (fast)."""
    shapes = jax.eval_shape(module.init, key, example)
    return jax.tree_util.tree_map(lambda s: np.zeros(s.shape, s.dtype), shapes)


def test_default_parameter_counts_equal_the_tutorials(key):
    # Published in the tutorial's model printout and recomputed from PyTorch below.
    generator, discriminator = _models()
    g_vars = _abstract_init(generator, key, jnp.zeros((1, 100)))
    d_vars = _abstract_init(discriminator, key, jnp.zeros((1, 64, 64, 3)))
    net_g, net_d = dcgan.Generator(), dcgan.Discriminator()
    assert count_params(g_vars["params"]) == sum(p.numel() for p in net_g.parameters()) == 3_576_704
    assert count_params(d_vars["params"]) == sum(p.numel() for p in net_d.parameters()) == 2_765_568


@pytest.mark.parametrize("image_size", [32, 64, 128])
def test_state_dict_keys_and_shapes_match_pytorch(image_size, key):
    generator, discriminator = _models(ngf=8, ndf=8, image_size=image_size)
    g_vars = _abstract_init(generator, key, jnp.zeros((1, 100)))
    d_vars = _abstract_init(discriminator, key, jnp.zeros((1, image_size, image_size, 3)))
    for variables, module in (
        (g_vars, dcgan.Generator(ngf=8, image_size=image_size)),
        (d_vars, dcgan.Discriminator(ndf=8, image_size=image_size)),
    ):
        ours = state_dicts.variables_to_state_dict(variables["params"], variables["batch_stats"])
        theirs = module.state_dict()
        assert list(ours) == list(theirs)
        assert {k: v.shape for k, v in ours.items()} == {k: tuple(v.shape) for k, v in theirs.items()}


@pytest.mark.parametrize("image_size", [32, 64, 128])
def test_generator_and_discriminator_forward_match_pytorch(image_size):
    config = dataclasses.replace(TUTORIAL, nz=10, ngf=4, ndf=4, image_size=image_size)
    net_g, net_d = dcgan.make_models(config, dtype=torch.float64)
    g_vars = state_dicts.state_dict_to_variables(dcgan.state_dict_numpy(net_g))
    d_vars = state_dicts.state_dict_to_variables(dcgan.state_dict_numpy(net_d))
    z = np.random.default_rng(0).normal(size=(3, 10, 1, 1))
    generator, discriminator = make_models(config)
    with jax.enable_x64(True):
        fake, _ = generator.apply(g_vars, jnp.asarray(z[:, :, 0, 0]), mutable=["batch_stats"])
        prob, _ = discriminator.apply(d_vars, fake, mutable=["batch_stats"])
    torch_fake = net_g(torch.tensor(z))
    assert fake.shape == (3, image_size, image_size, 3)
    np.testing.assert_allclose(nhwc_to_nchw(fake), torch_fake.detach().numpy(), rtol=1e-11, atol=1e-12)
    np.testing.assert_allclose(prob, net_d(torch_fake).view(-1).detach().numpy(), rtol=1e-11, atol=1e-12)


def test_weights_init_distribution(key):
    """Conv weights N(0, 0.02), BN weight N(1, 0.02), BN bias 0: the tutorial's weights_init."""
    params = _models()[0].init(jax.random.fold_in(key, 1), jnp.zeros((1, 100)))["params"]
    conv = np.asarray(params["main_3"]["weight"])  # 512·256·16 ≈ 2.1M samples: the std is known to ~1e-3
    assert abs(conv.mean()) < 1e-3 and abs(conv.std() - 0.02) < 1e-3
    bn = params["main_1"]
    assert abs(float(np.mean(bn["weight"])) - 1.0) < 0.01 and np.all(np.asarray(bn["bias"]) == 0)


def test_unsupported_image_size_is_rejected(key):
    with pytest.raises(ValueError, match="image size 48 is not supported"):
        _models(image_size=48)[0].init(key, jnp.zeros((1, 100)))
