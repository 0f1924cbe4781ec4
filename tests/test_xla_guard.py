"""No silently wrong numbers from the JAX build: jaxlib 0.10.2's CPU miscompile (jax-ml/jax#39103) is guarded.

Upstream's reproducer runs in fresh processes started as users start them: ``import functional_gan`` first
(the command line and every process it starts do that), the user's own ``XLA_FLAGS`` given, and JAX started
before the package (then a warning says what to set). The expected numbers are exact: the last row of the
reproducer is (n − 1)², a power of two that float32 and float64 hold exactly.
"""

import os
import subprocess
import sys

import pytest

from functional_gan import xla_guard

REPRODUCER = """
import jax
jax.config.update("jax_enable_x64", True)
import jax.numpy as jnp

def last_row(dtype, n):
    i = jnp.arange(n, dtype=dtype)
    x = jnp.stack((i, jnp.zeros_like(i), jnp.zeros_like(i)), axis=1)
    matrix = jnp.eye(3, dtype=dtype)
    f = lambda x: jax.vmap(lambda row: jnp.sum((matrix @ row) ** 2))(x)
    return float(jax.jit(f)(x)[-1])

print(last_row(jnp.float64, 16_385), last_row(jnp.float32, 32_769), jax.device_count())
"""
EXACT = [16_384.0 ** 2, 32_768.0 ** 2]


def _run(code: str, **env) -> subprocess.CompletedProcess:
    environment = {k: v for k, v in os.environ.items() if k not in ("XLA_FLAGS", xla_guard.DISABLE_ENV)}
    environment.update(env)
    return subprocess.run([sys.executable, "-W", "always::RuntimeWarning", "-c", code], env=environment,
                          capture_output=True, text=True, timeout=300, check=True)


def _numbers(result) -> list[float]:
    return [float(v) for v in result.stdout.split()]


def test_the_reproducer_is_right_when_the_package_is_imported_first():
    result = _run("import functional_gan\n" + REPRODUCER)
    assert _numbers(result)[:2] == EXACT
    assert "RuntimeWarning" not in result.stderr


def test_without_the_guard_the_reproducer_is_wrong_exactly_on_a_known_bad_build():
    """The control: the guard is what makes the numbers right (and KNOWN_BAD names the builds that need it)."""
    result = _run("import functional_gan\n" + REPRODUCER, **{xla_guard.DISABLE_ENV: "0"})
    wrong = [got != want for got, want in zip(_numbers(result), EXACT)]
    assert wrong == [xla_guard.needs_workaround(xla_guard.installed_jaxlib())] * 2, (result.stdout, xla_guard.describe())


def test_the_users_own_xla_flags_survive_and_keep_their_effect():
    # Both user flags stay in effect: 3 host devices, and YNNPACK convolutions added to the fusion types
    # (on a known-bad build the guard's later "-reduce" only takes the reductions out again).
    user = "--xla_force_host_platform_device_count=3 --xla_cpu_experimental_ynn_fusion_type=+individual_convolution"
    code = "import os, functional_gan\nprint(os.environ['XLA_FLAGS'].replace(' ', '|'))\n" + REPRODUCER
    lines = _run(code, XLA_FLAGS=user).stdout.splitlines()
    assert lines[0].replace("|", " ").startswith(user)
    assert _numbers(subprocess.CompletedProcess([], 0, lines[1], "")) == [*EXACT, 3.0]


def test_a_process_that_started_jax_first_is_warned_once_with_what_to_set():
    code = ("import jax\njax.numpy.ones(1).block_until_ready()\nimport functional_gan\n"
            "from functional_gan import xla_guard\nprint(xla_guard.guard(), xla_guard.guard())\n")
    result = _run(code)
    if xla_guard.needs_workaround(xla_guard.installed_jaxlib()):
        assert result.stdout.split() == ["too", "late", "too", "late"]
        assert result.stderr.count("RuntimeWarning") == 1
        assert f"XLA_FLAGS='{xla_guard.FLAG}'" in result.stderr
    else:
        assert result.stdout.split() == ["not", "needed", "not", "needed"] and "RuntimeWarning" not in result.stderr


@pytest.mark.parametrize("flags,in_effect", [
    ("", False),
    (xla_guard.FLAG, True),
    ("--xla_cpu_experimental_ynn_fusion_type=+individual_convolution,-reduce", True),
    (f"{xla_guard.FLAG} --xla_cpu_experimental_ynn_fusion_type=+reduce", False),  # a later occurrence wins
    ("--xla_force_host_platform_device_count=2", False),
])
def test_the_flag_counts_as_set_only_when_its_last_occurrence_takes_reductions_out(flags, in_effect):
    assert xla_guard.flag_in_effect(flags) is in_effect
    assert xla_guard.flag_in_effect(xla_guard.with_flag(flags))


ENERGY_SPEC = '''
import numpy as np, torch, jax.numpy as jnp, flax.linen as fnn
N = {n}

class Energy(torch.nn.Module):
    """The upstream reproducer as a model: a fixed projection (a constant of the program), then each row's energy."""
    def __init__(self):
        super().__init__()
        self.scale = torch.nn.Parameter(torch.ones(3))

    def forward(self, x):
        return ((torch.eye(3, dtype=x.dtype) @ (x * self.scale).T) ** 2).sum(0)

class FlaxEnergy(fnn.Module):
    @fnn.compact
    def __call__(self, x):
        scale = self.param("scale", fnn.initializers.ones, (3,))
        return jnp.sum((jnp.eye(3, dtype=x.dtype) @ (x * scale).T) ** 2, axis=0)

def torch_model():
    return Energy()

def jax_model():
    return FlaxEnergy()

def example_inputs():
    i = np.arange(N, dtype=np.float64)
    return (np.stack([i, np.zeros_like(i), np.zeros_like(i)], axis=1),)
'''


@pytest.mark.parametrize("dtype,n", [("float64", 16_385), ("float32", 32_769)])
def test_check_port_passes_a_correct_port_with_the_pattern_and_names_the_build_without_the_guard(tmp_path, dtype, n):
    (tmp_path / "energy.py").write_text(ENERGY_SPEC.format(n=n))
    command = [sys.executable, "-m", "functional_gan.main", "check-port", str(tmp_path / "energy.py"), "--dtype", dtype]
    environment = {k: v for k, v in os.environ.items() if k not in ("XLA_FLAGS", xla_guard.DISABLE_ENV)}
    guarded = subprocess.run(command, env=environment, capture_output=True, text=True, timeout=300)
    assert guarded.returncode == 0 and "Agreement: all 2 quantities" in guarded.stdout, guarded.stdout + guarded.stderr
    unguarded = subprocess.run(command, env={**environment, xla_guard.DISABLE_ENV: "0"}, capture_output=True, text=True,
                               timeout=300)
    if xla_guard.needs_workaround(xla_guard.installed_jaxlib()):  # the miscompile, caught and blamed on the build
        assert unguarded.returncode == 1, unguarded.stdout + unguarded.stderr
        assert "Only the compiled program (jax.jit) departs" in unguarded.stdout
        assert "workaround NOT in effect" in unguarded.stdout
    else:
        assert unguarded.returncode == 0, unguarded.stdout + unguarded.stderr
