"""The command line's start-up: --help without JAX, and the persistent compilation cache it turns on."""

import os
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]

PROBE = """
import sys
from functional_gan.main import main
try:
    main(sys.argv[1:])
except SystemExit:
    pass
print("JAX IMPORTED" if "jax" in sys.modules else "NO JAX", file=sys.stderr)
"""


def _run(*args, env=None):
    return subprocess.run([sys.executable, "-c", PROBE, *args], capture_output=True, text=True, timeout=120,
                          env={**os.environ, "PYTHONPATH": str(ROOT), **(env or {})})


def test_help_answers_without_importing_jax():
    # (`train`, `replay` and `diverge --help` list the losses' entries and the flags' defaults, `lessons` and `bench`
    # what they define: those load JAX.)
    for args in (["--help"], ["sample", "--help"], ["export", "--help"], ["check-port", "--help"]):
        result = _run(*args)
        assert "usage: functional-gan" in result.stdout, result.stderr
        assert "NO JAX" in result.stderr, (args, result.stderr)
    # The top-level help still lists every command, and a command's help its own flags.
    assert all(c in _run("--help").stdout for c in ("train", "sample", "diverge", "check-port", "bench"))
    assert "--batch-size" in _run("train", "--help").stdout


def test_an_unknown_command_is_refused_with_the_list_of_commands():
    result = _run("trian")
    assert "invalid choice: 'trian'" in result.stderr and "'train'" in result.stderr


def test_commands_use_the_persistent_compilation_cache_unless_told_not_to(tmp_path):
    # JAX imported before the command runs, as `train`'s flags import it (and a user's own script may)
    probe = ("import os, sys, jax\nfrom functional_gan import main as m\nm.main(sys.argv[1:])\n"
             "print('CACHE', jax.config.jax_compilation_cache_dir)\n"
             "print('MIN', jax.config.jax_persistent_cache_min_compile_time_secs)")
    env = {k: v for k, v in os.environ.items() if not k.startswith("JAX_")}
    env.update(PYTHONPATH=str(ROOT), XDG_CACHE_HOME=str(tmp_path))
    args = ["linreg"]
    on = subprocess.run([sys.executable, "-c", probe, *args], capture_output=True, text=True, timeout=300, env=env)
    assert f"CACHE {tmp_path / 'functional-gan' / 'jax'}" in on.stdout, on.stderr
    # Every program cached, however fast it compiled, though JAX was imported before the cache was turned on: JAX's
    # own threshold, 1 s, kept a training run's model initialisation (4.7 s of small programs) out of it.
    assert "MIN 0.0" in on.stdout, on.stdout
    assert any((tmp_path / "functional-gan" / "jax").iterdir())  # the programs were written there
    off = subprocess.run([sys.executable, "-c", probe, "--no-compile-cache", *args], capture_output=True, text=True,
                         timeout=300, env=env)
    assert "CACHE None" in off.stdout, off.stderr
