"""check-port's detection power: the smallest planted mistake it names, at depth, in float32 and float64; and the
verdicts on the corpus of correct ports (tests/corpus/).

    python -m functional_gan.benchmarks.detection_power [--out benchmarks/results] [--depths 2 50 150]

The model: a residual stack of ``depth`` blocks ``x + tanh(LayerNorm(Linear(x)))`` (width 32, batch 16, an MSE loss),
PyTorch and a Flax Linen port. The mistake, in the port only, at the middle block: its output scaled by ``1 + ε``, or
its LayerNorm's ``eps`` 1e-5 made ``1e-5·(1 + ε)`` (both of every size from 10 down to 1e-12, a decade apart); the
smallest ε whose first divergence the check names at the next block's first layer (the scaled output shows there) or at
the block's own LayerNorm (its eps). Then the corpus: each correct port checked in float32 and float64, its exit
status. Writes ``detection-power.json`` and ``.md`` to ``--out``.
"""

from __future__ import annotations

import argparse
import importlib.util
import json
import os
import time
from pathlib import Path

import flax.linen as nn
import jax
import jax.numpy as jnp
import numpy as np
import torch

from functional_gan import testing
from functional_gan.testing.spec import Spec

WIDTH, BATCH = 32, 16
EPSILONS = [10.0 ** -e for e in range(-1, 13)]  # 10 down to 1e-12, a decade apart
CORPUS = Path(__file__).resolve().parents[1] / "tests" / "corpus"


class TorchStack(torch.nn.Module):
    def __init__(self, depth: int):
        super().__init__()
        self.blocks = torch.nn.ModuleList(
            torch.nn.Sequential(torch.nn.Linear(WIDTH, WIDTH), torch.nn.LayerNorm(WIDTH)) for _ in range(depth))

    def forward(self, x):
        for block in self.blocks:
            x = x + torch.tanh(block(x))
        return x


class Stack(nn.Module):
    depth: int
    mistake: str | None = None
    at: int = 0
    epsilon: float = 0.0

    @nn.compact
    def __call__(self, x):
        for i in range(self.depth):
            eps = 1e-5 * (1 + self.epsilon) if (self.mistake == "eps" and i == self.at) else 1e-5
            # the transposed kernel: x @ Wᵀ where the port should compute x @ W (PyTorch's weight moved as it should be)
            transposed = self.mistake == "transpose" and i == self.at
            h = nn.Dense(WIDTH, name=f"blocks_{i}_0", dot_general=_transposed_dot if transposed else jax.lax.dot_general)(x)
            h = nn.LayerNorm(epsilon=eps, use_fast_variance=False, name=f"blocks_{i}_1")(h)
            x = x + jnp.tanh(h)
            if self.mistake == "scale" and i == self.at:
                x = x * (1 + self.epsilon)
        return x


def _transposed_dot(lhs, rhs, dimensions, precision=None, preferred_element_type=None, **kwargs):
    return jax.lax.dot_general(lhs, rhs.T, dimensions, precision=precision,
                               preferred_element_type=preferred_element_type, **kwargs)


