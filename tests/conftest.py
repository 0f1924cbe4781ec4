"""Shared test settings, as the JAX anchors write them: strict dtype promotion and a key fixture."""

import jax
import pytest


@pytest.fixture
def strict_dtype_promotion():
    """Mixing dtypes implicitly (float32 with float64, ints with floats) is an error inside the test.

    Used by the modules that test this project's own numerics (layers, models), so that a silent
    upcast there shows up as a failure. Not global: optax 0.2.8's own adam and MultiSteps mix
    their int32 step counters with floats, which strict promotion rejects.
    """
    with jax.numpy_dtype_promotion("strict"):
        yield


@pytest.fixture
def key():
    """A fresh root PRNG key; tests derive what they need with split / fold_in."""
    return jax.random.key(0)
