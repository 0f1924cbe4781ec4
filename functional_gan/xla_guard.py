"""No silently wrong numbers from a JAX build known to miscompile: the workaround set before XLA starts.

jaxlib 0.10.2 (the newest release for Python 3.11) miscompiles some reductions on the CPU
(jax-ml/jax#39103, fixed in later releases): under ``jax.jit`` a sum over the short leading axis of
a wide array whose other operand is a compile-time constant, e.g. ``jnp.sum((W @ x.T) ** 2, axis=0)``
with ``W`` closed over as in ``jax.jit(lambda x: model.apply(params, x))``, returns one wrong row,
without an error or a NaN. Upstream's reproducer (``tests/test_xla_guard.py`` runs it) gives
267911424 instead of 268435456. XLA's flag ``--xla_cpu_experimental_ynn_fusion_type=-reduce`` keeps
such reductions out of the YNNPACK fusions where the bug lives, and the numbers are right again.

:func:`guard` runs when ``functional_gan`` is imported, before anything of the package touches JAX, so
every process the project starts (each command, the specs ``check-port`` runs, the Grain workers,
the processes of a multi-process run, which inherit the environment) computes with the flag:

* on a known-bad jaxlib, while XLA's backend has not started yet, the flag is appended to
  ``XLA_FLAGS`` (whatever the user set there stays, and XLA reads the flag's later occurrences as
  changes to the earlier ones: ``+individual_convolution`` set by the user is kept);
* if the backend has started already (the user's own process ran JAX before importing this
  package), XLA has read its flags and it is too late: one warning says what to set;
* on any other jaxlib nothing changes (the flag does not exist everywhere; an unknown XLA flag aborts).

``FUNCTIONAL_GAN_XLA_GUARD=0`` turns the guard off (to reproduce the bug, or to measure the flag's cost).
Nothing here imports JAX.
"""

from __future__ import annotations

import os
import sys
import warnings

FLAG = "--xla_cpu_experimental_ynn_fusion_type=-reduce"
# jaxlib version → the upstream report of its miscompile (the flag above is the workaround for each).
KNOWN_BAD = {"0.10.2": "https://github.com/jax-ml/jax/issues/39103"}
DISABLE_ENV = "FUNCTIONAL_GAN_XLA_GUARD"

_warned = False


def installed_jaxlib() -> str | None:
    """The installed jaxlib's version, read from its metadata (JAX is not imported), or None."""
    from importlib import metadata

    try:
        return metadata.version("jaxlib")
    except metadata.PackageNotFoundError:
        return None


def needs_workaround(version: str | None = None) -> bool:
    """True on a jaxlib known to miscompile, unless the guard is turned off."""
    if os.environ.get(DISABLE_ENV) == "0":
        return False
    return (version if version is not None else installed_jaxlib()) in KNOWN_BAD


def flag_in_effect(xla_flags: str | None = None) -> bool:
    """True when ``XLA_FLAGS`` ends its YNN fusion settings with the workaround (later occurrences win)."""
    flags = (os.environ.get("XLA_FLAGS", "") if xla_flags is None else xla_flags).split()
    ynn = [f for f in flags if f.startswith("--xla_cpu_experimental_ynn_fusion_type=")]
    return bool(ynn) and ynn[-1].rsplit(",", 1)[-1].endswith("-reduce")


def with_flag(xla_flags: str | None) -> str:
    """``xla_flags`` with the workaround appended (the user's flags kept, in their order)."""
    flags = (xla_flags or "").strip()
    return f"{flags} {FLAG}".strip()


def backend_started() -> bool:
    """True when this process's JAX has already created an XLA backend (and so has read XLA_FLAGS)."""
    if "jax" not in sys.modules:
        return False
    bridge = sys.modules.get("jax._src.xla_bridge")
    return bool(getattr(bridge, "_backends", None))


def guard() -> str:
    """Set the workaround in this process when its jaxlib needs it; returns what it did:
    ``"not needed"``, ``"set"``, ``"already set"`` or ``"too late"`` (then it has warned, once)."""
    global _warned
    version = installed_jaxlib()
    if not needs_workaround(version):
        return "not needed"
    if flag_in_effect():
        return "already set"
    if backend_started():
        if not _warned:
            _warned = True
            warnings.warn(
                f"jaxlib {version} miscompiles some reductions on the CPU ({KNOWN_BAD[version]}): jitted code can return "
                f"wrong numbers without an error. JAX had already started before functional_gan was imported, so the "
                f"workaround could not be set; start Python with XLA_FLAGS='{with_flag(os.environ.get('XLA_FLAGS'))}' "
                "or import functional_gan before running anything with JAX (or use jax ≥ 0.12 on Python ≥ 3.12).",
                RuntimeWarning, stacklevel=3)
        return "too late"
    os.environ["XLA_FLAGS"] = with_flag(os.environ.get("XLA_FLAGS"))
    return "set"


def describe() -> str:
    """One line for reports: the JAX build and what the guard did about it."""
    version = installed_jaxlib()
    if version not in KNOWN_BAD:
        return f"jaxlib {version}"
    if flag_in_effect():
        return f"jaxlib {version} (known CPU miscompile {KNOWN_BAD[version]}; workaround {FLAG} in effect)"
    return f"jaxlib {version} (known CPU miscompile {KNOWN_BAD[version]}; workaround NOT in effect)"
