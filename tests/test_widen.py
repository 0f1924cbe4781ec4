"""Lower-precision islands removed: the JAX program with its casts to float32 computed in float64
(functional_gan.testing.widen) and the PyTorch run with them removed (torch_side.Islands), each against the same
computation written in float64 throughout."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest
import torch

from functional_gan.testing import widen
from functional_gan.testing.torch_side import Islands


def _model(dt):
    def f(w, x):
        h = jnp.tanh(x @ w)
        v = jnp.mean(jnp.asarray(h, dt) ** 2, -1, keepdims=True)  # an RMSNorm's variance in dt
        h = h / jnp.sqrt(v + 1e-6)

        def body(c, _):  # a scan whose body casts
            return c * 0.5 + jnp.sin(c.astype(dt)).astype(c.dtype), None

        h, _ = jax.lax.scan(body, h, None, length=3)
        h = jax.lax.cond(h.sum() > 0, lambda a: jax.nn.softmax(a.astype(dt)), lambda a: a.astype(dt), h)
        h = jnp.einsum("bi,bj->ij", h.astype(dt), h.astype(dt), preferred_element_type=dt)
        return jnp.sum(h.astype(jnp.float64) ** 2)

    return lambda w, x: jax.value_and_grad(f)(w, x)


def test_a_program_with_float32_islands_widened_is_the_float64_program():
    with jax.enable_x64(True):
        rng = np.random.default_rng(0)
        w, x = jnp.asarray(rng.standard_normal((8, 8)) / 3), jnp.asarray(rng.standard_normal((4, 8)))
        narrow, exact = _model(jnp.float32)(w, x), _model(jnp.float64)(w, x)
        wide = jax.jit(widen.widened(_model(jnp.float32)))(w, x)
        for a, b, c in zip(jax.tree.leaves(narrow), jax.tree.leaves(wide), jax.tree.leaves(exact)):
            scale = float(jnp.max(jnp.abs(c)))
            assert float(jnp.max(jnp.abs(a - c))) / scale > 1e-9  # the islands err as float32 does
            # the float64 program's own rounding: the islands' constants (1e-6, 0.5) stay as they were rounded in
            # float32 (2⁻²⁴ of each; their effect here is under 1e-12 of the scale)
            assert float(jnp.max(jnp.abs(b - c))) / scale < 1e-12
        assert set(widen.islands(_model(jnp.float32), w, x).values()) == {"float32"}
        assert widen.islands(_model(jnp.float64), w, x) == {}


class _RMSNorm(torch.nn.Module):
    def __init__(self, cast):
        super().__init__()
        self.cast = cast
        self.weight = torch.nn.Parameter(torch.linspace(0.5, 1.5, 16))

    def forward(self, x):
        h = x.to(torch.float32) if self.cast == "to" else x.float() if self.cast == "float" else x
        h = h * torch.rsqrt(h.pow(2).mean(-1, keepdim=True) + 1e-6)
        h = torch.softmax(h, -1, dtype=torch.float32) if self.cast else torch.softmax(h, -1)
        return self.weight * h.to(x.dtype)


@pytest.mark.parametrize("cast", ["to", "float"])
def test_pytorch_runs_with_their_islands_found_and_removed(cast):
    x = torch.from_numpy(np.random.default_rng(1).standard_normal((4, 16)))
    model, exact = torch.nn.Sequential(_RMSNorm(cast)).double(), torch.nn.Sequential(_RMSNorm(None)).double()
    found = Islands(model, torch.float64)
    with found:
        narrow = model(x)
    assert found.found == {"0": "float32"}
    with Islands(model, torch.float64, widen=True):
        wide = model(x)
    reference = exact(x)
    assert (narrow - reference).abs().max() > 1e-9 and (wide - reference).abs().max() < 1e-15