def _spec(depth: int, mistake: str | None, epsilon: float) -> Spec:
    rng = np.random.default_rng(0)
    inputs = rng.standard_normal((BATCH, WIDTH)).astype(np.float32)
    targets = rng.standard_normal((BATCH, WIDTH)).astype(np.float32)
    return Spec(name=f"stack{depth}", torch_model=lambda: TorchStack(depth), example_inputs=lambda: (inputs,),
                jax_model=lambda: Stack(depth, mistake, depth // 2, epsilon), example_targets=lambda: (targets,),
                torch_loss=lambda out, x, t: torch.mean((out - t) ** 2),
                jax_loss=lambda out, x, t: jnp.mean((out - t) ** 2))


def _named(report, depth: int, mistake: str) -> bool:
    first = report.first_divergence
    if first is None:
        return False
    at = depth // 2
    expected = {"scale": f"blocks.{at + 1}.0", "eps": f"blocks.{at}.1", "transpose": f"blocks.{at}.0"}[mistake]
    if mistake == "scale" and at + 1 == depth:
        expected = "output"
    return first.name == expected


def detection(depths, dtypes=("float32", "float64")) -> list[dict]:
    results = []
    for depth in depths:
        for dtype in dtypes:
            correct = testing.check_port(_spec(depth, None, 0.0), dtype, programs=("jit",))
            for mistake in ("scale", "eps"):
                smallest = None
                for epsilon in EPSILONS:
                    start = time.perf_counter()
                    report = testing.check_port(_spec(depth, mistake, epsilon), dtype, programs=("jit",))
                    named = _named(report, depth, mistake)
                    print(f"depth {depth:>3} {dtype} {mistake:<5} ε={epsilon:.0e}: "
                          f"{'named' if named else 'not named'} ({time.perf_counter() - start:.1f} s)", flush=True)
                    if not named:
                        break
                    smallest = epsilon
                results.append({"depth": depth, "dtype": dtype, "mistake": mistake, "smallest_named": smallest,
                                "correct_exit": correct.exit_status(),
                                "correct_worst_ratio": max(r.ratio for r in correct.rows if r.ratio is not None)})
            report = testing.check_port(_spec(depth, "transpose", 0.0), dtype, programs=("jit",))
            results.append({"depth": depth, "dtype": dtype, "mistake": "transpose",
                            "named": _named(report, depth, "transpose"),
                            "where": report.first_divergence.name if report.first_divergence else None})
            print(f"depth {depth:>3} {dtype} transposed kernel: {results[-1]}", flush=True)
    return results


def corpus(names=("mnist_nnx_handwritten", "linen_adam_groupnorm", "transposed_proj")) -> list[dict]:
    results = []
    for name in names:
        spec = importlib.util.spec_from_file_location(f"corpus_{name}", CORPUS / f"{name}.py")
        module = importlib.util.module_from_spec(spec)
        spec.loader.exec_module(module)
        for dtype in ("float32", "float64"):
            report = testing.check_port(testing.spec_from_module(module), dtype, steps=2)
            results.append({"spec": name, "dtype": dtype, "exit": report.exit_status(),
                            "notes": len(report.precision_notes), "not_compared": len(report.not_compared),
                            "worst_ratio": max(r.ratio for r in report.rows if r.ratio is not None)})
            print(results[-1], flush=True)
    return results


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", default="benchmarks/results")
    parser.add_argument("--depths", type=int, nargs="+", default=[2, 50, 150])
    args = parser.parse_args(argv)
    if not CORPUS.is_dir():  # installed from the wheel: the tests are not there
        parser.exit(2, f"{parser.prog}: the corpus of correct ports lives in a clone's tests/corpus ({CORPUS} is not "
                       "there); run it from a clone (pip install -e .)\n")
    found = {"detection": detection(args.depths), "corpus": corpus()}
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    (out / "detection-power.json").write_text(json.dumps(found, indent=1) + "\n")
    lines = ["# check-port's detection power and its verdicts on correct ports", "",
             f"`python -m functional_gan.benchmarks.detection_power --depths {' '.join(map(str, args.depths))}` "
             f"({os.cpu_count()} cores).", "",
             "| depth | dtype | correct stack: exit (worst ×) | smallest output scale 1 + ε named "
             "| smallest eps change named | transposed kernel |",
             "|---|---|---|---|---|---|"]
    by = {(r["depth"], r["dtype"], r["mistake"]): r for r in found["detection"]}
    for depth in args.depths:
        for dtype in ("float32", "float64"):
            scale, eps, turned = by[depth, dtype, "scale"], by[depth, dtype, "eps"], by[depth, dtype, "transpose"]
            fmt = lambda v: "none" if v is None else f"{v:.0e}"  # noqa: E731
            lines.append(f"| {depth} | {dtype} | {scale['correct_exit']} ({scale['correct_worst_ratio']:.2f}×) | "
                         f"{fmt(scale['smallest_named'])} | {fmt(eps['smallest_named'])} | "
                         f"{'named at ' + turned['where'] if turned['named'] else 'not named'} |")
    lines += ["", "| correct port (tests/corpus/) | dtype | exit | notes | not compared | worst × |", "|---|---|---|---|---|---|"]
    lines += [f"| {r['spec']} | {r['dtype']} | {r['exit']} | {r['notes']} | {r['not_compared']} | {r['worst_ratio']:.2f} |"
              for r in found["corpus"]]
    (out / "detection-power.md").write_text("\n".join(lines) + "\n")
    print("\n".join(lines))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
